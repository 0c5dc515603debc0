import Foundation
import VLMCheckpoint
import VLMModels
import VLMTensor

/// LLaVA's first training stage, projector alignment (Liu et al. 2023, "feature alignment"), on a LLaVA checkpoint:
/// the vision tower and the language model stay frozen and only the multimodal projector learns, from image–text
/// examples scored by the language model on their answer tokens, as transformers computes
/// `model(input_ids, pixel_values, attention_mask, labels=labels).loss` with every other parameter frozen and
/// `Trainer` steps it. The vision features the projector reads never change, so each image is encoded once.
///
/// The language model's gradient flows back to the projector's output through its frozen layers (inputs only, no
/// weight gradients), so its weights are held a second time here, in fp32 and unpacked, beside the inference model's.
public final class ProjectorAlignment: @unchecked Sendable {
    public let directory: ModelDirectory
    public let config: LlavaConfig
    /// The frozen model the vision features and the rotary tables come from.
    public let frozen: LlavaForConditionalGeneration
    /// `linear_1` and `linear_2` of the projector, under the checkpoint's own names.
    public let parameters: [Parameter]
    private let store: WeightStore
    private let projectorPrefix: String
    private let languageModel: FrozenDecoder
    private let activation: Activation

    /// Loads a checkpoint directory of `model_type` `llava` (a Llama, Mistral or Qwen2 language model).
    public init(directory: ModelDirectory) throws {
        self.directory = directory
        let file = directory.url.appendingPathComponent("config.json").path
        frozen = try MatrixPrecision.$forNewLayers.withValue(.float32) { try LlavaForConditionalGeneration(directory: directory) }
        config = frozen.config
        store = try WeightStore(directory: directory.url)
        let weights = Weights(store)
        projectorPrefix = weights.scoped(firstOf: ["multi_modal_projector", "model.multi_modal_projector"], holding: "linear_1.weight").prefix
        let names = ["linear_1.weight", "linear_2.weight"] + (config.multimodalProjectorBias ? ["linear_1.bias", "linear_2.bias"] : [])
        let store = self.store, prefix = projectorPrefix
        parameters = try names.map { name in
            try Parameter(name: prefix + "." + name, value: store.tensor(prefix + "." + name), decays: !name.hasSuffix("bias"))
        }
        activation = try Activation(huggingFaceName: config.projectorHiddenAct, file: file)
        languageModel = try FrozenDecoder(config: config.textConfig, weights: weights, file: file)
    }

    /// The frozen vision tower's features for the projector, per image `[tokens per image, features]`, from pixel values
    /// `[N, 3, S, S]`.
    public func visionFeatures(pixelValues: Tensor) throws -> Tensor {
        try frozen.visionFeatures(pixelValues: pixelValues)
    }

    /// The language model's loss on `labels` (-100 where nothing is scored; transformers shifts them by one) for
    /// prompts holding their images' tokens, with the projector's parameters' gradients set for the optimizer.
    ///
    /// - Parameters:
    ///   - visionFeatures: `[images, tokens per image, features]` from ``visionFeatures(pixelValues:)``, the images of
    ///     the rows in order.
    ///   - inputIds: token sequences of one length, right-padded.
    ///   - attentionMask: their padding mask (nil: no padding).
    public func lossAndGradients(visionFeatures: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]]) throws -> Float {
        try loss(visionFeatures: visionFeatures, inputIds: inputIds, attentionMask: attentionMask, labels: labels, settingGradients: true)
    }

    /// The loss as ``lossAndGradients(visionFeatures:inputIds:attentionMask:labels:)`` computes it, without the
    /// backward pass.
    public func loss(visionFeatures: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]]) throws -> Float {
        try loss(visionFeatures: visionFeatures, inputIds: inputIds, attentionMask: attentionMask, labels: labels, settingGradients: false)
    }

    private func loss(visionFeatures: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]],
                      settingGradients: Bool) throws -> Float {
        let (batch, length) = (inputIds.count, inputIds.first?.count ?? 0)
        guard batch > 0, length > 0, inputIds.allSatisfy({ $0.count == length }),
              labels.count == batch, labels.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("projector alignment needs token ids and labels of one length per row")
        }
        let width = config.textConfig.hiddenSize
        let features = visionFeatures.reshaped([-1, visionFeatures.shape.last ?? 0])
        func value(_ name: String) -> Tensor { parameters.first { $0.name == projectorPrefix + "." + name }!.value }
        let bias = config.multimodalProjectorBias

        // Forward: the projector, the image rows in their tokens' places, the frozen language model.
        let hidden = linear(features, weight: value("linear_1.weight"), bias: bias ? value("linear_1.bias") : nil)
        let activated = VLMTensor.activation(hidden, activation)
        let projected = linear(activated, weight: value("linear_2.weight"), bias: bias ? value("linear_2.bias") : nil)
        let embeddings = try frozen.inputsEmbeds(inputIds: inputIds, imageEmbeddings: projected.reshaped([-1, features.shape[0], width]))
        let imageRows = inputIds.enumerated().flatMap { row, ids in
            ids.indices.filter { ids[$0] == config.imageTokenIndex }.map { row * length + $0 }
        }
        let pass = try languageModel.forward(embeddings, attentionMask: attentionMask, rotary: frozen.languageModel.rotaryTables(positions: Array(0..<length)))
        let (loss, logitsGradient) = try causalLanguageModelLossGradient(logits: pass.logits, labels: labels)
        guard settingGradients else { return loss }

        // Backward to the projector's output rows, then through the projector.
        let embeddingGradient = languageModel.backward(logitsGradient, through: pass)
        let projectedGradient = gatherRows(embeddingGradient, imageRows)
        let second = linearBackward(projectedGradient, input: activated, weight: value("linear_2.weight"))
        let first = linearBackward(activationBackward(second.input, input: hidden, activation), input: features,
                                   weight: value("linear_1.weight"))
        let gradients = ["linear_1.weight": first.weight, "linear_2.weight": second.weight,
                         "linear_1.bias": first.bias, "linear_2.bias": second.bias]
        for parameter in parameters {
            parameter.gradient = gradients[String(parameter.name.dropFirst(projectorPrefix.count + 1))]
        }
        return loss
    }

    /// Rows `rows` of `x` read as rows of its last dimension, in that order.
    private func gatherRows(_ x: Tensor, _ rows: [Int]) -> Tensor {
        embedding(x.reshaped([-1, x.shape.last ?? 0]), ids: rows)
    }

    /// Writes the aligned checkpoint to `output` as ``LockedImageTextTuning/save(to:)`` writes one: every tensor of
    /// the original in fp32 with the projector's replaced, config.json with `dtype` float32, the processor files.
    public func save(to output: URL) throws {
        try writeCheckpoint(from: directory, store: store, replacing: Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.value) }),
                            to: output)
    }
}

/// A Llama-family decoder whose weights do not change (read once, fp32, unpacked), run forward keeping what its
/// backward pass reads, and backward for the gradient of its input embeddings only.
private struct FrozenDecoder {
    struct Layer {
        let inputNorm, postAttentionNorm: Tensor
        let query, key, value, output: (weight: Tensor, bias: Tensor?)
        let gate, up, down: (weight: Tensor, bias: Tensor?)
    }

    let config: LlamaConfig
    let layers: [Layer]
    let norm: Tensor
    let head: Tensor
    let activation: Activation

    init(config: LlamaConfig, weights: Weights, file: String) throws {
        self.config = config
        let decoder = weights.scoped(firstOf: ["language_model.model", "model.language_model"], holding: "embed_tokens.weight")
        let (d, heads, keyHeads, headDim, mlp) = (config.hiddenSize, config.numAttentionHeads, config.numKeyValueHeads,
                                                  config.headDim, config.intermediateSize)
        layers = try (0..<config.numHiddenLayers).map { index in
            if config.attentionWindow(layer: index) != nil {
                throw ModelError.invalidConfig("projector alignment does not run sliding-window attention (layer \(index))", file: file)
            }
            let layer = decoder.scoped("layers.\(index)")
            func projection(_ name: String, out: Int, in width: Int, bias: Bool) throws -> (weight: Tensor, bias: Tensor?) {
                (try layer(name + ".weight", shape: [out, width]), bias ? try layer(name + ".bias", shape: [out]) : nil)
            }
            return Layer(
                inputNorm: try layer("input_layernorm.weight", shape: [d]),
                postAttentionNorm: try layer("post_attention_layernorm.weight", shape: [d]),
                query: try projection("self_attn.q_proj", out: heads * headDim, in: d, bias: config.attentionBias),
                key: try projection("self_attn.k_proj", out: keyHeads * headDim, in: d, bias: config.attentionBias),
                value: try projection("self_attn.v_proj", out: keyHeads * headDim, in: d, bias: config.attentionBias),
                output: try projection("self_attn.o_proj", out: d, in: heads * headDim, bias: config.outputProjectionBias),
                gate: try projection("mlp.gate_proj", out: mlp, in: d, bias: config.mlpBias),
                up: try projection("mlp.up_proj", out: mlp, in: d, bias: config.mlpBias),
                down: try projection("mlp.down_proj", out: d, in: mlp, bias: config.mlpBias))
        }
        norm = try decoder("norm.weight", shape: [d])
        let headName = weights.contains("language_model.lm_head.weight") ? "language_model.lm_head.weight" : "lm_head.weight"
        head = config.tieWordEmbeddings ? try decoder("embed_tokens.weight", shape: [config.vocabSize, d])
                                        : try weights(headName, shape: [config.vocabSize, d])
        activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
    }

    struct LayerActivations {
        let input, normed1, query, key, value: Tensor
        let attention: AttentionForTraining
        let afterAttention, normed2, gate, activated, up: Tensor
    }

    struct Pass {
        let layers: [LayerActivations]
        let last: Tensor
        let normed: Tensor
        let logits: Tensor
        let rotary: (cos: Tensor, sin: Tensor)
    }

    func forward(_ embeddings: Tensor, attentionMask: [[Int]]?, rotary: (cos: Tensor, sin: Tensor)) -> Pass {
        let (batch, length) = (embeddings.shape[0], embeddings.shape[1])
        let (heads, keyHeads) = (config.numAttentionHeads, config.numKeyValueHeads)
        // The rows' tables: positions 0..<T for every row (right padding).
        let cos = Tensor(shape: [batch * length, rotary.cos.shape[1]], scalars: Array((0..<batch).map { _ in rotary.cos.scalars }.joined()))
        let sin = Tensor(shape: [batch * length, rotary.sin.shape[1]], scalars: Array((0..<batch).map { _ in rotary.sin.scalars }.joined()))
        let mask = attentionMask.map { Tensor(shape: [batch, length], scalars: $0.flatMap { $0.map(Float.init) }) }
        var hidden = embeddings
        var activations: [LayerActivations] = []
        for layer in layers {
            let normed1 = rmsNorm(hidden, weight: layer.inputNorm, eps: config.rmsNormEps)
            let query = applyRotaryEmbedding(linear(normed1, weight: layer.query.weight, bias: layer.query.bias), heads: heads, cos: cos, sin: sin)
            let key = applyRotaryEmbedding(linear(normed1, weight: layer.key.weight, bias: layer.key.bias), heads: keyHeads, cos: cos, sin: sin)
            let value = linear(normed1, weight: layer.value.weight, bias: layer.value.bias)
            let attention = attentionForTraining(query: query, key: repeatingKeyValueHeads(key, keyHeads: keyHeads, heads: heads),
                                                 value: repeatingKeyValueHeads(value, keyHeads: keyHeads, heads: heads),
                                                 heads: heads, causal: true, keyPaddingMask: mask)
            let afterAttention = add(hidden, linear(attention.output, weight: layer.output.weight, bias: layer.output.bias))
            let normed2 = rmsNorm(afterAttention, weight: layer.postAttentionNorm, eps: config.rmsNormEps)
            let gate = linear(normed2, weight: layer.gate.weight, bias: layer.gate.bias)
            let activated = VLMTensor.activation(gate, activation)
            let up = linear(normed2, weight: layer.up.weight, bias: layer.up.bias)
            activations.append(LayerActivations(input: hidden, normed1: normed1, query: query, key: key, value: value,
                                                attention: attention, afterAttention: afterAttention, normed2: normed2,
                                                gate: gate, activated: activated, up: up))
            hidden = add(afterAttention, linear(multiply(activated, up), weight: layer.down.weight, bias: layer.down.bias))
        }
        let normed = rmsNorm(hidden, weight: norm, eps: config.rmsNormEps)
        return Pass(layers: activations, last: hidden, normed: normed, logits: linear(normed, weight: head, bias: nil),
                    rotary: (cos, sin))
    }

    /// The gradient of the loss with respect to the input embeddings, from the gradient of the logits.
    func backward(_ logitsGradient: Tensor, through pass: Pass) -> Tensor {
        let (heads, keyHeads) = (config.numAttentionHeads, config.numKeyValueHeads)
        let normedGradient = matmul(logitsGradient.reshaped([-1, head.shape[0]]), head).reshaped(pass.normed.shape)
        var hiddenGradient = rmsNormBackward(normedGradient, input: pass.last, weight: norm, eps: config.rmsNormEps)
        for (layer, saved) in zip(layers, pass.layers).reversed() {
            // The MLP: down(act(gate) · up).
            let productGradient = inputGradient(hiddenGradient, layer.down.weight)
            let gateGradient = activationBackward(multiply(productGradient, saved.up), input: saved.gate, activation)
            let upGradient = multiply(productGradient, saved.activated)
            let normed2Gradient = add(inputGradient(gateGradient, layer.gate.weight), inputGradient(upGradient, layer.up.weight))
            let residualGradient = add(hiddenGradient, rmsNormBackward(normed2Gradient, input: saved.afterAttention,
                                                                       weight: layer.postAttentionNorm, eps: config.rmsNormEps))
            // Attention over the rotated queries and keys, the key heads repeated for their query heads.
            let attention = attentionBackward(inputGradient(residualGradient, layer.output.weight), query: saved.query,
                                              key: repeatingKeyValueHeads(saved.key, keyHeads: keyHeads, heads: heads),
                                              value: repeatingKeyValueHeads(saved.value, keyHeads: keyHeads, heads: heads),
                                              probabilities: saved.attention.probabilities, heads: heads)
            let queryGradient = applyRotaryEmbeddingBackward(attention.query, heads: heads, cos: pass.rotary.cos, sin: pass.rotary.sin)
            let keyGradient = applyRotaryEmbeddingBackward(repeatingKeyValueHeadsBackward(attention.key, keyHeads: keyHeads, heads: heads),
                                                           heads: keyHeads, cos: pass.rotary.cos, sin: pass.rotary.sin)
            let valueGradient = repeatingKeyValueHeadsBackward(attention.value, keyHeads: keyHeads, heads: heads)
            let normed1Gradient = add(add(inputGradient(queryGradient, layer.query.weight), inputGradient(keyGradient, layer.key.weight)),
                                      inputGradient(valueGradient, layer.value.weight))
            hiddenGradient = add(residualGradient, rmsNormBackward(normed1Gradient, input: saved.input, weight: layer.inputNorm,
                                                                   eps: config.rmsNormEps))
        }
        return hiddenGradient
    }

    /// `dY·W` for a frozen `y = x·Wᵀ (+ b)`, shaped like `x` with `W`'s input width.
    private func inputGradient(_ outputGradient: Tensor, _ weight: Tensor) -> Tensor {
        let shape = Array(outputGradient.shape.dropLast()) + [weight.shape[1]]
        return matmul(outputGradient.reshaped([-1, weight.shape[0]]), weight).reshaped(shape)
    }
}
