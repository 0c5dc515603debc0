#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The activation functions transformer checkpoints name in their configs.
public enum Activation: Sendable, Hashable {
    /// No activation.
    case identity
    /// Exact GELU, `0.5·x·(1 + erf(x/√2))` (PyTorch `nn.GELU()`, transformers "gelu").
    case gelu
    /// Tanh approximation of GELU (PyTorch `GELU(approximate="tanh")`, transformers "gelu_new"/"gelu_pytorch_tanh").
    case geluTanh
    /// `x·sigmoid(1.702·x)` (transformers "quick_gelu", used by OpenAI CLIP).
    case quickGelu
    /// `max(x, 0)`.
    case relu
    /// `x·sigmoid(x)` (transformers "silu"/"swish").
    case silu
    /// `1 / (1 + exp(-x))` (`torch.sigmoid`; turns segmentation logits and SigLIP scores into probabilities).
    case sigmoid
    /// `x` for positive `x`, else `exp(x) - 1` (PyTorch `nn.ELU()`, alpha 1; OWL-ViT's logit scale).
    case elu

    /// The function on one value, in fp32 as PyTorch computes it; the portable backend's implementation.
    func callAsFunction(_ x: Float) -> Float {
        switch self {
        case .identity: x
        case .gelu: 0.5 * x * (1 + erf(x * 0.70710678118654752))
        case .geluTanh: 0.5 * x * (1 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)))
        case .quickGelu: x / (1 + exp(-1.702 * x))
        case .relu: max(x, 0)
        case .silu: x / (1 + exp(-x))
        case .sigmoid: 1 / (1 + exp(-x))
        case .elu: x > 0 ? x : expm1(x)
        }
    }
}

/// A linear layer's epilogue where its product came from a kernel of ours: adds the bias, applies the activation and
/// adds the residual on `columns` of `rows` rows of `y` (rows `stride` floats apart, the residual laid out alike).
func finishLinearOutput(_ y: UnsafeMutablePointer<Float>, rows: Int, columns: Range<Int>, stride: Int, bias: Tensor?,
                        activation: Activation, residual: UnsafeMutablePointer<Float>?) {
    if bias == nil && activation == .identity && residual == nil { return }
    for row in 0..<rows {
        let out = y + row * stride
        for column in columns {
            var value = out[column] + (bias?.storage.pointer[column] ?? 0)
            value = activation(value)
            if let residual { value += residual[row * stride + column] }
            out[column] = value
        }
    }
}
