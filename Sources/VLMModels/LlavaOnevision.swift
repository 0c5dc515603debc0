import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// LLaVA-OneVision (Li et al. 2024) as transformers' models/llava_onevision/modeling_llava_onevision.py builds
// `LlavaOnevisionForConditionalGeneration`: a headless SigLIP vision tower (Siglip.swift), LLaVA's projector and a
// Qwen2 decoder (Llava.swift, Llama.swift), over LLaVA-NeXT's anyres tiles with finer grids. Its "anyres_max_N" rule
// bounds an image's tokens: when the unpadded tile grid holds more than about N base views' worth of features, it
// is shrunk bilinearly to fit. An image that shares its conversation with others is read whole, its base view only
// (LlavaOnevisionImageProcessor decides which, per image).

extension SiglipVisionConfig.Defaults {
    /// The defaults `LlavaOnevisionConfig` gives `vision_config`: SigLIP so400m at 384 pixels, without its head.
    static let llavaOnevision = SiglipVisionConfig.Defaults(hiddenSize: 1152, intermediateSize: 4304, numHiddenLayers: 26,
                                                            numAttentionHeads: 16, imageSize: 384, patchSize: 14,
                                                            visionUseHead: false)
}

extension SiglipVisionTransformer: LlavaVisionTower {}

/// transformers' `LlavaOnevisionConfig`, with its defaults (llava-onevision-qwen2-7b-ov's).
public struct LlavaOnevisionConfig: Decodable, Sendable {
    /// The SigLIP vision tower's config; what it leaves out takes OneVision's defaults (so400m at 384 pixels).
    public var visionConfig: SiglipVisionConfig
    /// The language model's config (`qwen2` when absent; `llama` and `mistral` are read too).
    public var textConfig: LlamaConfig
    /// The token id that marks where image features go (`image_token_index`, also read as `image_token_id`).
    public var imageTokenIndex: Int
    /// The activation between the projector's two linear layers.
    public var projectorHiddenAct: String
    /// Which of the vision tower's hidden states the projector reads (concatenated when several), as indices into
    /// transformers' `hidden_states`.
    public var visionFeatureLayers: [Int]
    /// `"full"` keeps every patch feature (SigLIP has no class token to drop).
    public var visionFeatureSelectStrategy: String
    /// Whether the projector's linear layers have biases.
    public var multimodalProjectorBias: Bool
    /// Whether `lm_head` is the token embeddings: the top-level `tie_word_embeddings`, or the text config's.
    public var tieWordEmbeddings: Bool
    /// `image_grid_pinpoints`: the (height, width) resolutions an image may be tiled at.
    public var imageGridPinpoints: [ImageSize]
    /// `vision_aspect_ratio`, "anyres_max_N": a tile grid of more than about N base views' features is shrunk.
    public var visionAspectRatio: String

    enum CodingKeys: String, CodingKey {
        case visionConfig = "vision_config", textConfig = "text_config"
        case imageTokenIndex = "image_token_index", imageTokenId = "image_token_id"
        case projectorHiddenAct = "projector_hidden_act", visionFeatureLayer = "vision_feature_layer"
        case visionFeatureSelectStrategy = "vision_feature_select_strategy"
        case multimodalProjectorBias = "multimodal_projector_bias", tieWordEmbeddings = "tie_word_embeddings"
        case imageGridPinpoints = "image_grid_pinpoints", visionAspectRatio = "vision_aspect_ratio"
    }

    private struct VisionConfig: Decodable {
        let config: SiglipVisionConfig
        init(from decoder: any Decoder) throws { config = try SiglipVisionConfig(from: decoder, defaults: .llavaOnevision) }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        visionConfig = try (c.decodeIfPresent(VisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(VisionConfig.self, from: Data("{}".utf8))).config
        textConfig = try c.decodeIfPresent(LlamaConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(LlamaConfig.self, from: Data(#"{"model_type": "qwen2"}"#.utf8))
        guard LlamaConfig.supportedModelTypes.contains(textConfig.modelType) else {
            throw DecodingError.dataCorruptedError(forKey: .textConfig, in: c,
                                                   debugDescription: "text_config.model_type \"\(textConfig.modelType)\" is not supported here (supported: \(LlamaConfig.supportedModelTypes.joined(separator: ", ")))")
        }
        imageTokenIndex = try c.decodeIfPresent(Int.self, forKey: .imageTokenIndex)
            ?? c.decodeIfPresent(Int.self, forKey: .imageTokenId) ?? 151646
        projectorHiddenAct = try c.value(.projectorHiddenAct, default: "gelu")
        if let layers = try? c.decodeIfPresent([Int].self, forKey: .visionFeatureLayer) {
            visionFeatureLayers = layers
        } else {
            visionFeatureLayers = [try c.value(.visionFeatureLayer, default: -1)]
        }
        visionFeatureSelectStrategy = try c.value(.visionFeatureSelectStrategy, default: "full")
        multimodalProjectorBias = try c.value(.multimodalProjectorBias, default: true)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: false) || textConfig.tieWordEmbeddings
        let pairs = try c.value(.imageGridPinpoints, default: (1...6).flatMap { rows in (1...6).map { [384 * rows, 384 * $0] } })
        guard !pairs.isEmpty, pairs.allSatisfy({ $0.count == 2 && $0[0] > 0 && $0[1] > 0 }) else {
            throw DecodingError.dataCorruptedError(forKey: .imageGridPinpoints, in: c,
                                                   debugDescription: "image_grid_pinpoints \(pairs) must be a non-empty list of positive [height, width] pairs")
        }
        imageGridPinpoints = pairs.map { ImageSize(height: $0[0], width: $0[1]) }
        visionAspectRatio = try c.value(.visionAspectRatio, default: "anyres_max_9")
    }

    /// N of "anyres_max_N", read as transformers does (`int(vision_aspect_ratio.strip("anyres_max_"))`); nil when
    /// that is not a positive number.
    public var maxNumPatches: Int? { Self.maxNumPatches(visionAspectRatio) }

    /// N of an "anyres_max_N" string; nil when it gives no positive number.
    public static func maxNumPatches(_ aspectRatio: String) -> Int? {
        let stripped = Set("anyres_max_")
        let digits = aspectRatio.drop { stripped.contains($0) }.reversed().drop { stripped.contains($0) }.reversed()
        return Int(String(digits)).flatMap { $0 > 0 ? $0 : nil }
    }
}

/// transformers' `LlavaOnevisionForConditionalGeneration` with a Qwen2 (or Llama, Mistral) language model:
/// captioning, visual question answering and image chat.
///
/// A tiled image becomes `(S/p)²` tokens of its base view, then its tile grid's rows, unpadded (and shrunk under the
/// anyres_max rule), each followed by a newline token; an image read whole (one of several in a conversation) becomes
/// its base view's tokens and one newline. `LlavaOnevisionProcessor` expands each `<image>` into that many tokens.
public final class LlavaOnevisionForConditionalGeneration: ImageChatModel, @unchecked Sendable {
    public let config: LlavaOnevisionConfig
    let encoder: LlavaImageEncoder
    /// `image_newline` `[text hiddenSize]`: the row that ends each row of the tile grid, and a base-only image.
    let imageNewline: Tensor
    let maxNumPatches: Int
    /// The language model that reads the projected image features and generates.
    public let languageModel: LlamaForCausalLM

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is
    /// `llava_onevision`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = try directory.configPath(checkingModelType: "llava_onevision")
        try self.init(config: directory.decode(LlavaOnevisionConfig.self),
                      weights: Weights(WeightStore(directory: directory.url)), file: configPath)
    }

    /// Builds the model from `weights` as transformers 5.23 saves them (`vision_tower.…` without SiglipVisionModel's
    /// `vision_model.`, `multi_modal_projector.…`, `image_newline`, `language_model.model.…`,
    /// `language_model.lm_head.weight`), as the published llava-hf checkpoints have them
    /// (`vision_tower.vision_model.…`), or as its modules name them (`model.vision_tower.…`, `model.image_newline`,
    /// `model.language_model.…`, `lm_head.weight`); `file` is what configuration errors name.
    ///
    /// - Throws: `ModelError.invalidConfig` for a `"default"` feature selection (it drops a patch of SigLIP's, which
    ///   has no class token, and breaks the tile grid), pinpoints that are not whole tiles, a `vision_aspect_ratio`
    ///   that is not "anyres_max_N".
    public init(config: LlavaOnevisionConfig, weights: Weights, file: String = "config.json") throws {
        self.config = config
        (encoder, maxNumPatches) = try Self.imageEncoder(config: config, weights: weights, file: file)
        let width = config.textConfig.hiddenSize
        imageNewline = try weights(weights.contains("model.image_newline") ? "model.image_newline" : "image_newline", shape: [width])
        languageModel = try llavaLanguageModel(config: config.languageModelConfig, weights: weights, file: file)
    }

    /// The vision tower and projector of `weights` and the anyres_max rule's N, after `config`'s checks (see
    /// ``init(config:weights:file:)``).
    static func imageEncoder(config: LlavaOnevisionConfig, weights: Weights, file: String) throws -> (LlavaImageEncoder, maxNumPatches: Int) {
        guard config.visionFeatureSelectStrategy == "full" else {
            throw ModelError.invalidConfig("vision_feature_select_strategy \"\(config.visionFeatureSelectStrategy)\": LLaVA-OneVision lays each tile's patch features out as a grid, and SigLIP has no class token to drop, so only \"full\" works", file: file)
        }
        let tile = config.visionConfig.imageSize
        guard tile > 0, config.imageGridPinpoints.allSatisfy({ $0.height % tile == 0 && $0.width % tile == 0 }) else {
            throw ModelError.invalidConfig("image_grid_pinpoints \(config.imageGridPinpoints.map { [$0.height, $0.width] }) must be multiples of the vision tower's image_size \(tile)", file: file)
        }
        guard let maxNumPatches = config.maxNumPatches else {
            throw ModelError.invalidConfig("vision_aspect_ratio \"\(config.visionAspectRatio)\" is not \"anyres_max_N\"", file: file)
        }
        try LlavaImageEncoder.validate(strategy: config.visionFeatureSelectStrategy, layers: config.visionFeatureLayers,
                                       towerLayers: config.visionConfig.numHiddenLayers, file: file)
        let tower = try SiglipVisionTransformer(
            config.visionConfig,
            weights: weights.scoped(firstOf: ["vision_tower", "vision_tower.vision_model", "model.vision_tower", "model.vision_tower.vision_model"],
                                    holding: "embeddings.patch_embedding.weight"),
            file: file)
        let projector = try LlavaMultiModalProjector(
            weights.scoped(firstOf: ["multi_modal_projector", "model.multi_modal_projector"], holding: "linear_1.weight"),
            inWidth: config.visionConfig.hiddenSize * config.visionFeatureLayers.count, width: config.textConfig.hiddenSize,
            bias: config.multimodalProjectorBias, activation: config.projectorHiddenAct, file: file)
        return (LlavaImageEncoder(visionTower: tower, projector: projector, featureLayers: config.visionFeatureLayers,
                                  dropsClassToken: false), maxNumPatches)
    }

    /// `get_image_features` with `pack_image_features`: per image, the `[tokens, text hiddenSize]` rows that take its
    /// image tokens' places, in order. `images` holds pixel values `[N, patches, 3, S, S]` (each image's base view
    /// and tiles, or its one whole view, padded with unused patches to the batch's largest count), each image's
    /// original size, and which images were tiled (all, when it does not say), as `LlavaOnevisionImageProcessor`
    /// makes them.
    ///
    /// - Throws: `ModelError.invalidInput` when the pixel values do not have that shape or hold fewer patches than an
    ///   image's size asks for.
    public func imageFeatures(_ images: ProcessedImages) throws -> [Tensor] {
        try LlavaImageLayout.anyresMax(config, maxNumPatches: maxNumPatches).imageRows(images, encoder: encoder)
            .map { $0.projected(by: encoder.projector, newline: imageNewline) }
    }

    /// The anyres_max rule on an unpadded grid of `height`×`width` features: unchanged when it holds at most about
    /// `maxNumPatches` base views (its ratio to them, `sqrt(h·w / (N·side²))`, is at most 1.1), else each side
    /// divided by that ratio and floored, with Python's float arithmetic. `LlavaOnevisionProcessor` counts an image's
    /// tokens by it.
    public static func anyresMaxGrid(height: Int, width: Int, patchesPerSide side: Int, maxNumPatches: Int) -> (height: Int, width: Int) {
        let ratio = (Double(height * width) / Double(maxNumPatches * side * side)).squareRoot()
        guard ratio > 1.1 else { return (height, width) }
        return (Int(pythonFloorDivide(Double(height), ratio)), Int(pythonFloorDivide(Double(width), ratio)))
    }

    /// Python's `a // b` on floats (CPython's `float_floor_div`), which can differ from `floor(a / b)` by one where
    /// the quotient rounds up to an integer.
    static func pythonFloorDivide(_ a: Double, _ b: Double) -> Double {
        var remainder = fmod(a, b)
        var quotient = (a - remainder) / b
        if remainder != 0 && (b < 0) != (remainder < 0) {
            remainder += b
            quotient -= 1
        }
        guard quotient != 0 else { return a / b < 0 ? -0.0 : 0.0 }
        var floored = quotient.rounded(.down)
        if quotient - floored > 0.5 { floored += 1 }
        return floored
    }

    /// The token embeddings of `inputIds` (`[B][T]`, equal lengths) with the image tokens' rows replaced, image after
    /// image, by the rows of `imageFeatures` (``imageFeatures(_:)``'s), as transformers' `masked_scatter` does.
    ///
    /// - Throws: `ModelError.invalidInput` unless the prompts hold exactly one image token per feature row.
    public func inputsEmbeds(inputIds: [[Int]], imageFeatures: [Tensor]) throws -> Tensor {
        try placingImageFeatures(imageFeatures, into: languageModel.embed(inputIds), inputIds: inputIds,
                                 imageToken: config.imageTokenIndex, width: config.textConfig.hiddenSize)
    }

    /// The forward pass's logits `[B, T, vocab]` for processed images and prompts holding their image tokens.
    public func logits(images: ProcessedImages, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        let embeds = try inputsEmbeds(inputIds: inputIds, imageFeatures: imageFeatures(images))
        return try languageModel.logits(inputsEmbeds: embeds, attentionMask: attentionMask)
    }

    /// Refused: an image's views say nothing of its size, which decides its grid; ``imageEmbeddings(_:)`` takes the
    /// processor's output.
    public func imageEmbeddings(pixelValues: Tensor) throws -> Tensor {
        throw ModelError.invalidInput("LLaVA-OneVision needs each image's size with its pixel values (the processor's image_sizes)")
    }

    /// ``imageFeatures(_:)`` stacked, `[N, tokens, text hiddenSize]`, for images that come to the same number of
    /// tokens (always one image).
    ///
    /// - Throws: `ModelError.invalidInput` when they do not: such images are embedded one at a time.
    public func imageEmbeddings(_ images: ProcessedImages) throws -> Tensor {
        let features = try imageFeatures(images)
        let counts = features.map { $0.shape[0] }
        guard Set(counts).count <= 1 else {
            throw ModelError.invalidInput("these images come to different numbers of image tokens (\(counts.map(String.init).joined(separator: ", "))); embed them one at a time")
        }
        if features.isEmpty { return Tensor(zeros: [0, 0, config.textConfig.hiddenSize]) }
        return concatenate(features.map { $0.reshaped([1] + $0.shape) }, axis: 0)
    }

    /// Answers or continuations for image embeddings computed once by ``imageEmbeddings(_:)``, as transformers'
    /// `generate`: greedy decoding, sampling or beam search by `config`.
    ///
    /// - Parameter inputIds: prompts (`[B][T]`, left-padded) holding each image's tokens, as
    ///   `LlavaOnevisionProcessor` expands `<image>`; nil reads each image's tokens alone.
    /// - Returns: the new tokens only.
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

extension LlavaOnevisionConfig {
    /// The language model's config with the head tied as LLaVA-OneVision ties it (either `tie_word_embeddings`).
    var languageModelConfig: LlamaConfig {
        var text = textConfig
        text.tieWordEmbeddings = tieWordEmbeddings
        return text
    }

    /// `get_anyres_image_grid_shape`: the (rows, columns) of tiles an image of `size` is cut into.
    func tileGrid(_ size: ImageSize) -> (rows: Int, columns: Int) {
        let best = selectBestResolution(size, among: imageGridPinpoints)
        let tile = visionConfig.imageSize
        return (best.height / tile, best.width / tile)
    }

    /// An image read whole, as rows of its view's projected features `[(S/p)², D]` followed by `image_newline`: the
    /// view's rows, then the newline.
    var wholeImagePacking: RowCombination {
        let perView = visionConfig.patchesPerSide * visionConfig.patchesPerSide
        return RowCombination(inputRows: perView + 1, gathering: Array(0...perView))
    }

    /// `pack_image_features` for one tiled image of `originalSize` tiled `grid`, as rows of its views' projected
    /// features `[(1 + tiles) · (S/p)², D]` (base view first) followed by `image_newline`: the base view's rows, then
    /// the tiles' features as one grid, unpadded, shrunk bilinearly when the anyres_max rule says so (`F.interpolate`
    /// of the grid's channels), each grid row followed by the newline.
    func packing(grid: (rows: Int, columns: Int), originalSize: ImageSize, maxNumPatches: Int) -> RowCombination {
        let side = visionConfig.patchesPerSide, perView = side * side
        let newline = (1 + grid.rows * grid.columns) * perView
        let kept = LlavaNextForConditionalGeneration.unpaddedGrid(height: grid.rows * side, width: grid.columns * side,
                                                                 originalSize: originalSize)
        var order: [Int] = []
        order.reserveCapacity(kept.rows.count * kept.columns.count)
        for y in kept.rows {
            for x in kept.columns {
                let tile = (y / side) * grid.columns + x / side
                order.append((1 + tile) * perView + (y % side) * side + x % side)
            }
        }
        let shrunk = LlavaOnevisionForConditionalGeneration.anyresMaxGrid(height: kept.rows.count, width: kept.columns.count,
                                                                         patchesPerSide: side, maxNumPatches: maxNumPatches)
        let resize = RowCombination.bilinearResize(height: kept.rows.count, width: kept.columns.count,
                                                   toHeight: shrunk.height, toWidth: shrunk.width)
        var rows = (0..<perView).map { [(row: $0, weight: Float(1))] }
        rows.reserveCapacity(perView + shrunk.height * (shrunk.width + 1))
        for y in 0..<shrunk.height {
            for x in 0..<shrunk.width {
                rows.append(resize.terms(ofRow: y * shrunk.width + x).map { (order[$0.row], $0.weight) })
            }
            rows.append([(newline, 1)])
        }
        return RowCombination(inputRows: newline + 1, rows: rows)
    }
}
