import Foundation
import Testing

/// `vlm perplexity` on the real SmolLM2-135M-Instruct Q4_1 GGUF, against the perplexity transformers computed from
/// the same file for a passage of Pride and Prejudice (Tests/Fixtures/llama/smollm2-perplexity.json, by
/// oracle/language_model_loss.py).
@Suite(.enabled(if: RealSmolLM2.path != nil, "SmolLM2 GGUF not found"))
struct PerplexityCLITests {
    struct Expected: Decodable {
        let text: String
        let input_ids: [Int]
        let context: Int
        let stride: Int
        let windows: [Window]
        let scored: Int
        let nll: Double
        let perplexity: Double
        struct Window: Decodable { let begin: Int }
    }

    let model = RealSmolLM2.path ?? ""
    let expected: Expected

    init() throws {
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: CLI.fixtures
            .appendingPathComponent("llama/smollm2-perplexity.json")))
    }

    func expectTransformersNumbers(_ run: CLI.Run) throws {
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(try CLI.json(run) as? [String: Any])
        #expect(report["tokens"] as? Int == expected.input_ids.count)
        #expect(report["scored"] as? Int == expected.scored)
        #expect(report["windows"] as? Int == expected.windows.count)
        #expect(abs((report["nll"] as? Double ?? .nan) - expected.nll) < 1e-3)
        #expect(abs((report["perplexity"] as? Double ?? .nan) / expected.perplexity - 1) < 1e-3)
    }

    @Test func perplexityOfATextAndOfAFileMatchTransformers() throws {
        let window = ["--context", String(expected.context), "--stride", String(expected.stride), "--json"]
        try expectTransformersNumbers(try CLI.run(["perplexity", "--model", model, "--text", expected.text] + window))
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-perplexity-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: file) }
        try Data(expected.text.utf8).write(to: file)
        try expectTransformersNumbers(try CLI.run(["perplexity", "--model", model, "--file", file.path] + window))

        let sentence = try CLI.run(["perplexity", "--model", model, "--text", expected.text, "--context", "128"])
        #expect(sentence.status == 0 && sentence.stdout.hasPrefix("perplexity "), "\(sentence.stderr)")
    }

    @Test func badInputGetsOneLine() throws {
        let missing = try CLI.run(["perplexity", "--model", model, "--file", "/nonexistent/passage.txt"])
        #expect(missing.status == 1 && missing.stderr.contains("/nonexistent/passage.txt: cannot read the file"))
        let both = try CLI.run(["perplexity", "--model", model, "--file", "a.txt", "--text", "hello"])
        #expect(both.status == 64 && both.stderr.contains("either --file or --text"))
        let stride = try CLI.run(["perplexity", "--model", model, "--text", expected.text, "--context", "64", "--stride", "64"])
        #expect(stride.status == 1 && stride.stderr.contains("stride") && !stride.stderr.contains("Fatal"))
        let short = try CLI.run(["perplexity", "--model", model, "--text", "Hi"])
        #expect(short.status == 1 && short.stderr.contains("at least two tokens"))
        for run in [missing, stride, short] { #expect(run.stderr.split(separator: "\n").count == 1, "\(run.stderr)") }
    }
}

/// `vlm perplexity`'s window on a model with fewer than 512 positions: the LLaVA GGUF pair's tiny language model
/// (128 positions), whose default context is then its positions, half of them the stride.
@Suite struct PerplexityDefaultsCLITests {
    @Test func theDefaultContextIsTheModelsPositions() throws {
        let model = CLI.fixtures.appendingPathComponent("llava-gguf/lm-q8_0.gguf").path
        let passage = try #require((try JSONSerialization.jsonObject(with: Data(contentsOf: CLI.fixtures
            .appendingPathComponent("llama/smollm2-perplexity.json"))) as? [String: Any])?["text"] as? String)
        let byDefault = try CLI.run(["perplexity", "--model", model, "--text", passage, "--json"])
        let explicit = try CLI.run(["perplexity", "--model", model, "--text", passage, "--context", "128", "--stride", "64", "--json"])
        #expect(byDefault.status == 0 && explicit.status == 0, "\(byDefault.stderr) \(explicit.stderr)")
        #expect(byDefault.stdout == explicit.stdout)
        let report = try #require(try CLI.json(byDefault) as? [String: Any])
        #expect(report["windows"] as? Int == 4 && report["scored"] as? Int == (report["tokens"] as? Int ?? 0) - 1)
        let tooLong = try CLI.run(["perplexity", "--model", model, "--text", passage, "--context", "129"])
        #expect(tooLong.status == 1 && tooLong.stderr.contains("exceeds the model's 128 positions"))
    }
}
