import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

/// Locked-image text tuning (LiT, Zhai et al. 2022) of a CLIP, SigLIP or SigLIP 2 checkpoint: the image tower (and
/// CLIP's image projection) stays as it is, and the text transformer, its projection and the temperature
/// (`logit_scale`; SigLIP's `logit_bias` too) learn to place each text where its image already is, by the model's own
/// contrastive loss over batches of pairs (CLIP's softmax loss, SigLIP's sigmoid loss, as SigLiT trains): what a
/// transformers user gets from `model(..., return_loss=True)` with `vision_model` frozen, trained by `Trainer`. The
/// image embeddings never change, so each image is encoded once.
public final class LockedImageTextTuning: @unchecked Sendable {
    public let directory: ModelDirectory
    /// The frozen model the image embeddings come from.
    public let frozen: any ImageTextDualEncoder
    /// The text side's parameters under their Hugging Face names: `text_model.*` and `logit_scale`, with CLIP's
    /// `text_projection.weight` or SigLIP's `logit_bias`.
    public let parameters: [Parameter]
    private let text: TextSide
    private let store: WeightStore
    private let byName: [String: Parameter]
    /// The token embedding table's gradient (vocabulary × width, 100 MB for CLIP), written over each step.
    private let tokenEmbeddingGradient: Tensor

    /// Loads a checkpoint directory of `model_type` `clip`, `siglip` or `siglip2`.
    public init(directory: ModelDirectory) throws {
        self.directory = directory
        let configFile = directory.url.appendingPathComponent("config.json").path
        text = try TextSide(directory, file: configFile)
        store = try WeightStore(directory: directory.url)
        frozen = try MatrixPrecision.$forNewLayers.withValue(.float32) { try ModelRegistry.dualEncoder(directory, for: .embed) }
        let names = store.names.filter { $0.hasPrefix("text_model.") } + text.parametersOutsideTextModel
        let store = self.store
        parameters = try names.map { name in
            // Trainer's get_decay_parameter_names: no decay for parameters named like biases and for LayerNorm
            // parameters (all named `…layer_norm…` in these families).
            try Parameter(name: name, value: store.tensor(name), decays: !(name.contains("bias") || name.contains("layer_norm")))
        }
        byName = Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0) })
        tokenEmbeddingGradient = Tensor(zeros: [text.vocabSize, text.hiddenSize])
    }

    /// The frozen image tower's projected embeddings of the image processor's output (`get_image_features`),
    /// computed once per image.
    public func imageFeatures(_ images: ProcessedImages) throws -> Tensor {
        try frozen.imageFeatures(images)
    }

    /// The contrastive loss of the pairs (image `i`'s embedding, text `i`) under the current parameters, with every
    /// parameter's gradient set for the optimizer.
    ///
    /// - Parameters:
    ///   - imageFeatures: `[N, projection_dim]` from ``imageFeatures(pixelValues:)``.
    ///   - inputIds: N token sequences of one length, as the tokenizer pads them.
    ///   - attentionMask: their padding mask (nil: no padding).
    public func lossAndGradients(imageFeatures: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Float {
        try loss(imageFeatures: imageFeatures, inputIds: inputIds, attentionMask: attentionMask, settingGradients: true)
    }

    /// The contrastive loss of the pairs under the current parameters, as ``lossAndGradients(imageFeatures:inputIds:attentionMask:)``
    /// computes it, without the backward pass (an evaluation's loss).
    public func loss(imageFeatures: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Float {
        try loss(imageFeatures: imageFeatures, inputIds: inputIds, attentionMask: attentionMask, settingGradients: false)
    }

    private func loss(imageFeatures: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?, settingGradients: Bool) throws -> Float {
        let (batch, length, width) = (inputIds.count, inputIds.first?.count ?? 0, text.hiddenSize)
        guard batch > 0, imageFeatures.shape == [batch, frozen.embeddingSize] else {
            throw ModelError.invalidInput("a contrastive loss needs pairs, one image embedding [\(frozen.embeddingSize)] per text: got \(batch) texts and image features \(imageFeatures.shape)")
        }
        guard length > 0, length <= text.maxPositions, inputIds.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("texts must be padded to one length of 1...\(text.maxPositions) tokens")
        }
        let ids = inputIds.flatMap { $0 }
        if let bad = ids.first(where: { $0 < 0 || $0 >= text.vocabSize }) {
            throw ModelError.invalidInput("token id \(bad) is outside the vocabulary of \(text.vocabSize)")
        }
        if let attentionMask, attentionMask.count != batch || attentionMask.contains(where: { $0.count != length }) {
            throw ModelError.invalidInput("attention mask is not [\(batch), \(length)] like the token ids")
        }
        let mask = attentionMask.map { Tensor(shape: [batch, length], scalars: $0.flatMap { $0.map(Float.init) }) }
        var gradients: [String: Tensor] = [:]

        // Forward, keeping what the backward pass reads.
        let positions = Array(0..<length)
        var hidden = add(embedding(value("text_model.embeddings.token_embedding.weight"), ids: ids).reshaped([batch, length, width]),
                         embedding(value("text_model.embeddings.position_embedding.weight"), ids: positions))
        var layers: [LayerActivations] = []
        for index in 0..<text.layers {
            let layer = forward(hidden, layer: "text_model.encoder.layers.\(index).", mask: mask)
            layers.append(layer)
            hidden = layer.output
        }
        let pooledPositions = inputIds.map(text.pooledPosition)
        let pooled = gatherTokens(hidden, positions: pooledPositions)
        let finalNorm = "text_model.final_layer_norm."
        let normed = layerNorm(pooled, weight: value(finalNorm + "weight"), bias: value(finalNorm + "bias"), eps: text.eps)
        let projection = text.projection
        let textEmbeddings = linear(normed, weight: value(projection + ".weight"),
                                    bias: text.projectionHasBias ? value(projection + ".bias") : nil)
        let (images, texts) = (l2Normalized(imageFeatures), l2Normalized(textEmbeddings))
        let scale = Float(exp(Double(value("logit_scale").scalars[0])))
        let similarities = matmul(images, texts, transposeB: true)
        let bias = text.sigmoidLoss ? value("logit_bias").scalars[0] : 0
        let logitsPerImage = Tensor(shape: similarities.shape, scalars: similarities.scalars.map { $0 * scale + bias })
        let (loss, logitsGradient) = text.sigmoidLoss ? try sigmoidContrastiveLossGradient(logitsPerImage: logitsPerImage)
                                                      : try clipContrastiveLossGradient(logitsPerImage: logitsPerImage)
        guard settingGradients else { return loss }

        // Backward. L = e^s·S (+ b): dL/ds = Σ dL ⊙ e^s·S, dL/db = Σ dL.
        let scaleGradient = zip(logitsGradient.scalars, similarities.scalars).reduce(Float(0)) { $0 + $1.0 * $1.1 * scale }
        gradients["logit_scale"] = Tensor(shape: value("logit_scale").shape, scalars: [scaleGradient])
        if text.sigmoidLoss {
            gradients["logit_bias"] = Tensor(shape: value("logit_bias").shape, scalars: [logitsGradient.scalars.reduce(0, +)])
        }
        let similarityGradient = scaled(logitsGradient, by: scale)
        let embeddingGradient = l2NormalizedBackward(matmul(similarityGradient, images, transposeA: true), input: textEmbeddings)
        let projected = linearBackward(embeddingGradient, input: normed, weight: value(projection + ".weight"))
        gradients[projection + ".weight"] = projected.weight
        if text.projectionHasBias { gradients[projection + ".bias"] = projected.bias }
        let norm = layerNormBackward(projected.input, input: pooled, weight: value(finalNorm + "weight"), eps: text.eps)
        gradients[finalNorm + "weight"] = norm.weight
        gradients[finalNorm + "bias"] = norm.bias
        let pooledRows = pooledPositions.enumerated().map { $0.offset * length + $0.element }
        var hiddenGradient = replacingRows(of: Tensor(zeros: [batch, length, width]), at: pooledRows, with: norm.input)
        for (index, layer) in layers.enumerated().reversed() {
            hiddenGradient = backward(hiddenGradient, through: layer, layer: "text_model.encoder.layers.\(index).",
                                      into: &gradients)
        }
        let embeddings = "text_model.embeddings."
        embeddingBackward(hiddenGradient, ids: ids, into: tokenEmbeddingGradient)
        gradients[embeddings + "token_embedding.weight"] = tokenEmbeddingGradient
        gradients[embeddings + "position_embedding.weight"] = embeddingBackward(
            hiddenGradient, ids: Array(repeating: positions, count: batch).flatMap { $0 }, rows: text.maxPositions)

        for parameter in parameters { parameter.gradient = gradients[parameter.name] }
        return loss
    }

    /// Writes the tuned checkpoint to `output` (created if needed): the original config.json (its `dtype` now
    /// float32), every tensor of the original with the text side's replaced (all fp32, in one model.safetensors), and
    /// the tokenizer and preprocessor files copied, so that transformers, `vlm classify` and this class load it.
    public func save(to output: URL) throws {
        try writeCheckpoint(from: directory, store: store, replacing: Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.value) }),
                            to: output)
    }

    private func value(_ name: String) -> Tensor { byName[name]!.value }

    /// What one encoder layer's backward pass reads from its forward pass.
    private struct LayerActivations {
        let input: Tensor
        let normed1: Tensor
        let query: Tensor, key: Tensor, value: Tensor
        let attention: AttentionForTraining
        let afterAttention: Tensor
        let normed2: Tensor
        let hidden: Tensor
        let activated: Tensor
        let output: Tensor
    }

    /// `CLIPEncoderLayer` (`SiglipEncoderLayer`): pre-norm self-attention (CLIP's causal) and MLP, each added to the
    /// residual stream.
    private func forward(_ x: Tensor, layer prefix: String, mask: Tensor?) -> LayerActivations {
        let eps = text.eps
        func project(_ name: String, _ input: Tensor) -> Tensor {
            linear(input, weight: value(prefix + name + ".weight"), bias: value(prefix + name + ".bias"))
        }
        let normed1 = layerNorm(x, weight: value(prefix + "layer_norm1.weight"), bias: value(prefix + "layer_norm1.bias"), eps: eps)
        let (query, key, values) = (project("self_attn.q_proj", normed1), project("self_attn.k_proj", normed1),
                                    project("self_attn.v_proj", normed1))
        let attention = attentionForTraining(query: query, key: key, value: values, heads: text.heads,
                                             causal: text.causal, keyPaddingMask: mask)
        let afterAttention = add(x, project("self_attn.out_proj", attention.output))
        let normed2 = layerNorm(afterAttention, weight: value(prefix + "layer_norm2.weight"),
                                bias: value(prefix + "layer_norm2.bias"), eps: eps)
        let hidden = project("mlp.fc1", normed2)
        let activated = VLMTensor.activation(hidden, text.activation)
        return LayerActivations(input: x, normed1: normed1, query: query, key: key, value: values, attention: attention,
                                afterAttention: afterAttention, normed2: normed2, hidden: hidden, activated: activated,
                                output: add(afterAttention, project("mlp.fc2", activated)))
    }

    /// The gradient of one layer's input from its output's, adding its parameters' gradients to `gradients`.
    private func backward(_ outputGradient: Tensor, through layer: LayerActivations, layer prefix: String,
                          into gradients: inout [String: Tensor]) -> Tensor {
        let eps = text.eps
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
        let activatedGradient = linearGradient("mlp.fc2", outputGradient, input: layer.activated)
        let hiddenGradient = activationBackward(activatedGradient, input: layer.hidden, text.activation)
        let normed2Gradient = linearGradient("mlp.fc1", hiddenGradient, input: layer.normed2)
        let residualGradient = add(outputGradient, normGradient("layer_norm2", normed2Gradient, input: layer.afterAttention))
        let attentionOutputGradient = linearGradient("self_attn.out_proj", residualGradient, input: layer.attention.output)
        let attention = attentionBackward(attentionOutputGradient, query: layer.query, key: layer.key, value: layer.value,
                                          probabilities: layer.attention.probabilities,
                                          heads: text.heads)
        let normed1Gradient = add(add(linearGradient("self_attn.q_proj", attention.query, input: layer.normed1),
                                      linearGradient("self_attn.k_proj", attention.key, input: layer.normed1)),
                                  linearGradient("self_attn.v_proj", attention.value, input: layer.normed1))
        return add(residualGradient, normGradient("layer_norm1", normed1Gradient, input: layer.input))
    }
}

/// What differs between the text sides LiT trains, from the checkpoint's config: the text transformer's shape, how it
/// attends and pools, its projection, and the loss.
private struct TextSide {
    let vocabSize, hiddenSize, layers, heads, maxPositions: Int
    let eps: Float
    let activation: Activation
    /// CLIP's text transformer is causal; SigLIP's attends both ways.
    let causal: Bool
    /// CLIP pools at its end-of-text token, SigLIP at the last position (its texts all padded to one length).
    let pooledPosition: @Sendable ([Int]) -> Int
    /// CLIP's `text_projection` (no bias), SigLIP's `text_model.head`.
    let projection: String
    let projectionHasBias: Bool
    /// SigLIP's sigmoid loss with its `logit_bias`, or CLIP's softmax loss.
    let sigmoidLoss: Bool

    init(_ directory: ModelDirectory, file: String) throws {
        switch try directory.modelType {
        case "clip":
            let config = try directory.decode(CLIPConfig.self).textConfig
            (vocabSize, hiddenSize, layers, heads) = (config.vocabSize, config.hiddenSize, config.numHiddenLayers, config.numAttentionHeads)
            (maxPositions, eps) = (config.maxPositionEmbeddings, config.layerNormEps)
            activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
            (causal, pooledPosition) = (true, { config.pooledPosition($0) })
            (projection, projectionHasBias, sigmoidLoss) = ("text_projection", false, false)
        case "siglip", "siglip2":
            let config = try directory.modelType == "siglip" ? directory.decode(SiglipConfig.self).textConfig
                                                            : directory.decode(Siglip2Config.self).textConfig
            (vocabSize, hiddenSize, layers, heads) = (config.vocabSize, config.hiddenSize, config.numHiddenLayers, config.numAttentionHeads)
            (maxPositions, eps) = (config.maxPositionEmbeddings, config.layerNormEps)
            activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
            (causal, pooledPosition) = (false, { $0.count - 1 })
            (projection, projectionHasBias, sigmoidLoss) = ("text_model.head", true, true)
        case let other:
            throw ModelError.unsupportedModelType(other, supported: ["clip", "siglip", "siglip2"], file: file)
        }
        guard heads > 0, hiddenSize % heads == 0 else {
            throw ModelError.invalidConfig("text_config: hidden_size \(hiddenSize) is not a multiple of num_attention_heads \(heads)", file: file)
        }
    }

    /// The trained parameters that are not under `text_model.`.
    var parametersOutsideTextModel: [String] {
        (projection.hasPrefix("text_model.") ? [] : [projection + ".weight"]) + ["logit_scale"] + (sigmoidLoss ? ["logit_bias"] : [])
    }
}
