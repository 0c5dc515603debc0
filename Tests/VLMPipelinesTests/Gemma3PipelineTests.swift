import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTemplates

/// Gemma 3 image chat from files, as a user meets it: oracle/gemma3.py's checkpoint with its processor config,
/// GemmaTokenizer files and chat template, against what transformers' Gemma3Processor, `apply_chat_template(...,
/// tokenize=True)`, generate (with the processor's `token_type_ids`) and decoding gave.
@Suite struct Gemma3PipelineTests {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable { let images: [String]; let prompt: String; let input_ids: [Int]; let greedy: Generated }
        struct Answer: Decodable { let prompt: String; let input_ids: [Int]; let ids: [Int]; let text: String }
        struct Turn: Decodable { let images: [String]; let text: String; let input_ids: [Int]; let ids: [Int]; let answer: String }
        let max_new_tokens: Int
        let chat_tokens: Int
        let requests: [Request]
        let chat: [Answer]
        let session: [Turn]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let directory = fixtures.appendingPathComponent("gemma3/tiny")

    static func load() throws -> (Expected, [[JSONValue]]) {
        let data = try Data(contentsOf: fixtures.appendingPathComponent("gemma3/expected.json"))
        return (try JSONDecoder().decode(Expected.self, from: data), try conversations(data))
    }

    /// The messages of an oracle's "chat" records, image paths made absolute.
    static func conversations(_ data: Data) throws -> [[JSONValue]] {
        guard case let .array(chats)? = try JSONValue(parsing: data)["chat"] else { throw CocoaError(.fileReadCorruptFile) }
        return chats.map { chat -> [JSONValue] in
            guard case let .array(messages)? = chat["messages"] else { return [] }
            return messages.map { ImageChatTests.withImagePaths($0) { .string(fixtures.appendingPathComponent($0).path) } }
        }
    }

    static func photos(_ names: [String]) throws -> [RGBImage] {
        try names.map { try ImageDecoder.decode(contentsOf: fixtures.appendingPathComponent($0)) }
    }

    static func greedy(_ base: GenerationConfig, tokens: Int) -> GenerationConfig {
        var settings = base
        settings.maxNewTokens = tokens
        settings.doSample = false
        return settings
    }

    /// Each `<start_of_image>` becomes its blank lines, markers and 16 image tokens, tokenized with the text around
    /// it (the blank lines merge with the newline before them), and the prompt keeps the bos the tokenizer adds.
    @Test func processorExpandsImagesLikeTransformers() throws {
        let (expected, _) = try Self.load()
        let processor = try Gemma3Processor(directory: ModelDirectory(url: Self.directory))
        #expect(processor.imageSeqLength == 16 && processor.imageToken == "<start_of_image>")
        for request in expected.requests {
            let images = try processor.imageProcessor.preprocess(Self.photos(request.images))
            #expect(try processor.promptIds(request.prompt, images: images) == request.input_ids, "\(request.prompt)")
        }
        #expect(processor.questionPrompt("What is this?") == "<start_of_turn>user\n<start_of_image>What is this?<end_of_turn>\n<start_of_turn>model\n")
    }

    @Test func answersConversationsLikeTransformers() throws {
        let (expected, conversations) = try Self.load()
        let pipeline = try ImageTextToTextPipeline(directory: Self.directory)
        for (messages, reference) in zip(conversations, expected.chat) {
            let result = try pipeline.generate(messages: messages, settings: Self.greedy(pipeline.text.config, tokens: expected.chat_tokens))
            #expect(result.promptTokens == reference.input_ids, "\(reference.prompt)")
            #expect(result.ids == reference.ids, "\(reference.prompt)")
            #expect(result.text == reference.text, "\(reference.prompt)")
        }
    }

    /// Turn by turn over one KV cache: each turn runs only its new part, whose image tokens see each other.
    @Test func sessionAnswersTurnByTurnLikeTransformers() throws {
        let (expected, _) = try Self.load()
        let pipeline = try ImageTextToTextPipeline(directory: Self.directory)
        let session = try ChatSession(pipeline: pipeline)
        for (index, turn) in expected.session.enumerated() {
            let answer = try session.send(turn.text, images: Self.photos(turn.images),
                                          settings: Self.greedy(pipeline.text.config, tokens: expected.chat_tokens))
            #expect(answer.promptTokens == turn.input_ids, "turn \(index)")
            #expect(answer.ids == turn.ids, "turn \(index)")
            #expect(answer.text == turn.answer, "turn \(index)")
            if index > 0 { #expect(answer.reusedTokens >= expected.session[index - 1].input_ids.count, "turn \(index)") }
        }
    }

    /// The prompt the server runs (ids, embeddings, prefix key and the image blocks' mask) through the continuous
    /// batcher, twice: the second time its prefix comes from the cache.
    @Test func continuousBatcherAnswersLikeTransformers() async throws {
        let (expected, conversations) = try Self.load()
        let pipeline = try ImageTextToTextPipeline(directory: Self.directory)
        let batcher = try ContinuousBatcher(model: pipeline.model.textDecoder)
        defer { batcher.shutdown() }
        for (messages, reference) in zip(conversations, expected.chat) {
            let prompt = try pipeline.prompt(messages: messages)
            #expect(prompt.ids == reference.input_ids && prompt.attentionMask != nil)
            let firstImage = try #require(prompt.ids.firstIndex(of: pipeline.model.imageTokenId))
            for round in 0..<2 {
                var tokens: [Int] = [], cached = 0
                for try await event in try batcher.submit(BatchRequest(
                    promptIds: prompt.ids, inputsEmbeds: prompt.inputsEmbeds, prefixKey: prompt.prefixKey,
                    attentionMask: prompt.attentionMask, config: Self.greedy(pipeline.text.config, tokens: expected.chat_tokens))) {
                    switch event {
                    case .started(let count): cached = count
                    case .token(let token): tokens.append(token.id)
                    case .finished: break
                    }
                }
                #expect(tokens == reference.ids, "\(reference.prompt) round \(round)")
                // The first time only text shared with an earlier conversation, the second time all but the last token.
                #expect(round == 0 ? cached < firstImage : cached == prompt.ids.count - 1, "\(reference.prompt) round \(round)")
            }
        }
    }

    @Test func captionsWithAPlainPromptLikeTransformers() throws {
        let (expected, _) = try Self.load()
        let request = try #require(expected.requests.first { !$0.prompt.hasPrefix("<bos>") })
        let pipeline = try ImageToTextPipeline(directory: Self.directory)
        let results = try pipeline(Self.photos(request.images), prompt: request.prompt,
                                   settings: Self.greedy(pipeline.config, tokens: expected.max_new_tokens))
        #expect(results.map(\.ids) == [request.greedy.ids])
        #expect(results.map(\.text) == [request.greedy.text])
    }
}
