import Foundation
import Testing

/// `vlm generate --image` and `vlm chat` on Tests/Fixtures/gemma3/tiny, against oracle/gemma3.py (transformers'
/// answers with the processor's `token_type_ids`). Image paths are relative to the directory the command runs in.
@Suite struct Gemma3CLITests {
    struct Expected: Decodable {
        struct Turn: Decodable { let images: [String]; let text: String; let input_ids: [Int]; let ids: [Int]; let answer: String }
        let chat_tokens: Int
        let session: [Turn]
    }

    static let model = CLI.fixtures.appendingPathComponent("gemma3/tiny").path

    static func expected() throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("gemma3/expected.json")))
    }

    /// `--image … --prompt` is one user turn without a system message: the session's first turn.
    @Test func generateWithAnImageAndAPromptIsOneUserTurn() throws {
        let expected = try Self.expected()
        try Self.expectGenerate(expected.session[0], tokens: expected.chat_tokens)
    }

    /// Three turns over one KV cache, the second bringing another photo.
    @Test func chatSessionAnswersEachTurnLikeTransformers() throws {
        let expected = try Self.expected()
        try Self.expectChat(expected.session, tokens: expected.chat_tokens)
    }

    /// `vlm generate --image IMAGE --prompt TEXT` (and `arguments`) gives `turn`'s answer.
    static func expectGenerate(_ turn: Expected.Turn, tokens: Int, arguments: [String] = []) throws {
        let run = try CLI.run(["generate", "--model", model, "--image", turn.images[0], "--prompt", turn.text,
                               "--temperature", "0", "--max-new-tokens", String(tokens), "--json"] + arguments,
                              directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == turn.ids)
        #expect(result["prompt_tokens"] as? Int == turn.input_ids.count)
        #expect(result["text"] as? String == turn.answer)
    }

    /// `vlm chat` (with `arguments`) over `turns`, each turn's images after the first's given as "/image PATH" lines,
    /// answers each turn as transformers did.
    static func expectChat(_ turns: [Expected.Turn], tokens: Int, arguments: [String] = []) throws {
        var lines: [String] = []
        for (index, turn) in turns.enumerated() {
            if index > 0 { lines += turn.images.map { "/image \($0)" } }
            lines.append(turn.text)
        }
        let input = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-gemma3-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try Data((lines.joined(separator: "\n") + "\n").utf8).write(to: input)
        let run = try CLI.run(["chat", "--model", model, "--temperature", "0", "--max-new-tokens", String(tokens),
                               "--image", turns[0].images[0]] + arguments,
                              standardInput: input, directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout == turns.map { $0.answer + "\n" }.joined())
    }
}

/// `--pan-and-scan` on `vlm generate` and `vlm chat`, against oracle/gemma3_pan_and_scan.py's session (transformers'
/// `apply_chat_template(..., do_pan_and_scan=True)`: coffee.png and rocket.jpg each read whole and as two crops).
@Suite struct Gemma3PanAndScanCLITests {
    struct Expected: Decodable { let session: [Gemma3CLITests.Expected.Turn] }

    static let chatTokens = 8

    static func expected() throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("gemma3/pan-and-scan.json")))
    }

    @Test func generateReadsAnImageAndItsCrops() throws {
        try Gemma3CLITests.expectGenerate(Self.expected().session[0], tokens: Self.chatTokens, arguments: ["--pan-and-scan"])
    }

    @Test func chatReadsEachTurnsImagesAndCrops() throws {
        try Gemma3CLITests.expectChat(Self.expected().session, tokens: Self.chatTokens, arguments: ["--pan-and-scan"])
    }

    /// A model whose processor does not crop refuses the flag in one line.
    @Test func captionOfAnotherFamilyRefusesPanAndScan() throws {
        let run = try CLI.run(["caption", "--model", CLI.fixtures.appendingPathComponent("image-to-text/blip-captioning").path,
                               "--pan-and-scan", CLI.fixtures.appendingPathComponent("photos/coffee.png").path])
        #expect(run.status != 0)
        #expect(run.stderr.contains("pan and scan") && run.stderr.split(separator: "\n").count == 1, "\(run.stderr)")
    }
}
