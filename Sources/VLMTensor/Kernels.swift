internal import CVLMKernels

/// Which implementation of the hand-written kernels in CVLMKernels runs. Everything uses `best`; tests pin
/// `scalar` to check the portable fallback on machines that would otherwise never run it.
enum KernelPath: Sendable {
    case vector
    case scalar

    static let best: KernelPath = vlm_best_isa() == VLM_ISA_AVX512 ? .vector : .scalar

    var isa: vlm_kernel_isa { self == .vector ? VLM_ISA_AVX512 : VLM_ISA_SCALAR }
}
