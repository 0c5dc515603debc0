import VLMTensor

/// A stack of CLIP's or SigLIP's pre-norm encoder layers (`CLIPEncoderLayer`, `SiglipEncoderLayer`: self-attention and
/// an MLP, each after its layer norm and added to the residual stream) as training runs it, for the text and the
/// vision towers alike: the forward pass keeps what the backward pass reads, and the backward pass gives every
/// layer parameter's gradient under its Hugging Face name.
struct EncoderTraining {
    /// Where the layers' weights are, e.g. `text_model.encoder.layers.`.
    let prefix: String
    let layers, heads: Int
    let eps: Float
    let activation: Activation
    /// CLIP's text transformer attends causally; its vision transformer and SigLIP's towers both ways.
    let causal: Bool

    /// What one layer's backward pass reads from its forward pass.
    struct LayerActivations {
        let input: Tensor
        let normed1: Tensor
        let query: Tensor, key: Tensor, value: Tensor
        let attention: AttentionForTraining
        let afterAttention: Tensor
        let normed2: Tensor
        let hidden: Tensor
        let activated: Tensor
    }

    /// The stack's output for `x [B, T, D]`, and each layer's activations when `keeping` (a frozen tower keeps none).
    ///
    /// - Parameter mask: the texts' key padding mask `[B, T]` (nil: every position attended).
    func forward(_ x: Tensor, mask: Tensor?, keeping: Bool, weights value: (String) -> Tensor) -> (output: Tensor, layers: [LayerActivations]) {
        var hidden = x
        var kept: [LayerActivations] = []
        for index in 0..<layers {
            let prefix = self.prefix + "\(index)."
            func project(_ name: String, _ input: Tensor) -> Tensor {
                linear(input, weight: value(prefix + name + ".weight"), bias: value(prefix + name + ".bias"))
            }
            let normed1 = layerNorm(hidden, weight: value(prefix + "layer_norm1.weight"), bias: value(prefix + "layer_norm1.bias"), eps: eps)
            let (query, key, values) = (project("self_attn.q_proj", normed1), project("self_attn.k_proj", normed1),
                                        project("self_attn.v_proj", normed1))
            let attention = attentionForTraining(query: query, key: key, value: values, heads: heads, causal: causal,
                                                 keyPaddingMask: mask)
            let afterAttention = add(hidden, project("self_attn.out_proj", attention.output))
            let normed2 = layerNorm(afterAttention, weight: value(prefix + "layer_norm2.weight"),
                                    bias: value(prefix + "layer_norm2.bias"), eps: eps)
            let mlpHidden = project("mlp.fc1", normed2)
            let activated = VLMTensor.activation(mlpHidden, activation)
            if keeping {
                kept.append(LayerActivations(input: hidden, normed1: normed1, query: query, key: key, value: values,
                                             attention: attention, afterAttention: afterAttention, normed2: normed2,
                                             hidden: mlpHidden, activated: activated))
            }
            hidden = add(afterAttention, project("mlp.fc2", activated))
        }
        return (hidden, kept)
    }

    /// The gradient of the stack's input from its output's, adding every layer parameter's gradient to `gradients`.
    func backward(_ outputGradient: Tensor, through layers: [LayerActivations], weights value: (String) -> Tensor,
                  into gradients: inout [String: Tensor]) -> Tensor {
        var gradient = outputGradient
        for (index, layer) in layers.enumerated().reversed() {
            let prefix = self.prefix + "\(index)."
            func linearGradient(_ name: String, _ dy: Tensor, input: Tensor) -> Tensor {
                let result = linearBackward(dy, input: input, weight: value(prefix + name + ".weight"))
                gradients[prefix + name + ".weight"] = result.weight
                gradients[prefix + name + ".bias"] = result.bias
                return result.input
            }
            func normGradient(_ name: String, _ dy: Tensor, input: Tensor) -> Tensor {
                let result = layerNormBackward(dy, input: input, weight: value(prefix + name + ".weight"), eps: eps)
                gradients[prefix + name + ".weight"] = result.weight
                gradients[prefix + name + ".bias"] = result.bias
                return result.input
            }
            let activatedGradient = linearGradient("mlp.fc2", gradient, input: layer.activated)
            let hiddenGradient = activationBackward(activatedGradient, input: layer.hidden, activation)
            let normed2Gradient = linearGradient("mlp.fc1", hiddenGradient, input: layer.normed2)
            let residualGradient = add(gradient, normGradient("layer_norm2", normed2Gradient, input: layer.afterAttention))
            let attentionOutputGradient = linearGradient("self_attn.out_proj", residualGradient, input: layer.attention.output)
            let attention = attentionBackward(attentionOutputGradient, query: layer.query, key: layer.key, value: layer.value,
                                              probabilities: layer.attention.probabilities, heads: heads)
            let normed1Gradient = add(add(linearGradient("self_attn.q_proj", attention.query, input: layer.normed1),
                                          linearGradient("self_attn.k_proj", attention.key, input: layer.normed1)),
                                      linearGradient("self_attn.v_proj", attention.value, input: layer.normed1))
            gradient = add(residualGradient, normGradient("layer_norm1", normed1Gradient, input: layer.input))
        }
        return gradient
    }
}
