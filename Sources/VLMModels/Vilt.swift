import Foundation
import VLMCheckpoint
import VLMTensor

// ViLT (Kim et al. 2021) as transformers' models/vilt/modeling_vilt.py builds `ViltForQuestionAnswering`: one
// transformer reads the question's BERT-style token embeddings and the photo's patch embeddings side by side (no
// separate vision tower), and a classifier over the first token scores every answer of a fixed vocabulary.

/// transformers' `ViltConfig`, with its defaults (dandelin/vilt-b32's).
public struct ViltConfig: Decodable, Sendable {
    public var vocabSize: Int
    public var typeVocabSize: Int
    public var modalityTypeVocabSize: Int
    /// The longest question, in tokens, the text position embeddings cover.
    public var maxPositionEmbeddings: Int
    public var hiddenSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var intermediateSize: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// The side of the square the position embeddings were learned on; other sizes interpolate them.
    public var imageSize: Int
    public var patchSize: Int
    public var numChannels: Int
    public var qkvBias: Bool
    /// The answers, by classifier output (`id2label`; `LABEL_i` where it names none).
    public var labels: [String]

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", typeVocabSize = "type_vocab_size", modalityTypeVocabSize = "modality_type_vocab_size"
        case maxPositionEmbeddings = "max_position_embeddings", hiddenSize = "hidden_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case intermediateSize = "intermediate_size", hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps"
        case imageSize = "image_size", patchSize = "patch_size", numChannels = "num_channels", qkvBias = "qkv_bias"
        case id2label, numLabels = "num_labels"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 30522)
        typeVocabSize = try c.value(.typeVocabSize, default: 2)
        modalityTypeVocabSize = try c.value(.modalityTypeVocabSize, default: 2)
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 40)
        hiddenSize = try c.value(.hiddenSize, default: 768)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 12)
        intermediateSize = try c.value(.intermediateSize, default: 3072)
        hiddenAct = try c.value(.hiddenAct, default: "gelu")
        layerNormEps = try c.value(.layerNormEps, default: 1e-12)
        // The position embeddings form a square grid (`view(patch_dim, patch_dim)`), so only square sizes load.
        func side(_ key: CodingKeys, default value: Int) throws -> Int {
            guard let sides = try? c.decodeIfPresent([Int].self, forKey: key) else { return try c.value(key, default: value) }
            guard sides.count == 2, sides[0] == sides[1] else {
                throw DecodingError.dataCorruptedError(forKey: key, in: c, debugDescription: "\(key.rawValue) \(sides) is not square")
            }
            return sides[0]
        }
        imageSize = try side(.imageSize, default: 384)
        patchSize = try side(.patchSize, default: 32)
        numChannels = try c.value(.numChannels, default: 3)
        qkvBias = try c.value(.qkvBias, default: true)
        let names = try c.decodeIfPresent([String: String].self, forKey: .id2label) ?? [:]
        let count = try c.decodeIfPresent(Int.self, forKey: .numLabels)
            ?? (names.keys.compactMap { Int($0) }.max().map { $0 + 1 } ?? 2)
        labels = (0..<count).map { names[String($0)] ?? "LABEL_\($0)" }
    }
}

/// transformers' `ViltForQuestionAnswering`: answer logits for a question about a photo.
public final class ViltForQuestionAnswering: VisualQuestionClassifier, @unchecked Sendable {
    public let config: ViltConfig
    // Text embeddings (BERT's).
    let wordEmbeddings: Tensor
    let textPositionEmbeddings: Tensor
    let textTokenTypeEmbeddings: Tensor
    let textLayerNorm: LayerNorm
    // Patch embeddings (ViT's), with the square grid of position embeddings they are interpolated from.
    let patchEmbedding: Conv2d
    let classToken: Tensor
    let positionEmbeddings: Tensor
    /// Added to every text token (row 0) and every image token (row 1).
    let modalityEmbeddings: Tensor
    let layers: [PreNormEncoderLayer]
    let finalLayerNorm: LayerNorm
    let pooler: Linear
    let classifier: (first: Linear, norm: LayerNorm, last: Linear)

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `vilt`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard type == "vilt" else { throw ModelError.unsupportedModelType(type, supported: ["vilt"], file: configPath) }
        try self.init(config: directory.decode(ViltConfig.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: configPath)
    }

    /// Builds the model from weights named as transformers saves `ViltForQuestionAnswering` (`vilt.…`,
    /// `classifier.0/1/3.…`); `file` is what configuration errors name.
    public init(config: ViltConfig, weights: Weights, file: String = "config.json") throws {
        let d = config.hiddenSize
        guard config.patchSize > 0, config.imageSize >= config.patchSize, config.numAttentionHeads > 0,
              d % config.numAttentionHeads == 0, config.numChannels == 3, !config.labels.isEmpty else {
            throw ModelError.invalidConfig("ViLT needs patch_size ≤ image_size, hidden_size \(d) a multiple of num_attention_heads \(config.numAttentionHeads), 3 channels and at least one label", file: file)
        }
        self.config = config
        let embeddings = weights.scoped("vilt.embeddings")
        let text = embeddings.scoped("text_embeddings")
        wordEmbeddings = try text("word_embeddings.weight", shape: [config.vocabSize, d])
        textPositionEmbeddings = try text("position_embeddings.weight", shape: [config.maxPositionEmbeddings, d])
        textTokenTypeEmbeddings = try text("token_type_embeddings.weight", shape: [config.typeVocabSize, d])
        textLayerNorm = try LayerNorm(text.scoped("LayerNorm"), size: d, eps: config.layerNormEps)
        let p = config.patchSize
        patchEmbedding = try Conv2d(weight: embeddings("patch_embeddings.projection.weight", shape: [d, 3, p, p]),
                                    bias: embeddings("patch_embeddings.projection.bias", shape: [d]), stride: p, padding: 0)
        classToken = try embeddings("cls_token", shape: [1, 1, d]).reshaped([d])
        let side = config.imageSize / p
        positionEmbeddings = try embeddings("position_embeddings", shape: [1, side * side + 1, d]).reshaped([side * side + 1, d])
        modalityEmbeddings = try embeddings("token_type_embeddings.weight", shape: [config.modalityTypeVocabSize, d])
        let activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        layers = try (0..<config.numHiddenLayers).map { index in
            let layer = weights.scoped("vilt.encoder.layer.\(index)")
            let attention = layer.scoped("attention")
            let projections = ["query", "key", "value"].map(attention.scoped("attention").scoped)
            let queryKeyValue = try Linear(
                weight: concatenate(projections.map { try $0("weight", shape: [d, d]) }, axis: 0),
                bias: config.qkvBias ? concatenate(projections.map { try $0("bias", shape: [d]) }, axis: 0) : nil)
            return PreNormEncoderLayer(
                layerNorm1: try LayerNorm(layer.scoped("layernorm_before"), size: d, eps: config.layerNormEps),
                selfAttention: SelfAttention(queryKeyValue: queryKeyValue,
                                             output: try Linear(attention.scoped("output.dense"), inFeatures: d, outFeatures: d),
                                             heads: config.numAttentionHeads),
                layerNorm2: try LayerNorm(layer.scoped("layernorm_after"), size: d, eps: config.layerNormEps),
                mlp: FeedForward(fc1: try Linear(layer.scoped("intermediate.dense"), inFeatures: d, outFeatures: config.intermediateSize),
                                 fc2: try Linear(layer.scoped("output.dense"), inFeatures: config.intermediateSize, outFeatures: d),
                                 activation: activation))
        }
        finalLayerNorm = try LayerNorm(weights.scoped("vilt.layernorm"), size: d, eps: config.layerNormEps)
        pooler = try Linear(weights.scoped("vilt.pooler.dense"), inFeatures: d, outFeatures: d)
        classifier = (first: try Linear(weights.scoped("classifier.0"), inFeatures: d, outFeatures: 2 * d),
                      norm: try LayerNorm(weights.scoped("classifier.1"), size: 2 * d, eps: 1e-5),
                      last: try Linear(weights.scoped("classifier.3"), inFeatures: 2 * d, outFeatures: config.labels.count))
    }

    public var labels: [String] { config.labels }
    public var maxTextLength: Int { config.maxPositionEmbeddings }

    /// The answers' logits `[B, labels]` for questions `inputIds` (`[B][T]`, right-padded, with `attentionMask`) about
    /// images `pixelValues` `[B, 3, H, W]` whose valid pixels `pixelMask` `[B, H, W]` marks (nil: all valid), as
    /// `ViltForQuestionAnswering(...).logits`.
    ///
    /// ViLT's embeddings pick which patches the encoder reads at random (`torch.multinomial`): every valid patch, in a
    /// random order, then padding patches that the attention mask hides. Attention does not depend on the order of
    /// the keys, so this reads every patch in place, the padding ones hidden, and gives the same logits.
    public func logits(pixelValues: Tensor, pixelMask: Tensor?, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        let batch = inputIds.count
        guard pixelValues.rank == 4, pixelValues.shape[0] == batch, batch > 0, pixelValues.shape[1] == 3 else {
            throw ModelError.invalidInput("ViLT expects pixel values [\(batch), 3, H, W] for \(batch) questions, got \(pixelValues.shape)")
        }
        let (height, width) = (pixelValues.shape[2], pixelValues.shape[3])
        guard height >= config.patchSize, width >= config.patchSize else {
            throw ModelError.invalidInput("ViLT needs images of at least \(config.patchSize)×\(config.patchSize) pixels, got \(width)×\(height)")
        }
        if let pixelMask, pixelMask.shape != [batch, height, width] {
            throw ModelError.invalidInput("the pixel mask must be [\(batch), \(height), \(width)], got \(pixelMask.shape)")
        }
        let length = inputIds.first?.count ?? 0
        guard length > 0, inputIds.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("ViLT needs questions of one non-zero length per batch (padded), got \(inputIds.map(\.count))")
        }
        guard length <= config.maxPositionEmbeddings else {
            throw ModelError.invalidInput("the question is \(length) tokens long, more than the \(config.maxPositionEmbeddings) ViLT reads")
        }
        guard inputIds.joined().allSatisfy({ $0 >= 0 && $0 < config.vocabSize }) else {
            throw ModelError.invalidInput("token ids must be in 0..<\(config.vocabSize)")
        }
        return try answerLogits(pixelValues, pixelMask, inputIds, attentionMask, length: length)
    }

    private func answerLogits(_ pixelValues: Tensor, _ pixelMask: Tensor?, _ inputIds: [[Int]], _ attentionMask: [[Int]]?,
                              length: Int) throws -> Tensor {
        let batch = inputIds.count, d = config.hiddenSize
        // Text: word + token type 0 + position, layer norm, then the text modality embedding.
        let words = embedding(wordEmbeddings, ids: inputIds)
        let positions = Tensor(shape: [length, d], scalars: Array(textPositionEmbeddings.scalars.prefix(length * d)))
        let textType = textTokenTypeEmbeddings.scalars.prefix(d)
        var text = textLayerNorm(add(add(words, Tensor(shape: [d], scalars: Array(textType))), positions))
        text = add(text, Tensor(shape: [d], scalars: Array(modalityEmbeddings.scalars.prefix(d))))

        // Image: class token and patches with position embeddings interpolated to each image's valid patch grid.
        let patches = patchEmbedding(pixelValues, channelsLast: true)   // [B, rows, columns, D]
        let (rows, columns) = (patches.shape[1], patches.shape[2])
        let grid = patchGrid(pixelMask, batch: batch, height: pixelValues.shape[2], width: pixelValues.shape[3],
                             rows: rows, columns: columns)
        let imageTokens = 1 + rows * columns
        let image = Tensor(uninitialized: [batch, imageTokens, d])
        let imageType = Array(modalityEmbeddings.scalars[d..<(2 * d)])
        var imageMask = [[Int]]()
        for item in 0..<batch {
            let (validRows, validColumns) = grid[item]
            let interpolated = interpolatedPositions(rows: validRows, columns: validColumns)
            var mask = [1]
            let base = item * imageTokens * d
            for i in 0..<d { image.storage.pointer[base + i] = classToken.storage.pointer[i] + positionEmbeddings.storage.pointer[i] + imageType[i] }
            for r in 0..<rows {
                for c in 0..<columns {
                    let valid = r < validRows && c < validColumns
                    mask.append(valid ? 1 : 0)
                    let token = base + (1 + r * columns + c) * d
                    let patch = ((item * rows + r) * columns + c) * d
                    for i in 0..<d {
                        // Padding patches get no position embedding (transformers pads the interpolated grid with 0).
                        let position = valid ? interpolated[(r * validColumns + c) * d + i] : 0
                        image.storage.pointer[token + i] = patches.storage.pointer[patch + i] + position + imageType[i]
                    }
                }
            }
            imageMask.append(mask)
        }

        let textMask = attentionMask ?? Array(repeating: Array(repeating: 1, count: length), count: batch)
        guard textMask.count == batch, textMask.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("the attention mask must be [\(batch)][\(length)]")
        }
        let mask = Tensor(shape: [batch, length + imageTokens],
                          scalars: zip(textMask, imageMask).flatMap { ($0 + $1).map(Float.init) })
        // The pooler reads only the first token, so the last layer computes only that row.
        let first = finalLayerNorm(encode(concatenate([text, image], axis: 1), layers: layers,
                                          pooledAt: Array(repeating: 0, count: batch), keyPaddingMask: mask))
        let pooledLinear = pooler(first)
        let pooled = Tensor(shape: pooledLinear.shape, scalars: pooledLinear.scalars.map { Foundation.tanh($0) })
        return classifier.last(activation(classifier.norm(classifier.first(pooled)), .gelu))
    }

    /// Each image's valid patch rows and columns: its pixel mask sampled at the patch grid as
    /// `interpolate(mode="nearest")` samples it, the valid rows counted down the first column and the valid columns
    /// along the first row.
    private func patchGrid(_ pixelMask: Tensor?, batch: Int, height: Int, width: Int, rows: Int,
                           columns: Int) -> [(rows: Int, columns: Int)] {
        guard let pixelMask else { return Array(repeating: (rows, columns), count: batch) }
        let rowScale = Float(height) / Float(rows), columnScale = Float(width) / Float(columns)
        return (0..<batch).map { item in
            let plane = pixelMask.storage.pointer + item * height * width
            let validRows = (0..<rows).filter { plane[min(Int((Float($0) * rowScale).rounded(.down)), height - 1) * width] != 0 }.count
            let validColumns = (0..<columns).filter { plane[min(Int((Float($0) * columnScale).rounded(.down)), width - 1)] != 0 }.count
            return (validRows, validColumns)
        }
    }

    /// The patch position embeddings, a square grid, resized to `rows × columns` as
    /// `interpolate(mode="bilinear", align_corners=True)` resizes them: `[rows · columns, D]` row-major.
    private func interpolatedPositions(rows: Int, columns: Int) -> [Float] {
        let d = config.hiddenSize, side = config.imageSize / config.patchSize
        var output = [Float](repeating: 0, count: rows * columns * d)
        // align_corners=True maps the corners onto each other: source = destination · (in − 1) / (out − 1).
        func source(_ index: Int, _ count: Int) -> (Int, Int, Float) {
            let scale: Float = count > 1 ? Float(side - 1) / Float(count - 1) : 0
            let position = scale * Float(index)
            let low = min(Int(position), side - 1)
            let high = min(low + 1, side - 1)
            return (low, high, position - Float(low))
        }
        let grid = positionEmbeddings.storage.pointer + d   // row 0 is the class token's
        for r in 0..<rows {
            let (top, bottom, dy) = source(r, rows)
            for c in 0..<columns {
                let (left, right, dx) = source(c, columns)
                for i in 0..<d {
                    let topValue = (1 - dx) * grid[(top * side + left) * d + i] + dx * grid[(top * side + right) * d + i]
                    let bottomValue = (1 - dx) * grid[(bottom * side + left) * d + i] + dx * grid[(bottom * side + right) * d + i]
                    output[(r * columns + c) * d + i] = (1 - dy) * topValue + dy * bottomValue
                }
            }
        }
        return output
    }

    /// Rows of `table` for `ids` `[B][T]`: `[B, T, D]`.
    private func embedding(_ table: Tensor, ids: [[Int]]) -> Tensor {
        VLMTensor.embedding(table, ids: Array(ids.joined())).reshaped([ids.count, ids[0].count, table.shape[1]])
    }
}
