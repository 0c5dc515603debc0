import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTokenizers

/// A family's processor, like transformers' `Processor` classes: its image processor, its tokenizer, and how a prompt
/// is laid out around an image's tokens.
public protocol ImageToTextProcessor: Sendable {
    var imageProcessor: any ImageProcessor { get }
    var tokenizer: Tokenizer { get }
    /// `images` as the model reads them: the image processor's output, unless the processor adds to it (Gemma 3's
    /// pan and scan crops).
    func preprocess(_ images: [RGBImage]) throws -> ProcessedImages
    /// The ids the model reads for one image and `prompt` (image tokens included where the family puts them); nil
    /// when there is no prompt and the model starts on its own.
    func promptIds(_ prompt: String?) throws -> [Int]?
    /// ``promptIds(_:)`` for each of `images`: the same for every image, unless the family's image token count
    /// depends on the image (LLaVA-NeXT's, on its size).
    func promptIds(_ prompt: String?, for images: ProcessedImages) throws -> [[Int]]?
    /// The prompt a visual question is asked in, as the family was trained to read it.
    func questionPrompt(_ question: String) -> String
}

/// The processor of a chat model that reads images (LLaVA): its chat template writes ``imageToken`` where each image
/// goes, and the processor expands each into the image's tokens.
public protocol ImageChatProcessor: ImageToTextProcessor {
    /// The text that marks where an image goes (`image_token`).
    var imageToken: String { get }
    /// How many image tokens each processed image takes in the prompt, as transformers counts them.
    func imageTokenCounts(_ images: ProcessedImages) -> [Int]
    /// The text an image's marker becomes for an image of `tokenCount` tokens: the marker that many times for most
    /// families; Gemma 3 frames its image tokens with their own markers and blank lines.
    func imageText(tokenCount: Int) -> String
    /// `images`, some or all of the images of one conversation holding `conversationImageCount` in all, processed
    /// as transformers' processor takes a conversation's images together (`apply_chat_template` passes them as one
    /// sample's): for most families each image as it would be alone.
    func preprocess(_ images: [RGBImage], conversationImageCount: Int) throws -> ProcessedImages
    /// How the images of a conversation holding `count` images are read: where this changes as a conversation
    /// grows, every image's features and tokens are computed again (LLaVA-OneVision reads an image whole once it
    /// has company). The same for every count for most families.
    func imageLayout(conversationImageCount count: Int) -> Int
}

extension ImageChatProcessor {
    public func preprocess(_ images: [RGBImage], conversationImageCount: Int) throws -> ProcessedImages {
        try preprocess(images)
    }

    public func imageLayout(conversationImageCount count: Int) -> Int { 0 }

    public func imageText(tokenCount: Int) -> String { String(repeating: imageToken, count: tokenCount) }
}

extension ImageChatProcessor {
    /// The ids of `text` with its `<image>`s expanded, the first into the first image's tokens and so on, as
    /// `processor(text=[text], images=[images])` makes them (one sample, as a conversation's images are).
    ///
    /// - Throws: `ModelError.invalidInput` unless the text holds one `<image>` per image.
    public func promptIds(_ text: String, images: ProcessedImages) throws -> [Int] {
        let pieces = text.components(separatedBy: imageToken)
        let counts = imageTokenCounts(images)
        guard pieces.count - 1 == counts.count else {
            throw ModelError.invalidInput("the text holds \(pieces.count - 1) \(imageToken) for \(counts.count) images")
        }
        let expanded = zip(pieces, counts).map { $0 + imageText(tokenCount: $1) }.joined() + (pieces.last ?? "")
        return tokenizer.encode(expanded).ids
    }

    /// One prompt per image, each image alone: `text` (an `<image>` put in front where it holds none) with its
    /// `<image>`s expanded into that image's tokens.
    func promptIdsPerImage(_ text: String, images: ProcessedImages) -> [[Int]] {
        let placed = text.contains(imageToken) ? text : "\(imageToken)\n" + text
        return imageTokenCounts(images).map { count in
            tokenizer.encode(placed.replacingOccurrences(of: imageToken, with: imageText(tokenCount: count))).ids
        }
    }
}

extension ImageToTextProcessor {
    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages { try imageProcessor.preprocess(images) }

    public func promptIds(_ prompt: String?, for images: ProcessedImages) throws -> [[Int]]? {
        try promptIds(prompt).map { Array(repeating: $0, count: images.imageSizes.count) }
    }
}

/// Builds the processor of an image-to-text checkpoint by config.json's `model_type`.
enum ImageToTextProcessors {
    static let builders: [String: @Sendable (ModelDirectory) throws -> any ImageToTextProcessor] = [
        "blip-2": { try Blip2Processor(directory: $0) },
        "blip": { try BlipProcessor(directory: $0) },
        "llava": { try LlavaProcessor(directory: $0) },
        "llava_next": { try LlavaNextProcessor(directory: $0) },
        "llava_onevision": { try LlavaOnevisionProcessor(directory: $0) },
        "gemma3": { try Gemma3Processor(directory: $0) },
    ]

    static func load(_ directory: ModelDirectory) throws -> any ImageToTextProcessor {
        let type = try directory.modelType
        guard let build = builders[type] else {
            throw ModelError.unsupportedModelType(type, supported: builders.keys.sorted(),
                                                  file: directory.url.appendingPathComponent("config.json").path)
        }
        return try build(directory)
    }
}

/// transformers' `Blip2Processor`: BLIP's image processor, and `num_query_tokens` image tokens put in front of the
/// tokenized text (which keeps its special tokens: OPT's tokenizer starts it with bos).
public struct Blip2Processor: ImageToTextProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer
    /// Image tokens per image: the Q-Former's query count.
    public let numQueryTokens: Int
    /// The id of the tokenizer's `<image>` token.
    public let imageTokenId: Int

    /// Reads the tokenizer files, the image processor config and `num_query_tokens` (processor_config.json's, else
    /// config.json's) of a checkpoint directory.
    ///
    /// - Throws: the loaders' errors; `PipelineError.invalidProcessor` when the tokenizer has no `<image>` token or no
    ///   query-token count is given.
    public init(directory: ModelDirectory) throws {
        tokenizer = try Tokenizer(directory: directory.url)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
        let count = try directory.jsonObject("processor_config.json")?["num_query_tokens"] as? Int
            ?? directory.jsonObject("config.json")?["num_query_tokens"] as? Int
        guard let count, count > 0 else {
            throw PipelineError.invalidProcessor(directory.url.path, "neither processor_config.json nor config.json gives a positive num_query_tokens")
        }
        guard let imageToken = tokenizer.tokenId("<image>") else {
            throw PipelineError.invalidProcessor(directory.url.path, "the tokenizer has no <image> token (Blip2Processor adds one)")
        }
        (numQueryTokens, imageTokenId) = (count, imageToken)
    }

    public func promptIds(_ prompt: String?) throws -> [Int]? {
        guard let prompt else { return nil }
        return Array(repeating: imageTokenId, count: numQueryTokens) + tokenizer.encode(prompt).ids
    }

    /// BLIP-2's VQA prompt, as in its paper and model cards.
    public func questionPrompt(_ question: String) -> String {
        "Question: \(question) Answer:"
    }
}

/// transformers' `BlipProcessor`: BLIP's image processor and its BERT tokenizer, the text framed as `[CLS] … [SEP]`
/// (the captioning model turns that into its decoder prompt; the VQA model encodes it as the question).
public struct BlipProcessor: ImageToTextProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer

    public init(directory: ModelDirectory) throws {
        tokenizer = try Tokenizer(directory: directory.url)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
    }

    public func promptIds(_ prompt: String?) throws -> [Int]? {
        prompt.map { tokenizer.encode($0).ids }
    }

    /// BLIP's VQA model reads the question as it is.
    public func questionPrompt(_ question: String) -> String { question }
}

/// transformers' `LlavaProcessor`: CLIP's image processor, and each `<image>` in the text expanded into as many image
/// tokens as the vision tower gives features per image, the text then tokenized as a whole (with the tokenizer's
/// special tokens: Llama's adds bos).
///
/// LLaVA-1.5 was trained on conversations laid out as `USER: <image>\n… ASSISTANT:`; questions are asked in that
/// layout, and no prompt asks "Describe this image." in it. A prompt without `<image>` reads the image first, as
/// `<image>\n` + prompt (transformers would fail on it for want of image tokens).
public struct LlavaProcessor: ImageChatProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer
    /// The text that marks where the image goes (`image_token`, `<image>` by default).
    public let imageToken: String
    /// The tokenizer's id for ``imageToken``.
    public let imageTokenId: Int
    /// Image tokens per image: `(height / patch_size) × (width / patch_size) + num_additional_image_tokens`, less
    /// one under the `"default"` feature selection strategy (the class token dropped).
    public let imageTokensPerImage: Int

    /// Reads the tokenizer files, the image processor config and processor_config.json's `patch_size`,
    /// `vision_feature_select_strategy`, `num_additional_image_tokens` and `image_token` of a checkpoint directory.
    ///
    /// - Throws: the loaders' errors; `PipelineError.invalidProcessor` when `patch_size` is missing, the image
    ///   processor does not crop to a fixed size (the count of image tokens would depend on each image), or the
    ///   tokenizer has no image token.
    public init(directory: ModelDirectory) throws {
        tokenizer = try Tokenizer(directory: directory.url)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
        let settings = try directory.jsonObject("processor_config.json") ?? [:]
        let path = directory.url.appendingPathComponent("processor_config.json").path
        guard let patchSize = settings["patch_size"] as? Int, patchSize > 0 else {
            throw PipelineError.invalidProcessor(path, "patch_size is missing or not a positive integer")
        }
        // transformers counts from the processed image's size; a fixed centre crop makes that the crop size.
        guard let crop = (imageProcessor as? StandardImageProcessor)?.config, crop.doCenterCrop else {
            throw PipelineError.invalidProcessor(path, "the image processor does not centre-crop to a fixed size, so the number of image tokens is unknown")
        }
        let additional = settings["num_additional_image_tokens"] as? Int ?? 0
        let dropsClassToken = settings["vision_feature_select_strategy"] as? String == "default"
        imageTokensPerImage = (crop.cropHeight / patchSize) * (crop.cropWidth / patchSize) + additional - (dropsClassToken ? 1 : 0)
        imageToken = settings["image_token"] as? String ?? "<image>"
        guard let id = tokenizer.tokenId(imageToken) else {
            throw PipelineError.invalidProcessor(path, "the tokenizer has no \(imageToken) token")
        }
        imageTokenId = id
    }

    /// A processor from its parts, as a GGUF pair gives them (GGUFPairLoading.swift).
    public init(imageProcessor: any ImageProcessor, tokenizer: Tokenizer, imageToken: String, imageTokenId: Int,
                imageTokensPerImage: Int) {
        (self.imageProcessor, self.tokenizer, self.imageToken) = (imageProcessor, tokenizer, imageToken)
        (self.imageTokenId, self.imageTokensPerImage) = (imageTokenId, imageTokensPerImage)
    }

    /// Image tokens per image: ``imageTokensPerImage`` for each.
    public func imageTokenCounts(_ images: ProcessedImages) -> [Int] {
        Array(repeating: imageTokensPerImage, count: images.imageSizes.count)
    }

    public func promptIds(_ prompt: String?) throws -> [Int]? {
        let text = prompt ?? questionPrompt("Describe this image.")
        let placed = text.contains(imageToken) ? text : "\(imageToken)\n" + text
        let expanded = placed.replacingOccurrences(of: imageToken,
                                                   with: String(repeating: imageToken, count: imageTokensPerImage))
        return tokenizer.encode(expanded).ids
    }

    /// LLaVA-1.5's conversation layout for one user turn with the image.
    public func questionPrompt(_ question: String) -> String {
        "USER: \(imageToken)\n\(question) ASSISTANT:"
    }
}

/// transformers' `LlavaNextProcessor`: LLaVA-NeXT's tiling image processor, and each `<image>` in the text expanded
/// into as many image tokens as the model makes of that image, which depends on its size (its tile grid, unpadded,
/// with a newline per row, after its base view), the text then tokenized as a whole (with the tokenizer's special
/// tokens).
///
/// Questions are asked in the layout of llava-v1.6-mistral-7b, the checkpoint transformers documents LLaVA-NeXT
/// with (`[INST] <image>\n… [/INST]`); other checkpoints were trained on their own chat templates. A prompt without
/// `<image>` reads the image first, as `<image>\n` + prompt.
public struct LlavaNextProcessor: ImageChatProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer
    /// The text that marks where an image goes (`image_token`, `<image>` by default).
    public let imageToken: String
    /// The tokenizer's id for ``imageToken``.
    public let imageTokenId: Int
    /// The vision tower's patch size (`patch_size`).
    public let patchSize: Int
    /// `num_additional_image_tokens` (0 when absent): tokens the vision tower adds to an image's patches; llava-hf's
    /// checkpoints give 1, CLIP's class token.
    public let numAdditionalImageTokens: Int
    /// Whether `vision_feature_select_strategy` is `"default"`, which drops the class token (one token fewer).
    public let dropsClassToken: Bool
    /// The image processor's pinpoints, which decide each image's tile grid.
    public let imageGridPinpoints: [ImageSize]
    /// The (height, width) of every patch the image processor puts out.
    public let processedSize: ImageSize

    /// Reads the tokenizer files, the image processor config and processor_config.json's `patch_size`,
    /// `vision_feature_select_strategy`, `num_additional_image_tokens` and `image_token` of a checkpoint directory.
    ///
    /// - Throws: the loaders' errors; `PipelineError.invalidProcessor` when the image processor is not LLaVA-NeXT's,
    ///   `patch_size` is missing, a pinpoint is smaller than a processed patch or a patch smaller than `patch_size`
    ///   (transformers divides by zero there), or the tokenizer has no image token.
    public init(directory: ModelDirectory) throws {
        tokenizer = try Tokenizer(directory: directory.url)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
        let settings = try directory.jsonObject("processor_config.json") ?? [:]
        let path = directory.url.appendingPathComponent("processor_config.json").path
        guard let tiling = imageProcessor as? LlavaNextImageProcessor else {
            throw PipelineError.invalidProcessor(path, "the image processor is not LLaVA-NeXT's (LlavaNextImageProcessor)")
        }
        guard let patchSize = settings["patch_size"] as? Int, patchSize > 0 else {
            throw PipelineError.invalidProcessor(path, "patch_size is missing or not a positive integer")
        }
        let (pinpoints, processed) = (tiling.config.imageGridPinpoints, tiling.outputSize)
        guard processed.height >= patchSize, processed.width >= patchSize,
              pinpoints.allSatisfy({ $0.height >= processed.height && $0.width >= processed.width }) else {
            throw PipelineError.invalidProcessor(path, "the image processor's \(processed.width)x\(processed.height) patches must hold a \(patchSize)-pixel patch_size and fit in every image_grid_pinpoint")
        }
        (imageGridPinpoints, processedSize) = (pinpoints, processed)
        self.patchSize = patchSize
        numAdditionalImageTokens = settings["num_additional_image_tokens"] as? Int ?? 0
        dropsClassToken = settings["vision_feature_select_strategy"] as? String == "default"
        imageToken = settings["image_token"] as? String ?? "<image>"
        guard let id = tokenizer.tokenId(imageToken) else {
            throw PipelineError.invalidProcessor(path, "the tokenizer has no \(imageToken) token")
        }
        imageTokenId = id
    }

    /// A processor from its parts, as a GGUF pair gives them (GGUFPairLoading.swift); `"default"` strategy, one
    /// additional token (the class token, dropped), as llama.cpp's LLaVA projector reads the tower.
    public init(imageProcessor: LlavaNextImageProcessor, tokenizer: Tokenizer, imageToken: String, imageTokenId: Int,
                patchSize: Int) {
        (self.imageProcessor, self.tokenizer, self.imageToken, self.imageTokenId) = (imageProcessor, tokenizer, imageToken, imageTokenId)
        (self.patchSize, numAdditionalImageTokens, dropsClassToken) = (patchSize, 1, true)
        (imageGridPinpoints, processedSize) = (imageProcessor.config.imageGridPinpoints, imageProcessor.outputSize)
    }

    /// `_get_number_of_features`, less the class token under `"default"`: the base view's patches plus the tile
    /// grid's (its size in patches scaled from the processed patch to the best pinpoint), unpadded as the model
    /// unpads it, plus a newline per grid row.
    public func imageTokenCount(originalSize: ImageSize) -> Int {
        let best = selectBestResolution(originalSize, among: imageGridPinpoints)
        let patchesHigh = processedSize.height / patchSize, patchesWide = processedSize.width / patchSize
        let grid = LlavaNextForConditionalGeneration.unpaddedGrid(
            height: patchesHigh * (best.height / processedSize.height), width: patchesWide * (best.width / processedSize.width),
            originalSize: originalSize)
        let base = patchesHigh * patchesWide + numAdditionalImageTokens
        return grid.rows.count * (grid.columns.count + 1) + base - (dropsClassToken ? 1 : 0)
    }

    /// Image tokens per image, by each image's original size.
    public func imageTokenCounts(_ images: ProcessedImages) -> [Int] {
        images.imageSizes.map { imageTokenCount(originalSize: $0) }
    }

    /// Refused: how many tokens an image becomes depends on its size; ``promptIds(_:for:)`` takes the images.
    public func promptIds(_ prompt: String?) throws -> [Int]? {
        throw ModelError.invalidInput("LLaVA-NeXT expands \(imageToken) by each image's size: its prompts are made with the images")
    }

    /// One prompt per image: `prompt` (or a request to describe the image) with its `<image>`s expanded into that
    /// image's tokens.
    public func promptIds(_ prompt: String?, for images: ProcessedImages) throws -> [[Int]]? {
        promptIdsPerImage(prompt ?? questionPrompt("Describe this image."), images: images)
    }

    /// llava-v1.6-mistral-7b's layout for one user turn with the image.
    public func questionPrompt(_ question: String) -> String {
        "[INST] \(imageToken)\n\(question) [/INST]"
    }
}

/// transformers' `LlavaOnevisionProcessor`: LLaVA-OneVision's image processor, and each `<image>` expanded into as
/// many image tokens as the model makes of that image: for an image tiled as its prompt's only one, its base view,
/// then its tile grid (unpadded, shrunk under the anyres_max rule) with a newline per row; for an image read whole
/// (one of a conversation's several), its base view and one newline.
///
/// Questions are asked in the layout of llava-onevision-qwen2's chat template (`<|im_start|>user <image>\n…<|im_end|>`
/// then the assistant's turn). A prompt without `<image>` reads the image first, as `<image>\n` + prompt.
public struct LlavaOnevisionProcessor: ImageChatProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer
    /// The text that marks where an image goes (`image_token`, `<image>` by default).
    public let imageToken: String
    /// The tokenizer's id for ``imageToken``.
    public let imageTokenId: Int
    /// `num_image_tokens`: the features of one view, `(image_size / patch_size)²`.
    public let numImageTokens: Int
    /// Whether `vision_feature_select_strategy` is `"default"`, which takes one token off every image's count.
    public let dropsClassToken: Bool
    /// N of `vision_aspect_ratio` "anyres_max_N".
    public let maxNumPatches: Int
    let onevision: LlavaOnevisionImageProcessor

    /// Reads the tokenizer files, the image processor config and processor_config.json's `num_image_tokens`,
    /// `vision_feature_select_strategy`, `vision_aspect_ratio` and `image_token` of a checkpoint directory.
    ///
    /// - Throws: the loaders' errors; `PipelineError.invalidProcessor` when the image processor is not
    ///   LLaVA-OneVision's, `num_image_tokens` is missing, the aspect ratio is not "anyres_max_N", a pinpoint is
    ///   smaller than a processed patch, or the tokenizer has no image token.
    public init(directory: ModelDirectory) throws {
        tokenizer = try Tokenizer(directory: directory.url)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
        let settings = try directory.jsonObject("processor_config.json") ?? [:]
        let path = directory.url.appendingPathComponent("processor_config.json").path
        guard let onevision = imageProcessor as? LlavaOnevisionImageProcessor else {
            throw PipelineError.invalidProcessor(path, "the image processor is not LLaVA-OneVision's (LlavaOnevisionImageProcessor)")
        }
        self.onevision = onevision
        guard let count = settings["num_image_tokens"] as? Int, count > 0 else {
            throw PipelineError.invalidProcessor(path, "num_image_tokens is missing or not a positive integer")
        }
        numImageTokens = count
        let aspect = settings["vision_aspect_ratio"] as? String ?? "anyres_max_9"
        guard let maxNumPatches = LlavaOnevisionConfig.maxNumPatches(aspect) else {
            throw PipelineError.invalidProcessor(path, "vision_aspect_ratio \"\(aspect)\" is not \"anyres_max_N\"")
        }
        self.maxNumPatches = maxNumPatches
        let processed = onevision.outputSize
        guard onevision.config.imageGridPinpoints.allSatisfy({ $0.height >= processed.height && $0.width >= processed.width }) else {
            throw PipelineError.invalidProcessor(path, "the image processor's \(processed.width)x\(processed.height) patches must fit in every image_grid_pinpoint")
        }
        dropsClassToken = settings["vision_feature_select_strategy"] as? String == "default"
        imageToken = settings["image_token"] as? String ?? "<image>"
        guard let id = tokenizer.tokenId(imageToken) else {
            throw PipelineError.invalidProcessor(path, "the tokenizer has no \(imageToken) token")
        }
        imageTokenId = id
    }

    /// `replace_image_token`'s count for an image of `originalSize`: tiled, `_get_number_of_features` (the base
    /// view, the grid scaled from the processed patch to the best pinpoint, unpadded as the model unpads it, shrunk
    /// under the anyres_max rule, a newline per row); read whole, the base view and its newline. Less one under
    /// `"default"`.
    public func imageTokenCount(originalSize: ImageSize, tiled: Bool = true) -> Int {
        let adjustment = dropsClassToken ? -1 : 0
        guard tiled else { return numImageTokens + 1 + adjustment }
        let best = selectBestResolution(originalSize, among: onevision.config.imageGridPinpoints)
        let processed = onevision.outputSize
        let side = Int(Double(numImageTokens).squareRoot())
        let kept = LlavaNextForConditionalGeneration.unpaddedGrid(
            height: side * (best.height / processed.height), width: side * (best.width / processed.width),
            originalSize: originalSize)
        let grid = LlavaOnevisionForConditionalGeneration.anyresMaxGrid(
            height: kept.rows.count, width: kept.columns.count, patchesPerSide: side, maxNumPatches: maxNumPatches)
        return grid.height * (grid.width + 1) + numImageTokens + adjustment
    }

    /// Image tokens per image, by each image's original size and whether it was tiled.
    public func imageTokenCounts(_ images: ProcessedImages) -> [Int] {
        images.imageSizes.enumerated().map { imageTokenCount(originalSize: $1, tiled: images.tiled?[$0] ?? true) }
    }

    /// A conversation's images: tiled when it holds one, each read whole when it holds several.
    public func preprocess(_ images: [RGBImage], conversationImageCount: Int) throws -> ProcessedImages {
        try onevision.preprocess(images, tiled: Array(repeating: conversationImageCount == 1, count: images.count))
    }

    /// 0 while a conversation holds at most one image (tiled), 1 once it holds several (each read whole).
    public func imageLayout(conversationImageCount count: Int) -> Int { count <= 1 ? 0 : 1 }

    /// Refused: how many tokens an image becomes depends on its size; ``promptIds(_:for:)`` takes the images.
    public func promptIds(_ prompt: String?) throws -> [Int]? {
        throw ModelError.invalidInput("LLaVA-OneVision expands \(imageToken) by each image's size: its prompts are made with the images")
    }

    /// One prompt per image (each its prompt's only one, so tiled): `prompt` (or a request to describe the image)
    /// with its `<image>`s expanded into that image's tokens.
    public func promptIds(_ prompt: String?, for images: ProcessedImages) throws -> [[Int]]? {
        promptIdsPerImage(prompt ?? questionPrompt("Describe this image."), images: images)
    }

    /// llava-onevision-qwen2's layout for one user turn with the image, the assistant's turn opened.
    public func questionPrompt(_ question: String) -> String {
        "<|im_start|>user \(imageToken)\n\(question)<|im_end|>\n<|im_start|>assistant\n"
    }
}

/// transformers' `Gemma3Processor`: Gemma 3's image processor (every image resized to one square, no crop), and each
/// `<start_of_image>` the text holds expanded into its `full_image_sequence`: a blank line, `<start_of_image>`,
/// `image_seq_length` image tokens, `<end_of_image>` and a blank line; the text is then tokenized as a whole.
///
/// With ``panAndScan`` (`do_pan_and_scan=True`), an image wide or tall enough is also read as crops, and its
/// `<start_of_image>` becomes "Here is the original image " + its sequence + " and here are some crops to help you
/// see better " + one sequence per crop, joined by spaces.
///
/// Questions are asked in the layout of Gemma 3's chat template (`<start_of_turn>user\n<start_of_image>…<end_of_turn>`
/// then the model's turn). A prompt without `<start_of_image>` reads the image first.
public struct Gemma3Processor: ImageChatProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer
    /// The text that marks where an image goes: the tokenizer's `boi_token`, `<start_of_image>`.
    public let imageToken: String
    /// The image tokens' text (`image_token`, `<image_soft_token>`) and the one that ends an image (`eoi_token`).
    public let imageSoftToken: String, endOfImageToken: String
    /// Image tokens per image (`image_seq_length`, 256 by default): the model's `mm_tokens_per_image`.
    public let imageSeqLength: Int
    /// Pan and scan, as transformers' processor does it when a call asks (`do_pan_and_scan=True`); nil (its
    /// default): every image read whole only. A checkpoint's config does not turn it on (see ``PanAndScan``).
    public var panAndScan: PanAndScan?

    /// Reads the tokenizer files, the image processor config, processor_config.json's `image_seq_length` and the
    /// tokenizer's image markers (tokenizer_config.json's `boi_token`, `eoi_token` and `image_token`, at its top
    /// level or in `extra_special_tokens`).
    ///
    /// - Throws: the loaders' errors; `PipelineError.invalidProcessor` when `image_seq_length` is not a positive
    ///   integer or the tokenizer lacks a marker.
    public init(directory: ModelDirectory) throws {
        let tokenizer = try Tokenizer(directory: directory.url)
        self.tokenizer = tokenizer
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
        let path = directory.url.appendingPathComponent("processor_config.json").path
        let settings = try directory.jsonObject("processor_config.json") ?? [:]
        let length = settings["image_seq_length"] == nil ? 256 : settings["image_seq_length"] as? Int
        guard let length, length > 0 else {
            throw PipelineError.invalidProcessor(path, "image_seq_length must be a positive integer")
        }
        imageSeqLength = length
        let tokenizerConfig = try directory.jsonObject("tokenizer_config.json") ?? [:]
        let extra = tokenizerConfig["extra_special_tokens"] as? [String: Any] ?? [:]
        func marker(_ key: String, _ fallback: String) throws -> String {
            let text = tokenizerConfig[key] as? String ?? extra[key] as? String ?? fallback
            guard tokenizer.tokenId(text) != nil else {
                throw PipelineError.invalidProcessor(directory.url.appendingPathComponent("tokenizer_config.json").path,
                                                     "the tokenizer has no \(key) \(text)")
            }
            return text
        }
        imageToken = try marker("boi_token", "<start_of_image>")
        imageSoftToken = try marker("image_token", "<image_soft_token>")
        endOfImageToken = try marker("eoi_token", "<end_of_image>")
    }

    /// A processor over parts read elsewhere (a GGUF pair's tokenizer and mmproj); `tokenizer` must know the markers.
    public init(imageProcessor: any ImageProcessor, tokenizer: Tokenizer, imageSeqLength: Int,
                imageToken: String = "<start_of_image>", imageSoftToken: String = "<image_soft_token>",
                endOfImageToken: String = "<end_of_image>") {
        self.imageProcessor = imageProcessor
        self.tokenizer = tokenizer
        self.imageSeqLength = imageSeqLength
        (self.imageToken, self.imageSoftToken, self.endOfImageToken) = (imageToken, imageSoftToken, endOfImageToken)
    }

    /// Each image, then with ``panAndScan`` its crops after it, through the image processor.
    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages {
        guard let panAndScan else { return try imageProcessor.preprocess(images) }
        let crops = try images.map(panAndScan.crops(of:))
        var processed = try imageProcessor.preprocess(zip(images, crops).flatMap { [$0] + $1 })
        processed.imageSizes = images.map { ImageSize(height: $0.height, width: $0.width) }
        processed.crops = crops.map(\.count)
        return processed
    }

    /// ``imageSeqLength`` for each image and each of its crops.
    public func imageTokenCounts(_ images: ProcessedImages) -> [Int] {
        (images.crops ?? Array(repeating: 0, count: images.imageSizes.count)).map { imageSeqLength * (1 + $0) }
    }

    /// `full_image_sequence` for an image of `tokenCount` tokens; for a whole multiple of ``imageSeqLength``, the
    /// text of an image and its crops, one sequence each.
    public func imageText(tokenCount: Int) -> String {
        func sequence(_ count: Int) -> String {
            "\n\n\(imageToken)" + String(repeating: imageSoftToken, count: count) + "\(endOfImageToken)\n\n"
        }
        guard tokenCount > imageSeqLength, tokenCount % imageSeqLength == 0 else { return sequence(tokenCount) }
        let crops = Array(repeating: sequence(imageSeqLength), count: tokenCount / imageSeqLength - 1)
        return "Here is the original image \(sequence(imageSeqLength)) and here are some crops to help you see better "
            + crops.joined(separator: " ")
    }

    public func promptIds(_ prompt: String?) throws -> [Int]? { promptIds(prompt, tokenCount: imageSeqLength) }

    /// One prompt per image, each with that image's crops.
    public func promptIds(_ prompt: String?, for images: ProcessedImages) throws -> [[Int]]? {
        imageTokenCounts(images).map { promptIds(prompt, tokenCount: $0) }
    }

    private func promptIds(_ prompt: String?, tokenCount: Int) -> [Int] {
        let text = prompt ?? questionPrompt("Describe this image.")
        let placed = text.contains(imageToken) ? text : imageToken + text
        return tokenizer.encode(placed.replacingOccurrences(of: imageToken, with: imageText(tokenCount: tokenCount))).ids
    }

    /// Gemma 3's chat layout for one user turn with the image, the model's turn opened.
    public func questionPrompt(_ question: String) -> String {
        "<start_of_turn>user\n\(imageToken)\(question)<end_of_turn>\n<start_of_turn>model\n"
    }
}
