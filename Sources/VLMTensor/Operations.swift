#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
internal import CVLMKernels

/// Layer normalization over the last dimension (`torch.nn.functional.layer_norm(x, [D], weight, bias, eps)`).
public func layerNorm(_ x: Tensor, weight: Tensor, bias: Tensor, eps: Float) -> Tensor {
    layerNorm(x, weight: weight, bias: bias, eps: eps, path: .best)
}

/// Rows per layer-norm work unit. One image's 50 tokens stay on the calling thread: splitting 20 µs of work saves
/// 10 µs on an idle machine, but a parallel region waits for its slowest thread, which on a busy machine can be
/// a whole scheduler time slice away.
private let layerNormRowsPerUnit = 64

func layerNorm(_ x: Tensor, weight: Tensor, bias: Tensor, eps: Float, path: KernelPath) -> Tensor {
    let features = x.shape.last ?? 0
    precondition(x.rank >= 1 && weight.shape == [features] && bias.shape == [features],
                 "layerNorm of \(x.shape) needs weight and bias [\(features)], got \(weight.shape) and \(bias.shape)")
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let rows = x.count / features
    let units = (rows + layerNormRowsPerUnit - 1) / layerNormRowsPerUnit
    let run: @Sendable (Int) -> Void = { unit in
        let first = unit * layerNormRowsPerUnit
        let count = min(layerNormRowsPerUnit, rows - first)
        vlm_layer_norm(x.storage.pointer + first * features, output.storage.pointer + first * features, count, features,
                       weight.storage.pointer, bias.storage.pointer, eps, path.isa)
    }
    if units == 1 {
        run(0)
    } else {
        parallelFor(units, run)
    }
    return output
}

/// Applies an activation function elementwise.
public func activation(_ x: Tensor, _ kind: Activation) -> Tensor {
    activation(x, kind, backend: .best)
}

func activation(_ x: Tensor, _ kind: Activation, backend: Backend) -> Tensor {
    if kind == .identity { return x }
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    switch backend {
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    case .oneDNN: oneDNNActivation(x, kind, into: output)
    #endif
    case .portable: for index in 0..<x.count { output.storage.pointer[index] = kind(x.storage.pointer[index]) }
    }
    return output
}

/// `x * factor`.
public func scaled(_ x: Tensor, by factor: Float) -> Tensor {
    scaled(x, by: factor, backend: .best)
}

func scaled(_ x: Tensor, by factor: Float, backend: Backend) -> Tensor {
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    switch backend {
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    case .oneDNN: oneDNNScaled(x, by: factor, into: output)
    #endif
    case .portable: for index in 0..<x.count { output.storage.pointer[index] = x.storage.pointer[index] * factor }
    }
    return output
}

/// `a + b` where `b` has `a`'s shape or a suffix of it (then it is broadcast over `a`'s leading dimensions).
public func add(_ a: Tensor, _ b: Tensor) -> Tensor {
    add(a, b, backend: .best)
}

func add(_ a: Tensor, _ b: Tensor, backend: Backend) -> Tensor {
    precondition(b.rank <= a.rank && Array(a.shape.suffix(b.rank)) == b.shape,
                 "add: \(b.shape) is neither \(a.shape) nor a suffix of it")
    let output = Tensor(uninitialized: a.shape)
    if a.count == 0 { return output }
    let columns = b.count
    let rows = a.count / columns
    switch backend {
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    case .oneDNN: oneDNNAdd(a, b, rows: rows, columns: columns, into: output)
    #endif
    case .portable:
        for index in 0..<a.count { output.storage.pointer[index] = a.storage.pointer[index] + b.storage.pointer[index % columns] }
    }
    return output
}

/// Softmax over the last dimension.
public func softmax(_ x: Tensor) -> Tensor {
    softmax(x, backend: .best)
}

func softmax(_ x: Tensor, backend: Backend) -> Tensor {
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let columns = x.shape.last!
    let rows = x.count / columns
    switch backend {
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    case .oneDNN: oneDNNSoftmax(x, rows: rows, columns: columns, into: output)
    #endif
    case .portable:
        for row in 0..<rows {
            let input = x.storage.pointer + row * columns, out = output.storage.pointer + row * columns
            var largest = -Float.infinity
            for column in 0..<columns { largest = max(largest, input[column]) }
            var sum: Float = 0
            for column in 0..<columns {
                out[column] = exp(input[column] - largest)
                sum += out[column]
            }
            for column in 0..<columns { out[column] /= sum }
        }
    }
    return output
}

/// `x / ‖x‖₂` over the last dimension (`x / x.norm(p=2, dim=-1, keepdim=True)`).
public func l2Normalized(_ x: Tensor) -> Tensor {
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let columns = x.shape.last!
    let rows = x.count / columns
    let source = x.storage.pointer
    let destination = output.storage.pointer
    for row in 0..<rows {
        let input = source + row * columns
        // Accumulating in Double makes the norm correctly rounded, which PyTorch's float reduction approximates.
        var sumOfSquares = 0.0
        for column in 0..<columns { sumOfSquares += Double(input[column]) * Double(input[column]) }
        let norm = Float(sumOfSquares.squareRoot())
        for column in 0..<columns { destination[row * columns + column] = input[column] / norm }
    }
    return output
}

/// Matrix product of 2-D tensors: `a [M, K] · b [K, N]`; `a` stored as `[K, M]` when `transposeA`, `b` as `[N, K]`
/// when `transposeB` (a gradient's products: `dW = dYᵀ·X`).
public func matmul(_ a: Tensor, _ b: Tensor, transposeA: Bool = false, transposeB: Bool = false) -> Tensor {
    matmul(a, b, transposeA: transposeA, transposeB: transposeB, backend: .best)
}

/// ``matmul(_:_:transposeA:transposeB:)`` written over `output` (`[M, N]`): a product whose buffer is kept from one
/// training step to the next (a weight's gradient) instead of fresh pages every step.
public func matmul(_ a: Tensor, _ b: Tensor, transposeA: Bool = false, transposeB: Bool = false, into output: Tensor) {
    matmul(a, b, transposeA: transposeA, transposeB: transposeB, backend: .best, into: output)
}

func matmul(_ a: Tensor, _ b: Tensor, transposeB: Bool, backend: Backend) -> Tensor {
    matmul(a, b, transposeA: false, transposeB: transposeB, backend: backend)
}

func matmul(_ a: Tensor, _ b: Tensor, transposeA: Bool, transposeB: Bool, backend: Backend) -> Tensor {
    precondition(a.rank == 2 && b.rank == 2, "matmul needs 2-D tensors, got \(a.shape) and \(b.shape)")
    let output = Tensor(uninitialized: [transposeA ? a.shape[1] : a.shape[0], transposeB ? b.shape[0] : b.shape[1]])
    matmul(a, b, transposeA: transposeA, transposeB: transposeB, backend: backend, into: output)
    return output
}

private func matmul(_ a: Tensor, _ b: Tensor, transposeA: Bool, transposeB: Bool, backend: Backend, into output: Tensor) {
    precondition(a.rank == 2 && b.rank == 2, "matmul needs 2-D tensors, got \(a.shape) and \(b.shape)")
    let (m, k) = transposeA ? (a.shape[1], a.shape[0]) : (a.shape[0], a.shape[1])
    let n = transposeB ? b.shape[0] : b.shape[1]
    precondition((transposeB ? b.shape[1] : b.shape[0]) == k,
                 "matmul: \(a.shape)\(transposeA ? "ᵀ" : "") x \(b.shape)\(transposeB ? "ᵀ" : "") do not line up")
    precondition(output.shape == [m, n], "matmul: output \(output.shape) for a [\(m), \(n)] product")
    if output.count == 0 { return }
    if k == 0 { return output.storage.pointer.update(repeating: 0, count: output.count) }
    switch backend {
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    case .oneDNN: oneDNNMatmul(a, b, m: m, k: k, n: n, transposeA: transposeA, transposeB: transposeB, into: output)
    #endif
    case .portable:
        let left = transposeA ? transposed(a) : a
        gemm(m: m, n: n, k: k, left.storage.pointer, b.storage.pointer, transposeB: transposeB, into: output.storage.pointer)
    }
}

/// The transpose of a 2-D tensor, copied.
public func transposed(_ x: Tensor) -> Tensor {
    precondition(x.rank == 2, "transposed needs a 2-D tensor, got \(x.shape)")
    let (rows, columns) = (x.shape[0], x.shape[1])
    let output = Tensor(uninitialized: [columns, rows])
    let source = x.storage.pointer, destination = output.storage.pointer
    for row in 0..<rows {
        for column in 0..<columns { destination[column * rows + row] = source[row * columns + column] }
    }
    return output
}
