import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// SigLIP 2 (Tschannen et al. 2025) as transformers' models/siglip2/modeling_siglip2.py builds `Siglip2Model`: SigLIP's
// towers and sigmoid logits, with a NaFlex vision tower that reads an image at its own aspect ratio. The image
// processor hands it flattened patches padded to a fixed count, the mask of the real ones and each image's patch grid;
// the tower embeds the patches with a linear layer, resizes its square grid of learned positions to each image's grid
// (bilinear with antialiasing) and masks the padding in every attention, the pooling head's too. The text tower is
// SigLIP's.

/// transformers' `Siglip2VisionConfig`, with its defaults.
public struct Siglip2VisionConfig: Decodable, Sendable {
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var numChannels: Int
    public var patchSize: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// Whether the tower has its attention-pooling head (`head.…`), whose output is the pooled output.
    public var visionUseHead: Bool
    /// The number of learned position embeddings, a square grid (`num_patches`).
    public var numPatches: Int

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case numChannels = "num_channels", patchSize = "patch_size", hiddenAct = "hidden_act"
        case layerNormEps = "layer_norm_eps", visionUseHead = "vision_use_head", numPatches = "num_patches"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        hiddenSize = try c.value(.hiddenSize, default: 768)
        intermediateSize = try c.value(.intermediateSize, default: 3072)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 12)
        numChannels = try c.value(.numChannels, default: 3)
        patchSize = try c.value(.patchSize, default: 16)
        hiddenAct = try c.value(.hiddenAct, default: "gelu_pytorch_tanh")
        layerNormEps = try c.value(.layerNormEps, default: 1e-6)
        visionUseHead = try c.value(.visionUseHead, default: true)
        numPatches = try c.value(.numPatches, default: 256)
    }

    /// The side of the square grid of position embeddings (`int(num_patches ** 0.5)`).
    var positionGridSide: Int { Int(Double(numPatches).squareRoot()) }
}

/// transformers' `Siglip2Config`: both towers. `Siglip2TextConfig` has `SiglipTextConfig`'s fields and defaults.
public struct Siglip2Config: Decodable, Sendable {
    public var textConfig: SiglipTextConfig
    public var visionConfig: Siglip2VisionConfig

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        // An absent sub-config means all of its defaults, as Siglip2Config(text_config=None) does.
        textConfig = try c.decodeIfPresent(SiglipTextConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(SiglipTextConfig.self, from: Data("{}".utf8))
        visionConfig = try c.decodeIfPresent(Siglip2VisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(Siglip2VisionConfig.self, from: Data("{}".utf8))
    }
}

/// `Siglip2VisionModel`'s transformer: linear patch embedding plus positions resized to each image's grid, a
/// pre-norm encoder whose attention skips the padded patches, post_layernorm, and the attention-pooling head.
final class Siglip2VisionTransformer: Sendable {
    let config: Siglip2VisionConfig
    let patchEmbedding: Linear
    /// The learned positions as a picture of `hidden_size` channels, [1, D, side, side], ready for resizing.
    let positionGrid: Tensor
    let layers: [PreNormEncoderLayer]
    let postLayerNorm: LayerNorm
    let head: SiglipAttentionPoolingHead

    /// `weights` scoped to where `embeddings.…`, `encoder.…`, `post_layernorm.…` and `head.…` are.
    init(_ config: Siglip2VisionConfig, weights: Weights, file: String) throws {
        let side = config.positionGridSide
        guard config.patchSize > 0, config.numPatches > 0, side * side == config.numPatches,
              config.numAttentionHeads > 0, config.hiddenSize % config.numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("vision_config: num_patches \(config.numPatches) must be a square, patch_size \(config.patchSize) positive, hidden_size \(config.hiddenSize) a multiple of num_attention_heads \(config.numAttentionHeads)", file: file)
        }
        // Without the head 5.23's get_image_features has no pooler_output and Siglip2Model's forward fails.
        guard config.visionUseHead else {
            throw ModelError.invalidConfig("vision_config.vision_use_head is false: Siglip2Model's image features are its attention-pooling head's output", file: file)
        }
        self.config = config
        let d = config.hiddenSize
        let embeddings = weights.scoped("embeddings")
        patchEmbedding = try Linear(embeddings.scoped("patch_embedding"),
                                    inFeatures: config.numChannels * config.patchSize * config.patchSize, outFeatures: d)
        let positions = try embeddings("position_embedding.weight", shape: [config.numPatches, d])
        positionGrid = channelsFirst(positions.reshaped([1, config.numPatches, d])).reshaped([1, d, side, side])
        let activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        layers = try (0..<config.numHiddenLayers).map { i in
            try PreNormEncoderLayer(weights.scoped("encoder.layers.\(i)"), hiddenSize: d,
                                    intermediateSize: config.intermediateSize, heads: config.numAttentionHeads,
                                    activation: activation, eps: config.layerNormEps)
        }
        postLayerNorm = try LayerNorm(weights.scoped("post_layernorm"), size: d, eps: config.layerNormEps)
        head = try SiglipAttentionPoolingHead(weights.scoped("head"), hiddenSize: d, intermediateSize: config.intermediateSize,
                                              heads: config.numAttentionHeads, eps: config.layerNormEps,
                                              activation: activation)
    }

    /// The attention-pooling head's output [B, D] (transformers' pooler_output).
    func pooledOutput(_ images: ProcessedImages) throws -> Tensor {
        let (hidden, mask) = try lastHiddenState(images)
        return head(hidden, keyPaddingMask: mask)
    }

    /// `last_hidden_state` [B, patches, D] (after post_layernorm; padded rows too) and the patch mask it was computed
    /// with.
    func lastHiddenState(_ images: ProcessedImages) throws -> (hidden: Tensor, mask: Tensor) {
        let (pixels, mask, shapes) = try inputs(images)
        var hidden = add(patchEmbedding(pixels), positions(shapes, length: pixels.shape[1]))
        for layer in layers { hidden = layer(hidden, keyPaddingMask: mask) }
        return (postLayerNorm(hidden), mask)
    }

    /// The processor's patches, mask and grids, checked against each other and the config.
    private func inputs(_ images: ProcessedImages) throws -> (Tensor, Tensor, [ImageSize]) {
        let pixels = images.pixelValues
        let width = config.numChannels * config.patchSize * config.patchSize
        guard pixels.rank == 3, pixels.shape[2] == width else {
            throw ModelError.invalidInput("SigLIP 2 vision model expects flattened patches [batch, patches, \(width)], got \(pixels.shape)")
        }
        let (batch, length) = (pixels.shape[0], pixels.shape[1])
        guard let mask = images.pixelAttentionMask, let shapes = images.spatialShapes,
              mask.shape == [batch, length], shapes.count == batch else {
            throw ModelError.invalidInput("SigLIP 2 vision model needs a pixel attention mask [\(batch), \(length)] and \(batch) spatial shapes, as Siglip2ImageProcessor makes them")
        }
        if let bad = shapes.first(where: { $0.height <= 0 || $0.width <= 0 || $0.height * $0.width > length }) {
            throw ModelError.invalidInput("spatial shape \(bad.height)×\(bad.width) does not fit \(length) patches")
        }
        return (pixels, mask, shapes)
    }

    /// `resize_positional_embeddings`: for each image the position grid resized to its patch grid as
    /// `F.interpolate(mode="bilinear", align_corners=False, antialias=True)`, row-major, the padding rows given the
    /// first position: [B, length, D].
    private func positions(_ shapes: [ImageSize], length: Int) -> Tensor {
        let d = config.hiddenSize
        var resized: [ImageSize: Tensor] = [:]
        let rows = shapes.map { shape -> Tensor in
            let grid = resized[shape] ?? channelsFirst(
                interpolateAntialiased(positionGrid, height: shape.height, width: shape.width)
                    .reshaped([1, d, shape.height * shape.width]))
            resized[shape] = grid
            let count = shape.height * shape.width
            guard count < length else { return grid }
            let first = sequenceSlice(grid, 0..<1)
            return concatenate([grid] + Array(repeating: first, count: length - count), axis: 1)
        }
        return concatenate(rows, axis: 0)
    }
}

/// transformers' `Siglip2Model`: the NaFlex vision tower, SigLIP's text tower, the learned temperature and bias of
/// the sigmoid logits.
public final class Siglip2Model: ImageTextDualEncoder {
    /// The length SigLIP 2's texts are padded to: `Siglip2Processor`'s `max_length` and the zero-shot pipeline's.
    public static let textLength = 64

    public let config: Siglip2Config
    let vision: Siglip2VisionTransformer
    let text: SiglipTextTransformer
    public let logitScale: Float
    public let logitBias: Float

    /// Loads config.json and the safetensors weights of a checkpoint directory.
    public convenience init(directory: ModelDirectory) throws {
        try self.init(config: directory.decode(Siglip2Config.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: directory.url.appendingPathComponent("config.json").path)
    }

    public init(config: Siglip2Config, weights: Weights, file: String = "config.json") throws {
        guard config.textConfig.projectionSize == config.visionConfig.hiddenSize else {
            throw ModelError.invalidConfig("text_config.projection_size \(config.textConfig.projectionSize) differs from vision_config.hidden_size \(config.visionConfig.hiddenSize): image and text features would not share a space", file: file)
        }
        self.config = config
        vision = try Siglip2VisionTransformer(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        text = try SiglipTextTransformer(config.textConfig, weights: weights.scoped("text_model"), file: file)
        logitScale = try weights("logit_scale", shape: [1]).scalars[0]
        logitBias = try weights("logit_bias", shape: [1]).scalars[0]
    }

    public var embeddingSize: Int { config.visionConfig.hiddenSize }
    public var textPadding: DualEncoderTextPadding { .fixed(length: Self.textLength) }

    /// `get_image_features(pixel_values, pixel_attention_mask, spatial_shapes).pooler_output`: the attention-pooling
    /// head's output (not normalized) [B, hidden_size].
    ///
    /// - Throws: `ModelError.invalidInput` for pixel values that are not SigLIP 2's flattened patches with their mask
    ///   and grids.
    public func imageFeatures(_ images: ProcessedImages) throws -> Tensor {
        try vision.pooledOutput(images)
    }

    /// `get_text_features(...).pooler_output`: the text head's output (not normalized) [B, projection_size].
    public func textFeatures(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        try text.pooledOutput(inputIds: inputIds, attentionMask: attentionMask)
    }

    /// `logits_per_image`: exp(logit_scale) × cosine similarity + logit_bias, [images, texts].
    public func logitsPerImage(imageFeatures: Tensor, textFeatures: Tensor) -> Tensor {
        sigmoidLossLogits(imageFeatures: imageFeatures, textFeatures: textFeatures, scale: logitScale, bias: logitBias)
    }

    /// The pipeline's scores: each pair's sigmoid, independent of the other labels.
    public func labelProbabilities(logitsPerImage: Tensor) -> Tensor {
        activation(logitsPerImage, .sigmoid)
    }

    /// `return_loss=True`'s loss; see ``ImageTextDualEncoder/contrastiveLoss(logitsPerImage:)``.
    public func contrastiveLoss(logitsPerImage: Tensor) throws -> Float {
        try sigmoidContrastiveLoss(logitsPerImage: logitsPerImage)
    }
}
