import VLMTensor

/// Linear layers that read the same input (a decoder's q/k/v projections, its gate and up projections), run as one
/// matrix product over their stacked weights when the weights stack (all fp32, or all quantized in one format):
/// one pass over the input and one parallel region instead of several. GGUF layers in different formats (Q4_K_M's
/// Q8_0 v beside Q5_0 q and k) still decode in one parallel region.
struct StackedProjections {
    private enum Layers {
        case stacked(Linear)
        case separate([Linear])
    }

    private let layers: Layers
    /// Output width of each projection.
    let widths: [Int]

    init(weights: [WeightMatrix], biases: [Tensor?]) throws {
        precondition(!weights.isEmpty && weights.count == biases.count)
        widths = weights.map { $0.shape[0] }
        let stackedBias: Tensor?? = biases.allSatisfy { $0 == nil } ? .some(nil)
            : biases.allSatisfy { $0 != nil } ? .some(concatenate(biases.map { $0! }, axis: 0)) : nil
        if let stackedBias, let stacked = WeightMatrix.stackingRows(weights) {
            layers = .stacked(try Linear(weight: stacked, bias: stackedBias))
        } else {
            layers = .separate(try zip(weights, biases).map { try Linear(weight: $0, bias: $1) })
        }
    }

    /// The layers the projections run as: one stacking them, or one each.
    var linears: [Linear] {
        switch layers {
        case let .stacked(linear): [linear]
        case let .separate(linears): linears
        }
    }

    /// Each projection of `x [..., in]`: `[..., widths[i]]`.
    func callAsFunction(_ x: Tensor) -> [Tensor] {
        switch layers {
        case let .stacked(linear): splitLastDimension(linear(x), widths: widths)
        case let .separate(linears): Linear.together(linears, x) ?? linears.map { $0(x) }
        }
    }

    /// `activation(gate(x)) · up(x)` for the two projections gate and up (SwiGLU and its kin).
    func gated(_ x: Tensor, activation: Activation) -> Tensor {
        precondition(widths.count == 2 && widths[0] == widths[1], "a gated pair needs two projections of one width")
        switch layers {
        case let .stacked(linear): return gatedActivation(linear(x), activation: activation)
        case let .separate(linears): return multiply(linears[0](x, activation: activation), linears[1](x))
        }
    }
}
