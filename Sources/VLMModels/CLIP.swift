import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// CLIP (Radford et al. 2021) as transformers' models/clip/modeling_clip.py builds it: a ViT image tower and a causal
// text transformer, each projected into a shared embedding space where cosine similarity ranks image–text pairs.

/// transformers' `CLIPTextConfig`, with its defaults.
public struct CLIPTextConfig: Decodable, Sendable {
    public var vocabSize: Int
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var maxPositionEmbeddings: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    public var eosTokenId: Int

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case maxPositionEmbeddings = "max_position_embeddings", hiddenAct = "hidden_act"
        case layerNormEps = "layer_norm_eps", eosTokenId = "eos_token_id"
    }

    /// The defaults of the fields a containing config overrides: `CLIPTextConfig`'s own, or `GroupViTTextConfig`'s
    /// (the same text transformer, narrower).
    struct Defaults {
        var hiddenSize = 512, intermediateSize = 2048, numAttentionHeads = 8

        static let clip = Defaults()
        static let groupViT = Defaults(hiddenSize: 256, intermediateSize: 1024, numAttentionHeads: 4)
    }

    public init(from decoder: any Decoder) throws { try self.init(from: decoder, defaults: .clip) }

    init(from decoder: any Decoder, defaults: Defaults) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 49408)
        hiddenSize = try c.value(.hiddenSize, default: defaults.hiddenSize)
        intermediateSize = try c.value(.intermediateSize, default: defaults.intermediateSize)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: defaults.numAttentionHeads)
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 77)
        hiddenAct = try c.value(.hiddenAct, default: "quick_gelu")
        layerNormEps = try c.value(.layerNormEps, default: 1e-5)
        eosTokenId = try c.value(.eosTokenId, default: 49407)
    }
}

extension CLIPTextConfig {
    /// The position whose final state the text model pools: the argmax id under the legacy `eos_token_id == 2`
    /// configs (the eot token had the highest id), otherwise the first `eos_token_id` (position 0 when there is none,
    /// as argmax of all-false gives), as transformers' `CLIPTextTransformer` pools.
    public func pooledPosition(_ ids: [Int]) -> Int {
        eosTokenId == 2 ? Self.highestIdPosition(ids) : ids.firstIndex(of: eosTokenId) ?? 0
    }

    /// The first position of the highest id.
    static func highestIdPosition(_ ids: [Int]) -> Int {
        ids.indices.max { ids[$0] < ids[$1] || (ids[$0] == ids[$1] && $0 > $1) } ?? 0
    }
}

/// transformers' `CLIPVisionConfig`, with its defaults.
public struct CLIPVisionConfig: Decodable, Sendable {
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var numChannels: Int
    public var imageSize: Int
    public var patchSize: Int
    public var hiddenAct: String
    public var layerNormEps: Float

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case numChannels = "num_channels", imageSize = "image_size", patchSize = "patch_size"
        case hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps"
    }

    /// The defaults of the fields a containing config overrides: `CLIPVisionConfig`'s own, or those `LlavaConfig`
    /// gives its `vision_config` (CLIP ViT-L/14 at 336 pixels).
    struct Defaults {
        var hiddenSize = 768, intermediateSize = 3072, numHiddenLayers = 12, numAttentionHeads = 12
        var imageSize = 224, patchSize = 32

        static let clip = Defaults()
        static let llava = Defaults(hiddenSize: 1024, intermediateSize: 4096, numHiddenLayers: 24, numAttentionHeads: 16,
                                    imageSize: 336, patchSize: 14)
    }

    public init(from decoder: any Decoder) throws { try self.init(from: decoder, defaults: .clip) }

    init(from decoder: any Decoder, defaults: Defaults) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        hiddenSize = try c.value(.hiddenSize, default: defaults.hiddenSize)
        intermediateSize = try c.value(.intermediateSize, default: defaults.intermediateSize)
        numHiddenLayers = try c.value(.numHiddenLayers, default: defaults.numHiddenLayers)
        numAttentionHeads = try c.value(.numAttentionHeads, default: defaults.numAttentionHeads)
        numChannels = try c.value(.numChannels, default: 3)
        imageSize = try c.value(.imageSize, default: defaults.imageSize)
        patchSize = try c.value(.patchSize, default: defaults.patchSize)
        hiddenAct = try c.value(.hiddenAct, default: "quick_gelu")
        layerNormEps = try c.value(.layerNormEps, default: 1e-5)
    }

    var patchesPerSide: Int { imageSize / patchSize }
}

/// transformers' `CLIPConfig`: both towers and the shared projection size.
public struct CLIPConfig: Decodable, Sendable {
    public var textConfig: CLIPTextConfig
    public var visionConfig: CLIPVisionConfig
    public var projectionDim: Int

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config", projectionDim = "projection_dim"
    }

    init(textConfig: CLIPTextConfig, visionConfig: CLIPVisionConfig, projectionDim: Int) {
        self.textConfig = textConfig
        self.visionConfig = visionConfig
        self.projectionDim = projectionDim
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        // An absent sub-config means all of its defaults, as CLIPConfig(text_config=None) does.
        textConfig = try c.decodeIfPresent(CLIPTextConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(CLIPTextConfig.self, from: Data("{}".utf8))
        visionConfig = try c.decodeIfPresent(CLIPVisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(CLIPVisionConfig.self, from: Data("{}".utf8))
        projectionDim = try c.value(.projectionDim, default: 512)
    }
}

/// `CLIPVisionTransformer`: patch embedding, class token, learned positions, pre-norm encoder, pooled class token.
final class CLIPVisionTransformer: Sendable {
    let config: CLIPVisionConfig
    /// Whether images of another size than `image_size` are taken, their position embeddings resized to the patch
    /// grid (transformers' `interpolate_pos_encoding=True`, CLIPSeg's default); otherwise they are refused.
    let interpolatesPositions: Bool
    let patchEmbedding: Conv2d
    let classEmbedding: Tensor
    let positionEmbedding: Tensor
    let preLayerNorm: LayerNorm
    let layers: [PreNormEncoderLayer]
    let postLayerNorm: LayerNorm

    /// - Parameter preLayerNormName: the pre-encoder norm's weight name, `pre_layrnorm` as CLIP misspells it, or
    ///   `pre_layernorm` (OWL-ViT).
    init(_ config: CLIPVisionConfig, weights: Weights, file: String, interpolatesPositions: Bool = false,
         preLayerNormName: String = "pre_layrnorm") throws {
        guard config.patchSize > 0, config.imageSize % config.patchSize == 0,
              config.numAttentionHeads > 0, config.hiddenSize % config.numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("vision_config: image_size \(config.imageSize) must be a multiple of patch_size \(config.patchSize), hidden_size \(config.hiddenSize) of num_attention_heads \(config.numAttentionHeads)", file: file)
        }
        self.config = config
        self.interpolatesPositions = interpolatesPositions
        let d = config.hiddenSize
        let embeddings = weights.scoped("embeddings")
        patchEmbedding = try Conv2d(
            weight: embeddings("patch_embedding.weight", shape: [d, config.numChannels, config.patchSize, config.patchSize]),
            bias: nil, stride: config.patchSize, padding: 0)
        classEmbedding = try embeddings("class_embedding", shape: [d]).reshaped([1, 1, d])
        positionEmbedding = try embeddings("position_embedding.weight", shape: [config.patchesPerSide * config.patchesPerSide + 1, d])
        preLayerNorm = try LayerNorm(weights.scoped(preLayerNormName), size: d, eps: config.layerNormEps)
        let activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        layers = try (0..<config.numHiddenLayers).map { i in
            try PreNormEncoderLayer(weights.scoped("encoder.layers.\(i)"), hiddenSize: d,
                                    intermediateSize: config.intermediateSize, heads: config.numAttentionHeads,
                                    activation: activation, eps: config.layerNormEps)
        }
        postLayerNorm = try LayerNorm(weights.scoped("post_layernorm"), size: d, eps: config.layerNormEps)
    }

    /// pixel_values [B, C, S, S] → the post-layernormed class token [B, D] (transformers' pooler_output).
    func pooledOutput(_ pixelValues: Tensor) throws -> Tensor {
        let hidden = try embeddings(pixelValues)
        return postLayerNorm(encode(hidden, layers: layers, pooledAt: Array(repeating: 0, count: pixelValues.shape[0])))
    }

    /// transformers' `hidden_states[i]` for each `i` of `indices` ([B, 1 + patches, D] each): 0 is the pre-layernormed
    /// embeddings, `i` the output of encoder layer `i`, and a negative index counts from the end as Python's does (-1
    /// is the last layer's output, without post_layernorm). Layers past the deepest one asked for are not run.
    func hiddenStates(_ pixelValues: Tensor, at indices: [Int]) throws -> [Tensor] {
        try encoderHiddenStates(layers: layers, at: indices) { try embeddings(pixelValues) }
    }

    /// pixel_values [B, C, H, W] → patch embeddings after the class token, plus positions, pre-layernormed.
    private func embeddings(_ pixelValues: Tensor) throws -> Tensor {
        let channels = config.numChannels, patch = config.patchSize
        let fits = pixelValues.rank == 4 && pixelValues.shape[1] == channels && (interpolatesPositions
            ? pixelValues.shape[2] >= patch && pixelValues.shape[3] >= patch
            : pixelValues.shape[2] == config.imageSize && pixelValues.shape[3] == config.imageSize)
        guard fits else {
            let expected = interpolatesPositions ? "[batch, \(channels), H, W] with H and W at least \(patch)"
                : "[batch, \(channels), \(config.imageSize), \(config.imageSize)]"
            throw ModelError.invalidInput("CLIP vision model expects pixel values \(expected), got \(pixelValues.shape)")
        }
        let batch = pixelValues.shape[0], d = config.hiddenSize
        let patches = patchEmbedding(pixelValues, channelsLast: true).reshaped([batch, -1, d])
        let classTokens = concatenate(Array(repeating: classEmbedding, count: batch), axis: 0)
        let positions = positionEmbeddings(height: pixelValues.shape[2], width: pixelValues.shape[3])
        return preLayerNorm(add(concatenate([classTokens, patches], axis: 1), positions))
    }

    /// The position embeddings of an image of `height`×`width` pixels, [1 + patches, D]: the learned ones, or, for
    /// another patch grid (or any non-square image) when positions are interpolated, their patch grid resized to the
    /// image's with bicubic interpolation, as transformers' `interpolate_pos_encoding` does.
    private func positionEmbeddings(height: Int, width: Int) -> Tensor {
        let side = config.patchesPerSide, d = config.hiddenSize
        let (rows, columns) = (height / config.patchSize, width / config.patchSize)
        if !interpolatesPositions || (rows * columns == side * side && height == width) { return positionEmbedding }
        let grid = sequenceSlice(positionEmbedding.reshaped([1, 1 + side * side, d]), 1..<(1 + side * side))
        let resized = interpolate(channelsFirst(grid).reshaped([1, d, side, side]), height: rows, width: columns, mode: .bicubic)
        let classPosition = sequenceSlice(positionEmbedding.reshaped([1, 1 + side * side, d]), 0..<1)
        return concatenate([classPosition, channelsFirst(resized.reshaped([1, d, rows * columns]))], axis: 1)
            .reshaped([1 + rows * columns, d])
    }
}

/// `CLIPTextTransformer`: token + position embeddings, causal pre-norm encoder, final norm, eos pooling.
final class CLIPTextTransformer: Sendable {
    let config: CLIPTextConfig
    let encoder: PreNormTextEncoder
    /// Whether the pooled token is always the one with the highest id (OWL-ViT), whatever `eos_token_id` says.
    let poolsAtHighestId: Bool

    init(_ config: CLIPTextConfig, weights: Weights, file: String, poolsAtHighestId: Bool = false) throws {
        self.config = config
        self.poolsAtHighestId = poolsAtHighestId
        encoder = try PreNormTextEncoder(weights, family: "CLIP", vocabSize: config.vocabSize, hiddenSize: config.hiddenSize,
                                         intermediateSize: config.intermediateSize, heads: config.numAttentionHeads,
                                         layerCount: config.numHiddenLayers, maxPositions: config.maxPositionEmbeddings,
                                         hiddenAct: config.hiddenAct, eps: config.layerNormEps, file: file)
    }

    /// input_ids [B][T] (all rows the same length) → the final-normed state at each text's eos position [B, D].
    func pooledOutput(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        try encoder.pooledOutput(inputIds: inputIds, attentionMask: attentionMask, causal: true, pooledAt: eosPosition)
    }

    private func eosPosition(_ ids: [Int]) -> Int {
        poolsAtHighestId ? CLIPTextConfig.highestIdPosition(ids) : config.pooledPosition(ids)
    }
}

/// transformers' `CLIPModel`: both towers, their projections and the learned temperature.
public final class CLIPModel: ImageTextDualEncoder {
    public let config: CLIPConfig
    let vision: CLIPVisionTransformer
    let text: CLIPTextTransformer
    let visualProjection: Linear
    let textProjection: Linear
    public let logitScale: Float

    /// Loads config.json and the safetensors weights of a checkpoint directory.
    public convenience init(directory: ModelDirectory) throws {
        try self.init(config: directory.decode(CLIPConfig.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: directory.url.appendingPathComponent("config.json").path)
    }

    public convenience init(config: CLIPConfig, weights: Weights, file: String = "config.json") throws {
        try self.init(config: config, weights: weights, file: file, interpolatesPositions: false)
    }

    /// - Parameter interpolatesPositions: take images of any size, as `interpolate_pos_encoding=True` does (see
    ///   `CLIPVisionTransformer`).
    init(config: CLIPConfig, weights: Weights, file: String, interpolatesPositions: Bool) throws {
        self.config = config
        vision = try CLIPVisionTransformer(config.visionConfig, weights: weights.scoped("vision_model"), file: file,
                                           interpolatesPositions: interpolatesPositions)
        text = try CLIPTextTransformer(config.textConfig, weights: weights.scoped("text_model"), file: file)
        visualProjection = try Linear(weights.scoped("visual_projection"), inFeatures: config.visionConfig.hiddenSize,
                                      outFeatures: config.projectionDim, bias: false)
        textProjection = try Linear(weights.scoped("text_projection"), inFeatures: config.textConfig.hiddenSize,
                                    outFeatures: config.projectionDim, bias: false)
        logitScale = try weights("logit_scale").scalars.first ?? 0
    }

    public var imageSize: Int { config.visionConfig.imageSize }
    public var embeddingSize: Int { config.projectionDim }
    public var textPadding: DualEncoderTextPadding { .longest }

    /// `get_image_features`: projected (not normalized) image embeddings [B, projection_dim].
    public func imageFeatures(pixelValues: Tensor) throws -> Tensor {
        try visualProjection(vision.pooledOutput(pixelValues))
    }

    /// ``imageFeatures(pixelValues:)`` of the image processor's pixel values.
    public func imageFeatures(_ images: ProcessedImages) throws -> Tensor {
        try imageFeatures(pixelValues: images.pixelValues)
    }

    /// `get_text_features`: projected (not normalized) text embeddings [B, projection_dim].
    public func textFeatures(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        try textProjection(text.pooledOutput(inputIds: inputIds, attentionMask: attentionMask))
    }

    /// `logits_per_image`: exp(logit_scale) × cosine similarity, [images, texts].
    public func logitsPerImage(imageFeatures: Tensor, textFeatures: Tensor) -> Tensor {
        scaled(matmul(l2Normalized(imageFeatures), l2Normalized(textFeatures), transposeB: true), by: Float(exp(Double(logitScale))))
    }

    /// The pipeline's scores: a softmax over each image's labels.
    public func labelProbabilities(logitsPerImage: Tensor) -> Tensor {
        softmax(logitsPerImage)
    }

    /// `return_loss=True`'s loss; see ``ImageTextDualEncoder/contrastiveLoss(logitsPerImage:)``.
    public func contrastiveLoss(logitsPerImage: Tensor) throws -> Float {
        try clipContrastiveLoss(logitsPerImage: logitsPerImage)
    }
}
