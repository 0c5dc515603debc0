import Foundation
import Synchronization
import VLMGrammar
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
    /// How the model's replies are laid out (tokenizer_config.json's `response_template`), to split a reply into
    /// content, reasoning and tool calls; nil when the checkpoint declares none.
    public let responseTemplate: ResponseTemplate?
    private let tokenTable = TokenTable()

    public init(model: any CausalLanguageModel, tokenizer: Tokenizer, config: GenerationConfig, chatTemplate: ChatTemplate? = nil,
                responseTemplate: ResponseTemplate? = nil) {
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.chatTemplate = chatTemplate
        self.responseTemplate = responseTemplate
    }

    /// The same model and tokenizer with another chat template (llama-server's `--chat-template-file`, vLLM's
    /// `--chat-template`): for a checkpoint whose own template does not show tools, or that has none.
    public func withChatTemplate(_ template: ChatTemplate) -> TextGenerationPipeline {
        TextGenerationPipeline(model: model, tokenizer: tokenizer, config: config, chatTemplate: template,
                               responseTemplate: responseTemplate)
    }

    /// The same pipeline whose chat template gets `variables` in every rendering that does not set them itself
    /// (llama-cli's and llama-server's `--chat-template-kwargs`: `["enable_thinking": false]` for Qwen 3); itself
    /// without a template.
    public func withChatTemplateContext(_ variables: [String: JSONValue]) -> TextGenerationPipeline {
        guard let chatTemplate, !variables.isEmpty else { return self }
        return withChatTemplate(chatTemplate.withDefaultContext(variables))
    }

    /// A chat reply as the assistant message transformers' text-generation pipeline returns for a chat when the
    /// tokenizer has a response template: `tokenizer.parse_response(reply, prefix=prompt, tools=tools)`, the reply's
    /// and the prompt's ids decoded with their special tokens (the template's delimiters are often special tokens).
    ///
    /// - Parameter template: the template to parse with (default: the checkpoint's ``responseTemplate``).
    /// - Returns: nil when there is no template.
    public func message(replyIds: [Int], promptIds: [Int], tools: [JSONValue]? = nil,
                        template: ResponseTemplate? = nil) throws -> JSONValue? {
        guard let template = template ?? responseTemplate else { return nil }
        return try template.parse(tokenizer.decode(replyIds, skipSpecialTokens: false),
                                  prefix: tokenizer.decode(promptIds, skipSpecialTokens: false), tools: tools)
    }

    /// Continues `prompt`, tokenized as `tokenizer(prompt)` does (special tokens included).
    ///
    /// - Parameter grammar: what the new text must follow (llama.cpp's grammar-constrained sampling): only tokens
    ///   the grammar can read are chosen, an eos token only once the text is a whole match, and generation stops
    ///   where the grammar allows nothing more.
    public func generate(prompt: String, settings: GenerationConfig? = nil, seed: UInt64 = 0,
                         grammar: Grammar? = nil) throws -> TextGenerationResult {
        let settings = settings ?? config
        return try run(promptTokens: tokenizer.encode(prompt).ids, settings: settings, seed: seed,
                       constraint: grammar.map { constraint($0, settings: settings) }, onText: nil)
    }

    /// Answers a conversation: `apply_chat_template(messages, tools=tools, add_generation_prompt=True)`, then
    /// generation (``message(replyIds:promptIds:tools:template:)`` parses the reply into an assistant message).
    /// With tools and no grammar, the tool calls the reply makes are held to the tools' schemas in the model's own
    /// format, the rest of it free (``toolCallConstraint(tools:promptIds:settings:template:parallelCalls:)``).
    /// `continueFinalMessage` continues the last message (a reply the caller began, `continue_final_message=True`)
    /// instead of starting a new one; by default, as transformers' pipeline decides, when that message is the
    /// assistant's.
    public func generate(messages: [JSONValue], tools: [JSONValue]? = nil, settings: GenerationConfig? = nil, seed: UInt64 = 0,
                         grammar: Grammar? = nil, continueFinalMessage: Bool? = nil) throws -> TextGenerationResult {
        let settings = settings ?? config
        let prompt = try chatPrompt(messages, tools: tools,
                                    continueFinalMessage: continueFinalMessage ?? endsWithAssistantMessage(messages))
        return try run(promptTokens: prompt, settings: settings, seed: seed,
                       constraint: chatConstraint(grammar: grammar, tools: tools, promptIds: prompt, settings: settings), onText: nil)
    }

    /// A chat reply's constraint: the grammar, else with tools their calls' (when the response template has a format
    /// for them; not under beam search, which takes no constraint).
    func chatConstraint(grammar: Grammar?, tools: [JSONValue]?, promptIds: [Int], settings: GenerationConfig) throws -> (any GenerationConstraint)? {
        if let grammar { return constraint(grammar, settings: settings) }
        guard let tools, settings.numBeams == 1 else { return nil }
        return try toolCallConstraint(tools: tools, promptIds: promptIds, settings: settings)
    }

    /// What holds a chat reply's tool calls to `tools` while leaving the rest of it free, llama.cpp's lazy grammars
    /// with the calls found by the response template (see ``ToolCallConstraint``).
    ///
    /// - Parameters:
    ///   - promptIds: the chat's prompt, whose text the template's parser reads first.
    ///   - template: the template that says where calls go (default: the checkpoint's ``responseTemplate``).
    ///   - parallelCalls: false ends the reply after its first call.
    /// - Returns: nil without a template, or where its calls are not JSON between literal delimiters.
    public func toolCallConstraint(tools: [JSONValue], promptIds: [Int], settings: GenerationConfig,
                                   template: ResponseTemplate? = nil, parallelCalls: Bool = true) throws -> ToolCallConstraint? {
        guard let template = template ?? responseTemplate else { return nil }
        let count = model.vocabularySize
        return try ToolCallConstraint(template: template, tools: tools, prompt: tokenizer.decode(promptIds, skipSpecialTokens: false),
                                      tokenBytes: tokenTable.bytes(tokenizer, count: count),
                                      grammarConstraint: { tokenTable.constraint($0, endTokens: [], tokenizer: tokenizer, count: count) },
                                      endTokens: Set(settings.eosTokenIds), parallelCalls: parallelCalls)
    }

    /// ``generate(prompt:settings:seed:grammar:)`` as a stream of text pieces, each yielded as soon as the tokens
    /// that make it are generated (never a broken character). Cancelling the consuming task stops generation.
    public func stream(prompt: String, settings: GenerationConfig? = nil, seed: UInt64 = 0,
                       grammar: Grammar? = nil) -> AsyncThrowingStream<String, any Error> {
        let settings = settings ?? config
        return stream(settings: settings, seed: seed) { pipeline in
            let ids = pipeline.tokenizer.encode(prompt).ids
            return (ids, grammar.map { pipeline.constraint($0, settings: settings) })
        }
    }

    /// ``generate(messages:tools:settings:seed:grammar:continueFinalMessage:)`` as a stream of text pieces.
    public func stream(messages: [JSONValue], tools: [JSONValue]? = nil, settings: GenerationConfig? = nil, seed: UInt64 = 0,
                       grammar: Grammar? = nil, continueFinalMessage: Bool? = nil) -> AsyncThrowingStream<String, any Error> {
        let settings = settings ?? config
        return stream(settings: settings, seed: seed) { pipeline in
            let ids = try pipeline.chatPrompt(messages, tools: tools,
                                              continueFinalMessage: continueFinalMessage ?? endsWithAssistantMessage(messages))
            return (ids, try pipeline.chatConstraint(grammar: grammar, tools: tools, promptIds: ids, settings: settings))
        }
    }

    private func stream(settings: GenerationConfig, seed: UInt64,
                        prompt: @escaping @Sendable (TextGenerationPipeline) throws -> (ids: [Int], constraint: (any GenerationConstraint)?))
        -> AsyncThrowingStream<String, any Error> {
        AsyncThrowingStream { continuation in
            let task = Task.detached { [self] in
                // A thread of Swift's shared pool, maybe another next time: its OpenMP workers end with the stream.
                defer { releaseParallelWorkers() }
                do {
                    let (ids, constraint) = try prompt(self)
                    _ = try run(promptTokens: ids, settings: settings, seed: seed, constraint: constraint) { piece in
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

    /// A conversation's prompt ids: `apply_chat_template(messages, tools=tools, add_generation_prompt=True,
    /// tokenize=True, **templateArguments)` (`tools`: OpenAI-style function descriptions, for the templates that show
    /// them to the model; `templateArguments`: more template variables, such as Qwen 3's `enable_thinking`).
    /// `addGenerationPrompt` false ends the prompt with the last message; `continueFinalMessage`
    /// (`continue_final_message=True`, instead of the generation prompt) ends it inside the last message, a reply
    /// begun by the caller for the model to continue.
    public func promptIds(messages: [JSONValue], tools: [JSONValue]? = nil, templateArguments: [String: JSONValue] = [:],
                          addGenerationPrompt: Bool = true, continueFinalMessage: Bool = false) throws -> [Int] {
        try chatPrompt(messages, tools: tools, templateArguments: templateArguments, addGenerationPrompt: addGenerationPrompt,
                       continueFinalMessage: continueFinalMessage)
    }

    /// The stopping criteria `settings` ask for beyond eos tokens and lengths (its stop strings), for driving the
    /// model through something other than this pipeline (a ``ContinuousBatcher``).
    public func stoppingCriteria(_ settings: GenerationConfig) -> [any StoppingCriterion] {
        tokenTable.stoppingCriteria(settings, tokenizer: tokenizer, count: model.vocabularySize)
    }

    /// GBNF text as a grammar for this pipeline's model: a token written by text (`<think>`) is the one token this
    /// tokenizer makes of it, special tokens included, as llama.cpp resolves it against the model's vocabulary.
    public func grammar(gbnf text: String, root: String = "root") throws(GrammarError) -> Grammar {
        try Grammar(gbnf: text, root: root) { [tokenizer] in tokenizer.encode($0, addSpecialTokens: false).ids }
    }

    /// `grammar` over this pipeline's vocabulary, ending where `settings`' eos tokens end generation (for driving
    /// the model through a ``ContinuousBatcher``; the `generate` and `stream` calls build it themselves).
    ///
    /// The last few grammars' constraints are kept and handed out again for the same grammar text and eos tokens
    /// (a server sees the same `response_format` request after request), with the states their masks were worked
    /// out for.
    public func constraint(_ grammar: Grammar, settings: GenerationConfig) -> GrammarConstraint {
        tokenTable.constraint(grammar, endTokens: Set(settings.eosTokenIds), tokenizer: tokenizer, count: model.vocabularySize)
    }

    func chatPrompt(_ messages: [JSONValue], tools: [JSONValue]? = nil, templateArguments: [String: JSONValue] = [:],
                    addGenerationPrompt: Bool = true, continueFinalMessage: Bool = false) throws -> [Int] {
        if let index = ChatImages.firstMessageWithImages(messages) {
            throw PipelineError.imagesNotSupported(message: index)
        }
        // The template writes the special tokens itself, as apply_chat_template(tokenize=True) assumes.
        let text = try renderChat(messages, addGenerationPrompt: addGenerationPrompt, tools: tools, templateArguments: templateArguments,
                                  continueFinalMessage: continueFinalMessage)
        return tokenizer.encode(text, addSpecialTokens: false).ids
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

    /// `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)` (with `continueFinalMessage`,
    /// `continue_final_message=True` and no generation prompt).
    func renderChat(_ messages: [JSONValue], addGenerationPrompt: Bool = true, tools: [JSONValue]? = nil,
                    templateArguments: [String: JSONValue] = [:], continueFinalMessage: Bool = false) throws -> String {
        guard let chatTemplate else { throw PipelineError.noChatTemplate }
        var context = templateArguments
        if let tools { context["tools"] = .array(tools) }
        return try chatTemplate.render(messages: messages, addGenerationPrompt: addGenerationPrompt && !continueFinalMessage,
                                       bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token),
                                       eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token), extraContext: context,
                                       continueFinalMessage: continueFinalMessage)
    }

    /// Generates from `promptTokens`; with `cache`, from where the cache's tokens (the prompt's first ones) end.
    ///
    /// - Parameters:
    ///   - embeddings: the input embeddings of the prompt's positions from the given one on, for prompts whose
    ///     embeddings carry image features; nil embeds the tokens.
    ///   - attentionMask: the prompt's, where it marks blocks (``ImageChatModel/attentionMask(promptIds:)``).
    func run(promptTokens: [Int], settings: GenerationConfig, seed: UInt64, cache: KVCache? = nil,
             embeddings: ((_ from: Int) throws -> Tensor)? = nil, attentionMask: [Int]? = nil,
             constraint: (any GenerationConstraint)? = nil,
             onText: ((String) throws -> Void)?) throws -> TextGenerationResult {
        guard !promptTokens.isEmpty else { throw PipelineError.emptyPrompt }
        let criteria = stoppingCriteria(settings)
        var detokenizer = StreamingDetokenizer(tokenizer: tokenizer)
        let onStep: ([Int?]) throws -> Void = { tokens in
            if let onText, let token = tokens[0] { try onText(detokenizer.append(token)) }
        }
        let output = try cache.map {
            try model.generate(continuing: $0, inputIds: promptTokens, inputsEmbeds: embeddings?($0.length),
                               attentionMask: attentionMask, config: settings, stoppingCriteria: criteria, seed: seed, constraint: constraint,
                               onStep: onStep)
        } ?? model.generate(inputsEmbeds: embeddings?(0) ?? model.embed([promptTokens]), promptIds: [promptTokens],
                            attentionMask: attentionMask.map { [$0] }, config: settings, stoppingCriteria: criteria, seed: seed, constraint: constraint,
                            onStep: onStep)
        try onText?(detokenizer.finish())
        let ids = output.sequences.first ?? []
        return TextGenerationResult(text: tokenizer.decode(ids, skipSpecialTokens: true), ids: ids, promptTokens: promptTokens)
    }
}

/// Each token's bytes, for stop strings and grammars: one decode per token, so built on first use and kept, with
/// the grammar trie over them.
final class TokenTable: Sendable {
    private let tables = Mutex<(bytes: [[UInt8]]?, vocabulary: GrammarVocabulary?)>((nil, nil))
    /// Recent grammars' constraints, most recent last.
    private let constraints = Mutex<[(key: ConstraintKey, constraint: GrammarConstraint)]>([])
    private static let keptConstraints = 8

    private struct ConstraintKey: Equatable {
        var source: String
        var root: String
        var endTokens: Set<Int>
    }

    func constraint(_ grammar: Grammar, endTokens: Set<Int>, tokenizer: Tokenizer, count: Int) -> GrammarConstraint {
        let key = ConstraintKey(source: grammar.source, root: grammar.rootName, endTokens: endTokens)
        if let kept = constraints.withLock({ kept -> GrammarConstraint? in
            guard let index = kept.firstIndex(where: { $0.key == key }) else { return nil }
            let entry = kept.remove(at: index)
            kept.append(entry)
            return entry.constraint
        }) {
            return kept
        }
        let made = GrammarConstraint(grammar: grammar, vocabulary: vocabulary(tokenizer, count: count), endTokens: endTokens)
        constraints.withLock { kept in
            kept.append((key, made))
            if kept.count > Self.keptConstraints { kept.removeFirst() }
        }
        return made
    }

    func bytes(_ tokenizer: Tokenizer, count: Int) -> [[UInt8]] {
        tables.withLock { tables in
            if let bytes = tables.bytes { return bytes }
            let bytes = tokenizer.tokenBytes(count: count)
            tables.bytes = bytes
            return bytes
        }
    }

    func vocabulary(_ tokenizer: Tokenizer, count: Int) -> GrammarVocabulary {
        let bytes = bytes(tokenizer, count: count)
        return tables.withLock { tables in
            if let vocabulary = tables.vocabulary { return vocabulary }
            let vocabulary = GrammarVocabulary(tokenBytes: bytes, specialTokens: tokenizer.specialTokenIds)
            tables.vocabulary = vocabulary
            return vocabulary
        }
    }

    /// The stop-string criterion of `settings`, if it has stop strings.
    func stoppingCriteria(_ settings: GenerationConfig, tokenizer: Tokenizer, count: Int) -> [any StoppingCriterion] {
        guard !settings.stopStrings.isEmpty else { return [] }
        return [StopStringCriterion(stopStrings: settings.stopStrings, tokenBytes: bytes(tokenizer, count: count))]
    }
}

extension TextGenerationPipeline {
    /// The perplexity of `text`, tokenized as the tokenizer does by default (special tokens included), under the
    /// model; see ``CausalLanguageModel/perplexity(of:context:stride:)``.
    public func perplexity(of text: String, context: Int, stride: Int) throws -> Perplexity {
        try model.perplexity(of: tokenizer.encode(text).ids, context: context, stride: stride)
    }
}

/// Whether a conversation ends with the assistant's message: a reply begun for the model to continue, as transformers'
/// chat pipelines take it (`continue_final_message` by default).
func endsWithAssistantMessage(_ messages: [JSONValue]) -> Bool {
    messages.last?["role"] == .string("assistant")
}
