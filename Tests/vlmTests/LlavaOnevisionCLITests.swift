import Foundation
import Testing

/// `vlm generate`, `vlm chat` and `vlm caption` on the LLaVA-OneVision checkpoints of Tests/Fixtures/llava-onevision,
/// against oracle/llava_onevision.py (transformers' image-text-to-text answers: one image tiled, several read whole).
/// Image paths are relative to the directory the command runs in.
@Suite struct LlavaOnevisionCLITests {
    struct Chat: Decodable {
        struct Answer: Decodable { let input_ids: [Int]; let ids: [Int]; let text: String }
        struct Conversation: Decodable { let greedy: Answer }
        struct Turn: Decodable { let images: [String]; let text: String; let answer: String }
        let max_new_tokens: Int
        let system: String
        let conversations: [Conversation]
        let session: [Turn]
        let single_turns: [Conversation]
    }

    static let model = CLI.fixtures.appendingPathComponent("llava-onevision/qwen2-smollm2-bf16").path

    static func chat() throws -> (Chat, [String: Any]) {
        let data = try Data(contentsOf: URL(fileURLWithPath: model).appendingPathComponent("expected.json"))
        struct File: Decodable { let chat: Chat }
        let raw = try #require((try JSONSerialization.jsonObject(with: data) as? [String: Any])?["chat"] as? [String: Any])
        return (try JSONDecoder().decode(File.self, from: data).chat, raw)
    }

    /// `--image … --prompt` is one user turn: one photo is tiled, two are each read whole, as transformers does.
    @Test(arguments: [(["photos/chelsea.png"], "What is in this picture?", 0),
                      (["llava-next/photos/tall.png", "llava-next/photos/half.png"], "Compare them.", 1)])
    func generateWithImagesAndAPromptIsOneUserTurn(_ images: [String], _ prompt: String, _ index: Int) throws {
        let (expected, _) = try Self.chat()
        let reference = expected.single_turns[index].greedy
        let run = try CLI.run(["generate", "--model", Self.model] + images.flatMap { ["--image", $0] }
                              + ["--prompt", prompt, "--temperature", "0", "--max-new-tokens", String(expected.max_new_tokens),
                                 "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == reference.ids)
        #expect(result["prompt_tokens"] as? Int == reference.input_ids.count)
        #expect(result["text"] as? String == reference.text)
    }

    @Test func generateAnswersAMessagesFileWithImagesInTwoTurns() throws {
        let (expected, raw) = try Self.chat()
        let conversations = try #require(raw["conversations"] as? [[String: Any]])
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-onevision-\(UUID().uuidString).json")
        defer { try? FileManager.default.removeItem(at: file) }
        try JSONSerialization.data(withJSONObject: conversations[1]["messages"] as Any).write(to: file)
        let run = try CLI.run(["generate", "--model", Self.model, "--chat", file.path, "--temperature", "0",
                               "--max-new-tokens", String(expected.max_new_tokens), "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == expected.conversations[1].greedy.ids)
    }

    /// The second turn's "/image" makes both images read whole; the answers are transformers' for the whole
    /// conversation each turn.
    @Test func chatSessionRereadsItsImages() throws {
        let (expected, _) = try Self.chat()
        var lines: [String] = []
        for (index, turn) in expected.session.enumerated() {
            if index > 0 { lines += turn.images.map { "/image \($0)" } }
            lines.append(turn.text)
        }
        let input = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-onevision-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try Data((lines.joined(separator: "\n") + "\n").utf8).write(to: input)
        let run = try CLI.run(["chat", "--model", Self.model, "--temperature", "0", "--max-new-tokens", String(expected.max_new_tokens),
                               "--image", expected.session[0].images[0], "--system", expected.system],
                              standardInput: input, directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout == expected.session.map { $0.answer + "\n" }.joined())
    }

    @Test func captionTilesEachPhoto() throws {
        let checkpoint = CLI.fixtures.appendingPathComponent("llava-onevision/qwen2-layers-fp16")
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable { let images: [String]; let prompt: String; let greedy: Generated }
        struct Requests: Decodable { let requests: [Request] }
        let requests = try JSONDecoder().decode(Requests.self, from: Data(contentsOf: checkpoint.appendingPathComponent("expected.json")))
            .requests.filter { $0.images.count == 1 }
        let images = requests.map { CLI.fixtures.appendingPathComponent($0.images[0]).path }
        let run = try CLI.run(["caption"] + images + ["--model", checkpoint.path, "--prompt", requests[0].prompt,
                                                    "--max-new-tokens", "10", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let output = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(output.map { $0["ids"] as? [Int] } == requests.map(\.greedy.ids))
        #expect(output.map { $0["text"] as? String } == requests.map(\.greedy.text))
    }
}
