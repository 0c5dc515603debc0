/// The number format in which ``Linear`` layers hold their weights and multiply.
///
/// Everything else (layer norms, softmax, attention, activations between layers) stays fp32 whatever the layers'
/// precision: fewer bits buy speed only in the matrix products, which are most of an encoder's time, while the
/// reductions are where low precision would cost accuracy.
public enum MatrixPrecision: String, Sendable, CaseIterable, Codable {
    /// fp32 weights and products: the numbers of transformers in fp32.
    case float32 = "fp32"
    /// bf16 weights; each layer's input is rounded to bf16 and the products accumulate in fp32 (AVX512-BF16).
    case bfloat16 = "bf16"

    /// The precision layers built inside `body` use, and the one they are built in when nothing says otherwise.
    ///
    /// A model's constructor builds dozens of layers in many files; the precision it should give them is a
    /// property of the load, not of each layer, so it travels with the task that loads the model.
    @TaskLocal public static var forNewLayers = MatrixPrecision.float32

    /// What this machine's backend actually runs when asked for `self`: bf16 needs oneDNN and a CPU with bf16
    /// dot products (AVX512-BF16 or AMX); elsewhere the layers compute in fp32 rather than emulate bf16, which
    /// would be slower than fp32 itself.
    public var available: MatrixPrecision {
        switch self {
        case .float32: return .float32
        case .bfloat16:
            #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
            return OneDNNLinear.hasNativeBFloat16 ? .bfloat16 : .float32
            #else
            return .float32
            #endif
        }
    }
}
