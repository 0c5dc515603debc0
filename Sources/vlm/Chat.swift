import ArgumentParser
import Foundation
import SwiftVLM

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

struct Chat: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Talk with a chat model: each line you type is a user turn, the reply streams back; the conversation so far goes through the chat template every turn. End with Ctrl-D or /exit.")

    @OptionGroup var options: ModelOption
    @OptionGroup var settings: GenerationSettings

    @Option(help: "A system message opening the conversation.")
    var system: String?

    func run() async throws {
        let path = try await options.fileOrDirectory()
        let pipeline = try TextGenerationPipeline(path: path)
        guard pipeline.chatTemplate != nil else { throw TokenizeError.noChatTemplate(path.path) }
        let config = try settings.apply(to: pipeline.config)
        var seed = settings.samplerSeed
        var messages: [JSONValue] = system.map { [["role": "system", "content": .string($0)]] } ?? []
        let interactive = isatty(STDIN_FILENO) != 0
        while true {
            if interactive { writeToStandardOutput("> ") }
            guard let line = readLine(), line != "/exit" else { break }
            if line.trimmingCharacters(in: .whitespaces).isEmpty { continue }
            messages.append(["role": "user", "content": .string(line)])
            var reply = ""
            for try await piece in pipeline.stream(messages: messages, settings: config, seed: seed) {
                writeToStandardOutput(piece)
                reply += piece
            }
            writeToStandardOutput("\n")
            messages.append(["role": "assistant", "content": .string(reply)])
            seed &+= 1
        }
    }
}
