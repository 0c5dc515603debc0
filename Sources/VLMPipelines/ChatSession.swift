import VLMModels
import VLMTemplates
import VLMTokenizers

/// One answered turn of a ``ChatSession``.
public struct ChatTurn: Sendable, Equatable {
    /// The reply, special tokens skipped.
    public var text: String
    /// The reply's token ids, ending with the eos token that stopped it, if one did.
    public var ids: [Int]
    /// The whole conversation's prompt as the model saw it this turn.
    public var promptTokens: [Int]
    /// How many of the prompt's first tokens were already in the KV cache from earlier turns, and not run again.
    public var reusedTokens: Int
}

/// A multi-turn conversation with a chat model that keeps the model's KV cache from turn to turn, as llama.cpp's
/// chat does: each turn renders the whole conversation through the chat template, as
/// ``TextGenerationPipeline/generate(messages:settings:seed:)`` would, but runs only the tokens after the longest
/// prefix the cache already holds. Replies can differ from a fresh run of the whole conversation by the rounding of
/// keys computed a token at a time rather than in one pass.
public final class ChatSession {
    public let pipeline: TextGenerationPipeline
    /// The conversation so far: the system message if any, then user and assistant turns.
    public private(set) var messages: [JSONValue]
    private var cache: KVCache?
    /// The tokens whose keys and values `cache` holds, in order.
    private var cachedTokens: [Int] = []

    /// Positions the first cache has room for at least; it at least doubles when a conversation outgrows it.
    private let initialCapacity: Int

    /// - Parameters:
    ///   - system: a system message opening the conversation.
    ///   - cacheCapacity: positions the KV cache starts with (it grows as the conversation needs).
    public init(pipeline: TextGenerationPipeline, system: String? = nil, cacheCapacity: Int = 1024) throws {
        guard pipeline.chatTemplate != nil else { throw PipelineError.noChatTemplate }
        self.pipeline = pipeline
        messages = system.map { [["role": "system", "content": .string($0)]] } ?? []
        initialCapacity = max(cacheCapacity, 1)
    }

    /// Adds the user's `message`, answers it (passing the reply's text to `onText` piece by piece as it is
    /// generated) and adds the answer to the conversation.
    public func send(_ message: String, settings: GenerationConfig? = nil, seed: UInt64 = 0,
                     onText: ((String) throws -> Void)? = nil) throws -> ChatTurn {
        let settings = settings ?? pipeline.config
        let conversation = messages + [["role": "user", "content": .string(message)]]
        let prompt = try pipeline.chatPrompt(conversation)
        let result: TextGenerationResult, reused: Int
        if settings.numBeams > 1 || settings.numReturnSequences > 1 {
            // Beam search runs a cache per beam of its own.
            (cache, cachedTokens, reused) = (nil, [], 0)
            result = try pipeline.run(promptTokens: prompt, settings: settings, seed: seed, onText: onText)
        } else {
            let (room, overflow) = prompt.count.addingReportingOverflow(try settings.newTokenLimit(promptLength: prompt.count))
            guard !overflow else { throw ModelError.invalidInput("max_new_tokens \(settings.maxNewTokens ?? 0) is out of range") }
            // At least one prompt token must run to give the next token's logits.
            reused = min(zip(cachedTokens, prompt).prefix { $0 == $1 }.count, prompt.count - 1)
            let cache = try cacheHolding(reused, room: room)
            result = try pipeline.run(promptTokens: prompt, settings: settings, seed: seed, cache: cache, onText: onText)
            cachedTokens = Array((prompt + result.ids).prefix(cache.length))
        }
        messages = conversation + [["role": "assistant", "content": .string(result.text)]]
        return ChatTurn(text: result.text, ids: result.ids, promptTokens: prompt, reusedTokens: reused)
    }

    /// The session's cache cut back to its first `reused` positions, in a larger cache when `room` positions
    /// do not fit.
    private func cacheHolding(_ reused: Int, room: Int) throws -> KVCache {
        if let cache, cache.capacity >= room {
            try cache.truncate(to: reused)
            return cache
        }
        let capacity = max(room, 2 * (cache?.capacity ?? 0), initialCapacity)
        let grown = try pipeline.model.makeCache(batch: 1, capacity: capacity)
        if let cache {
            try cache.truncate(to: reused)
            try cache.copyStored(into: grown)
        }
        self.cache = grown
        return grown
    }
}
