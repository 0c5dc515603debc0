import Foundation
import VLMCheckpoint
import VLMModels
import VLMTemplates
import VLMTensor

/// Locked-image text tuning (LiT, Zhai et al. 2022) of a CLIP checkpoint: the image tower and its projection stay
/// as they are, and the text transformer, the text projection and the temperature (`logit_scale`) learn to place
/// each text where its image already is, by CLIP's contrastive loss over batches of pairs: what a transformers user
/// gets from `CLIPModel(..., return_loss=True)` with `vision_model` and `visual_projection` frozen, trained by
/// `Trainer`. The image embeddings never change, so each image is encoded once.
public final class LockedImageTextTuning: @unchecked Sendable {
    public let directory: ModelDirectory
    public let config: CLIPConfig
    /// The frozen model the image embeddings come from.
    public let frozen: CLIPModel
    /// The text side's parameters under their Hugging Face names: `text_model.*`, `text_projection.weight` and
    /// `logit_scale`.
    public let parameters: [Parameter]
    private let store: WeightStore
    private let byName: [String: Parameter]
    private let activation: Activation
    /// The token embedding table's gradient (vocabulary × width, 100 MB for CLIP), written over each step.
    private let tokenEmbeddingGradient: Tensor

    /// Loads a CLIP checkpoint directory (`model_type` `clip`).
    public init(directory: ModelDirectory) throws {
        self.directory = directory
        let configFile = directory.url.appendingPathComponent("config.json").path
        guard try directory.modelType == "clip" else {
            throw ModelError.unsupportedModelType(try directory.modelType, supported: ["clip"], file: configFile)
        }
        config = try directory.decode(CLIPConfig.self)
        store = try WeightStore(directory: directory.url)
        frozen = try CLIPModel(config: config, weights: Weights(store), file: configFile)
        activation = try Activation(huggingFaceName: config.textConfig.hiddenAct, file: configFile)
        let names = store.names.filter { $0.hasPrefix("text_model.") } + ["text_projection.weight", "logit_scale"]
        let store = self.store
        parameters = try names.map { name in
            // Trainer's get_decay_parameter_names: no decay for biases and LayerNorm parameters.
            let decays = !(name.hasSuffix(".bias") || name.contains("layer_norm"))
            return try Parameter(name: name, value: store.tensor(name), decays: decays)
        }
        byName = Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0) })
        tokenEmbeddingGradient = Tensor(zeros: [config.textConfig.vocabSize, config.textConfig.hiddenSize])
    }

    /// The frozen image tower's projected embeddings of `pixelValues` (`get_image_features`), computed once per image.
    public func imageFeatures(pixelValues: Tensor) throws -> Tensor {
        try frozen.imageFeatures(pixelValues: pixelValues)
    }

    /// The contrastive loss of the pairs (image `i`'s embedding, text `i`) under the current parameters, with every
    /// parameter's gradient set for the optimizer.
    ///
    /// - Parameters:
    ///   - imageFeatures: `[N, projection_dim]` from ``imageFeatures(pixelValues:)``.
    ///   - inputIds: N token sequences of one length, as the tokenizer pads them.
    ///   - attentionMask: their padding mask (nil: no padding).
    public func lossAndGradients(imageFeatures: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Float {
        let textConfig = config.textConfig
        let (batch, length, width) = (inputIds.count, inputIds.first?.count ?? 0, textConfig.hiddenSize)
        guard batch > 0, imageFeatures.shape == [batch, config.projectionDim] else {
            throw ModelError.invalidInput("a contrastive loss needs pairs, one image embedding [\(config.projectionDim)] per text: got \(batch) texts and image features \(imageFeatures.shape)")
        }
        guard length > 0, length <= textConfig.maxPositionEmbeddings, inputIds.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("texts must be padded to one length of 1...\(textConfig.maxPositionEmbeddings) tokens")
        }
        let ids = inputIds.flatMap { $0 }
        if let bad = ids.first(where: { $0 < 0 || $0 >= textConfig.vocabSize }) {
            throw ModelError.invalidInput("token id \(bad) is outside the vocabulary of \(textConfig.vocabSize)")
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
        for index in 0..<textConfig.numHiddenLayers {
            let layer = forward(hidden, layer: "text_model.encoder.layers.\(index).", mask: mask)
            layers.append(layer)
            hidden = layer.output
        }
        let pooledRows = inputIds.enumerated().map { $0.offset * length + textConfig.pooledPosition($0.element) }
        let pooled = gatherTokens(hidden, positions: inputIds.map(textConfig.pooledPosition))
        let finalNorm = "text_model.final_layer_norm."
        let normed = layerNorm(pooled, weight: value(finalNorm + "weight"), bias: value(finalNorm + "bias"), eps: textConfig.layerNormEps)
        let textEmbeddings = linear(normed, weight: value("text_projection.weight"), bias: nil)
        let (images, texts) = (l2Normalized(imageFeatures), l2Normalized(textEmbeddings))
        let scale = Float(exp(Double(value("logit_scale").scalars[0])))
        let logitsPerImage = scaled(matmul(images, texts, transposeB: true), by: scale)
        let (loss, logitsGradient) = try clipContrastiveLossGradient(logitsPerImage: logitsPerImage)

        // Backward. d(logit_scale) = Σ dL ⊙ L, since L = e^s·S.
        let scaleGradient = zip(logitsGradient.scalars, logitsPerImage.scalars).reduce(Float(0)) { $0 + $1.0 * $1.1 }
        gradients["logit_scale"] = Tensor(shape: value("logit_scale").shape, scalars: [scaleGradient])
        let similarityGradient = scaled(logitsGradient, by: scale)
        let embeddingGradient = l2NormalizedBackward(matmul(similarityGradient, images, transposeA: true), input: textEmbeddings)
        let projection = linearBackward(embeddingGradient, input: normed, weight: value("text_projection.weight"))
        gradients["text_projection.weight"] = projection.weight
        let norm = layerNormBackward(projection.input, input: pooled, weight: value(finalNorm + "weight"), eps: textConfig.layerNormEps)
        gradients[finalNorm + "weight"] = norm.weight
        gradients[finalNorm + "bias"] = norm.bias
        var hiddenGradient = replacingRows(of: Tensor(zeros: [batch, length, width]), at: pooledRows, with: norm.input)
        for (index, layer) in layers.enumerated().reversed() {
            hiddenGradient = backward(hiddenGradient, through: layer, layer: "text_model.encoder.layers.\(index).",
                                      into: &gradients)
        }
        let embeddings = "text_model.embeddings."
        embeddingBackward(hiddenGradient, ids: ids, into: tokenEmbeddingGradient)
        gradients[embeddings + "token_embedding.weight"] = tokenEmbeddingGradient
        gradients[embeddings + "position_embedding.weight"] = embeddingBackward(
            hiddenGradient, ids: Array(repeating: positions, count: batch).flatMap { $0 }, rows: textConfig.maxPositionEmbeddings)

        for parameter in parameters { parameter.gradient = gradients[parameter.name] }
        return loss
    }

    /// Writes the tuned checkpoint to `output` (created if needed): the original config.json (its `dtype` now
    /// float32), every tensor of the original with the text side's replaced (all fp32, in one model.safetensors), and
    /// the tokenizer and preprocessor files copied, so that transformers, `vlm classify` and this class load it.
    public func save(to output: URL) throws {
        do {
            try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
        } catch {
            throw CheckpointError.unwritable(path: output.path, reason: error.localizedDescription)
        }
        var tensors: [String: Tensor] = [:]
        for name in store.names {
            tensors[name] = try byName[name]?.value ?? store.tensor(name)
        }
        try SafetensorsFile.write(tensors, to: output.appendingPathComponent(WeightStore.singleFileName))
        // config.json as transformers' save_pretrained writes it, its dtype now the weights' (every member else kept:
        // a float stays a float, which its strict config classes insist on).
        let configURL = directory.url.appendingPathComponent("config.json")
        guard case let .object(members) = try JSONValue(parsing: Data(contentsOf: configURL), file: configURL.path) else {
            throw CheckpointError.invalidJSON(file: configURL.path, reason: "not an object")
        }
        let config = JSONValue.object(members.filter { $0.0 != "dtype" && $0.0 != "torch_dtype" } + [("dtype", "float32")])
        let configData = Data((config.pythonJSONText(indent: 2, sortKeys: true) + "\n").utf8)
        let copied = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                      "preprocessor_config.json", "processor_config.json"]
        do {
            try configData.write(to: output.appendingPathComponent("config.json"), options: .atomic)
            for name in copied {
                guard let source = directory.fileURL(name) else { continue }
                let destination = output.appendingPathComponent(name)
                if source.standardizedFileURL == destination.standardizedFileURL { continue }
                try? FileManager.default.removeItem(at: destination)
                try FileManager.default.copyItem(at: source, to: destination)
            }
        } catch {
            throw CheckpointError.unwritable(path: output.path, reason: error.localizedDescription)
        }
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

    /// `CLIPEncoderLayer`: pre-norm causal self-attention and MLP, each added to the residual stream.
    private func forward(_ x: Tensor, layer prefix: String, mask: Tensor?) -> LayerActivations {
        let eps = config.textConfig.layerNormEps
        func project(_ name: String, _ input: Tensor) -> Tensor {
            linear(input, weight: value(prefix + name + ".weight"), bias: value(prefix + name + ".bias"))
        }
        let normed1 = layerNorm(x, weight: value(prefix + "layer_norm1.weight"), bias: value(prefix + "layer_norm1.bias"), eps: eps)
        let (query, key, values) = (project("self_attn.q_proj", normed1), project("self_attn.k_proj", normed1),
                                    project("self_attn.v_proj", normed1))
        let attention = attentionForTraining(query: query, key: key, value: values, heads: config.textConfig.numAttentionHeads,
                                             causal: true, keyPaddingMask: mask)
        let afterAttention = add(x, project("self_attn.out_proj", attention.output))
        let normed2 = layerNorm(afterAttention, weight: value(prefix + "layer_norm2.weight"),
                                bias: value(prefix + "layer_norm2.bias"), eps: eps)
        let hidden = project("mlp.fc1", normed2)
        let activated = VLMTensor.activation(hidden, activation)
        return LayerActivations(input: x, normed1: normed1, query: query, key: key, value: values, attention: attention,
                                afterAttention: afterAttention, normed2: normed2, hidden: hidden, activated: activated,
                                output: add(afterAttention, project("mlp.fc2", activated)))
    }

    /// The gradient of one layer's input from its output's, adding its parameters' gradients to `gradients`.
    private func backward(_ outputGradient: Tensor, through layer: LayerActivations, layer prefix: String,
                          into gradients: inout [String: Tensor]) -> Tensor {
        let eps = config.textConfig.layerNormEps
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
        let hiddenGradient = activationBackward(activatedGradient, input: layer.hidden, activation)
        let normed2Gradient = linearGradient("mlp.fc1", hiddenGradient, input: layer.normed2)
        let residualGradient = add(outputGradient, normGradient("layer_norm2", normed2Gradient, input: layer.afterAttention))
        let attentionOutputGradient = linearGradient("self_attn.out_proj", residualGradient, input: layer.attention.output)
        let attention = attentionBackward(attentionOutputGradient, query: layer.query, key: layer.key, value: layer.value,
                                          probabilities: layer.attention.probabilities,
                                          heads: config.textConfig.numAttentionHeads)
        let normed1Gradient = add(add(linearGradient("self_attn.q_proj", attention.query, input: layer.normed1),
                                      linearGradient("self_attn.k_proj", attention.key, input: layer.normed1)),
                                  linearGradient("self_attn.v_proj", attention.value, input: layer.normed1))
        return add(residualGradient, normGradient("layer_norm1", normed1Gradient, input: layer.input))
    }
}
