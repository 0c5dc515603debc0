import Foundation
import Synchronization
import VLMModels
import VLMTensor
import VLMTemplates
import VLMTokenizers

/// What ``TextGenerationPipeline`` produced for one prompt.
public struct TextGenerationResult: Sendable, Equatable {
    /// The new text, special tokens skipped (as the "text-generation" pipeline's `generated_text` without the prompt).
    public var text: String
    /// The new token ids, ending with the eos token that stopped generation, if one did.
    public var ids: [Int]
    /// The prompt's token ids as the model saw them.
    public var promptTokens: [Int]
}

/// transformers' "text-generation" pipeline for one prompt: tokenize (special tokens added where the tokenizer adds
/// them, or a chat template rendered with the generation prompt), generate, decode.
public final class TextGenerationPipeline: Sendable {
    public let model: any CausalLanguageModel
    public let tokenizer: Tokenizer
    /// The settings used when a call gives none (typically `GenerationConfig.load(directory:)`).
    public let config: GenerationConfig
    /// Renders ``generate(messages:settings:seed:)``'s conversations; nil when the checkpoint has none.
    public let chatTemplate: ChatTemplate?
    private let stopStrings = StopStringCriteria()

    public init(model: any CausalLanguageModel, tokenizer: Tokenizer, config: GenerationConfig, chatTemplate: ChatTemplate? = nil) {
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.chatTemplate = chatTemplate
    }

    /// Continues `prompt`, tokenized as `tokenizer(prompt)` does (special tokens included).
    public func generate(prompt: String, settings: GenerationConfig? = nil, seed: UInt64 = 0) throws -> TextGenerationResult {
        try run(promptTokens: tokenizer.encode(prompt).ids, settings: settings ?? config, seed: seed, onText: nil)
    }

    /// Answers a conversation: `apply_chat_template(messages, add_generation_prompt=True)`, then generation.
    public func generate(messages: [JSONValue], settings: GenerationConfig? = nil, seed: UInt64 = 0) throws -> TextGenerationResult {
        try run(promptTokens: chatPrompt(messages), settings: settings ?? config, seed: seed, onText: nil)
    }

    /// ``generate(prompt:settings:seed:)`` as a stream of text pieces, each yielded as soon as the tokens that make it
    /// are generated (never a broken character). Cancelling the consuming task stops generation.
    public func stream(prompt: String, settings: GenerationConfig? = nil, seed: UInt64 = 0) -> AsyncThrowingStream<String, any Error> {
        stream(settings: settings ?? config, seed: seed) { $0.tokenizer.encode(prompt).ids }
    }

    /// ``generate(messages:settings:seed:)`` as a stream of text pieces.
    public func stream(messages: [JSONValue], settings: GenerationConfig? = nil, seed: UInt64 = 0) -> AsyncThrowingStream<String, any Error> {
        stream(settings: settings ?? config, seed: seed) { try $0.chatPrompt(messages) }
    }

    private func stream(settings: GenerationConfig, seed: UInt64,
                        promptTokens: @escaping @Sendable (TextGenerationPipeline) throws -> [Int]) -> AsyncThrowingStream<String, any Error> {
        AsyncThrowingStream { continuation in
            let task = Task.detached { [self] in
                do {
                    _ = try run(promptTokens: promptTokens(self), settings: settings, seed: seed) { piece in
                        try Task.checkCancellation()
                        if !piece.isEmpty { continuation.yield(piece) }
                    }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// A conversation's prompt ids: `apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`.
    public func promptIds(messages: [JSONValue]) throws -> [Int] {
        try chatPrompt(messages)
    }

    /// The stopping criteria `settings` ask for beyond eos tokens and lengths (its stop strings), for driving the
    /// model through something other than this pipeline (a ``ContinuousBatcher``).
    public func stoppingCriteria(_ settings: GenerationConfig) -> [any StoppingCriterion] {
        stopStrings.criteria(settings, tokenizer: tokenizer, vocabularySize: model.vocabularySize)
    }

    func chatPrompt(_ messages: [JSONValue]) throws -> [Int] {
        if let index = ChatImages.firstMessageWithImages(messages) {
            throw PipelineError.imagesNotSupported(message: index)
        }
        // The template writes the special tokens itself, as apply_chat_template(tokenize=True) assumes.
        return tokenizer.encode(try renderChat(messages), addSpecialTokens: false).ids
    }

    /// transformers' `apply_chat_template(messages, tokenize=True, return_dict=True,
    /// return_assistant_tokens_mask=True)`: a conversation's ids, and 1 for each token of the text the template's
    /// `{% generation %}` blocks mark (the assistant's replies, in templates written for training), 0 elsewhere: the
    /// tokens supervised fine-tuning computes its loss on (the others' labels -100, see
    /// ``CausalLanguageModel/loss(inputIds:attentionMask:labels:)``). A template without generation blocks marks none.
    public func chatIdsWithAssistantMask(messages: [JSONValue], addGenerationPrompt: Bool = false) throws
        -> (ids: [Int], assistantMask: [Int])
    {
        guard let chatTemplate else { throw PipelineError.noChatTemplate }
        if let index = ChatImages.firstMessageWithImages(messages) {
            throw PipelineError.imagesNotSupported(message: index)
        }
        let rendered = try chatTemplate.renderMarkingGenerations(
            messages: messages, addGenerationPrompt: addGenerationPrompt,
            bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token), eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
        let encoding = tokenizer.encode(rendered.text, addSpecialTokens: false)
        return (encoding.ids, encoding.mask(covering: rendered.generations))
    }

    /// `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`.
    func renderChat(_ messages: [JSONValue], addGenerationPrompt: Bool = true) throws -> String {
        guard let chatTemplate else { throw PipelineError.noChatTemplate }
        return try chatTemplate.render(messages: messages, addGenerationPrompt: addGenerationPrompt,
                                       bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token),
                                       eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
    }

    /// Generates from `promptTokens`; with `cache`, from where the cache's tokens (the prompt's first ones) end.
    ///
    /// - Parameter embeddings: the input embeddings of the prompt's positions from the given one on, for prompts
    ///   whose embeddings carry image features; nil embeds the tokens.
    func run(promptTokens: [Int], settings: GenerationConfig, seed: UInt64, cache: KVCache? = nil,
             embeddings: ((_ from: Int) throws -> Tensor)? = nil,
             onText: ((String) throws -> Void)?) throws -> TextGenerationResult {
        guard !promptTokens.isEmpty else { throw PipelineError.emptyPrompt }
        let criteria = stopStrings.criteria(settings, tokenizer: tokenizer, vocabularySize: model.vocabularySize)
        var detokenizer = StreamingDetokenizer(tokenizer: tokenizer)
        let onStep: ([Int?]) throws -> Void = { tokens in
            if let onText, let token = tokens[0] { try onText(detokenizer.append(token)) }
        }
        let output = try cache.map {
            try model.generate(continuing: $0, inputIds: promptTokens, inputsEmbeds: embeddings?($0.length),
                               config: settings, stoppingCriteria: criteria, seed: seed, onStep: onStep)
        } ?? model.generate(inputsEmbeds: embeddings?(0) ?? model.embed([promptTokens]), promptIds: [promptTokens],
                            config: settings, stoppingCriteria: criteria, seed: seed, onStep: onStep)
        try onText?(detokenizer.finish())
        let ids = output.sequences.first ?? []
        return TextGenerationResult(text: tokenizer.decode(ids, skipSpecialTokens: true), ids: ids, promptTokens: promptTokens)
    }
}

/// The stop-string criterion of a pipeline's settings. Matching needs every token's bytes, one decode per token, so
/// the table is built on the first call with stop strings and kept.
final class StopStringCriteria: Sendable {
    private let tokenBytes = Mutex<[[UInt8]]?>(nil)

    func criteria(_ settings: GenerationConfig, tokenizer: Tokenizer, vocabularySize: Int) -> [any StoppingCriterion] {
        guard !settings.stopStrings.isEmpty else { return [] }
        let bytes = tokenBytes.withLock { cached in
            if let cached { return cached }
            let bytes = tokenizer.tokenBytes(count: vocabularySize)
            cached = bytes
            return bytes
        }
        return [StopStringCriterion(stopStrings: settings.stopStrings, tokenBytes: bytes)]
    }
}

extension TextGenerationPipeline {
    /// The perplexity of `text`, tokenized as the tokenizer does by default (special tokens included), under the
    /// model; see ``CausalLanguageModel/perplexity(of:context:stride:)``.
    public func perplexity(of text: String, context: Int, stride: Int) throws -> Perplexity {
        try model.perplexity(of: tokenizer.encode(text).ids, context: context, stride: stride)
    }
}
