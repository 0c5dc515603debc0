import Foundation
import VLMCheckpoint
import VLMImages
import VLMGrammar
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

    /// How conversations become prompts: the processor's image tokens through the chat template.
    public let layout: ImageChatPromptLayout

    /// - Parameter imagePartsAsText: messages reach the chat template with text contents, each image part written as
    ///   the image token (see ``ImageChatPromptLayout/init(processor:chatTemplate:imagePartsAsText:)``).
    public init(model: any ImageChatModel, processor: any ImageChatProcessor, chatTemplate: ChatTemplate,
                config: GenerationConfig, imagePartsAsText: Bool = false, responseTemplate: ResponseTemplate? = nil) {
        self.model = model
        self.processor = processor
        layout = ImageChatPromptLayout(processor: processor, chatTemplate: chatTemplate, imagePartsAsText: imagePartsAsText)
        text = TextGenerationPipeline(model: model.textDecoder, tokenizer: processor.tokenizer, config: config,
                                      chatTemplate: chatTemplate, responseTemplate: responseTemplate)
    }

    /// The same pipeline reading images with Gemma 3's pan and scan (transformers' `do_pan_and_scan=True`).
    ///
    /// - Throws: `PipelineError.panAndScanNotSupported` for a model whose processor is not Gemma 3's.
    public func withPanAndScan(_ settings: PanAndScan = PanAndScan()) throws -> ImageTextToTextPipeline {
        guard var gemma = processor as? Gemma3Processor else { throw PipelineError.panAndScanNotSupported }
        gemma.panAndScan = settings
        return ImageTextToTextPipeline(model: model, processor: gemma, chatTemplate: layout.chatTemplate, config: text.config,
                                       imagePartsAsText: layout.imagePartsAsText, responseTemplate: text.responseTemplate)
    }

    /// The same model and processor with another chat template (llama-server's `--chat-template-file`).
    public func withChatTemplate(_ template: ChatTemplate) -> ImageTextToTextPipeline {
        ImageTextToTextPipeline(model: model, processor: processor, chatTemplate: template, config: text.config,
                                imagePartsAsText: layout.imagePartsAsText, responseTemplate: text.responseTemplate)
    }

    /// The same pipeline whose chat template gets `variables` in every rendering that does not set them itself
    /// (``TextGenerationPipeline/withChatTemplateContext(_:)``).
    public func withChatTemplateContext(_ variables: [String: JSONValue]) -> ImageTextToTextPipeline {
        variables.isEmpty ? self : withChatTemplate(layout.chatTemplate.withDefaultContext(variables))
    }

    /// Loads the model, its processor, chat template and generation settings from a checkpoint directory, refusing a
    /// family that does not serve `task` before reading anything else.
    ///
    /// - Parameter chatTemplate: a template in place of the checkpoint's own.
    /// - Throws: the loaders' errors; `PipelineError.noChatTemplate` when there is no chat template;
    ///   `ModelError.invalidConfig` for an image-to-text model that does not chat through a chat template.
    public convenience init(directory: URL, task: ModelTask = .generate, chatTemplate: ChatTemplate? = nil) throws {
        let pipeline = try ImageToTextPipeline(directory: directory, task: task)
        guard let model = pipeline.model as? any ImageChatModel, let processor = pipeline.processor as? any ImageChatProcessor else {
            throw ModelError.invalidConfig("this image-to-text model does not chat through a chat template",
                                           file: directory.appendingPathComponent("config.json").path)
        }
        try self.init(model: model, processor: processor, directory: directory, config: pipeline.config, chatTemplate: chatTemplate)
    }

    /// The image chat pipeline over an image-to-text pipeline's model and processor when they chat through a chat
    /// template (LLaVA; `chatTemplate` in place of the checkpoint's); nil for those that do not (BLIP-2, whose chat
    /// is ``VisualChatSession``'s prompting).
    public static func chatting(with pipeline: ImageToTextPipeline, directory: URL,
                                chatTemplate: ChatTemplate? = nil) throws -> ImageTextToTextPipeline? {
        guard let model = pipeline.model as? any ImageChatModel, let processor = pipeline.processor as? any ImageChatProcessor else {
            return nil
        }
        return try ImageTextToTextPipeline(model: model, processor: processor, directory: directory, config: pipeline.config,
                                           chatTemplate: chatTemplate)
    }

    private convenience init(model: any ImageChatModel, processor: any ImageChatProcessor, directory: URL,
                             config: GenerationConfig, chatTemplate: ChatTemplate?) throws {
        guard let template = try chatTemplate ?? ChatTemplate.load(directory: directory) else { throw PipelineError.noChatTemplate }
        self.init(model: model, processor: processor, chatTemplate: template, config: config,
                  responseTemplate: try ResponseTemplate.load(directory: directory))
    }

    /// Answers a conversation: its images read from their parts' references (see ``ChatImages``), the prompt laid
    /// out as ``promptIds(_:imageTokenCounts:)`` does, then greedy decoding, sampling or beam search by `settings`.
    /// `onText` receives the reply piece by piece as it is generated (not with beam search).
    ///
    /// - Parameter tools: OpenAI-style function descriptions for the chat template (`apply_chat_template(tools=…)`);
    ///   without a grammar, the reply's calls to them are held to their schemas as
    ///   ``TextGenerationPipeline/generate(messages:tools:settings:seed:grammar:continueFinalMessage:)`` holds them.
    /// - Parameter continueFinalMessage: continue the last message (`continue_final_message=True`) instead of starting
    ///   a new one; by default when it is the assistant's, as transformers' pipeline decides.
    public func generate(messages: [JSONValue], tools: [JSONValue]? = nil, settings: GenerationConfig? = nil, seed: UInt64 = 0,
                         grammar: Grammar? = nil, continueFinalMessage: Bool? = nil,
                         onText: ((String) throws -> Void)? = nil) throws -> TextGenerationResult {
        let images = try ChatImages.references(in: messages).map(ChatImages.load)
        // One conversation's images, read as transformers reads them together (LLaVA-OneVision: whole when several).
        let processed = try images.isEmpty ? nil : processor.preprocess(images, conversationImageCount: images.count)
        let features = try processed.map(model.imageFeatures) ?? []
        let prompt = try layout.promptIds(messages, imageTokenCounts: processed.map(processor.imageTokenCounts) ?? [],
                                          templateArguments: tools.map { ["tools": .array($0)] } ?? [:],
                                          continueFinalMessage: continueFinalMessage ?? endsWithAssistantMessage(messages))
        let settings = settings ?? text.config
        return try run(promptTokens: prompt, imageFeatures: features, settings: settings, seed: seed,
                       constraint: text.chatConstraint(grammar: grammar, tools: tools, promptIds: prompt, settings: settings),
                       onText: onText)
    }

    /// A conversation as a language model's prompt: its ids, and, when it holds images, the input embeddings with
    /// the images' features in place of their tokens, the key under which its prefix may be reused (the ids with
    /// each image's tokens standing for that image's pixels) and the attention mask where the model reads images
    /// otherwise than causally. What ``generate(messages:settings:seed:onText:)`` runs, for driving the language
    /// model through something else (a ``ContinuousBatcher``).
    ///
    /// - Parameters:
    ///   - templateArguments: more chat template variables (`apply_chat_template(**kwargs)`).
    ///   - addGenerationPrompt: false ends the prompt with the last message.
    ///   - continueFinalMessage: the prompt ends inside the last message, for the model to continue it
    ///     (`continue_final_message=True`) instead of with the generation prompt.
    public func prompt(messages: [JSONValue], templateArguments: [String: JSONValue] = [:], addGenerationPrompt: Bool = true,
                       continueFinalMessage: Bool = false) throws -> LanguageModelPrompt {
        let images = try ChatImages.references(in: messages).map(ChatImages.load)
        guard !images.isEmpty else {
            let ids = try layout.promptIds(messages, imageTokenCounts: [], addGenerationPrompt: addGenerationPrompt,
                                           templateArguments: templateArguments, continueFinalMessage: continueFinalMessage)
            return LanguageModelPrompt(ids: ids)
        }
        let processed = try processor.preprocess(images, conversationImageCount: images.count)
        let counts = processor.imageTokenCounts(processed)
        let ids = try layout.promptIds(messages, imageTokenCounts: counts, addGenerationPrompt: addGenerationPrompt,
                                       templateArguments: templateArguments, continueFinalMessage: continueFinalMessage)
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
        return LanguageModelPrompt(ids: ids, inputsEmbeds: embeds, prefixKey: key,
                                   attentionMask: model.attentionMask(promptIds: ids))
    }

    /// The conversation's prompt ids (``ImageChatPromptLayout/promptIds(_:imageTokenCounts:addGenerationPrompt:)``).
    public func promptIds(_ messages: [JSONValue], imageTokenCounts: [Int], addGenerationPrompt: Bool = true) throws -> [Int] {
        try layout.promptIds(messages, imageTokenCounts: imageTokenCounts, addGenerationPrompt: addGenerationPrompt)
    }

    /// Generates from a prompt holding the image tokens of `imageFeatures` (one tensor per image of the whole
    /// prompt); with `cache`, from where the cache's tokens (the prompt's first ones) end.
    func run(promptTokens: [Int], imageFeatures: [Tensor], settings: GenerationConfig, seed: UInt64,
             cache: KVCache? = nil, constraint: (any GenerationConstraint)? = nil,
             onText: ((String) throws -> Void)?) throws -> TextGenerationResult {
        try text.run(promptTokens: promptTokens, settings: settings, seed: seed, cache: cache,
                     embeddings: { [model] start in
                         try model.inputsEmbeds(inputIds: promptTokens, from: start, imageFeatures: imageFeatures)
                     },
                     attentionMask: model.attentionMask(promptIds: promptTokens), constraint: constraint, onText: onText)
    }
}

/// A prompt as a language model runs it (``ImageTextToTextPipeline/prompt(messages:templateArguments:addGenerationPrompt:continueFinalMessage:)``).
public struct LanguageModelPrompt: @unchecked Sendable {
    public var ids: [Int]
    /// `[1, ids.count, hidden]` with image features in their tokens' places; nil embeds the ids.
    public var inputsEmbeds: Tensor?
    /// What identifies the prompt's positions for reusing a cached prefix (``BatchRequest/prefixKey``); nil: never
    /// reused nor kept.
    public var prefixKey: [Int]?
    /// Where the model reads image tokens otherwise than causally (``ImageChatModel/attentionMask(promptIds:)``).
    public var attentionMask: [Int]?

    /// A text prompt, its ids its own prefix key.
    public init(ids: [Int]) {
        self.init(ids: ids, inputsEmbeds: nil, prefixKey: ids, attentionMask: nil)
    }

    public init(ids: [Int], inputsEmbeds: Tensor?, prefixKey: [Int]?, attentionMask: [Int]?) {
        (self.ids, self.inputsEmbeds, self.prefixKey, self.attentionMask) = (ids, inputsEmbeds, prefixKey, attentionMask)
    }
}
