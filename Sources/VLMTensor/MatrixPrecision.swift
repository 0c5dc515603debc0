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
    /// Dynamic int8 quantization: int8 weights with a scale per output channel, each input row quantized to int8 on
    /// a scale of its own as it comes, the products accumulated exactly in int32 (VNNI).
    case int8

    /// The precision layers built inside `body` use, and the one they are built in when nothing says otherwise.
    ///
    /// A model's constructor builds dozens of layers in many files; the precision it should give them is a
    /// property of the load, not of each layer, so it travels with the task that loads the model.
    @TaskLocal public static var forNewLayers = MatrixPrecision.float32

    /// What this machine's backend actually runs when asked for `self`: bf16 needs oneDNN and a CPU with bf16
    /// dot products (AVX512-BF16 or AMX), int8 oneDNN and VNNI (or AMX); elsewhere the layers compute in fp32
    /// rather than emulate bf16 (slower than fp32 itself) or clip int8 sums in 16 bits.
    public var available: MatrixPrecision {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        switch self {
        case .float32: return .float32
        case .bfloat16: return OneDNNLinear.hasNativeBFloat16 ? .bfloat16 : .float32
        case .int8: return OneDNNInt8Linear.hasVNNI ? .int8 : .float32
        }
        #else
        return .float32
        #endif
    }
}
