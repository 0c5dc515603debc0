import Foundation
import VLMCheckpoint
import VLMTensor

// CLIPSeg (Lüddecke and Ecker 2022) as transformers' models/clipseg/modeling_clipseg.py builds it: a frozen CLIP whose
// vision tower is read at a few layers, and a small transformer decoder over those activations, conditioned on a
// text's or an example image's CLIP embedding (FiLM), that upsamples its patch tokens back to pixels.

/// transformers' `CLIPSegConfig`, with its defaults. Its text and vision towers are CLIP's, with CLIP's defaults.
public struct CLIPSegConfig: Decodable, Sendable {
    public var textConfig: CLIPTextConfig
    public var visionConfig: CLIPVisionConfig
    public var projectionDim: Int
    /// The vision layers whose outputs the decoder reads (0 is the first layer's output).
    public var extractLayers: [Int]
    /// The decoder's width.
    public var reduceDim: Int
    public var decoderNumAttentionHeads: Int
    public var decoderIntermediateSize: Int
    /// The decoder step (0 is the first, which reads the deepest extracted layer) whose input FiLM conditions.
    public var conditionalLayer: Int
    /// A 3×3 convolution and two transposed convolutions of kernel `patch_size / 4` (the "refined" checkpoints)
    /// instead of one transposed convolution of kernel `patch_size`.
    public var useComplexTransposedConvolution: Bool
    // decoder_hidden_act is not read: transformers' decoder layers use ReLU whatever it says.

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config"
        case textConfigDict = "text_config_dict", visionConfigDict = "vision_config_dict"
        case projectionDim = "projection_dim", extractLayers = "extract_layers", reduceDim = "reduce_dim"
        case decoderNumAttentionHeads = "decoder_num_attention_heads", decoderIntermediateSize = "decoder_intermediate_size"
        case conditionalLayer = "conditional_layer", useComplexTransposedConvolution = "use_complex_transposed_convolution"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = Data("{}".utf8)
        // The legacy `*_config_dict` keys win: transformers rebuilds the sub-config from them, defaults filled in, and
        // lets that replace every field of `*_config`. Absent both, a sub-config takes all its defaults.
        textConfig = try c.decodeIfPresent(CLIPTextConfig.self, forKey: .textConfigDict)
            ?? c.decodeIfPresent(CLIPTextConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(CLIPTextConfig.self, from: defaults)
        visionConfig = try c.decodeIfPresent(CLIPVisionConfig.self, forKey: .visionConfigDict)
            ?? c.decodeIfPresent(CLIPVisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(CLIPVisionConfig.self, from: defaults)
        projectionDim = try c.value(.projectionDim, default: 512)
        extractLayers = try c.value(.extractLayers, default: [3, 6, 9])
        reduceDim = try c.value(.reduceDim, default: 64)
        decoderNumAttentionHeads = try c.value(.decoderNumAttentionHeads, default: 4)
        decoderIntermediateSize = try c.value(.decoderIntermediateSize, default: 2048)
        conditionalLayer = try c.value(.conditionalLayer, default: 0)
        useComplexTransposedConvolution = try c.value(.useComplexTransposedConvolution, default: false)
    }

    var clip: CLIPConfig { CLIPConfig(textConfig: textConfig, visionConfig: visionConfig, projectionDim: projectionDim) }
}

/// `CLIPSegDecoderLayer`: CLIP's encoder block with the norms after the attention and the MLP instead of before.
struct CLIPSegDecoderLayer {
    let selfAttention: SelfAttention
    let layerNorm1: LayerNorm
    let mlp: FeedForward
    let layerNorm2: LayerNorm

    init(_ weights: Weights, hiddenSize: Int, intermediateSize: Int, heads: Int, eps: Float) throws {
        selfAttention = try SelfAttention(weights.scoped("self_attn"), hiddenSize: hiddenSize, heads: heads)
        layerNorm1 = try LayerNorm(weights.scoped("layer_norm1"), size: hiddenSize, eps: eps)
        mlp = try FeedForward(weights.scoped("mlp"), hiddenSize: hiddenSize, intermediateSize: intermediateSize,
                              activation: .relu)
        layerNorm2 = try LayerNorm(weights.scoped("layer_norm2"), size: hiddenSize, eps: eps)
    }

    func callAsFunction(_ x: Tensor) -> Tensor {
        let attended = layerNorm1(selfAttention(x, causal: false, keyPaddingMask: nil, residual: x))
        return layerNorm2(mlp(attended, residual: attended))
    }
}

/// `CLIPSegDecoder`: each extracted activation, deepest first, reduced to `reduce_dim` and added to the running
/// state, FiLM-conditioned at `conditional_layer`, through a decoder layer; then the patch tokens (class token dropped)
/// as an image, upsampled by transposed convolutions to one logit per pixel.
final class CLIPSegDecoder: Sendable {
    let filmMul: Linear
    let filmAdd: Linear
    let reduces: [Linear]
    let layers: [CLIPSegDecoderLayer]
    let conditionalLayer: Int
    let upsampling: Upsampling

    /// `transposed_convolution`: one layer, or the refined stack (`nn.Sequential` indices 0, 2 and 4; ReLUs between).
    enum Upsampling {
        case simple(ConvTranspose2d)
        case complex(Conv2d, ConvTranspose2d, ConvTranspose2d)
    }

    init(_ config: CLIPSegConfig, weights: Weights, file: String) throws {
        let (reduce, vision) = (config.reduceDim, config.visionConfig)
        guard reduce > 0, config.decoderNumAttentionHeads > 0, reduce % config.decoderNumAttentionHeads == 0 else {
            throw ModelError.invalidConfig("reduce_dim \(reduce) is not a positive multiple of decoder_num_attention_heads \(config.decoderNumAttentionHeads)", file: file)
        }
        filmMul = try Linear(weights.scoped("film_mul"), inFeatures: config.projectionDim, outFeatures: reduce)
        filmAdd = try Linear(weights.scoped("film_add"), inFeatures: config.projectionDim, outFeatures: reduce)
        reduces = try config.extractLayers.indices.map { i in
            try Linear(weights.scoped("reduces.\(i)"), inFeatures: vision.hiddenSize, outFeatures: reduce)
        }
        // The decoder layers copy the vision config's layer_norm_eps.
        layers = try config.extractLayers.indices.map { i in
            try CLIPSegDecoderLayer(weights.scoped("layers.\(i)"), hiddenSize: reduce,
                                    intermediateSize: config.decoderIntermediateSize,
                                    heads: config.decoderNumAttentionHeads, eps: vision.layerNormEps)
        }
        conditionalLayer = config.conditionalLayer
        let convolution = weights.scoped("transposed_convolution")
        let patch = vision.patchSize
        if config.useComplexTransposedConvolution {
            let kernel = patch / 4
            guard kernel > 0, reduce >= 2 else {
                throw ModelError.invalidConfig("use_complex_transposed_convolution needs patch_size of at least 4 and reduce_dim of at least 2, got \(patch) and \(reduce)", file: file)
            }
            let (first, second, third) = (convolution.scoped("0"), convolution.scoped("2"), convolution.scoped("4"))
            upsampling = .complex(
                try Conv2d(weight: first("weight", shape: [reduce, reduce, 3, 3]), bias: first("bias", shape: [reduce]),
                           stride: 1, padding: 1),
                try ConvTranspose2d(weight: second("weight", shape: [reduce, reduce / 2, kernel, kernel]),
                                    bias: second("bias", shape: [reduce / 2]), stride: kernel),
                try ConvTranspose2d(weight: third("weight", shape: [reduce / 2, 1, kernel, kernel]),
                                    bias: third("bias", shape: [1]), stride: kernel))
        } else {
            upsampling = .simple(try ConvTranspose2d(weight: convolution("weight", shape: [reduce, 1, patch, patch]),
                                                     bias: convolution("bias", shape: [1]), stride: patch))
        }
    }

    /// `activations` in `extract_layers` order, each [1 or B, 1 + patches, hidden]; `conditional` [B, projection_dim]
    /// → logits [B, H', W']. Activations of one image serve every conditional embedding.
    func callAsFunction(_ activations: [Tensor], conditional: Tensor) throws -> Tensor {
        let batch = conditional.shape[0]
        var output: Tensor?
        for (i, (hidden, (layer, reduce))) in zip(activations.reversed(), zip(layers, reduces)).enumerated() {
            var reduced = reduce(hidden)
            if reduced.shape[0] != batch { reduced = concatenate(Array(repeating: reduced, count: batch), axis: 0) }
            var state = output.map { add(reduced, $0) } ?? reduced
            if i == conditionalLayer {
                state = modulated(state, scale: filmMul(conditional), shift: filmAdd(conditional))
            }
            output = layer(state)
        }
        guard let output else { throw ModelError.invalidInput("CLIPSeg decoder got no activations") }
        let (tokens, width) = (output.shape[1] - 1, output.shape[2])
        let side = Int(Double(tokens).squareRoot())
        guard side * side == tokens else {
            throw ModelError.invalidInput("CLIPSeg decodes square patch grids; \(tokens) patches are not one (a non-square image?)")
        }
        let image = channelsFirst(sequenceSlice(output, 1..<(1 + tokens))).reshaped([batch, width, side, side])
        let logits: Tensor
        switch upsampling {
        case let .simple(transposed):
            logits = transposed(image)
        case let .complex(convolution, first, second):
            logits = second(activation(first(activation(convolution(image), .relu)), .relu))
        }
        return logits.reshaped([batch, logits.shape[2], logits.shape[3]])
    }
}

/// transformers' `CLIPSegForImageSegmentation`: CLIP (its vision tower taking any image size, position embeddings
/// interpolated) and the decoder. The query image's activations come from the vision tower's `extract_layers`; the
/// conditional embedding is CLIP's projected text or image feature.
public final class CLIPSegForImageSegmentation: ZeroShotSegmentationModel {
    public let config: CLIPSegConfig
    let clip: CLIPModel
    let decoder: CLIPSegDecoder
    /// `hidden_states` indices of the extracted layers (index 0 is the embeddings).
    let hiddenStateIndices: [Int]

    /// Loads config.json and the safetensors weights of a checkpoint directory.
    public convenience init(directory: ModelDirectory) throws {
        try self.init(config: directory.decode(CLIPSegConfig.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: directory.url.appendingPathComponent("config.json").path)
    }

    public init(config: CLIPSegConfig, weights: Weights, file: String = "config.json") throws {
        let states = config.visionConfig.numHiddenLayers + 1
        guard !config.extractLayers.isEmpty, config.extractLayers.allSatisfy({ (-states..<states).contains($0 + 1) }) else {
            throw ModelError.invalidConfig("extract_layers \(config.extractLayers) must name layers of the \(config.visionConfig.numHiddenLayers)-layer vision model", file: file)
        }
        self.config = config
        clip = try CLIPModel(config: config.clip, weights: weights.scoped("clip"), file: file, interpolatesPositions: true)
        decoder = try CLIPSegDecoder(config, weights: weights.scoped("decoder"), file: file)
        hiddenStateIndices = config.extractLayers.map { $0 + 1 }
    }

    /// transformers' `CLIPSegModel` of a CLIPSeg checkpoint: its CLIP (the `clip.*` weights; the decoder's are not
    /// read) taking images of any size, as the zero-shot-image-classification pipeline and `get_image_features` /
    /// `get_text_features` load it.
    public static func clipModel(directory: ModelDirectory) throws -> CLIPModel {
        let file = directory.url.appendingPathComponent("config.json").path
        return try CLIPModel(config: directory.decode(CLIPSegConfig.self).clip,
                             weights: Weights(WeightStore(directory: directory.url)).scoped("clip"), file: file,
                             interpolatesPositions: true)
    }

    public var maxTextLength: Int { config.textConfig.maxPositionEmbeddings }
    public var probabilities: SegmentationProbabilities { .sigmoid }
    public var textPadding: SegmentationTextPadding { .maxLength }

    /// `get_text_features`: projected text embeddings [texts, projection_dim].
    public func conditionalEmbeddings(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        try clip.textFeatures(inputIds: inputIds, attentionMask: attentionMask)
    }

    /// `get_image_features` of example images, [images, projection_dim].
    public func conditionalEmbeddings(pixelValues: Tensor) throws -> Tensor {
        try clip.imageFeatures(pixelValues: pixelValues)
    }

    /// transformers' `logits`: [B, H', W'] (H' = image height / patch_size · patch_size for the simple upsampling).
    public func segmentationLogits(pixelValues: Tensor, conditionalEmbeddings: Tensor) throws -> Tensor {
        let batch = conditionalEmbeddings.shape.first ?? 0
        guard conditionalEmbeddings.rank == 2, conditionalEmbeddings.shape[1] == config.projectionDim, batch > 0 else {
            throw ModelError.invalidInput("CLIPSeg conditional embeddings must be [batch, \(config.projectionDim)], got \(conditionalEmbeddings.shape)")
        }
        guard pixelValues.rank == 4, pixelValues.shape[0] == batch || pixelValues.shape[0] == 1 else {
            throw ModelError.invalidInput("CLIPSeg needs one query image or one per conditional embedding (\(batch)), got pixel values \(pixelValues.shape)")
        }
        let activations = try clip.vision.hiddenStates(pixelValues, at: hiddenStateIndices)
        return try decoder(activations, conditional: conditionalEmbeddings)
    }
}
