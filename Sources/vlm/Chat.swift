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
    @OptionGroup var precision: PrecisionOption
    @OptionGroup var cache: CacheTypeOption
    @OptionGroup var chatTemplate: ChatTemplateOption
    @OptionGroup var panAndScan: PanAndScanOption

    @Option(help: "A system message opening the conversation.")
    var system: String?

    @Option(help: "An image for the first turn (models that read images: LLaVA; with BLIP-2 the image every question is about). In a LLaVA chat, a line \"/image PATH\" adds an image to the next turn.")
    var image: String?

    @Option(help: "llama.cpp's image encoder file for a GGUF --model (LLaVA-1.5, LLaVA-NeXT or Gemma 3: the vision tower and projector, as llama-mtmd-cli's --mmproj).")
    var mmproj: String?

    func run() async throws {
        try await cache.building { try await runWithCacheType() }
    }

    private func runWithCacheType() async throws {
        let template = try chatTemplate.template(), context = try chatTemplate.context()
        let path = try await options.fileOrDirectory()
        if let mmproj {
            let pipeline = try precision.building { try ImageTextToTextPipeline(gguf: path, mmproj: URL(fileURLWithPath: mmproj)) }
            try cache.check(pipeline.text.model, path: path.path)
            try chatAboutImages(panAndScan.apply(to: (template.map(pipeline.withChatTemplate) ?? pipeline).withChatTemplateContext(context)))
            return
        }
        let checkpoint = try? ModelDirectory(url: path)
        if let checkpoint, case .imageToText = try ModelRegistry.family(of: checkpoint, for: .chat).builder {
            let pipeline = try precision.building(storedIn: path) { try ImageToTextPipeline(directory: path, task: .chat) }
            try cache.check(pipeline.model, path: path.path)
            if let chat = try ImageTextToTextPipeline.chatting(with: pipeline, directory: path, chatTemplate: template) {
                try chatAboutImages(panAndScan.apply(to: chat.withChatTemplateContext(context)))
            } else {
                guard template == nil && context.isEmpty else { throw ChatError.noChatTemplates(path.path) }
                guard let image else { throw ChatError.needsImage(path.path) }
                try chat(about: image, pipeline: panAndScan.apply(to: pipeline))
            }
            return
        }
        guard image == nil, !panAndScan.panAndScan else { throw ChatError.readsNoImages(path.path) }
        let loaded = try precision.building { try TextGenerationPipeline(path: path) }
        try cache.check(loaded.model, path: path.path)
        let pipeline = (template.map(loaded.withChatTemplate) ?? loaded).withChatTemplateContext(context)
        guard pipeline.chatTemplate != nil else { throw TokenizeError.noChatTemplate(path.path) }
        let config = try settings.apply(to: pipeline.config)
        let session = try ChatSession(pipeline: pipeline, system: system)
        try converse { line, seed in
            try session.send(line, settings: config, seed: seed) { if !$0.isEmpty { writeToStandardOutput($0) } }
        }
    }

    /// A chat through the model's template in which turns may hold images: --image and each "/image PATH" line add
    /// an image to the next turn; each image's features are computed once.
    private func chatAboutImages(_ pipeline: ImageTextToTextPipeline) throws {
        let config = try settings.apply(to: pipeline.text.config)
        let session = try ChatSession(pipeline: pipeline, system: system)
        var pending = try image.map { [try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0))] } ?? []
        try converse(command: { line in
            guard line.hasPrefix("/image ") else { return false }
            let file = line.dropFirst("/image ".count).trimmingCharacters(in: .whitespaces)
            pending.append(try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: file)))
            return true
        }) { line, seed in
            defer { pending = [] }
            return try session.send(line, images: pending, settings: config, seed: seed) {
                if !$0.isEmpty { writeToStandardOutput($0) }
            }
        }
    }

    /// BLIP-2's chat-style prompting: each line a question about the image, asked after the earlier turns.
    private func chat(about image: String, pipeline: ImageToTextPipeline) throws {
        guard system == nil else { throw ChatError.systemAboutAnImage }
        let decoded = try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: image))
        let config = try settings.apply(to: pipeline.config)
        let session = try VisualChatSession(pipeline: pipeline, image: decoded)
        try converse { line, seed in
            try session.ask(line, settings: config, seed: seed) { if !$0.isEmpty { writeToStandardOutput($0) } }
        }
    }

    /// Reads lines until end of input or /exit, answering each with `reply` (which streams its text); each turn
    /// samples with the next seed. Lines `command` takes are not turns; what goes wrong with one is reported and the
    /// session goes on when a person is typing, and ends it otherwise.
    private func converse<Reply>(command: ((String) throws -> Bool)? = nil, _ reply: (String, UInt64) throws -> Reply) throws {
        var seed = settings.samplerSeed
        let interactive = isatty(STDIN_FILENO) != 0
        while true {
            if interactive { writeToStandardOutput("> ") }
            guard let line = readLine(), line != "/exit" else { break }
            if line.trimmingCharacters(in: .whitespaces).isEmpty { continue }
            do {
                if try command?(line) == true { continue }
            } catch where interactive {
                FileHandle.standardError.write(Data("\(error)\n".utf8))
                continue
            }
            _ = try reply(line, seed)
            writeToStandardOutput("\n")
            seed &+= 1
        }
    }
}

enum ChatError: Error, CustomStringConvertible {
    case needsImage(String)
    case systemAboutAnImage
    case readsNoImages(String)
    case noChatTemplates(String)

    var description: String {
        switch self {
        case .needsImage(let model): "\(model): an image-to-text model talks about an image: give it with --image FILE"
        case .systemAboutAnImage: "--system is for chat models: a conversation about an image has no system message"
        case .readsNoImages(let model): "\(model): this model reads no images (it has no vision tower); --image is for models such as LLaVA, BLIP-2 and Gemma 3, --pan-and-scan for Gemma 3"
        case .noChatTemplates(let model): "\(model): this model's chat is BLIP-2's question-and-answer prompt, not a chat template: --chat-template is for models that chat through one"
        }
    }
}
