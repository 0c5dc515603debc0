import Foundation
import VLMModels
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

    private func chatPrompt(_ messages: [JSONValue]) throws -> [Int] {
        guard let chatTemplate else { throw PipelineError.noChatTemplate }
        let text = try chatTemplate.render(messages: messages, addGenerationPrompt: true,
                                           bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token),
                                           eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
        // The template writes the special tokens itself, as apply_chat_template(tokenize=True) assumes.
        return tokenizer.encode(text, addSpecialTokens: false).ids
    }

    private func run(promptTokens: [Int], settings: GenerationConfig, seed: UInt64,
                     onText: ((String) throws -> Void)?) throws -> TextGenerationResult {
        guard !promptTokens.isEmpty else { throw PipelineError.emptyPrompt }
        var criteria: [any StoppingCriterion] = []
        if !settings.stopStrings.isEmpty {
            criteria.append(StopStringCriterion(stopStrings: settings.stopStrings, tokenBytes: tokenBytes()))
        }
        var detokenizer = StreamingDetokenizer(tokenizer: tokenizer)
        let output = try model.generate(inputIds: [promptTokens], config: settings, stoppingCriteria: criteria, seed: seed) { tokens in
            if let onText, let token = tokens[0] { try onText(detokenizer.append(token)) }
        }
        try onText?(detokenizer.finish())
        let ids = output.sequences.first ?? []
        return TextGenerationResult(text: tokenizer.decode(ids, skipSpecialTokens: true), ids: ids, promptTokens: promptTokens)
    }

    /// The bytes each token contributes to decoded text, for stop strings, found as transformers'
    /// `StopStringCriteria.clean_tokenizer_vocab` does: byte tokens (`<0xXX>` and byte-level pieces) as their bytes,
    /// others as the text they add after a fixed prefix (so that leading spaces survive).
    private func tokenBytes() -> [[UInt8]] {
        let prefix = tokenizer.encode("abcdef", addSpecialTokens: false).ids
        let prefixText = tokenizer.decode(prefix)
        return (0..<model.vocabularySize).map { id in
            let token = tokenizer.token(id) ?? ""
            if token.utf8.count == 6, token.hasPrefix("<0x"), token.hasSuffix(">"),
               let byte = UInt8(token.dropFirst(3).dropLast(), radix: 16) {
                return [byte]
            }
            let text = String(tokenizer.decode(prefix + [id]).unicodeScalars.dropFirst(prefixText.unicodeScalars.count))
            if text.unicodeScalars.contains("\u{FFFD}"), let bytes = byteLevelBytes(token) { return bytes }
            return Array(text.utf8)
        }
    }
}

/// A byte-level BPE token's bytes through GPT-2's byte-to-character table (printable bytes stand for themselves, the
/// others for 256 + their rank); nil if the token is not spelled that way.
private func byteLevelBytes(_ token: String) -> [UInt8]? {
    let printable = Array(33...126) + Array(161...172) + Array(174...255)
    let others = (0...255).filter { !printable.contains($0) }
    var bytes: [UInt8] = []
    for scalar in token.unicodeScalars {
        let value = Int(scalar.value)
        if printable.contains(value) {
            bytes.append(UInt8(value))
        } else if value >= 256, value - 256 < others.count {
            bytes.append(UInt8(others[value - 256]))
        } else {
            return nil
        }
    }
    return bytes
}
