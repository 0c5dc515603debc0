internal import CVLMKernels

// oneDNN code compiles where the CDNNL module is available (the Linux build) unless the build defines
// VLM_PORTABLE_BACKEND (`swift build -Xswiftc -DVLM_PORTABLE_BACKEND`), which compiles the package as it builds
// on Apple platforms. Every file with oneDNN code tests the same condition.

/// Which library runs the dense math: matmuls, convolutions and the elementwise ops. Everything uses `best`;
/// tests run each backend compiled in.
enum Backend: CaseIterable, Sendable {
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    /// oneDNN's primitives.
    case oneDNN
    #endif
    /// CVLMKernels' GEMM (Accelerate on Apple platforms) and plain Swift loops.
    case portable

    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    static let best = Backend.oneDNN
    #else
    static let best = Backend.portable
    #endif
}

/// `c = a·b`, or `a·bᵀ` when `transposeB`, of contiguous row-major matrices: `a [m, k]`, `b [k, n]` or `[n, k]`,
/// `c [m, n]`.
func gemm(m: Int, n: Int, k: Int, _ a: UnsafePointer<Float>, _ b: UnsafePointer<Float>, transposeB: Bool,
          into c: UnsafeMutablePointer<Float>) {
    let status = vlm_gemm(m, n, k, a, k, b, transposeB ? k : n, transposeB ? 1 : 0, c, n)
    precondition(status == 0, "out of memory for GEMM scratch")
}
