internal import CDNNL

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

    /// The oneDNN eltwise algorithm and its alpha/beta, nil for identity.
    var eltwise: (algorithm: dnnl_alg_kind_t, alpha: Float, beta: Float)? {
        switch self {
        case .identity: nil
        case .gelu: (dnnl_eltwise_gelu_erf, 0, 0)
        case .geluTanh: (dnnl_eltwise_gelu_tanh, 0, 0)
        // oneDNN's swish is x·sigmoid(alpha·x).
        case .quickGelu: (dnnl_eltwise_swish, 1.702, 0)
        case .relu: (dnnl_eltwise_relu, 0, 0)
        case .silu: (dnnl_eltwise_swish, 1, 0)
        }
    }

    var postOps: [PostOp] {
        eltwise.map { [.eltwise($0.algorithm, alpha: $0.alpha, beta: $0.beta)] } ?? []
    }
}
