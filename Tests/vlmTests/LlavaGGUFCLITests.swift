import Foundation
import Testing

/// `vlm generate --model LM.gguf --mmproj MMPROJ.gguf` on llama.cpp's GGUF pair of oracle/llava_gguf.py, against
/// transformers' answer from the checkpoint the pair was made from.
@Suite struct LlavaGGUFCLITests {
    struct Expected: Decodable {
        struct Chat: Decodable { let question: String; let input_ids: [Int]; let greedy_ids: [Int]; let greedy_text: String }
        struct Request: Decodable { let image: String; let prompt: String; let greedy_ids: [Int]; let greedy_text: String }
        let max_new_tokens: Int
        let chat: Chat
        let next_chat: Chat
        let requests: [Request]
    }

    static let directory = CLI.fixtures.appendingPathComponent("llava-gguf")

    @Test func generateWithAnImageAndAPromptReadsThePair() throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.directory.appendingPathComponent("expected.json")))
        let run = try CLI.run(["generate", "--model", Self.directory.appendingPathComponent("lm-q8_0.gguf").path,
                               "--mmproj", Self.directory.appendingPathComponent("mmproj-f32.gguf").path,
                               "--image", "photos/chelsea.png", "--prompt", expected.chat.question, "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens), "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == expected.chat.greedy_ids)
        #expect(result["prompt_tokens"] as? Int == expected.chat.input_ids.count)
        #expect(result["text"] as? String == expected.chat.greedy_text)
    }

    @Test func chatWithAnImageReadsThePair() throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.directory.appendingPathComponent("expected.json")))
        let input = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-llava-gguf-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try Data((expected.chat.question + "\n").utf8).write(to: input)
        let run = try CLI.run(["chat", "--model", Self.directory.appendingPathComponent("lm-q8_0.gguf").path,
                               "--mmproj", Self.directory.appendingPathComponent("mmproj-f32.gguf").path,
                               "--image", "photos/chelsea.png", "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens)],
                              standardInput: input, directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout == expected.chat.greedy_text + "\n")
    }

    /// `vlm caption --prompt` continues transformers' raw prompts; `vlm ask` lays the question out in LLaVA-1.5's
    /// USER/ASSISTANT form, the first request's prompt.
    @Test func captionAndAskReadThePair() throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.directory.appendingPathComponent("expected.json")))
        let pair = ["--model", Self.directory.appendingPathComponent("lm-q8_0.gguf").path,
                    "--mmproj", Self.directory.appendingPathComponent("mmproj-f32.gguf").path,
                    "--temperature", "0", "--max-new-tokens", String(expected.max_new_tokens), "--json"]
        for request in expected.requests {
            let run = try CLI.run(["caption", "photos/\(request.image)", "--prompt", request.prompt] + pair, directory: CLI.fixtures)
            #expect(run.status == 0, "\(run.stderr)")
            let result = try #require(try CLI.json(run) as? [[String: Any]])
            #expect(result.first?["ids"] as? [Int] == request.greedy_ids, "\(request.image)")
        }
        let first = expected.requests[0]
        let question = "What is in this picture?"
        #expect(first.prompt == "USER: <image>\n\(question) ASSISTANT:")
        let run = try CLI.run(["ask", "photos/\(first.image)", "--question", question] + pair, directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [[String: Any]])
        let answers = try #require(result.first?["answers"] as? [[String: Any]])
        #expect(answers.first?["ids"] as? [Int] == first.greedy_ids)
    }

    @Test func generateReadsALlavaNextMmproj() throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.directory.appendingPathComponent("expected.json")))
        let run = try CLI.run(["generate", "--model", Self.directory.appendingPathComponent("lm-q8_0.gguf").path,
                               "--mmproj", Self.directory.appendingPathComponent("mmproj-next-f32.gguf").path,
                               "--image", "photos/chelsea.png", "--prompt", expected.next_chat.question, "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens), "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == expected.next_chat.greedy_ids)
        #expect(result["prompt_tokens"] as? Int == expected.next_chat.input_ids.count)
    }

    /// `vlm bench` on the pair: the image chat report, with the prompt laid out as generate lays it out.
    @Test func benchReadsThePair() throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.directory.appendingPathComponent("expected.json")))
        let run = try CLI.run(["bench", "--model", Self.directory.appendingPathComponent("lm-q8_0.gguf").path,
                               "--mmproj", Self.directory.appendingPathComponent("mmproj-f32.gguf").path,
                               "--image", "photos/chelsea.png", "--prompt", expected.chat.question, "--new-tokens", "4",
                               "--runs", "1", "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(try CLI.json(run) as? [String: Any])
        #expect(report["task"] as? String == "image-text-to-text")
        #expect(report["prompt_tokens"] as? Int == expected.chat.input_ids.count)
        #expect((report["first_token_ms"] as? Double ?? 0) > 0)
        #expect(report["dtype"] as? String == "fp32")
        let directory = try CLI.run(["bench", "--model", CLI.fixtures.appendingPathComponent("image-chat/chatml").path,
                                     "--mmproj", Self.directory.appendingPathComponent("mmproj-f32.gguf").path,
                                     "--image", "photos/chelsea.png", "--prompt", "Hi"], directory: CLI.fixtures)
        #expect(directory.status != 0 && directory.stderr.contains("--mmproj goes with a GGUF --model"), "\(directory.stderr)")
    }

    @Test func aMismatchedPairIsOneLineNamingTheFile() throws {
        let run = try CLI.run(["generate", "--model", CLI.fixtures.appendingPathComponent("llama/qwen2-tiny.gguf").path,
                               "--mmproj", Self.directory.appendingPathComponent("mmproj-f32.gguf").path,
                               "--image", "photos/chelsea.png", "--prompt", "Hi"], directory: CLI.fixtures)
        #expect(run.status != 0)
        #expect(run.stderr.contains("mmproj-f32.gguf") && run.stderr.contains("not a pair"), "\(run.stderr)")
        #expect(run.stderr.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: "\n").count == 1, "\(run.stderr)")
    }
}
