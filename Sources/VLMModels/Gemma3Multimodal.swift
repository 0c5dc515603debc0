import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// Gemma 3's image chat models as transformers' models/gemma3/modeling_gemma3.py builds
// `Gemma3ForConditionalGeneration` (model type gemma3): a headless SigLIP vision tower (Siglip.swift), whose last
// hidden state is average-pooled to `mm_tokens_per_image` rows, RMS-normalized and projected into the text decoder's
// width (Gemma3MultiModalProjector), and Gemma 3's text decoder (Gemma3.swift), in which each image's tokens attend to
// one another in both directions (transformers' `token_type_ids` blocks).

/// transformers' `Gemma3Config`, with its defaults (Gemma 3 4B's).
public struct Gemma3Config: Decodable, Sendable {
    /// The text decoder's config; what it leaves out takes `Gemma3TextConfig`'s defaults.
    public var textConfig: Gemma3TextConfig
    /// The SigLIP vision tower's config (`SiglipVisionConfig`'s defaults where it says nothing).
    public var visionConfig: SiglipVisionConfig
    /// Image tokens per image: the pooled grid's rows, a square number.
    public var mmTokensPerImage: Int
    /// The ids of `<start_of_image>` and `<end_of_image>`, and of the image tokens whose places image features take
    /// (`image_token_index`, also read as `image_token_id`).
    public var boiTokenIndex: Int, eoiTokenIndex: Int, imageTokenIndex: Int
    /// Whether `lm_head` is the token embeddings: the top-level `tie_word_embeddings`, else the text config's.
    public var tieWordEmbeddings: Bool

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config", mmTokensPerImage = "mm_tokens_per_image"
        case boiTokenIndex = "boi_token_index", boiTokenId = "boi_token_id", eoiTokenIndex = "eoi_token_index"
        case eoiTokenId = "eoi_token_id", imageTokenIndex = "image_token_index", imageTokenId = "image_token_id"
        case tieWordEmbeddings = "tie_word_embeddings"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let empty = Data("{}".utf8)
        textConfig = try c.decodeIfPresent(Gemma3TextConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(Gemma3TextConfig.self, from: empty)
        visionConfig = try c.decodeIfPresent(SiglipVisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(SiglipVisionConfig.self, from: empty)
        mmTokensPerImage = try c.value(.mmTokensPerImage, default: 256)
        func index(_ key: CodingKeys, _ alias: CodingKeys, _ fallback: Int) throws -> Int {
            try c.decodeIfPresent(Int.self, forKey: key) ?? c.decodeIfPresent(Int.self, forKey: alias) ?? fallback
        }
        boiTokenIndex = try index(.boiTokenIndex, .boiTokenId, 255_999)
        eoiTokenIndex = try index(.eoiTokenIndex, .eoiTokenId, 256_000)
        imageTokenIndex = try index(.imageTokenIndex, .imageTokenId, 262_144)
        tieWordEmbeddings = try c.decodeIfPresent(Bool.self, forKey: .tieWordEmbeddings) ?? textConfig.tieWordEmbeddings
    }

    /// The vision tower's patches a side, and the pooling window that takes them to `mm_tokens_per_image` rows (all
    /// 0 where the sizes are not positive).
    var pooling: (patchesPerSide: Int, kernel: Int, tokensPerSide: Int) {
        guard visionConfig.patchSize > 0, visionConfig.imageSize > 0, mmTokensPerImage > 0 else { return (0, 0, 0) }
        let patches = visionConfig.patchesPerSide
        let side = Int(Double(mmTokensPerImage).squareRoot())
        return (patches, side > 0 ? patches / side : 0, side)
    }
}

/// transformers' `Gemma3ForConditionalGeneration`: captioning, visual question answering and image chat through the
/// checkpoint's chat template.
///
/// An image becomes `mm_tokens_per_image` rows: the vision tower's last hidden state (post-layernormed) laid out as
/// its patch grid, averaged over square windows (`AvgPool2d`), RMS-normalized with Gemma's `(1 + weight)` and
/// multiplied by `mm_input_projection_weight`. Gemma3Processor frames each image's tokens with `<start_of_image>` and
/// `<end_of_image>`.
public final class Gemma3ForConditionalGeneration: ImageChatModel, @unchecked Sendable {
    public let config: Gemma3Config
    let visionTower: SiglipVisionTransformer
    /// `mm_soft_emb_norm`'s `1 + weight` `[vision hiddenSize]`, and `mm_input_projection_weight`
    /// `[vision hiddenSize, text hiddenSize]`.
    let projectorNorm: Tensor, projection: Tensor
    /// The text decoder that reads the image rows and generates.
    public let languageModel: Gemma3ForCausalLM

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `gemma3`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = try directory.configPath(checkingModelType: "gemma3")
        try self.init(config: directory.decode(Gemma3Config.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: configPath)
    }

    /// Builds the model from `weights` as transformers 5.23 saves them (`vision_tower.…` without SiglipVisionModel's
    /// `vision_model.`, `multi_modal_projector.…`, `language_model.model.…`, `lm_head.weight` when untied), as the
    /// published google/gemma-3 checkpoints have them (`vision_tower.vision_model.…`), or as its modules name them
    /// (`model.vision_tower.vision_model.…`, `model.multi_modal_projector.…`, `model.language_model.…`); `file` is
    /// what configuration errors name.
    ///
    /// - Throws: `ModelError.invalidConfig` when the patch grid does not pool to `mm_tokens_per_image` rows.
    public convenience init(config: Gemma3Config, weights: Weights, file: String = "config.json") throws {
        try Self.checkPooling(config, file: file)
        var text = config.textConfig
        text.tieWordEmbeddings = config.tieWordEmbeddings
        // Gemma3ForCausalLM names its weights `model.…` and `lm_head.weight`, as a text checkpoint does.
        let decoder = weights.scoped(firstOf: ["model.language_model", "language_model.model"], holding: "embed_tokens.weight")
        let lmHead = weights.contains("language_model.lm_head.weight") ? "language_model.lm_head.weight" : "lm_head.weight"
        let languageModel = try Gemma3ForCausalLM(config: text, file: file) { name, shape in
            if name == "lm_head.weight" { return try weights(lmHead, shape: shape) }
            return try decoder(String(name.dropFirst("model.".count)), shape: shape)
        }
        try self.init(config: config, imageWeights: weights, languageModel: languageModel, file: file)
    }

    /// The vision tower and projector from `imageWeights` (named as ``init(config:weights:file:)`` reads them) over a
    /// text decoder built elsewhere.
    init(config: Gemma3Config, imageWeights weights: Weights, languageModel: Gemma3ForCausalLM, file: String) throws {
        try Self.checkPooling(config, file: file)
        self.config = config
        visionTower = try SiglipVisionTransformer(
            config.visionConfig,
            weights: weights.scoped(firstOf: ["vision_tower", "vision_tower.vision_model", "model.vision_tower.vision_model"],
                                    holding: "embeddings.patch_embedding.weight"),
            file: file)
        let projector = weights.scoped(firstOf: ["model.multi_modal_projector", "multi_modal_projector"],
                                       holding: "mm_input_projection_weight")
        let (visionWidth, textWidth) = (config.visionConfig.hiddenSize, config.textConfig.hiddenSize)
        projectorNorm = gemmaNormWeight(try projector("mm_soft_emb_norm.weight", shape: [visionWidth]))
        projection = try projector("mm_input_projection_weight", shape: [visionWidth, textWidth])
        self.languageModel = languageModel
    }

    private static func checkPooling(_ config: Gemma3Config, file: String) throws {
        let pooling = config.pooling
        guard pooling.tokensPerSide > 0, pooling.tokensPerSide * pooling.tokensPerSide == config.mmTokensPerImage, pooling.kernel > 0,
              pooling.patchesPerSide / pooling.kernel == pooling.tokensPerSide else {
            throw ModelError.invalidConfig("mm_tokens_per_image \(config.mmTokensPerImage) is not a square grid that the vision tower's \(pooling.patchesPerSide)×\(pooling.patchesPerSide) patches pool to", file: file)
        }
    }

    /// `get_image_features(...).pooler_output` per image: `[mm_tokens_per_image, text hiddenSize]` each, from pixel
    /// values `[N, 3, S, S]`; with pan-and-scan crops, an image's rows then its crops' (`[(1 + crops) · tokens,
    /// hiddenSize]`), in the order its text puts their tokens.
    public func imageFeatures(_ images: ProcessedImages) throws -> [Tensor] {
        let views = splitImages(try imageEmbeddings(pixelValues: images.pixelValues))
        guard let crops = try viewCounts(images) else { return views }
        var first = 0
        return crops.map { count in
            defer { first += count }
            return count == 1 ? views[first] : concatenate(Array(views[first..<(first + count)]), axis: 0)
        }
    }

    /// One row per image (``imageFeatures(_:)``'s rows): images with pan-and-scan crops batch only when each has as
    /// many as the others.
    ///
    /// - Throws: `ModelError.invalidInput` for images with different numbers of crops, which go one at a time.
    public func imageEmbeddings(_ images: ProcessedImages) throws -> Tensor {
        let embeddings = try imageEmbeddings(pixelValues: images.pixelValues)
        guard let counts = try viewCounts(images) else { return embeddings }
        guard let count = counts.first, counts.allSatisfy({ $0 == count }) else {
            throw ModelError.invalidInput("images cut into different numbers of pan-and-scan crops (\(counts.map { String($0 - 1) }.joined(separator: ", "))) do not batch: give them one at a time")
        }
        // An image's views are consecutive rows.
        return embeddings.reshaped([counts.count, count * embeddings.shape[1], embeddings.shape[2]])
    }

    /// How many rows of pixel values each image has (itself and its crops); nil where nothing was cropped.
    private func viewCounts(_ images: ProcessedImages) throws -> [Int]? {
        guard let crops = images.crops else { return nil }
        let counts = crops.map { 1 + $0 }
        guard crops.allSatisfy({ $0 >= 0 }), counts.reduce(0, +) == images.pixelValues.shape.first else {
            throw ModelError.invalidInput("pan-and-scan crops \(crops) do not account for \(images.pixelValues.shape.first ?? 0) images of pixel values")
        }
        return counts
    }

    /// The image rows of every image of `pixelValues` `[N, 3, S, S]`: `[N, mm_tokens_per_image, text hiddenSize]`.
    public func imageEmbeddings(pixelValues: Tensor) throws -> Tensor {
        let hidden = try visionTower.lastHiddenState(pixelValues)
        let (count, width) = (hidden.shape[0], hidden.shape[2])
        let (patches, kernel, side) = config.pooling
        // AvgPool2d over the patch grid, window by window (the grid is row-major: patch y·patches + x).
        let pooled = Tensor(zeros: [count, side * side, width])
        let scale = 1 / Float(kernel * kernel)
        for image in 0..<count {
            let source = hidden.storage.pointer + image * patches * patches * width
            for row in 0..<side {
                for column in 0..<side {
                    let target = pooled.storage.pointer + ((image * side + row) * side + column) * width
                    for y in (row * kernel)..<((row + 1) * kernel) {
                        for x in (column * kernel)..<((column + 1) * kernel) {
                            let patch = source + (y * patches + x) * width
                            for feature in 0..<width { target[feature] += patch[feature] }
                        }
                    }
                    for feature in 0..<width { target[feature] *= scale }
                }
            }
        }
        let normed = rmsNorm(pooled, weight: projectorNorm, eps: config.visionConfig.layerNormEps)
        return matmul(normed.reshaped([count * side * side, width]), projection)
            .reshaped([count, side * side, config.textConfig.hiddenSize])
    }

    /// The image tokens of each prompt run get a block value of their own (2, 3, …; 1 elsewhere), so that the text
    /// decoder lets them see each other (`get_block_sequence_ids_for_mask` of the processor's `token_type_ids`).
    public func attentionMask(promptIds: [Int]) -> [Int]? {
        var mask = Array(repeating: 1, count: promptIds.count)
        var block = 1
        for index in promptIds.indices where promptIds[index] == config.imageTokenIndex {
            if index == 0 || promptIds[index - 1] != config.imageTokenIndex { block += 1 }
            mask[index] = block
        }
        return block > 1 ? mask : nil
    }

    /// Answers or continuations for image rows computed once by ``imageEmbeddings(pixelValues:)``, as transformers'
    /// `generate` with the processor's `token_type_ids`: greedy decoding, sampling or beam search by `config`.
    ///
    /// - Parameter inputIds: prompts (`[B][T]`, left-padded) holding each image's tokens, as `Gemma3Processor`
    ///   expands `<start_of_image>`; nil reads each image's tokens alone.
    /// - Returns: the new tokens only.
    public func generate(imageEmbeddings: Tensor, inputIds: [[Int]]?, attentionMask: [[Int]]?, config generation: GenerationConfig,
                         stoppingCriteria: [any StoppingCriterion], seed: UInt64,
                         onStep: ((_ tokens: [Int?]) throws -> Void)?) throws -> GenerationOutput {
        try generateWithImages(languageModel, imageToken: config.imageTokenIndex, imageEmbeddings: imageEmbeddings,
                               inputIds: inputIds, attentionMask: attentionMask, blocks: self.attentionMask(promptIds:),
                               config: generation, stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
    }

    public var vocabularySize: Int { config.textConfig.vocabSize }

    public var textDecoder: any CausalLanguageModel { languageModel }

    public var imageTokenId: Int { config.imageTokenIndex }

    /// Rotary positions do not run out.
    public func positionsLeft(promptLength: Int?) -> Int? { nil }
}
