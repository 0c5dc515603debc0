import Foundation
import Testing

/// `vlm bench` on language models: the tiny GGUF and safetensors Llamas of Tests/Fixtures/llama (oracle/llama.py).
@Suite struct BenchLanguageModelTests {
    @Test(arguments: ["llama/gqa-untied.gguf", "llama/gqa-untied"], ["f32", "f16"])
    func reportsPrefillAndDecodeTokensPerSecond(model: String, cacheType: String) throws {
        let path = CLI.fixtures.appendingPathComponent(model).path
        let run = try CLI.run(["bench", "--model", path, "--runs", "1", "--prompt-tokens", "12", "--new-tokens", "5",
                               "--cache-type", cacheType, "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(try CLI.json(run) as? [String: Any])
        #expect(report["task"] as? String == "text-generation")
        #expect(report["prompt_tokens"] as? Int == 12 && report["new_tokens"] as? Int == 5)
        #expect((report["prefill_tokens_per_s"] as? Double ?? 0) > 0)
        #expect((report["decode_tokens_per_s"] as? Double ?? 0) > 0)
        #expect(report["dtype"] as? String == "fp32")
        #expect(report["cache_type"] as? String == cacheType)
    }

    @Test func missingGGUFFileIsOneLineNamingIt() throws {
        let run = try CLI.run(["bench", "--model", "/nowhere/model.gguf"])
        #expect(run.status == 1)
        #expect(run.stderr.contains("/nowhere/model.gguf"))
        #expect(run.stdout.isEmpty)
    }
}
