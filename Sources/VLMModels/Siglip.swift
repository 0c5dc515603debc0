import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// SigLIP (Zhai et al. 2023) as transformers' models/siglip/modeling_siglip.py builds it: CLIP's two towers trained
// with a sigmoid loss, so an image–text pair's logit is a probability on its own (no softmax over the texts). The
// vision tower has no class token: an attention-pooling head reads its patches. The text tower is not causal and
// pools its last position, padding included, which is why its texts are always padded to the same length.

/// transformers' `SiglipTextConfig`, with its defaults.
public struct SiglipTextConfig: Decodable, Sendable {
    public var vocabSize: Int
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var maxPositionEmbeddings: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// The width of the pooled output's `head` projection; `hidden_size` when absent or null.
    public var projectionSize: Int

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case maxPositionEmbeddings = "max_position_embeddings", hiddenAct = "hidden_act"
        case layerNormEps = "layer_norm_eps", projectionSize = "projection_size"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 32000)
        hiddenSize = try c.value(.hiddenSize, default: 768)
        intermediateSize = try c.value(.intermediateSize, default: 3072)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 12)
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 64)
        hiddenAct = try c.value(.hiddenAct, default: "gelu_pytorch_tanh")
        layerNormEps = try c.value(.layerNormEps, default: 1e-6)
        projectionSize = try c.value(.projectionSize, default: hiddenSize)
    }
}

/// transformers' `SiglipVisionConfig`, with its defaults.
public struct SiglipVisionConfig: Decodable, Sendable {
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var numChannels: Int
    public var imageSize: Int
    public var patchSize: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// Whether the tower has its multihead attention-pooling head (`head.…`), whose output is the pooled output.
    public var visionUseHead: Bool

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case numChannels = "num_channels", imageSize = "image_size", patchSize = "patch_size"
        case hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps", visionUseHead = "vision_use_head"
    }

    /// The defaults of the fields a containing config overrides: `SiglipVisionConfig`'s own here; a VLM that embeds
    /// the tower (LLaVA-OneVision's SigLIP so400m, headless) passes the ones its config class gives `vision_config`.
    struct Defaults {
        var hiddenSize = 768, intermediateSize = 3072, numHiddenLayers = 12, numAttentionHeads = 12
        var imageSize = 224, patchSize = 16
        var visionUseHead = true

        static let siglip = Defaults()
    }

    public init(from decoder: any Decoder) throws { try self.init(from: decoder, defaults: .siglip) }

    init(from decoder: any Decoder, defaults: Defaults) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        hiddenSize = try c.value(.hiddenSize, default: defaults.hiddenSize)
        intermediateSize = try c.value(.intermediateSize, default: defaults.intermediateSize)
        numHiddenLayers = try c.value(.numHiddenLayers, default: defaults.numHiddenLayers)
        numAttentionHeads = try c.value(.numAttentionHeads, default: defaults.numAttentionHeads)
        numChannels = try c.value(.numChannels, default: 3)
        imageSize = try c.value(.imageSize, default: defaults.imageSize)
        patchSize = try c.value(.patchSize, default: defaults.patchSize)
        hiddenAct = try c.value(.hiddenAct, default: "gelu_pytorch_tanh")
        layerNormEps = try c.value(.layerNormEps, default: 1e-6)
        visionUseHead = try c.value(.visionUseHead, default: defaults.visionUseHead)
    }

    var patchesPerSide: Int { imageSize / patchSize }
}

/// transformers' `SiglipConfig`: both towers.
public struct SiglipConfig: Decodable, Sendable {
    public var textConfig: SiglipTextConfig
    public var visionConfig: SiglipVisionConfig

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        // An absent sub-config means all of its defaults, as SiglipConfig(text_config=None) does.
        textConfig = try c.decodeIfPresent(SiglipTextConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(SiglipTextConfig.self, from: Data("{}".utf8))
        visionConfig = try c.decodeIfPresent(SiglipVisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(SiglipVisionConfig.self, from: Data("{}".utf8))
    }
}

/// `SiglipMultiheadAttentionPoolingHead` (and SigLIP 2's): a learned probe token attends over the tower's
/// post-layernormed patches (`nn.MultiheadAttention`, its q/k/v stacked in `in_proj_weight`), then a pre-norm MLP
/// with its residual.
struct SiglipAttentionPoolingHead {
    /// The probe through the query projection, the same for every image, so computed once.
    let query: Tensor
    let key: Linear
    let value: Linear
    let output: Linear
    let layerNorm: LayerNorm
    let mlp: FeedForward
    let heads: Int

    init(_ weights: Weights, hiddenSize d: Int, intermediateSize: Int, heads: Int, eps: Float, activation: Activation) throws {
        let attention = weights.scoped("attention")
        // Rows [0, d) of the stacked projections are the query's, [d, 2d) the key's, [2d, 3d) the value's.
        let weight = try attention("in_proj_weight", shape: [3 * d, d]).reshaped([1, 3 * d, d])
        let bias = try attention("in_proj_bias", shape: [3 * d]).reshaped([1, 3 * d])
        func projection(_ part: Int) throws -> Linear {
            let rows = (part * d)..<((part + 1) * d)
            return try Linear(weight: sequenceSlice(weight, rows).reshaped([d, d]), bias: sequenceSlice(bias, rows).reshaped([d]))
        }
        query = try projection(0)(weights("probe", shape: [1, 1, d]))
        key = try projection(1)
        value = try projection(2)
        output = try Linear(attention.scoped("out_proj"), inFeatures: d, outFeatures: d)
        layerNorm = try LayerNorm(weights.scoped("layernorm"), size: d, eps: eps)
        mlp = try FeedForward(weights.scoped("mlp"), hiddenSize: d, intermediateSize: intermediateSize,
                              activation: activation)
        self.heads = heads
    }

    /// The tower's post-layernormed last hidden state [B, T, D] → the pooled output [B, D]; the probe reads only the
    /// tokens where `keyPaddingMask` [B, T] is 1 (SigLIP 2's padded patches are 0).
    func callAsFunction(_ hidden: Tensor, keyPaddingMask: Tensor? = nil) -> Tensor {
        let batch = hidden.shape[0]
        let queries = concatenate(Array(repeating: query, count: batch), axis: 0)
        let attended = output(attention(query: queries, key: key(hidden), value: value(hidden), heads: heads,
                                        keyPaddingMask: keyPaddingMask))
            .reshaped([batch, hidden.shape[2]])
        return mlp(layerNorm(attended), residual: attended)
    }
}

/// `SiglipVisionModel` (in 5.23 the transformer itself, without the `vision_model.` level older checkpoints of it
/// have): a patch-embedding convolution plus learned positions, a pre-norm encoder, post_layernorm, and the
/// attention-pooling head when `vision_use_head`. A VLM reads its hidden states through ``hiddenStates(_:at:)``.
final class SiglipVisionTransformer: Sendable {
    let config: SiglipVisionConfig
    let patchEmbedding: Conv2d
    let positionEmbedding: Tensor
    let layers: [PreNormEncoderLayer]
    let postLayerNorm: LayerNorm
    let head: SiglipAttentionPoolingHead?

    /// `weights` scoped to where `embeddings.…`, `encoder.…`, `post_layernorm.…` and `head.…` are.
    init(_ config: SiglipVisionConfig, weights: Weights, file: String) throws {
        // The image size need not be a multiple of the patch size: so400m-patch14-384's 384 pixels make 27 patches
        // a side, the convolution dropping the last 6, as in transformers.
        guard config.patchSize > 0, config.imageSize >= config.patchSize,
              config.numAttentionHeads > 0, config.hiddenSize % config.numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("vision_config: image_size \(config.imageSize) must be at least patch_size \(config.patchSize), hidden_size a multiple of num_attention_heads \(config.numAttentionHeads) (it is \(config.hiddenSize))", file: file)
        }
        self.config = config
        let d = config.hiddenSize
        let embeddings = weights.scoped("embeddings")
        patchEmbedding = try Conv2d(
            weight: embeddings("patch_embedding.weight", shape: [d, config.numChannels, config.patchSize, config.patchSize]),
            bias: embeddings("patch_embedding.bias", shape: [d]), stride: config.patchSize, padding: 0)
        positionEmbedding = try embeddings("position_embedding.weight", shape: [config.patchesPerSide * config.patchesPerSide, d])
        let activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        layers = try (0..<config.numHiddenLayers).map { i in
            try PreNormEncoderLayer(weights.scoped("encoder.layers.\(i)"), hiddenSize: d,
                                    intermediateSize: config.intermediateSize, heads: config.numAttentionHeads,
                                    activation: activation, eps: config.layerNormEps)
        }
        postLayerNorm = try LayerNorm(weights.scoped("post_layernorm"), size: d, eps: config.layerNormEps)
        head = config.visionUseHead
            ? try SiglipAttentionPoolingHead(weights.scoped("head"), hiddenSize: d, intermediateSize: config.intermediateSize,
                                             heads: config.numAttentionHeads, eps: config.layerNormEps, activation: activation)
            : nil
    }

    /// pixel_values [B, C, S, S] → the attention-pooling head's output [B, D] (transformers' pooler_output).
    func pooledOutput(_ pixelValues: Tensor) throws -> Tensor {
        guard let head else {
            throw ModelError.invalidInput("the SigLIP vision tower has no pooling head (vision_use_head is false)")
        }
        return head(try lastHiddenState(pixelValues))
    }

    /// transformers' `hidden_states[i]` for each `i` of `indices` ([B, patches, D] each): 0 is the embeddings, `i`
    /// the output of encoder layer `i`, and a negative index counts from the end as Python's does (-1 is the last
    /// layer's output, without post_layernorm). Layers past the deepest one asked for are not run.
    func hiddenStates(_ pixelValues: Tensor, at indices: [Int]) throws -> [Tensor] {
        try encoderHiddenStates(layers: layers, at: indices) { try embeddings(pixelValues) }
    }

    /// pixel_values [B, C, S, S] → the last layer's output after post_layernorm, [B, patches, D] (transformers'
    /// `last_hidden_state`, what Gemma 3's projector reads).
    func lastHiddenState(_ pixelValues: Tensor) throws -> Tensor {
        var hidden = try embeddings(pixelValues)
        for layer in layers { hidden = layer(hidden) }
        return postLayerNorm(hidden)
    }

    /// pixel_values [B, C, S, S] → patch embeddings plus positions (no class token, no pre-layernorm).
    private func embeddings(_ pixelValues: Tensor) throws -> Tensor {
        let expected = [config.numChannels, config.imageSize, config.imageSize]
        guard pixelValues.rank == 4, Array(pixelValues.shape.dropFirst()) == expected else {
            throw ModelError.invalidInput("SigLIP vision model expects pixel values [batch, \(expected.map(String.init).joined(separator: ", "))], got \(pixelValues.shape)")
        }
        let patches = patchEmbedding(pixelValues, channelsLast: true).reshaped([pixelValues.shape[0], -1, config.hiddenSize])
        return add(patches, positionEmbedding)
    }
}

/// `SiglipTextModel`: token + position embeddings, a bidirectional pre-norm encoder, final norm, the last position
/// pooled and projected by `head`.
final class SiglipTextTransformer: Sendable {
    let encoder: PreNormTextEncoder
    let head: Linear

    init(_ config: SiglipTextConfig, weights: Weights, file: String) throws {
        encoder = try PreNormTextEncoder(weights, family: "SigLIP", vocabSize: config.vocabSize, hiddenSize: config.hiddenSize,
                                         intermediateSize: config.intermediateSize, heads: config.numAttentionHeads,
                                         layerCount: config.numHiddenLayers, maxPositions: config.maxPositionEmbeddings,
                                         hiddenAct: config.hiddenAct, eps: config.layerNormEps, file: file)
        head = try Linear(weights.scoped("head"), inFeatures: config.hiddenSize, outFeatures: config.projectionSize)
    }

    /// input_ids [B][T] (all rows the same length) → `head` of the final-normed last position [B, projection_size].
    func pooledOutput(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        head(try encoder.pooledOutput(inputIds: inputIds, attentionMask: attentionMask, causal: false,
                                      pooledAt: { $0.count - 1 }))
    }
}

/// transformers' `SiglipModel`: both towers, the learned temperature and bias of the sigmoid logits.
public final class SiglipModel: ImageTextDualEncoder {
    /// The length transformers' zero-shot-image-classification pipeline pads SigLIP's prompts to (`max_length=64`,
    /// SiglipTokenizer's default `model_max_length`, which embeddings are padded to).
    public static let zeroShotTextLength = 64

    public let config: SiglipConfig
    let vision: SiglipVisionTransformer
    let text: SiglipTextTransformer
    public let logitScale: Float
    public let logitBias: Float

    /// Loads config.json and the safetensors weights of a checkpoint directory.
    public convenience init(directory: ModelDirectory) throws {
        try self.init(config: directory.decode(SiglipConfig.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: directory.url.appendingPathComponent("config.json").path)
    }

    public init(config: SiglipConfig, weights: Weights, file: String = "config.json") throws {
        // Without the head 5.23's get_image_features has no pooler_output and SiglipModel's forward fails.
        guard config.visionConfig.visionUseHead else {
            throw ModelError.invalidConfig("vision_config.vision_use_head is false: SiglipModel's image features are its attention-pooling head's output", file: file)
        }
        guard config.textConfig.projectionSize == config.visionConfig.hiddenSize else {
            throw ModelError.invalidConfig("text_config.projection_size \(config.textConfig.projectionSize) differs from vision_config.hidden_size \(config.visionConfig.hiddenSize): image and text features would not share a space", file: file)
        }
        self.config = config
        vision = try SiglipVisionTransformer(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        text = try SiglipTextTransformer(config.textConfig, weights: weights.scoped("text_model"), file: file)
        logitScale = try weights("logit_scale", shape: [1]).scalars[0]
        logitBias = try weights("logit_bias", shape: [1]).scalars[0]
    }

    public var imageSize: Int { config.visionConfig.imageSize }
    public var embeddingSize: Int { config.visionConfig.hiddenSize }
    public var textPadding: DualEncoderTextPadding { .maxLength(zeroShotLength: Self.zeroShotTextLength) }

    /// `get_image_features(...).pooler_output`: the attention-pooling head's output (not normalized) [B, hidden_size].
    public func imageFeatures(pixelValues: Tensor) throws -> Tensor {
        try vision.pooledOutput(pixelValues)
    }

    /// ``imageFeatures(pixelValues:)`` of the image processor's pixel values.
    public func imageFeatures(_ images: ProcessedImages) throws -> Tensor {
        try imageFeatures(pixelValues: images.pixelValues)
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

/// SigLIP's and SigLIP 2's `logits_per_image`: exp(`scale`) × the cosine similarity of each image–text pair + `bias`,
/// [images, texts].
func sigmoidLossLogits(imageFeatures: Tensor, textFeatures: Tensor, scale: Float, bias: Float) -> Tensor {
    let similarity = matmul(l2Normalized(imageFeatures), l2Normalized(textFeatures), transposeB: true)
    let biases = Tensor(shape: [textFeatures.shape[0]], scalars: Array(repeating: bias, count: textFeatures.shape[0]))
    return add(scaled(similarity, by: Float(exp(Double(scale)))), biases)
}
