import VLMCheckpoint
import VLMModels
import VLMTensor

/// CLIP's or SigLIP's text transformer and its projection as contrastive training runs them: token and position
/// embeddings, the encoder (CLIP's causal), the final layer norm at the pooled position (CLIP: the end-of-text token;
/// SigLIP: the last position, its texts all padded to one length), then the projection (CLIP's `text_projection`
/// without bias, SigLIP's `text_model.head`).
struct TextTowerTraining {
    let vocabSize, hiddenSize, maxPositions: Int
    let eps: Float
    let encoder: EncoderTraining
    let pooledPosition: @Sendable ([Int]) -> Int
    let projection: String
    let projectionHasBias: Bool
    /// How the model's processor pads a batch of texts.
    let padding: DualEncoderTextPadding

    init(_ directory: ModelDirectory, file: String) throws {
        let (layers, heads, activation, causal): (Int, Int, Activation, Bool)
        switch try directory.modelType {
        case "clip":
            let config = try directory.decode(CLIPConfig.self).textConfig
            (vocabSize, hiddenSize, layers, heads) = (config.vocabSize, config.hiddenSize, config.numHiddenLayers, config.numAttentionHeads)
            (maxPositions, eps) = (config.maxPositionEmbeddings, config.layerNormEps)
            activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
            (causal, pooledPosition) = (true, { config.pooledPosition($0) })
            (projection, projectionHasBias, padding) = ("text_projection", false, .longest)
        case "siglip", "siglip2":
            let siglip = try directory.modelType == "siglip"
            let config = try siglip ? directory.decode(SiglipConfig.self).textConfig : directory.decode(Siglip2Config.self).textConfig
            (vocabSize, hiddenSize, layers, heads) = (config.vocabSize, config.hiddenSize, config.numHiddenLayers, config.numAttentionHeads)
            (maxPositions, eps) = (config.maxPositionEmbeddings, config.layerNormEps)
            activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
            (causal, pooledPosition) = (false, { $0.count - 1 })
            (projection, projectionHasBias) = ("text_model.head", true)
            padding = siglip ? .maxLength(zeroShotLength: SiglipModel.zeroShotTextLength) : .fixed(length: Siglip2Model.textLength)
        case let other:
            throw ModelError.unsupportedModelType(other, supported: ["clip", "siglip", "siglip2"], file: file)
        }
        guard heads > 0, hiddenSize % heads == 0 else {
            throw ModelError.invalidConfig("text_config: hidden_size \(hiddenSize) is not a multiple of num_attention_heads \(heads)", file: file)
        }
        encoder = EncoderTraining(prefix: "text_model.encoder.layers.", layers: layers, heads: heads, eps: eps,
                                  activation: activation, causal: causal)
    }

    /// What the backward pass reads from the forward pass.
    struct Activations {
        let ids: [Int]
        let batch, length: Int
        let layers: [EncoderTraining.LayerActivations]
        let pooledPositions: [Int]
        let pooled: Tensor
        let normed: Tensor
    }

    /// The padding mask `[B, T]` of texts checked to be padded to one length the tower takes, with ids in its
    /// vocabulary.
    func checkedMask(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor? {
        let (batch, length) = (inputIds.count, inputIds.first?.count ?? 0)
        guard length > 0, length <= maxPositions, inputIds.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("texts must be padded to one length of 1...\(maxPositions) tokens")
        }
        if let bad = inputIds.lazy.flatMap({ $0 }).first(where: { $0 < 0 || $0 >= vocabSize }) {
            throw ModelError.invalidInput("token id \(bad) is outside the vocabulary of \(vocabSize)")
        }
        if let attentionMask, attentionMask.count != batch || attentionMask.contains(where: { $0.count != length }) {
            throw ModelError.invalidInput("attention mask is not [\(batch), \(length)] like the token ids")
        }
        return attentionMask.map { Tensor(shape: [batch, length], scalars: $0.flatMap { $0.map(Float.init) }) }
    }

    /// The projected text embeddings `[B, projection]` (not normalized), keeping the encoder's activations when the
    /// tower learns.
    func forward(inputIds: [[Int]], mask: Tensor?, keepingLayers: Bool, weights value: (String) -> Tensor) -> (embeddings: Tensor, activations: Activations) {
        let (batch, length) = (inputIds.count, inputIds[0].count)
        let ids = inputIds.flatMap { $0 }
        let embedded = add(embedding(value("text_model.embeddings.token_embedding.weight"), ids: ids).reshaped([batch, length, hiddenSize]),
                           embedding(value("text_model.embeddings.position_embedding.weight"), ids: Array(0..<length)))
        let (hidden, layers) = encoder.forward(embedded, mask: mask, keeping: keepingLayers, weights: value)
        let pooledPositions = inputIds.map(pooledPosition)
        let pooled = gatherTokens(hidden, positions: pooledPositions)
        let normed = layerNorm(pooled, weight: value("text_model.final_layer_norm.weight"),
                               bias: value("text_model.final_layer_norm.bias"), eps: eps)
        let embeddings = linear(normed, weight: value(projection + ".weight"), bias: projectionHasBias ? value(projection + ".bias") : nil)
        return (embeddings, Activations(ids: ids, batch: batch, length: length, layers: layers, pooledPositions: pooledPositions,
                                        pooled: pooled, normed: normed))
    }

    /// Adds the gradients of the projection and, with a `tokenEmbeddingGradient` buffer (the tower learns), of every
    /// text-transformer parameter (the token embedding table's written into that buffer) to `gradients`, from the
    /// embeddings' gradient.
    func backward(_ embeddingGradient: Tensor, through activations: Activations, tokenEmbeddingGradient: Tensor?,
                  weights value: (String) -> Tensor, into gradients: inout [String: Tensor]) {
        let projected = linearBackward(embeddingGradient, input: activations.normed, weight: value(projection + ".weight"))
        gradients[projection + ".weight"] = projected.weight
        if projectionHasBias { gradients[projection + ".bias"] = projected.bias }
        guard let tokenEmbeddingGradient else { return }
        let finalNorm = "text_model.final_layer_norm."
        let norm = layerNormBackward(projected.input, input: activations.pooled, weight: value(finalNorm + "weight"), eps: eps)
        gradients[finalNorm + "weight"] = norm.weight
        gradients[finalNorm + "bias"] = norm.bias
        let (batch, length) = (activations.batch, activations.length)
        let pooledRows = activations.pooledPositions.enumerated().map { $0.offset * length + $0.element }
        let hiddenGradient = encoder.backward(replacingRows(of: Tensor(zeros: [batch, length, hiddenSize]), at: pooledRows, with: norm.input),
                                              through: activations.layers, weights: value, into: &gradients)
        let embeddings = "text_model.embeddings."
        embeddingBackward(hiddenGradient, ids: activations.ids, into: tokenEmbeddingGradient)
        gradients[embeddings + "token_embedding.weight"] = tokenEmbeddingGradient
        gradients[embeddings + "position_embedding.weight"] = embeddingBackward(
            hiddenGradient, ids: Array(repeating: Array(0..<length), count: batch).flatMap { $0 }, rows: maxPositions)
    }
}
