import Foundation
import VLMCheckpoint
import VLMTensor

// The ViT image tower of BLIP (transformers' models/blip/modeling_blip.py, `BlipVisionModel`) and BLIP-2
// (models/blip_2/modeling_blip_2.py, `Blip2VisionModel`, EVA-CLIP's ViT-g in the released checkpoints). Both are the
// same network: a patch convolution with bias, a class token, learned positions, pre-norm blocks whose attention
// is one fused `qkv` Linear followed by `projection`, and a final `post_layernorm` — no layer norm before the
// encoder, unlike CLIP. They differ only in defaults and in how the `qkv` bias is stored (see `BlipVisionConfig`).

/// transformers' `BlipVisionConfig` and `Blip2VisionConfig`: one shape, each family's defaults.
public struct BlipVisionConfig: Decodable, Sendable {
    /// Which family's defaults fill the fields config.json leaves out.
    public enum Family: Sendable {
        /// `BlipVisionConfig` (`blip_vision_model`): ViT-B/16 at 384 px, layer norm eps 1e-5.
        case blip
        /// `Blip2VisionConfig` (`blip_2_vision_model`): ViT-g/14 at 224 px, layer norm eps 1e-6.
        case blip2
    }

    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var imageSize: Int
    public var patchSize: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// Whether the attention's `qkv` projection has a bias. BLIP's always does (`qkv.bias`); BLIP-2's has one for
    /// queries and values only, stored as `q_bias` and `v_bias` by the Hub checkpoints and as one `qkv.bias` with a
    /// zero key third by transformers 5's `save_pretrained`.
    public var qkvBias: Bool

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", intermediateSize = "intermediate_size", numHiddenLayers = "num_hidden_layers"
        case numAttentionHeads = "num_attention_heads", imageSize = "image_size", patchSize = "patch_size"
        case hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps", qkvBias = "qkv_bias", modelType = "model_type"
    }

    /// Decodes with the defaults of `model_type`'s family: BLIP's for `blip_vision_model`, BLIP-2's otherwise.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let type = try c.decodeIfPresent(String.self, forKey: .modelType)
        try self.init(from: decoder, family: type == "blip_vision_model" ? .blip : .blip2)
    }

    /// Decodes with `family`'s defaults, as a parent config decodes its `vision_config` whatever its `model_type`.
    public init(from decoder: any Decoder, family: Family) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let blip2 = family == .blip2
        hiddenSize = try c.value(.hiddenSize, default: blip2 ? 1408 : 768)
        intermediateSize = try c.value(.intermediateSize, default: blip2 ? 6144 : 3072)
        numHiddenLayers = try c.value(.numHiddenLayers, default: blip2 ? 39 : 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: blip2 ? 16 : 12)
        imageSize = try c.value(.imageSize, default: blip2 ? 224 : 384)
        patchSize = try c.value(.patchSize, default: blip2 ? 14 : 16)
        hiddenAct = try c.value(.hiddenAct, default: "gelu")
        layerNormEps = try c.value(.layerNormEps, default: blip2 ? 1e-6 : 1e-5)
        // BlipVisionConfig has no qkv_bias: its qkv Linear always has a bias.
        qkvBias = blip2 ? try c.value(.qkvBias, default: true) : true
    }

    var patchesPerSide: Int { imageSize / patchSize }
}

/// What ``BlipVisionModel`` computes for a batch of images.
public struct BlipVisionOutput: Sendable {
    /// Every token after `post_layernorm`, class token first: `[B, 1 + patches, hiddenSize]`.
    public var lastHiddenState: Tensor
    /// The class token with `post_layernorm` applied once more, as transformers' `pooler_output` is: `[B, hiddenSize]`.
    public var pooledOutput: Tensor
}

/// transformers' `BlipVisionModel` / `Blip2VisionModel`.
public final class BlipVisionModel: @unchecked Sendable {
    public let config: BlipVisionConfig
    let patchEmbedding: Conv2d
    let classEmbedding: Tensor
    let positionEmbedding: Tensor
    let layers: [PreNormEncoderLayer]
    let postLayerNorm: LayerNorm

    /// Builds the tower from weights named as under `vision_model.` (`embeddings.…`, `encoder.layers.N.…`,
    /// `post_layernorm.…`).
    public init(_ config: BlipVisionConfig, weights: Weights, file: String) throws {
        guard config.patchSize > 0, config.imageSize % config.patchSize == 0,
              config.numAttentionHeads > 0, config.hiddenSize % config.numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("vision_config: image_size \(config.imageSize) must be a multiple of patch_size \(config.patchSize), hidden_size \(config.hiddenSize) of num_attention_heads \(config.numAttentionHeads)", file: file)
        }
        self.config = config
        let d = config.hiddenSize
        let embeddings = weights.scoped("embeddings")
        // Both families hard-code 3 input channels.
        patchEmbedding = try Conv2d(weight: embeddings("patch_embedding.weight", shape: [d, 3, config.patchSize, config.patchSize]),
                                    bias: embeddings("patch_embedding.bias", shape: [d]), stride: config.patchSize, padding: 0)
        classEmbedding = try embeddings("class_embedding", shape: [1, 1, d])
        let positions = config.patchesPerSide * config.patchesPerSide + 1
        positionEmbedding = try embeddings("position_embedding", shape: [1, positions, d]).reshaped([positions, d])
        let activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        layers = try (0..<config.numHiddenLayers).map { i in
            let layer = weights.scoped("encoder.layers.\(i)")
            return try PreNormEncoderLayer(layer, hiddenSize: d, intermediateSize: config.intermediateSize,
                                           activation: activation, eps: config.layerNormEps,
                                           selfAttention: Self.attention(layer.scoped("self_attn"), config))
        }
        postLayerNorm = try LayerNorm(weights.scoped("post_layernorm"), size: d, eps: config.layerNormEps)
    }

    /// `qkv` [3D, D] with its bias in whichever layout the checkpoint has, and `projection`.
    private static func attention(_ weights: Weights, _ config: BlipVisionConfig) throws -> SelfAttention {
        let d = config.hiddenSize
        let bias: Tensor?
        switch (config.qkvBias, weights.contains("qkv.bias")) {
        case (false, _): bias = nil
        case (true, true): bias = try weights("qkv.bias", shape: [3 * d])
        case (true, false):
            // BLIP-2's original parameters: the keys have no bias.
            bias = try concatenate([weights("q_bias", shape: [d]), Tensor(zeros: [d]), weights("v_bias", shape: [d])], axis: 0)
        }
        return try SelfAttention(queryKeyValue: Linear(weight: weights("qkv.weight", shape: [3 * d, d]), bias: bias),
                                 output: Linear(weights.scoped("projection"), inFeatures: d, outFeatures: d),
                                 heads: config.numAttentionHeads)
    }

    /// pixel_values `[B, 3, imageSize, imageSize]` → every token's state and the pooled class token.
    public func callAsFunction(pixelValues: Tensor) throws -> BlipVisionOutput {
        let expected = [3, config.imageSize, config.imageSize]
        guard pixelValues.rank == 4, Array(pixelValues.shape.dropFirst()) == expected, pixelValues.shape[0] > 0 else {
            throw ModelError.invalidInput("BLIP vision model expects pixel values [batch, \(expected.map(String.init).joined(separator: ", "))], got \(pixelValues.shape)")
        }
        let batch = pixelValues.shape[0], d = config.hiddenSize
        let patches = patchEmbedding(pixelValues, channelsLast: true).reshaped([batch, -1, d])
        let classTokens = concatenate(Array(repeating: classEmbedding, count: batch), axis: 0)
        var hidden = add(concatenate([classTokens, patches], axis: 1), positionEmbedding)
        for layer in layers { hidden = layer(hidden) }
        let lastHiddenState = postLayerNorm(hidden)
        let pooled = postLayerNorm(gatherTokens(lastHiddenState, positions: Array(repeating: 0, count: batch)))
        return BlipVisionOutput(lastHiddenState: lastHiddenState, pooledOutput: pooled)
    }
}
