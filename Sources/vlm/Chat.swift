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
        abstract: "Talk with a chat model: each line you type is a user turn, the reply streams back; the conversation so far goes through the chat template every turn, and only the tokens the model has not seen yet are run. End with Ctrl-D or /exit.")

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
        let session = try ChatSession(pipeline: pipeline, system: system)
        let interactive = isatty(STDIN_FILENO) != 0
        while true {
            if interactive { writeToStandardOutput("> ") }
            guard let line = readLine(), line != "/exit" else { break }
            if line.trimmingCharacters(in: .whitespaces).isEmpty { continue }
            _ = try session.send(line, settings: config, seed: seed) { piece in
                if !piece.isEmpty { writeToStandardOutput(piece) }
            }
            writeToStandardOutput("\n")
            seed &+= 1
        }
    }
}
