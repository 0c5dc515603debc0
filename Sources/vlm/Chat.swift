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

    @Option(help: "The image the conversation is about (image-to-text models such as BLIP-2; each line is a question).")
    var image: String?

    func run() async throws {
        let path = try await options.fileOrDirectory()
        if let image {
            try await chat(about: image, directory: path)
            return
        }
        let checkpoint = try? ModelDirectory(url: path)
        if let checkpoint, case .imageToText = try ModelRegistry.family(of: checkpoint, for: .chat).builder {
            throw ChatError.needsImage(path.path)
        }
        let pipeline = try TextGenerationPipeline(path: path)
        guard pipeline.chatTemplate != nil else { throw TokenizeError.noChatTemplate(path.path) }
        let config = try settings.apply(to: pipeline.config)
        let session = try ChatSession(pipeline: pipeline, system: system)
        try converse { line, seed in
            try session.send(line, settings: config, seed: seed) { if !$0.isEmpty { writeToStandardOutput($0) } }
        }
    }

    /// BLIP-2's chat-style prompting: each line a question about the image, asked after the earlier turns.
    private func chat(about image: String, directory: URL) async throws {
        guard system == nil else { throw ChatError.systemAboutAnImage }
        let decoded = try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: image))
        let pipeline = try ImageToTextPipeline(directory: directory, task: .chat)
        let config = try settings.apply(to: pipeline.config)
        let session = try VisualChatSession(pipeline: pipeline, image: decoded)
        try converse { line, seed in
            try session.ask(line, settings: config, seed: seed) { if !$0.isEmpty { writeToStandardOutput($0) } }
        }
    }

    /// Reads lines until end of input or /exit, answering each with `reply` (which streams its text); each turn
    /// samples with the next seed.
    private func converse<Reply>(_ reply: (String, UInt64) throws -> Reply) throws {
        var seed = settings.samplerSeed
        let interactive = isatty(STDIN_FILENO) != 0
        while true {
            if interactive { writeToStandardOutput("> ") }
            guard let line = readLine(), line != "/exit" else { break }
            if line.trimmingCharacters(in: .whitespaces).isEmpty { continue }
            _ = try reply(line, seed)
            writeToStandardOutput("\n")
            seed &+= 1
        }
    }
}

enum ChatError: Error, CustomStringConvertible {
    case needsImage(String)
    case systemAboutAnImage

    var description: String {
        switch self {
        case .needsImage(let model): "\(model): an image-to-text model talks about an image: give it with --image FILE"
        case .systemAboutAnImage: "--system is for chat models: a conversation about an image has no system message"
        }
    }
}
