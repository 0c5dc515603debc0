import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTemplates
import VLMTokenizers
import VLMTensor

/// transformers' "image-text-to-text" pipeline for chat models that read images (LLaVA): a conversation whose messages
/// hold image parts is rendered through the checkpoint's chat template, each image marker expanded into the image's
/// tokens and the text tokenized as the processor does (`processor.apply_chat_template(messages,
/// add_generation_prompt=True, tokenize=True)`), then answered by the language model with the images' features in
/// place of their tokens.
public final class ImageTextToTextPipeline: Sendable {
    public let model: any ImageChatModel
    public let processor: any ImageChatProcessor
    /// The language model's side: tokenizer, chat template, generation settings (its `config` is the default for
    /// calls that give none: the checkpoint's generation config, at most 256 new tokens where it sets no length).
    public let text: TextGenerationPipeline

    /// Whether messages reach the chat template with text contents, each image part written as the image token, as
    /// llama.cpp gives them to a language model's own template (which reads string contents only): text parts joined
    /// by newlines, none next to an image.
    let imagePartsAsText: Bool

    public init(model: any ImageChatModel, processor: any ImageChatProcessor, chatTemplate: ChatTemplate,
                config: GenerationConfig, imagePartsAsText: Bool = false) {
        self.model = model
        self.processor = processor
        self.imagePartsAsText = imagePartsAsText
        text = TextGenerationPipeline(model: model.textDecoder, tokenizer: processor.tokenizer, config: config,
                                      chatTemplate: chatTemplate)
    }

    /// Loads the model, its processor, chat template and generation settings from a checkpoint directory, refusing a
    /// family that does not serve `task` before reading anything else.
    ///
    /// - Throws: the loaders' errors; `PipelineError.noChatTemplate` when the checkpoint has no chat template;
    ///   `ModelError.invalidConfig` for an image-to-text model that does not chat through a chat template.
    public convenience init(directory: URL, task: ModelTask = .generate) throws {
        let pipeline = try ImageToTextPipeline(directory: directory, task: task)
        guard let model = pipeline.model as? any ImageChatModel, let processor = pipeline.processor as? any ImageChatProcessor else {
            throw ModelError.invalidConfig("this image-to-text model does not chat through a chat template",
                                           file: directory.appendingPathComponent("config.json").path)
        }
        try self.init(model: model, processor: processor, directory: directory, config: pipeline.config)
    }

    /// The image chat pipeline over an image-to-text pipeline's model and processor when they chat through a chat
    /// template (LLaVA); nil for those that do not (BLIP-2, whose chat is ``VisualChatSession``'s prompting).
    public static func chatting(with pipeline: ImageToTextPipeline, directory: URL) throws -> ImageTextToTextPipeline? {
        guard let model = pipeline.model as? any ImageChatModel, let processor = pipeline.processor as? any ImageChatProcessor else {
            return nil
        }
        return try ImageTextToTextPipeline(model: model, processor: processor, directory: directory, config: pipeline.config)
    }

    private convenience init(model: any ImageChatModel, processor: any ImageChatProcessor, directory: URL,
                             config: GenerationConfig) throws {
        guard let template = try ChatTemplate.load(directory: directory) else { throw PipelineError.noChatTemplate }
        self.init(model: model, processor: processor, chatTemplate: template, config: config)
    }

    /// Answers a conversation: its images read from their parts' references (see ``ChatImages``), the prompt laid
    /// out as ``promptIds(_:imageTokenCounts:)`` does, then greedy decoding, sampling or beam search by `settings`.
    /// `onText` receives the reply piece by piece as it is generated (not with beam search).
    public func generate(messages: [JSONValue], settings: GenerationConfig? = nil, seed: UInt64 = 0,
                         onText: ((String) throws -> Void)? = nil) throws -> TextGenerationResult {
        let images = try ChatImages.references(in: messages).map(ChatImages.load)
        // One conversation's images, read as transformers reads them together (LLaVA-OneVision: whole when several).
        let processed = try images.isEmpty ? nil : processor.preprocess(images, conversationImageCount: images.count)
        let features = try processed.map(model.imageFeatures) ?? []
        let prompt = try promptIds(messages, imageTokenCounts: processed.map(processor.imageTokenCounts) ?? [])
        return try run(promptTokens: prompt, imageFeatures: features, settings: settings ?? text.config, seed: seed,
                       onText: onText)
    }

    /// A conversation as a language model's prompt: its ids, and, when it holds images, the input embeddings with
    /// the images' features in place of their tokens and the key under which its prefix may be reused (the ids with
    /// each image's tokens standing for that image's pixels). What ``generate(messages:settings:seed:onText:)``
    /// runs, for driving the language model through something else (a ``ContinuousBatcher``).
    public func prompt(messages: [JSONValue]) throws -> (ids: [Int], inputsEmbeds: Tensor?, prefixKey: [Int]) {
        let images = try ChatImages.references(in: messages).map(ChatImages.load)
        guard !images.isEmpty else {
            let ids = try promptIds(messages, imageTokenCounts: [])
            return (ids, nil, ids)
        }
        let processed = try processor.preprocess(images, conversationImageCount: images.count)
        let counts = processor.imageTokenCounts(processed)
        let ids = try promptIds(messages, imageTokenCounts: counts)
        let embeds = try model.inputsEmbeds(inputIds: ids, imageFeatures: model.imageFeatures(processed))
        // Each image's run of image tokens becomes a value derived from its pixels (and its layout), never a token id.
        var key = ids
        var tags = images.map { image -> Int in
            var hasher = Hasher()
            hasher.combine(image.width)
            hasher.combine(image.height)
            image.pixels.withUnsafeBytes { hasher.combine(bytes: $0) }
            return -1 - abs(hasher.finalize() % (1 << 40))
        }.makeIterator()
        var remaining = 0, tag = 0
        var runs = counts.makeIterator()
        for index in key.indices where key[index] == model.imageTokenId {
            if remaining == 0 {
                remaining = runs.next() ?? 0
                tag = tags.next() ?? -1
            }
            key[index] = tag
            remaining -= 1
        }
        return (ids, embeds, key)
    }

    /// The conversation's prompt ids: the chat template rendered with the generation prompt (without it when
    /// `addGenerationPrompt` is false: a whole conversation to train on), its i-th image marker expanded into
    /// `imageTokenCounts[i]` image tokens, the text tokenized with the tokenizer's special tokens unless the template
    /// already wrote the bos token (as transformers' processors do).
    ///
    /// - Throws: `PipelineError.imageCountMismatch` when the template wrote a different number of markers than
    ///   there are images.
    public func promptIds(_ messages: [JSONValue], imageTokenCounts: [Int], addGenerationPrompt: Bool = true) throws -> [Int] {
        let rendered = try text.renderChat(imagePartsAsText ? messages.map(contentAsText) : messages,
                                           addGenerationPrompt: addGenerationPrompt)
        return try encode(expandingImageMarkers(in: rendered, imageTokenCounts: imageTokenCounts).text, rendered: rendered).ids
    }

    /// transformers' `processor.apply_chat_template(messages, tokenize=True, return_dict=True,
    /// return_assistant_tokens_mask=True)`: the whole conversation's ids as ``promptIds(_:imageTokenCounts:addGenerationPrompt:)``
    /// lays them out without the generation prompt, and 1 for each token overlapping the text of the template's
    /// `{% generation %}` blocks (the assistant's replies in templates written for training; the blocks' places
    /// shifted past the image markers expanded before them), 0 elsewhere: the tokens supervised fine-tuning scores
    /// (TRL's `assistant_only_loss`). A template without generation blocks marks none.
    public func conversationIdsWithAssistantMask(_ messages: [JSONValue], imageTokenCounts: [Int]) throws
        -> (ids: [Int], assistantMask: [Int])
    {
        guard let template = text.chatTemplate else { throw PipelineError.noChatTemplate }
        let tokenizer = processor.tokenizer
        let rendered = try template.renderMarkingGenerations(
            messages: imagePartsAsText ? messages.map(contentAsText) : messages, addGenerationPrompt: false,
            bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token), eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
        let expansion = try expandingImageMarkers(in: rendered.text, imageTokenCounts: imageTokenCounts)
        let encoding = try encode(expansion.text, rendered: rendered.text)
        // A character's place after the expansion: moved by what the markers ending at or before it gained.
        func shifted(_ offset: Int) -> Int {
            offset + (expansion.markers.last { $0.end <= offset }?.gainedSoFar ?? 0)
        }
        var mask = Array(repeating: 0, count: encoding.ids.count)
        for span in rendered.generations {
            let (start, end) = (shifted(span.lowerBound), shifted(span.upperBound))
            for (index, offsets) in encoding.offsets.enumerated() where offsets.lowerBound < end && offsets.upperBound > start {
                mask[index] = 1
            }
        }
        return (encoding.ids, mask)
    }

    /// `rendered` with its i-th image marker repeated `imageTokenCounts[i]` times, and where each marker ended in
    /// `rendered` (Unicode scalar offsets) with the characters the expansion had added up to its end.
    private func expandingImageMarkers(in rendered: String, imageTokenCounts: [Int]) throws
        -> (text: String, markers: [(end: Int, gainedSoFar: Int)])
    {
        let marker = processor.imageToken
        let pieces = rendered.components(separatedBy: marker)
        guard pieces.count - 1 == imageTokenCounts.count else {
            throw PipelineError.imageCountMismatch(markers: pieces.count - 1, images: imageTokenCounts.count, marker: marker)
        }
        let markerLength = marker.unicodeScalars.count
        var expanded = pieces[0], end = pieces[0].unicodeScalars.count, gained = 0
        var markers: [(end: Int, gainedSoFar: Int)] = []
        for (count, piece) in zip(imageTokenCounts, pieces.dropFirst()) {
            expanded += String(repeating: marker, count: count) + piece
            end += markerLength
            gained += (count - 1) * markerLength
            markers.append((end, gained))
            end += piece.unicodeScalars.count
        }
        return (expanded, markers)
    }

    /// The expanded conversation tokenized with the tokenizer's special tokens unless the template already wrote the
    /// bos token, as transformers' processors do.
    private func encode(_ expanded: String, rendered: String) throws -> Encoding {
        let tokenizer = processor.tokenizer
        let writesBos = tokenizer.bosTokenId.flatMap(tokenizer.token).map(rendered.hasPrefix) ?? false
        let encoding = tokenizer.encode(expanded, addSpecialTokens: !writesBos)
        guard !encoding.ids.isEmpty else { throw PipelineError.emptyPrompt }
        return encoding
    }

    /// `message` with its list of parts as one text, as llama.cpp's chat code joins them (`concat_content_parts`).
    private func contentAsText(_ message: JSONValue) -> JSONValue {
        guard case let .object(fields) = message, case let .array(parts)? = message["content"] else { return message }
        var text = "", lastWasImage = false
        for part in parts {
            if part["type"] == .string("image") {
                text += processor.imageToken
                lastWasImage = true
            } else if part["type"] == .string("text"), case let .string(piece)? = part["text"] {
                if !lastWasImage && !text.isEmpty { text += "\n" }
                text += piece
                lastWasImage = false
            }
        }
        return .object(fields.map { $0.0 == "content" ? ($0.0, .string(text)) : $0 })
    }

    /// Generates from a prompt holding the image tokens of `imageFeatures` (one tensor per image of the whole
    /// prompt); with `cache`, from where the cache's tokens (the prompt's first ones) end.
    func run(promptTokens: [Int], imageFeatures: [Tensor], settings: GenerationConfig, seed: UInt64,
             cache: KVCache? = nil, onText: ((String) throws -> Void)?) throws -> TextGenerationResult {
        try text.run(promptTokens: promptTokens, settings: settings, seed: seed, cache: cache,
                     embeddings: { [model] start in
                         try model.inputsEmbeds(inputIds: promptTokens, from: start, imageFeatures: imageFeatures)
                     },
                     onText: onText)
    }
}
