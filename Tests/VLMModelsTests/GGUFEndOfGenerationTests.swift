import Foundation
import Testing
import VLMCheckpoint
import VLMModels

/// The tokens generation from a GGUF file ends at, against llama.cpp's own `llama_vocab_is_eog` for vocabularies that
/// exercise each of its rules (oracle/llama_cpp_eog.py).
@Suite struct GGUFEndOfGenerationTests {
    static let fixtures = SmolLM2.packageRoot.appendingPathComponent("Tests/Fixtures/gguf-eog")

    static func expected() throws -> [String: [Int]] {
        let data = try Data(contentsOf: fixtures.appendingPathComponent("expected.json"))
        return try JSONDecoder().decode([String: [Int]].self, from: data)
    }

    @Test(arguments: ["qwen", "llama3", "harmony", "gemma4", "paddleocr", "metadata", "deepseek"])
    func endOfGenerationIdsAreLlamaCppsSet(name: String) throws {
        let file = try GGUFFile(url: Self.fixtures.appendingPathComponent("\(name).gguf"))
        let eos = try #require(file.metadata["tokenizer.ggml.eos_token_id"]?.integer)
        #expect(file.endOfGenerationIds(eos: [eos]) == (try Self.expected()[name]))
    }

    /// The real SmolLM2 file names `<|im_end|>` as its eos; llama.cpp also stops at `<|endoftext|>` and at `<reponame>`
    /// (a FIM repo token by its text), and so does generation from the loaded model.
    @Test(.enabled(if: SmolLM2.url != nil, Comment(rawValue: SmolLM2.skipMessage)))
    func smolLM2StopsWhereLlamaCppStops() throws {
        let file = try GGUFFile(url: try #require(SmolLM2.url))
        let (_, _, eosTokenIds) = try ModelRegistry.causalLanguageModel(gguf: file)
        #expect(eosTokenIds == (try Self.expected()["smollm2"]))
    }
}
