import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// LLaVA-NeXT (LLaVA-1.6, Liu et al. 2024) as transformers' models/llava_next/modeling_llava_next.py builds
// `LlavaNextForConditionalGeneration`: LLaVA's CLIP tower, projector and Llama-family decoder (Llava.swift), run over
// an image's base view and the tiles of its best grid resolution ("anyres", LlavaNextImageProcessor). The tiles'
// features are laid out as one grid, the rows or columns the processor's black padding filled are cut away
// (`unpad_image`), each grid row ends with the learned `image_newline`, and the base view's features go first.

/// transformers' `LlavaNextConfig`, with its defaults (llava-v1.6-mistral-7b's).
public struct LlavaNextConfig: Decodable, Sendable {
    /// What LLaVA-NeXT shares with LLaVA, read from the same keys with the same defaults: the vision tower, the
    /// language model, the image token, the projector and the feature selection.
    public var llava: LlavaConfig
    /// `image_grid_pinpoints`: the (height, width) resolutions an image may be tiled at, in tiles of the vision
    /// tower's image size. The image processor's own list decides the prompt's image tokens; checkpoints give both
    /// the same.
    public var imageGridPinpoints: [ImageSize]
    /// Whether `lm_head` is the token embeddings: the top-level `tie_word_embeddings` only (LlavaConfig also takes the
    /// text config's, LlavaNextConfig does not).
    public var tieWordEmbeddings: Bool

    enum CodingKeys: String, CodingKey {
        case imageGridPinpoints = "image_grid_pinpoints", tieWordEmbeddings = "tie_word_embeddings"
    }

    public init(from decoder: any Decoder) throws {
        llava = try LlavaConfig(from: decoder)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let pairs = try c.value(.imageGridPinpoints, default: [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]])
        guard !pairs.isEmpty, pairs.allSatisfy({ $0.count == 2 && $0[0] > 0 && $0[1] > 0 }) else {
            throw DecodingError.dataCorruptedError(forKey: .imageGridPinpoints, in: c,
                                                   debugDescription: "image_grid_pinpoints \(pairs) must be a non-empty list of positive [height, width] pairs")
        }
        imageGridPinpoints = pairs.map { ImageSize(height: $0[0], width: $0[1]) }
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: false)
    }
}

/// transformers' `LlavaNextForConditionalGeneration` with a Llama, Mistral, Qwen2, Qwen3 or SmolLM3 language model: captioning, visual
/// question answering and image chat over images of any aspect ratio.
///
/// An image becomes `(S/p)²` tokens of its base view, then its tile grid's rows, unpadded, each followed by a newline
/// token (S the vision tower's image size, p its patch size); `LlavaNextProcessor` expands each `<image>` into that
/// many tokens for the image's size, and the model puts the image's features in their place.
public final class LlavaNextForConditionalGeneration: ImageChatModel, @unchecked Sendable {
    public let config: LlavaNextConfig
    let encoder: LlavaImageEncoder
    /// `image_newline` `[text hiddenSize]`: the row that ends each row of the tile grid.
    let imageNewline: Tensor
    /// The language model that reads the projected image features and generates.
    public let languageModel: LlamaForCausalLM

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `llava_next`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = try directory.configPath(checkingModelType: "llava_next")
        try self.init(config: directory.decode(LlavaNextConfig.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: configPath)
    }

    /// Builds the model from `weights` in any of the layouts transformers 5.23 loads: LLaVA's (see
    /// ``LlavaForConditionalGeneration/init(config:weights:file:)``), with the newline as `image_newline` (as 5.23
    /// saves it and llava-hf publishes it) or `model.image_newline` (as its modules name it); `file` is what
    /// configuration errors name.
    ///
    /// - Throws: `ModelError.invalidConfig` for a `"full"` feature selection (a tile's class token breaks its grid of
    ///   patch features; transformers fails on it too) and for pinpoints that are not whole tiles.
    public init(config: LlavaNextConfig, weights: Weights, file: String = "config.json") throws {
        self.config = config
        encoder = try Self.imageEncoder(config: config, weights: weights, file: file)
        let width = config.llava.textConfig.hiddenSize
        imageNewline = try weights(weights.contains("model.image_newline") ? "model.image_newline" : "image_newline", shape: [width])
        languageModel = try llavaLanguageModel(config: config.languageModelConfig, weights: weights, file: file)
    }

    /// The vision tower and projector of `weights`, after `config`'s checks (see ``init(config:weights:file:)``).
    static func imageEncoder(config: LlavaNextConfig, weights: Weights, file: String) throws -> LlavaImageEncoder {
        guard config.llava.visionFeatureSelectStrategy == "default" else {
            throw ModelError.invalidConfig("vision_feature_select_strategy \"\(config.llava.visionFeatureSelectStrategy)\": LLaVA-NeXT lays each tile's patch features out as a grid, so only \"default\" (class token dropped) works", file: file)
        }
        let tile = config.llava.visionConfig.imageSize
        guard tile > 0, config.imageGridPinpoints.allSatisfy({ $0.height % tile == 0 && $0.width % tile == 0 }) else {
            throw ModelError.invalidConfig("image_grid_pinpoints \(config.imageGridPinpoints.map { [$0.height, $0.width] }) must be multiples of the vision tower's image_size \(tile)", file: file)
        }
        return try LlavaImageEncoder(config: config.llava, weights: weights, file: file)
    }

    /// The model over parts already built (from a GGUF pair, LlavaGGUF.swift).
    init(config: LlavaNextConfig, encoder: LlavaImageEncoder, imageNewline: Tensor, languageModel: LlamaForCausalLM) {
        (self.config, self.encoder, self.imageNewline, self.languageModel) = (config, encoder, imageNewline, languageModel)
    }

    /// `get_image_features` with `pack_image_features`: per image, the `[tokens, text hiddenSize]` rows that take its
    /// image tokens' places, in order. `images` holds pixel values `[N, patches, 3, S, S]` (each image's base view
    /// and tiles, padded with unused patches to the batch's largest count) and each image's original size, as
    /// `LlavaNextImageProcessor` makes them.
    ///
    /// - Throws: `ModelError.invalidInput` when the pixel values do not have that shape or hold fewer patches than an
    ///   image's size asks for.
    public func imageFeatures(_ images: ProcessedImages) throws -> [Tensor] {
        try LlavaImageLayout.anyres(config).imageRows(images, encoder: encoder).map { $0.projected(by: encoder.projector, newline: imageNewline) }
    }

    /// `unpad_image` on a `height`×`width` grid of features for an image of `originalSize`: the rows (when the image
    /// is wider than the grid) or the columns (otherwise) that the processor's centring padding filled, cut equally
    /// from both sides, with transformers' arithmetic. `LlavaNextProcessor` counts an image's tokens by it.
    public static func unpaddedGrid(height: Int, width: Int, originalSize: ImageSize) -> (rows: Range<Int>, columns: Range<Int>) {
        let original = (height: Double(originalSize.height), width: Double(originalSize.width))
        if original.width / original.height > Double(width) / Double(height) {
            let newHeight = intOfRoundedTo7Digits(original.height * (Double(width) / original.width))
            let padding = (height - newHeight) / 2
            return (padding..<(height - padding), 0..<width)
        }
        let newWidth = intOfRoundedTo7Digits(original.width * (Double(height) / original.height))
        let padding = (width - newWidth) / 2
        return (0..<height, padding..<(width - padding))
    }

    /// Python's `int(round(x, 7))` for `x >= 0`: `x` truncated, except that a value within 5e-8 below the next
    /// integer rounds up to it (exactly 5e-8 below too: the seventh decimal is then an odd 9, and round-half-even
    /// goes up). Python decides on the exact decimal value; so does this comparison, since `(n + 1) - x` is exact
    /// wherever it can be that small, and the doubles it can take there do not come between 5e-8 and the double
    /// nearest it.
    private static func intOfRoundedTo7Digits(_ x: Double) -> Int {
        let floor = x.rounded(.down)
        return Int(floor) + ((floor + 1) - x <= 5e-8 ? 1 : 0)
    }

    /// The token embeddings of `inputIds` (`[B][T]`, equal lengths) with the image tokens' rows replaced, image after
    /// image, by the rows of `imageFeatures` (``imageFeatures(_:)``'s), as transformers' `masked_scatter` does:
    /// `[B, T, text hiddenSize]`.
    ///
    /// - Throws: `ModelError.invalidInput` unless the prompts hold exactly one image token per feature row.
    public func inputsEmbeds(inputIds: [[Int]], imageFeatures: [Tensor]) throws -> Tensor {
        try placingImageFeatures(imageFeatures, into: languageModel.embed(inputIds), inputIds: inputIds,
                                 imageToken: config.llava.imageTokenIndex, width: config.llava.textConfig.hiddenSize)
    }

    /// The forward pass's logits `[B, T, vocab]` for processed images and left-padded prompts holding their image
    /// tokens.
    public func logits(images: ProcessedImages, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        let embeds = try inputsEmbeds(inputIds: inputIds, imageFeatures: imageFeatures(images))
        return try languageModel.logits(inputsEmbeds: embeds, attentionMask: attentionMask)
    }

    /// Refused: an image's tiles say nothing of its size, which decides its grid; ``imageEmbeddings(_:)`` takes the
    /// processor's output.
    public func imageEmbeddings(pixelValues: Tensor) throws -> Tensor {
        throw ModelError.invalidInput("LLaVA-NeXT needs each image's size with its pixel values (the processor's image_sizes)")
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
        if features.isEmpty { return Tensor(zeros: [0, 0, config.llava.textConfig.hiddenSize]) }
        return concatenate(features.map { $0.reshaped([1] + $0.shape) }, axis: 0)
    }

    /// Answers or continuations for image embeddings computed once by ``imageEmbeddings(_:)``, as transformers'
    /// `LlavaNextForConditionalGeneration.generate`: greedy decoding, sampling or beam search by `config`.
    ///
    /// - Parameter inputIds: prompts (`[B][T]`, left-padded) holding each image's tokens, as `LlavaNextProcessor`
    ///   expands `<image>`; nil reads each image's tokens alone.
    /// - Returns: the new tokens only; transformers' `sequences` are the prompt ids followed by these, padded.
    public func generate(imageEmbeddings: Tensor, inputIds: [[Int]]? = nil, attentionMask: [[Int]]? = nil,
                         config generation: GenerationConfig, stoppingCriteria: [any StoppingCriterion] = [],
                         seed: UInt64 = 0, onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        try generateWithImages(languageModel, imageToken: config.llava.imageTokenIndex, imageEmbeddings: imageEmbeddings,
                               inputIds: inputIds, attentionMask: attentionMask, config: generation,
                               stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
    }

    public var vocabularySize: Int { config.llava.textConfig.vocabSize }

    public var textDecoder: any CausalLanguageModel { languageModel }

    public var imageTokenId: Int { config.llava.imageTokenIndex }

    /// Rotary positions do not run out.
    public func positionsLeft(promptLength: Int?) -> Int? { nil }
}

extension LlavaNextConfig {
    /// The language model's config with the head tied as LLaVA-NeXT ties it (the top-level `tie_word_embeddings`).
    var languageModelConfig: LlamaConfig {
        var text = llava.textConfig
        text.tieWordEmbeddings = tieWordEmbeddings
        return text
    }

    /// `get_anyres_image_grid_shape`: the (rows, columns) of tiles an image of `size` is cut into.
    func tileGrid(_ size: ImageSize) -> (rows: Int, columns: Int) {
        let best = selectBestResolution(size, among: imageGridPinpoints)
        let tile = llava.visionConfig.imageSize
        return (best.height / tile, best.width / tile)
    }

    /// `pack_image_features` for one image of `originalSize` tiled `grid`, as rows to gather from its views'
    /// projected features `[(1 + tiles) · (S/p)², D]` (base view first) followed by `image_newline`: the base view's
    /// rows, then the tiles' features as one grid (tile row by tile row, each tile's patches row by row), unpadded,
    /// each grid row followed by the newline.
    func packing(grid: (rows: Int, columns: Int), originalSize: ImageSize) -> RowCombination {
        let side = llava.visionConfig.patchesPerSide, perView = side * side
        let newline = (1 + grid.rows * grid.columns) * perView
        let kept = LlavaNextForConditionalGeneration.unpaddedGrid(height: grid.rows * side, width: grid.columns * side,
                                                                 originalSize: originalSize)
        var order = Array(0..<perView)
        order.reserveCapacity(perView + kept.rows.count * (kept.columns.count + 1))
        for y in kept.rows {
            for x in kept.columns {
                let tile = (y / side) * grid.columns + x / side
                order.append((1 + tile) * perView + (y % side) * side + x % side)
            }
            order.append(newline)
        }
        return RowCombination(inputRows: newline + 1, gathering: order)
    }
}
