import ArgumentParser
import Foundation
import SwiftVLM

/// Generation settings shared by `vlm generate` and `vlm chat`; each overrides the model's generation_config.json.
struct GenerationSettings: ParsableArguments {
    @Option(help: "At most this many new tokens.")
    var maxNewTokens: Int?

    @Option(help: "Sample with this temperature; 0 decodes greedily. Without it, the model's generation config decides.")
    var temperature: Double?

    @Option(help: "When sampling: keep the K most likely tokens.")
    var topK: Int?

    @Option(help: "When sampling: keep the most likely tokens whose probabilities add up to P.")
    var topP: Double?

    @Option(help: "When sampling: drop tokens less likely than P times the most likely one.")
    var minP: Double?

    @Option(help: "Penalize tokens already in the text (1 = none).")
    var repetitionPenalty: Double?

    @Option(help: "Beam search with this many beams (no streaming).")
    var numBeams: Int?

    @Option(help: "Stop once the text ends with this string (repeatable).")
    var stop: [String] = []

    @Option(help: "Seed of the sampler; the same seed gives the same text. Random when not given.")
    var seed: UInt64?

    /// `base` with the command line's settings applied, checked.
    func apply(to base: GenerationConfig) throws -> GenerationConfig {
        var config = base
        if let maxNewTokens { config.maxNewTokens = maxNewTokens }
        if let temperature {
            config.doSample = temperature > 0
            if temperature > 0 { config.temperature = temperature }
        }
        if let topK { config.topK = topK }
        if let topP { config.topP = topP }
        if let minP { config.minP = minP }
        if let repetitionPenalty { config.repetitionPenalty = repetitionPenalty }
        if let numBeams { config.numBeams = numBeams }
        config.stopStrings += stop
        try config.validate(file: "command line")
        return config
    }

    var samplerSeed: UInt64 { seed ?? UInt64.random(in: .min ... .max) }
}

struct Generate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Continue a prompt, or answer a chat, with a language model; text is printed as it is generated.")

    @OptionGroup var options: ModelOption
    @OptionGroup var settings: GenerationSettings

    @Option(help: "The text to continue, tokenized as the model's tokenizer does by default (special tokens added).")
    var prompt: String?

    @Option(help: "A JSON file holding a list of chat messages; the reply follows the model's chat template.")
    var chat: String?

    @Flag(help: "Print {\"text\", \"ids\", \"prompt_tokens\"} as JSON at the end instead of streaming text.")
    var json = false

    func validate() throws {
        guard (prompt == nil) != (chat == nil) else { throw ValidationError("give either --prompt TEXT or --chat MESSAGES.json") }
    }

    private struct Result: Encodable {
        let text: String
        let ids: [Int]
        let promptTokens: Int

        enum CodingKeys: String, CodingKey { case text, ids, promptTokens = "prompt_tokens" }
    }

    func run() async throws {
        let pipeline = try TextGenerationPipeline(path: try await options.fileOrDirectory())
        let config = try settings.apply(to: pipeline.config)
        let messages = try chat.map(readMessages)
        let seed = settings.samplerSeed
        if json || config.numBeams > 1 {
            let result = try messages.map { try pipeline.generate(messages: $0, settings: config, seed: seed) }
                ?? pipeline.generate(prompt: prompt ?? "", settings: config, seed: seed)
            if json {
                try printJSON(Result(text: result.text, ids: result.ids, promptTokens: result.promptTokens.count))
            } else {
                print(result.text)
            }
            return
        }
        let pieces = messages.map { pipeline.stream(messages: $0, settings: config, seed: seed) }
            ?? pipeline.stream(prompt: prompt ?? "", settings: config, seed: seed)
        for try await piece in pieces { writeToStandardOutput(piece) }
        writeToStandardOutput("\n")
    }
}

/// Writes `text` and flushes, so a stream shows each piece as it comes.
func writeToStandardOutput(_ text: String) {
    FileHandle.standardOutput.write(Data(text.utf8))
}

/// A JSON list of chat messages (`[{"role": …, "content": …}, …]`).
func readMessages(_ file: String) throws -> [JSONValue] {
    let data: Data
    do { data = try Data(contentsOf: URL(fileURLWithPath: file)) } catch {
        throw TokenizeError.unreadable(file)
    }
    guard case .array(let messages) = try JSONValue(parsing: data, file: file) else {
        throw TokenizeError.notAMessageList(file)
    }
    return messages
}
