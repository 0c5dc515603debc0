import Foundation
import Testing

/// `vlm generate --image/--chat` and `vlm chat` with images on the LLaVA checkpoints of Tests/Fixtures/image-chat,
/// against oracle/image_chat.py (transformers' image-text-to-text answers). Image paths are relative to the
/// directory the command runs in, as a user types them.
@Suite struct ImageChatCLITests {
    struct Expected: Decodable {
        struct Answer: Decodable { let input_ids: [Int]; let ids: [Int]; let text: String }
        struct Conversation: Decodable { let greedy: Answer }
        struct Turn: Decodable { let images: [String]; let text: String; let answer: String }
        let max_new_tokens: Int
        let system: String?
        let conversations: [Conversation]
        let session: [Turn]
    }

    static func model(_ name: String) -> String { CLI.fixtures.appendingPathComponent("image-chat/\(name)").path }

    static func expected(_ name: String) throws -> (Expected, Data) {
        let data = try Data(contentsOf: URL(fileURLWithPath: model(name)).appendingPathComponent("expected.json"))
        return (try JSONDecoder().decode(Expected.self, from: data), data)
    }

    static func temporary(_ suffix: String) -> URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("vlm-image-chat-\(UUID().uuidString)\(suffix)")
    }

    @Test func generateWithAnImageAndAPromptIsOneUserTurn() throws {
        let (expected, _) = try Self.expected("llava-1.5")
        let reference = expected.conversations[0].greedy
        let arguments = ["generate", "--model", Self.model("llava-1.5"), "--image", "photos/chelsea.png",
                         "--prompt", "What is in this picture?", "--temperature", "0",
                         "--max-new-tokens", String(expected.max_new_tokens)]
        let run = try CLI.run(arguments + ["--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(Set(result.keys) == ["ids", "prompt_tokens", "text"])
        #expect(result["ids"] as? [Int] == reference.ids)
        #expect(result["prompt_tokens"] as? Int == reference.input_ids.count)
        #expect(result["text"] as? String == reference.text)
        // Without --json the text streams, then a newline.
        let streamed = try CLI.run(arguments, directory: CLI.fixtures)
        #expect(streamed.stdout == reference.text + "\n")
    }

    @Test func generateAnswersAMessagesFileWithImagesInLaterTurns() throws {
        let (expected, data) = try Self.expected("chatml")
        let root = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let conversations = try #require(root["conversations"] as? [[String: Any]])
        let file = Self.temporary(".json")
        defer { try? FileManager.default.removeItem(at: file) }
        try JSONSerialization.data(withJSONObject: conversations[2]["messages"] as Any).write(to: file)
        let run = try CLI.run(["generate", "--model", Self.model("chatml"), "--chat", file.path, "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens), "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == expected.conversations[2].greedy.ids)
    }

    /// Piped lines: --image opens the first turn, "/image PATH" adds one to the next; the answers are
    /// transformers' for the whole conversation each turn.
    @Test func chatSessionTakesImagesTurnByTurn() throws {
        let (expected, _) = try Self.expected("chatml")
        var lines: [String] = []
        for (index, turn) in expected.session.enumerated() {
            if index > 0 { lines += turn.images.map { "/image \($0)" } }
            lines.append(turn.text)
        }
        let input = Self.temporary(".txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try Data((lines.joined(separator: "\n") + "\n").utf8).write(to: input)
        var arguments = ["chat", "--model", Self.model("chatml"), "--temperature", "0",
                         "--max-new-tokens", String(expected.max_new_tokens), "--image", expected.session[0].images[0]]
        if let system = expected.system { arguments += ["--system", system] }
        let run = try CLI.run(arguments, standardInput: input, directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout == expected.session.map { $0.answer + "\n" }.joined())
    }

    @Test func benchTimesTheImageTheFirstTokenAndDecoding() throws {
        let (expected, _) = try Self.expected("llava-1.5")
        let run = try CLI.run(["bench", "--model", Self.model("llava-1.5"), "--image", "photos/chelsea.png",
                               "--prompt", "What is in this picture?", "--new-tokens", "4", "--runs", "1", "--json"],
                              directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(try CLI.json(run) as? [String: Any])
        #expect(Set(report.keys) == ["task", "prompt_tokens", "image_ms", "first_token_ms", "decode_tokens_per_s", "dtype"])
        #expect(report["dtype"] as? String == "fp32")
        #expect(report["task"] as? String == "image-text-to-text")
        #expect(report["prompt_tokens"] as? Int == expected.conversations[0].greedy.input_ids.count)
        for key in ["image_ms", "first_token_ms", "decode_tokens_per_s"] {
            #expect((report[key] as? Double ?? 0) > 0, "\(key)")
        }
    }

    @Test func badImageInputEndsWithOneLine() throws {
        let model = Self.model("llava-1.5")
        let missing = try CLI.run(["generate", "--model", model, "--image", "photos/no-such.png", "--prompt", "Hi"],
                                  directory: CLI.fixtures)
        #expect(missing.status == 1)
        #expect(missing.stdout.isEmpty)
        #expect(missing.stderr.contains("photos/no-such.png"))
        #expect(missing.stderr.split(separator: "\n").count == 1, "\(missing.stderr)")

        // BLIP-2 talks about images with its own prompting, not through `vlm generate`.
        let blip2 = try CLI.run(["generate", "--model", CLI.fixtures.appendingPathComponent("image-to-text/blip2-opt").path,
                                 "--image", "photos/chelsea.png", "--prompt", "Hi"], directory: CLI.fixtures)
        #expect(blip2.status == 1)
        #expect(blip2.stderr.contains("cannot run `vlm generate`"), "\(blip2.stderr)")

        let withoutPrompt = try CLI.run(["generate", "--model", model, "--image", "photos/chelsea.png", "--chat", "x.json"])
        #expect(withoutPrompt.status != 0)
    }

    @Test(.enabled(if: RealSmolLM2.path != nil, "SmolLM2 GGUF not found"))
    func aTextModelRefusesImages() throws {
        let run = try CLI.run(["generate", "--model", RealSmolLM2.path ?? "", "--image", "photos/chelsea.png",
                               "--prompt", "Hi"], directory: CLI.fixtures)
        #expect(run.status == 1)
        #expect(run.stderr.contains("reads no images"), "\(run.stderr)")
        #expect(run.stderr.split(separator: "\n").count == 1)
    }
}
