import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// LLaVA (Liu et al. 2023) as transformers' models/llava/modeling_llava.py builds `LlavaForConditionalGeneration`: a
// CLIP vision tower (CLIP.swift) read at an inner layer, a two-layer MLP projecting its patch features into the
// language model's embedding space, and a Llama-family decoder (Llama.swift) that reads them where the prompt holds
// its image tokens.

/// transformers' `LlavaConfig`, with its defaults (LLaVA-1.5-7B's).
public struct LlavaConfig: Decodable, Sendable {
    /// The CLIP vision tower's config; what it leaves out takes LLaVA's defaults (ViT-L/14 at 336 pixels).
    public var visionConfig: CLIPVisionConfig
    /// The language model's config (`llama`, `mistral`, `qwen2`, `qwen3` or `smollm3`; Llama's defaults when absent).
    public var textConfig: LlamaConfig
    /// The token id that marks where image features go (`image_token_index`, also read as `image_token_id`).
    public var imageTokenIndex: Int
    /// The activation between the projector's two linear layers.
    public var projectorHiddenAct: String
    /// Which of the vision tower's hidden states the projector reads, as indices into transformers' `hidden_states`
    /// (0 the embeddings, -1 the last layer's output); several are concatenated along the feature axis.
    public var visionFeatureLayers: [Int]
    /// `"default"` drops the class token from the vision features, `"full"` keeps it.
    public var visionFeatureSelectStrategy: String
    /// Whether the projector's linear layers have biases.
    public var multimodalProjectorBias: Bool

    enum CodingKeys: String, CodingKey {
        case visionConfig = "vision_config", textConfig = "text_config"
        case imageTokenIndex = "image_token_index", imageTokenId = "image_token_id"
        case projectorHiddenAct = "projector_hidden_act", visionFeatureLayer = "vision_feature_layer"
        case visionFeatureSelectStrategy = "vision_feature_select_strategy"
        case multimodalProjectorBias = "multimodal_projector_bias"
    }

    /// `vision_config` read with LLaVA's defaults, as `LlavaConfig` builds it.
    private struct VisionConfig: Decodable {
        let config: CLIPVisionConfig
        init(from decoder: any Decoder) throws { config = try CLIPVisionConfig(from: decoder, defaults: .llava) }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let empty = Data("{}".utf8)
        // An absent sub-config means all of its defaults, as LlavaConfig(vision_config=None) does.
        visionConfig = try (c.decodeIfPresent(VisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(VisionConfig.self, from: empty)).config
        textConfig = try c.decodeIfPresent(LlamaConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(LlamaConfig.self, from: empty)
        guard LlamaConfig.supportedModelTypes.contains(textConfig.modelType) else {
            throw DecodingError.dataCorruptedError(forKey: .textConfig, in: c,
                                                   debugDescription: "text_config.model_type \"\(textConfig.modelType)\" is not supported here (supported: \(LlamaConfig.supportedModelTypes.joined(separator: ", ")))")
        }
        imageTokenIndex = try c.decodeIfPresent(Int.self, forKey: .imageTokenIndex)
            ?? c.decodeIfPresent(Int.self, forKey: .imageTokenId) ?? 32000
        projectorHiddenAct = try c.value(.projectorHiddenAct, default: "gelu")
        if let layers = try? c.decodeIfPresent([Int].self, forKey: .visionFeatureLayer) {
            visionFeatureLayers = layers
        } else {
            visionFeatureLayers = [try c.value(.visionFeatureLayer, default: -2)]
        }
        visionFeatureSelectStrategy = try c.value(.visionFeatureSelectStrategy, default: "default")
        multimodalProjectorBias = try c.value(.multimodalProjectorBias, default: true)
    }

    /// Image tokens per image, and so rows of its features: one per patch, plus the class token under `"full"`.
    public var imageTokensPerImage: Int {
        visionConfig.patchesPerSide * visionConfig.patchesPerSide + (visionFeatureSelectStrategy == "full" ? 1 : 0)
    }
}

/// transformers' `LlavaMultiModalProjector` (and LLaVA-NeXT's, the same): `linear_2(act(linear_1(features)))`, from the
/// vision features (concatenated over the feature layers) to the language model's width.
struct LlavaMultiModalProjector {
    let linear1: Linear
    let linear2: Linear
    let activation: Activation

    init(_ weights: Weights, config: LlavaConfig, file: String) throws {
        try self.init(weights, inWidth: config.visionConfig.hiddenSize * config.visionFeatureLayers.count,
                      width: config.textConfig.hiddenSize, bias: config.multimodalProjectorBias,
                      activation: config.projectorHiddenAct, file: file)
    }

    /// From `inWidth` (the vision width times the feature layers) to the language model's `width`.
    init(_ weights: Weights, inWidth: Int, width: Int, bias: Bool, activation name: String, file: String) throws {
        linear1 = try Linear(weights.scoped("linear_1"), inFeatures: inWidth, outFeatures: width, bias: bias)
        linear2 = try Linear(weights.scoped("linear_2"), inFeatures: width, outFeatures: width, bias: bias)
        activation = try Activation(huggingFaceName: name, file: file)
    }

    func callAsFunction(_ features: Tensor) -> Tensor { linear2(linear1(features, activation: activation)) }
}

/// A vision tower a LLaVA-family model reads by `hidden_states` index: CLIP's, SigLIP's (LLaVA-OneVision).
protocol LlavaVisionTower: Sendable {
    /// transformers' `hidden_states[i]` for each of `indices`, `[B, tokens, D]` each.
    func hiddenStates(_ pixelValues: Tensor, at indices: [Int]) throws -> [Tensor]
}

extension CLIPVisionTransformer: LlavaVisionTower {}

/// The image side LLaVA and LLaVA-NeXT share (LLaVA-OneVision too, over a SigLIP tower), their `get_image_features` up to the projector: the CLIP tower's hidden
/// states at `vision_feature_layer`, the class token dropped under `"default"`, concatenated along the feature axis,
/// projected into the language model's width.
struct LlavaImageEncoder {
    let visionTower: any LlavaVisionTower
    let projector: LlavaMultiModalProjector
    let featureLayers: [Int]
    let dropsClassToken: Bool

    /// Finds the tower and the projector in any of the layouts transformers 5.23 loads (see
    /// ``LlavaForConditionalGeneration/init(config:weights:file:)``); `file` is what configuration errors name.
    init(config: LlavaConfig, weights: Weights, file: String) throws {
        try Self.validate(strategy: config.visionFeatureSelectStrategy, layers: config.visionFeatureLayers,
                          towerLayers: config.visionConfig.numHiddenLayers, file: file)
        visionTower = try CLIPVisionTransformer(
            config.visionConfig,
            weights: weights.scoped(firstOf: ["vision_tower", "vision_tower.vision_model", "model.vision_tower", "model.vision_tower.vision_model"],
                                    holding: "embeddings.class_embedding"),
            file: file)
        projector = try LlavaMultiModalProjector(weights.scoped(firstOf: ["multi_modal_projector", "model.multi_modal_projector"],
                                                                holding: "linear_1.weight"),
                                                 config: config, file: file)
        featureLayers = config.visionFeatureLayers
        dropsClassToken = config.visionFeatureSelectStrategy == "default"
    }

    init(visionTower: any LlavaVisionTower, projector: LlavaMultiModalProjector, featureLayers: [Int], dropsClassToken: Bool) {
        (self.visionTower, self.projector, self.featureLayers, self.dropsClassToken) = (visionTower, projector, featureLayers, dropsClassToken)
    }

    /// Refuses a feature selection strategy other than "default" and "full", and feature layers that do not index
    /// the `towerLayers + 1` hidden states.
    static func validate(strategy: String, layers: [Int], towerLayers: Int, file: String) throws {
        guard ["default", "full"].contains(strategy) else {
            throw ModelError.invalidConfig("vision_feature_select_strategy \"\(strategy)\" is neither \"default\" nor \"full\"", file: file)
        }
        let hiddenStates = towerLayers + 1
        guard !layers.isEmpty, layers.allSatisfy({ $0 >= -hiddenStates && $0 < hiddenStates }) else {
            throw ModelError.invalidConfig("vision_feature_layer \(layers) must index the vision tower's \(hiddenStates) hidden states", file: file)
        }
    }

    /// `[B, features per image, text hiddenSize]` for pixel values `[B, 3, imageSize, imageSize]`.
    func callAsFunction(_ pixelValues: Tensor) throws -> Tensor {
        projector(try visionFeatures(pixelValues))
    }

    /// What the projector reads: `[B, features per image, vision hiddenSize × feature layers]`.
    func visionFeatures(_ pixelValues: Tensor) throws -> Tensor {
        var states = try visionTower.hiddenStates(pixelValues, at: featureLayers)
        if dropsClassToken {
            states = states.map { sequenceSlice($0, 1..<$0.shape[1]) }
        }
        return states.count == 1 ? states[0] : concatenate(states, axis: 2)
    }
}

/// The Llama, Mistral, Qwen2, Qwen3 or SmolLM3 language model of a LLaVA or LLaVA-NeXT checkpoint, its decoder under
/// `language_model.model.` (as 5.23 saves it and llava-hf publishes it) or `model.language_model.` (as 5.23's modules
/// name it), its head `language_model.lm_head.weight` or `lm_head.weight` (the token embeddings when `config` ties
/// them).
func llavaLanguageModel(config: LlamaConfig, weights: Weights, file: String) throws -> LlamaForCausalLM {
    // LlamaForCausalLM names its weights `model.…` and `lm_head.weight`, as a Llama checkpoint does.
    let decoder = weights.scoped(firstOf: ["language_model.model", "model.language_model"], holding: "embed_tokens.weight")
    let lmHead = weights.contains("language_model.lm_head.weight") ? "language_model.lm_head.weight" : "lm_head.weight"
    return try LlamaForCausalLM(config: config, file: file) { name, shape in
        if name == "lm_head.weight" { return try weights(lmHead, shape: shape) }
        return try decoder(String(name.dropFirst("model.".count)), shape: shape)
    }
}

/// `generate` of the image chat families: each prompt's token embeddings with the image embeddings in their image
/// tokens' places, through the language model; nil prompts read each image's tokens alone. `blocks` gives a prompt's
/// image blocks as ``ImageChatModel/attentionMask(promptIds:)`` does (Gemma 3), kept where `attentionMask` has tokens.
func generateWithImages(_ languageModel: some CausalLanguageModel, imageToken: Int, imageEmbeddings: Tensor, inputIds: [[Int]]?,
                        attentionMask: [[Int]]?, blocks: ((_ promptIds: [Int]) -> [Int]?)? = nil,
                        config generation: GenerationConfig, stoppingCriteria: [any StoppingCriterion],
                        seed: UInt64, onStep: ((_ tokens: [Int?]) throws -> Void)?) throws -> GenerationOutput {
    let ids = inputIds ?? Array(repeating: Array(repeating: imageToken, count: imageEmbeddings.shape.count == 3 ? imageEmbeddings.shape[1] : 0),
                                count: imageEmbeddings.shape.first ?? 0)
    let tokens = try languageModel.embed(ids)
    let embeds = try placingImageFeatures(imageEmbeddings, into: tokens, inputIds: ids, imageToken: imageToken, width: tokens.shape[2])
    var mask = attentionMask
    if let blocks {
        guard attentionMask.map({ $0.count == ids.count && zip($0, ids).allSatisfy { $0.count == $1.count } }) ?? true else {
            throw ModelError.invalidInput("the attention mask must be shaped as the prompts, [\(ids.count)][\(ids.first?.count ?? 0)]")
        }
        mask = ids.enumerated().map { row, rowIds in
            let marked = blocks(rowIds) ?? Array(repeating: 1, count: rowIds.count)
            return attentionMask.map { zip($0[row], marked).map { $0 == 0 ? 0 : $1 } } ?? marked
        }
    }
    return try languageModel.generate(inputsEmbeds: embeds, promptIds: ids, attentionMask: mask,
                                      config: generation, stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
}

/// Per image, its rows of `embeddings` (`[images, tokens, width]`): `[tokens, width]` each.
func splitImages(_ embeddings: Tensor) -> [Tensor] {
    let (count, tokens, width) = (embeddings.shape[0], embeddings.shape[1], embeddings.shape[2])
    let rows = embeddings.reshaped([1, count * tokens, width])
    return (0..<count).map { sequenceSlice(rows, $0 * tokens..<($0 + 1) * tokens).reshaped([tokens, width]) }
}

/// One image as a LLaVA-family model reads it up to its projector: what the projector reads, and how the projected
/// rows (followed by `image_newline`, in the families that have one) become the rows that take the image's tokens'
/// places.
public struct LlavaImageRows: @unchecked Sendable {
    /// `[rows, vision hiddenSize × feature layers]`: every view's patch features, view after view.
    public let visionFeatures: Tensor
    /// From the projected rows, then `image_newline` where the family has one, to the image tokens' rows.
    public let layout: RowCombination

    /// The image tokens' rows: the features through `projector`, laid out with `newline` after them.
    func projected(by projector: LlavaMultiModalProjector, newline: Tensor) -> Tensor {
        let rows = projector(visionFeatures)
        return layout(concatenate([rows, newline.reshaped([1, rows.shape[1]])], axis: 0))
    }
}

/// How a LLaVA family cuts processed images into views for its vision tower and lays out their projected features.
enum LlavaImageLayout: Sendable {
    /// LLaVA: one view per image, its features in order.
    case whole
    /// LLaVA-NeXT: the base view and the anyres tiles, packed with newlines.
    case anyres(LlavaNextConfig)
    /// LLaVA-OneVision: LLaVA-NeXT's packing under the anyres_max rule; an image of several read whole.
    case anyresMax(LlavaOnevisionConfig, maxNumPatches: Int)

    /// Each image's views through the tower (read at the feature layers) and its layout. `images` holds pixel values
    /// `[N, 3, S, S]` for LLaVA, `[N, patches, 3, S, S]` for the tiling families (each image's base view and tiles,
    /// or OneVision's one whole view, padded with unused patches to the batch's largest count), with each image's
    /// original size and which were tiled, as the families' image processors make them.
    ///
    /// - Throws: `ModelError.invalidInput` when the pixel values do not have that shape or hold fewer patches than an
    ///   image's size asks for.
    func imageRows(_ images: ProcessedImages, encoder: LlavaImageEncoder) throws -> [LlavaImageRows] {
        let side: Int, perSide: Int, family: String
        switch self {
        case .whole:
            let features = try encoder.visionFeatures(images.pixelValues)
            let tokens = features.shape[1]
            return splitImages(features).map {
                LlavaImageRows(visionFeatures: $0, layout: RowCombination(inputRows: tokens, gathering: Array(0..<tokens)))
            }
        case .anyres(let config):
            (side, perSide, family) = (config.llava.visionConfig.imageSize, config.llava.visionConfig.patchesPerSide, "LLaVA-NeXT")
        case .anyresMax(let config, _):
            (side, perSide, family) = (config.visionConfig.imageSize, config.visionConfig.patchesPerSide, "LLaVA-OneVision")
        }
        let pixels = images.pixelValues, count = images.imageSizes.count
        guard pixels.rank == 5, pixels.shape[0] == count, Array(pixels.shape[2...]) == [3, side, side],
              images.imageSizes.allSatisfy({ $0.height > 0 && $0.width > 0 }), (images.tiled?.count ?? count) == count else {
            throw ModelError.invalidInput("\(family) takes pixel values [images, patches, 3, \(side), \(side)] with one positive size (and tiling flag) per image, got \(pixels.shape) and \(count) sizes")
        }
        let available = pixels.shape[1], perView = perSide * perSide
        let all = pixels.reshaped([1, count * available, 3, side, side])
        return try images.imageSizes.enumerated().map { index, size in
            let layout = tiledLayout(size: size, tiled: images.tiled?[index] ?? true)
            // The layout reads every view's rows, then the newline.
            let patches = (layout.inputRows - 1) / perView
            guard patches <= available else {
                throw ModelError.invalidInput("image \(index) (\(size.width)x\(size.height)) is \(patches) patches, but the pixel values hold \(available)")
            }
            let views = sequenceSlice(all, index * available..<(index * available + patches)).reshaped([patches, 3, side, side])
            let features = try encoder.visionFeatures(views)
            return LlavaImageRows(visionFeatures: features.reshaped([patches * perView, features.shape[2]]), layout: layout)
        }
    }

    /// A tiling family's layout for an image of `size`, cut into tiles or (OneVision) read whole.
    private func tiledLayout(size: ImageSize, tiled: Bool) -> RowCombination {
        switch self {
        case .whole: preconditionFailure("LLaVA's images are not tiled")
        case .anyres(let config): config.packing(grid: config.tileGrid(size), originalSize: size)
        case let .anyresMax(config, maxNumPatches):
            tiled ? config.packing(grid: config.tileGrid(size), originalSize: size, maxNumPatches: maxNumPatches) : config.wholeImagePacking
        }
    }
}

/// A LLaVA-family checkpoint's image side alone (LLaVA, LLaVA-NeXT, LLaVA-OneVision): the vision tower read at
/// `vision_feature_layer` and the family's layout of the projected rows, without the projector's use or the
/// language model, for training that keeps a language model and projector of its own.
public struct LlavaVisionEncoder: @unchecked Sendable {
    /// The language model's config, its head tied as the family ties it.
    public let textConfig: LlamaConfig
    /// The token id that marks where image features go.
    public let imageTokenIndex: Int
    /// The activation between the projector's two linear layers, and whether they have biases.
    public let projectorHiddenAct: String
    public let multimodalProjectorBias: Bool
    /// Whether the family's layouts read `image_newline` after the projected rows (LLaVA-NeXT, LLaVA-OneVision).
    public let readsImageNewline: Bool
    private let encoder: LlavaImageEncoder
    private let layout: LlavaImageLayout

    /// Model types whose image side this loads.
    public static let modelTypes = ["llava", "llava_next", "llava_onevision"]

    /// Loads the vision tower (and the projector it is stored beside) of a checkpoint directory of one of
    /// ``modelTypes``.
    public init(directory: ModelDirectory) throws {
        let file = directory.url.appendingPathComponent("config.json").path
        let weights = Weights(try WeightStore(directory: directory.url))
        switch try directory.modelType {
        case "llava":
            let config = try directory.decode(LlavaConfig.self)
            (textConfig, imageTokenIndex) = (config.textConfig, config.imageTokenIndex)
            (projectorHiddenAct, multimodalProjectorBias) = (config.projectorHiddenAct, config.multimodalProjectorBias)
            encoder = try LlavaImageEncoder(config: config, weights: weights, file: file)
            layout = .whole
        case "llava_next":
            let config = try directory.decode(LlavaNextConfig.self)
            (textConfig, imageTokenIndex) = (config.languageModelConfig, config.llava.imageTokenIndex)
            (projectorHiddenAct, multimodalProjectorBias) = (config.llava.projectorHiddenAct, config.llava.multimodalProjectorBias)
            encoder = try LlavaNextForConditionalGeneration.imageEncoder(config: config, weights: weights, file: file)
            layout = .anyres(config)
        case "llava_onevision":
            let config = try directory.decode(LlavaOnevisionConfig.self)
            (textConfig, imageTokenIndex) = (config.languageModelConfig, config.imageTokenIndex)
            (projectorHiddenAct, multimodalProjectorBias) = (config.projectorHiddenAct, config.multimodalProjectorBias)
            let (encoder, maxNumPatches) = try LlavaOnevisionForConditionalGeneration.imageEncoder(config: config, weights: weights, file: file)
            self.encoder = encoder
            layout = .anyresMax(config, maxNumPatches: maxNumPatches)
        case let type:
            throw ModelError.unsupportedModelType(type, supported: Self.modelTypes, file: file)
        }
        if case .whole = layout { readsImageNewline = false } else { readsImageNewline = true }
    }

    /// Each image's vision features and layout, for the family's processed images.
    public func imageRows(_ images: ProcessedImages) throws -> [LlavaImageRows] {
        try layout.imageRows(images, encoder: encoder)
    }
}

/// transformers' `LlavaForConditionalGeneration` with a Llama, Mistral, Qwen2, Qwen3 or SmolLM3 language model: image chat, captioning
/// and visual question answering.
///
/// A prompt holds ``LlavaConfig/imageTokensPerImage`` image tokens per image where `LlavaProcessor` expands its
/// `<image>`; the model puts the image's projected features in their place.
public final class LlavaForConditionalGeneration: ImageChatModel, @unchecked Sendable {
    public let config: LlavaConfig
    let encoder: LlavaImageEncoder
    /// The language model that reads the projected image features and generates.
    public let languageModel: LlamaForCausalLM

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `llava`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = try directory.configPath(checkingModelType: "llava")
        try self.init(config: directory.decode(LlavaConfig.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: configPath)
    }

    /// Builds the model from `weights` in any of the layouts transformers 5.23 loads: as it saves them
    /// (`vision_tower.…` without CLIPVisionModel's `vision_model.`, `multi_modal_projector.…`,
    /// `language_model.model.…`, `language_model.lm_head.weight`), as the published llava-hf checkpoints have them
    /// (`vision_tower.vision_model.…`), or as its modules name them (`model.vision_tower.…`,
    /// `model.multi_modal_projector.…`, `model.language_model.…`, `lm_head.weight`); `file` is what configuration
    /// errors name.
    public init(config: LlavaConfig, weights: Weights, file: String = "config.json") throws {
        self.config = config
        encoder = try LlavaImageEncoder(config: config, weights: weights, file: file)
        languageModel = try llavaLanguageModel(config: config.textConfig, weights: weights, file: file)
    }

    /// The model over parts already built (from a GGUF pair, LlavaGGUF.swift).
    init(config: LlavaConfig, encoder: LlavaImageEncoder, languageModel: LlamaForCausalLM) {
        (self.config, self.encoder, self.languageModel) = (config, encoder, languageModel)
    }

    /// `get_image_features`: what stands in for each image's tokens, `[B, imageTokensPerImage, text hiddenSize]`, for
    /// pixel values `[B, 3, imageSize, imageSize]`: the chosen hidden states of the vision tower (class token dropped
    /// under `"default"`), concatenated, through the projector.
    public func imageEmbeddings(pixelValues: Tensor) throws -> Tensor {
        try encoder(pixelValues)
    }

    /// What the projector reads for pixel values `[B, 3, imageSize, imageSize]`: the chosen hidden states of the
    /// vision tower (class token dropped under `"default"`), concatenated, `[B, imageTokensPerImage, vision
    /// hiddenSize × feature layers]`. Projector alignment trains the projector on these, computed once per image.
    public func visionFeatures(pixelValues: Tensor) throws -> Tensor {
        try encoder.visionFeatures(pixelValues)
    }

    /// Per image, the `[imageTokensPerImage, text hiddenSize]` rows that take its image tokens' places, in order.
    public func imageFeatures(_ images: ProcessedImages) throws -> [Tensor] {
        splitImages(try imageEmbeddings(pixelValues: images.pixelValues))
    }

    /// The token embeddings of `inputIds` (`[B][T]`, equal lengths) with the image tokens' rows replaced, in order,
    /// by the rows of `imageEmbeddings` (`[images, tokens, text hiddenSize]`), as transformers' `masked_scatter`
    /// does: `[B, T, text hiddenSize]`.
    ///
    /// - Throws: `ModelError.invalidInput` unless the prompts hold exactly one image token per image feature row, as
    ///   transformers requires.
    public func inputsEmbeds(inputIds: [[Int]], imageEmbeddings: Tensor) throws -> Tensor {
        try placingImageFeatures(imageEmbeddings, into: languageModel.embed(inputIds), inputIds: inputIds,
                                 imageToken: config.imageTokenIndex, width: config.textConfig.hiddenSize)
    }

    /// ``inputsEmbeds(inputIds:imageEmbeddings:)`` for features kept per image, as ``imageFeatures(_:)`` gives them.
    public func inputsEmbeds(inputIds: [[Int]], imageFeatures: [Tensor]) throws -> Tensor {
        try placingImageFeatures(imageFeatures, into: languageModel.embed(inputIds), inputIds: inputIds,
                                 imageToken: config.imageTokenIndex, width: config.textConfig.hiddenSize)
    }

    /// The forward pass's logits `[B, T, vocab]` for images `[B, 3, S, S]` and left-padded prompts holding their
    /// image tokens.
    public func logits(pixelValues: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        let embeds = try inputsEmbeds(inputIds: inputIds, imageEmbeddings: imageEmbeddings(pixelValues: pixelValues))
        return try languageModel.logits(inputsEmbeds: embeds, attentionMask: attentionMask)
    }

    /// Answers or continuations for image embeddings computed once by ``imageEmbeddings(pixelValues:)``, as
    /// transformers' `LlavaForConditionalGeneration.generate`: greedy decoding, sampling or beam search by `config`.
    ///
    /// - Parameter inputIds: prompts (`[B][T]`, left-padded) holding each image's tokens, as `LlavaProcessor` expands
    ///   `<image>`; nil reads each image's tokens alone (transformers' generate needs a prompt here; LLaVA was trained
    ///   on conversations, which `LlavaProcessor` lays out).
    /// - Returns: the new tokens only; transformers' `sequences` are the prompt ids followed by these, padded.
    public func generate(imageEmbeddings: Tensor, inputIds: [[Int]]? = nil, attentionMask: [[Int]]? = nil,
                         config generation: GenerationConfig, stoppingCriteria: [any StoppingCriterion] = [],
                         seed: UInt64 = 0, onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        try generateWithImages(languageModel, imageToken: config.imageTokenIndex, imageEmbeddings: imageEmbeddings,
                               inputIds: inputIds, attentionMask: attentionMask, config: generation,
                               stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
    }

    public var vocabularySize: Int { config.textConfig.vocabSize }

    public var textDecoder: any CausalLanguageModel { languageModel }

    public var imageTokenId: Int { config.imageTokenIndex }

    /// Rotary positions do not run out.
    public func positionsLeft(promptLength: Int?) -> Int? { nil }
}
