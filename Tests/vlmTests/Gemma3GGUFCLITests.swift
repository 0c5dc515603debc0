import Foundation
import Testing

/// `vlm generate` and `vlm chat` with `--model LM.gguf --mmproj MMPROJ.gguf` on llama.cpp's Gemma 3 pair of
/// oracle/gemma3_gguf.py, against transformers' answer from the checkpoint the pair was made from (its last
/// conversation: one user turn of an image and a question, answered up to `<end_of_turn>`).
@Suite struct Gemma3GGUFCLITests {
    struct Expected: Decodable {
        struct Answer: Decodable { let input_ids: [Int]; let ids: [Int]; let text: String }
        struct Continuation: Decodable { let prompt: String; let input_ids: [Int]; let ids: [Int]; let text: String }
        let chat_tokens: Int
        let max_new_tokens: Int
        let chat: [Answer]
        let text_only: Continuation
    }

    static let directory = CLI.fixtures.appendingPathComponent("gemma3-gguf")
    static let pair = ["--model", directory.appendingPathComponent("lm-q8_0.gguf").path,
                       "--mmproj", directory.appendingPathComponent("mmproj-f32.gguf").path]
    static let image = "llava-next/photos/wide.png", question = "Describe this image."

    static func all() throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
    }

    static func expected() throws -> Expected.Answer {
        try #require(try all().chat.last)
    }

    @Test func generateWithAnImageAndAPromptReadsThePair() throws {
        let reference = try Self.expected()
        let run = try CLI.run(["generate"] + Self.pair + ["--image", Self.image, "--prompt", Self.question, "--temperature", "0",
                                                         "--max-new-tokens", "8", "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == reference.ids)
        #expect(result["prompt_tokens"] as? Int == reference.input_ids.count)
        #expect(result["text"] as? String == reference.text)
    }

    @Test func chatWithAnImageReadsThePair() throws {
        let reference = try Self.expected()
        let input = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-gemma3-gguf-\(UUID().uuidString).txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try Data((Self.question + "\n").utf8).write(to: input)
        let run = try CLI.run(["chat"] + Self.pair + ["--image", Self.image, "--temperature", "0", "--max-new-tokens", "8"],
                              standardInput: input, directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout == reference.text + "\n")
    }

    /// The language model file alone continues a text prompt, its Gemma vocabulary and config read from the metadata.
    @Test func generateContinuesTextWithTheLanguageModelAlone() throws {
        let reference = try Self.all()
        let run = try CLI.run(["generate", "--model", Self.directory.appendingPathComponent("lm-q8_0.gguf").path,
                               "--prompt", reference.text_only.prompt, "--temperature", "0",
                               "--max-new-tokens", String(reference.max_new_tokens), "--json"], directory: CLI.fixtures)
        #expect(run.status == 0, "\(run.stderr)")
        let result = try #require(try CLI.json(run) as? [String: Any])
        #expect(result["ids"] as? [Int] == reference.text_only.ids)
        #expect(result["prompt_tokens"] as? Int == reference.text_only.input_ids.count)
        #expect(result["text"] as? String == reference.text_only.text)
    }
}
