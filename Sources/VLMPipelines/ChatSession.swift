import VLMImages
import VLMModels
import VLMTemplates
import VLMTensor
import VLMTokenizers

/// An image of a ``ChatSession``'s conversation with its features as they were last computed.
private struct ConversationImage {
    let image: RGBImage
    let features: Tensor
    let tokens: Int
    /// Unique to these features: cached tokens of earlier features of the same image never match them.
    let key: Int
}

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
/// ``TextGenerationPipeline/generate(messages:settings:seed:)`` (or, with images,
/// ``ImageTextToTextPipeline/generate(messages:settings:seed:onText:)``) would, but runs only the tokens after the
/// longest prefix the cache already holds. Each image's features are computed once, when its turn is sent, except
/// where the family reads a conversation's images differently as it grows (LLaVA-OneVision tiles an image only while
/// it is the conversation's only one): then every image's features are computed again and the cache is run again
/// from the first image on, as transformers' answer for the whole conversation reads them. Replies
/// can differ from a fresh run of the whole conversation by the rounding of keys computed a token at a time rather
/// than in one pass.
public final class ChatSession {
    public let pipeline: TextGenerationPipeline
    /// Reads the conversation's images; nil for a model that reads none.
    public let imagePipeline: ImageTextToTextPipeline?
    /// The conversation so far: the system message if any, then user and assistant turns.
    public private(set) var messages: [JSONValue]
    /// Per image of the conversation, in order: the image, its features, how many tokens it takes in the prompt,
    /// and the key its tokens have in ``cachedKeys`` (new whenever its features are computed).
    private var images: [ConversationImage] = []
    /// How the images' features were computed (the processor's ``ImageChatProcessor/imageLayout(conversationImageCount:)``).
    private var imageLayout = 0
    private var nextImageKey = 0
    private var cache: KVCache?
    /// What `cache` holds, position by position: token ids, and for image tokens `-1 - ` their image's key, so that
    /// a prefix matches only where the same features of the same images are in the same places.
    private var cachedKeys: [Int] = []

    /// Positions the first cache has room for at least; it at least doubles when a conversation outgrows it.
    private let initialCapacity: Int

    /// A conversation with a text model.
    ///
    /// - Parameters:
    ///   - system: a system message opening the conversation.
    ///   - cacheCapacity: positions the KV cache starts with (it grows as the conversation needs).
    public convenience init(pipeline: TextGenerationPipeline, system: String? = nil, cacheCapacity: Int = 1024) throws {
        try self.init(pipeline: pipeline, imagePipeline: nil,
                      system: system.map { .string($0) }, cacheCapacity: cacheCapacity)
    }

    /// A conversation about images with a chat model that reads them; messages are written with content parts
    /// (`[{"type": "image"}, …, {"type": "text", "text": …}]`), as image-chat templates expect.
    public convenience init(pipeline: ImageTextToTextPipeline, system: String? = nil, cacheCapacity: Int = 1024) throws {
        try self.init(pipeline: pipeline.text, imagePipeline: pipeline,
                      system: system.map { .array([["type": "text", "text": .string($0)]]) }, cacheCapacity: cacheCapacity)
    }

    private init(pipeline: TextGenerationPipeline, imagePipeline: ImageTextToTextPipeline?, system: JSONValue?,
                 cacheCapacity: Int) throws {
        guard pipeline.chatTemplate != nil else { throw PipelineError.noChatTemplate }
        self.pipeline = pipeline
        self.imagePipeline = imagePipeline
        messages = system.map { [["role": "system", "content": $0]] } ?? []
        initialCapacity = max(cacheCapacity, 1)
    }

    /// Adds the user's `message` (after `images`, which only a session with an image pipeline takes), answers it
    /// (passing the reply's text to `onText` piece by piece as it is generated) and adds the answer to the
    /// conversation. Nothing is added when it throws.
    public func send(_ message: String, images newImages: [RGBImage] = [], settings: GenerationConfig? = nil,
                     seed: UInt64 = 0, onText: ((String) throws -> Void)? = nil) throws -> ChatTurn {
        let settings = settings ?? pipeline.config
        let conversation = messages + [["role": "user", "content": try userContent(message, images: newImages.count)]]
        var images = self.images, layout = imageLayout, nextKey = nextImageKey
        if let imagePipeline, !newImages.isEmpty {
            let processor = imagePipeline.processor
            let total = images.count + newImages.count
            layout = processor.imageLayout(conversationImageCount: total)
            // Where the family reads a conversation's images differently now that it holds more (LLaVA-OneVision:
            // whole once there are several), every image's features are computed again, as transformers would.
            let reading = layout == imageLayout ? newImages : images.map(\.image) + newImages
            let processed = try processor.preprocess(reading, conversationImageCount: total)
            let features = try imagePipeline.model.imageFeatures(processed)
            let computed = zip(reading, zip(features, processor.imageTokenCounts(processed))).map { image, computed in
                defer { nextKey += 1 }
                return ConversationImage(image: image, features: computed.0, tokens: computed.1, key: nextKey)
            }
            images = layout == imageLayout ? images + computed : computed
        }
        let prompt = try imagePipeline?.promptIds(conversation, imageTokenCounts: images.map(\.tokens))
            ?? pipeline.chatPrompt(conversation)
        let keys = imagePipeline.map {
            Self.keys(prompt, imageToken: $0.model.imageTokenId, counts: images.map(\.tokens), imageKeys: images.map(\.key))
        } ?? prompt
        let features = images.map(\.features)
        func run(_ cache: KVCache?) throws -> TextGenerationResult {
            if let imagePipeline {
                return try imagePipeline.run(promptTokens: prompt, imageFeatures: features, settings: settings,
                                             seed: seed, cache: cache, onText: onText)
            }
            return try pipeline.run(promptTokens: prompt, settings: settings, seed: seed, cache: cache, onText: onText)
        }
        let result: TextGenerationResult, reused: Int
        if settings.numBeams > 1 || settings.numReturnSequences > 1 {
            // Beam search runs a cache per beam of its own.
            (cache, cachedKeys, reused) = (nil, [], 0)
            result = try run(nil)
        } else {
            let (room, overflow) = prompt.count.addingReportingOverflow(try settings.newTokenLimit(promptLength: prompt.count))
            guard !overflow else { throw ModelError.invalidInput("max_new_tokens \(settings.maxNewTokens ?? 0) is out of range") }
            // At least one prompt token must run to give the next token's logits.
            reused = min(zip(cachedKeys, keys).prefix { $0 == $1 }.count, prompt.count - 1)
            let cache = try cacheHolding(reused, room: room)
            // Until the turn succeeds, the cache holds only what is known to be there.
            cachedKeys = Array(cachedKeys.prefix(reused))
            result = try run(cache)
            cachedKeys = Array((keys + result.ids).prefix(cache.length))
        }
        (self.images, imageLayout, nextImageKey) = (images, layout, nextKey)
        messages = conversation + [["role": "assistant", "content": reply(result.text)]]
        return ChatTurn(text: result.text, ids: result.ids, promptTokens: prompt, reusedTokens: reused)
    }

    /// A user message's content: plain text for a text model; image parts then a text part for an image chat model.
    private func userContent(_ text: String, images: Int) throws -> JSONValue {
        guard imagePipeline != nil else {
            if images > 0 { throw PipelineError.imagesNotSupported(message: messages.count) }
            return .string(text)
        }
        return .array(Array(repeating: ["type": "image"], count: images) + [["type": "text", "text": .string(text)]])
    }

    private func reply(_ text: String) -> JSONValue {
        imagePipeline == nil ? .string(text) : .array([["type": "text", "text": .string(text)]])
    }

    /// `prompt` with each image token replaced by `-1 - ` the key of the image it belongs to (image `i` taking
    /// `counts[i]` consecutive image tokens, in order, its key `imageKeys[i]`).
    private static func keys(_ prompt: [Int], imageToken: Int, counts: [Int], imageKeys: [Int]) -> [Int] {
        var image = 0, left = counts.first ?? 0
        return prompt.map { token in
            guard token == imageToken, image < counts.count else { return token }
            defer {
                left -= 1
                if left == 0 {
                    image += 1
                    left = image < counts.count ? counts[image] : 0
                }
            }
            return -1 - imageKeys[image]
        }
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
