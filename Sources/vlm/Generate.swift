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
    @OptionGroup var precision: PrecisionOption
    @OptionGroup var cache: CacheTypeOption
    @OptionGroup var chatTemplate: ChatTemplateOption
    @OptionGroup var panAndScan: PanAndScanOption

    @Option(help: "The text to continue, tokenized as the model's tokenizer does by default (special tokens added).")
    var prompt: String?

    @Option(help: "A JSON file holding a list of chat messages; the reply follows the model's chat template. Image parts ({\"type\": \"image\", \"path\"|\"url\": …}: a path relative to the current directory, a file:// or data:image/…;base64, URL) go to models that read images.")
    var chat: String?

    @Option(help: "An image the prompt is about (repeatable): one user turn holding the images, then --prompt's text, through the chat template (models that read images, such as LLaVA).")
    var image: [String] = []

    @Option(help: "llama.cpp's image encoder file for a GGUF --model (LLaVA-1.5, LLaVA-NeXT or Gemma 3: the vision tower and projector, as llama-mtmd-cli's --mmproj).")
    var mmproj: String?

    @Option(help: "A JSON file holding a list of tools ({\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}) for --chat: shown to the model through its chat template (as apply_chat_template(tools=…)); with --json and a checkpoint that has a response template, the reply's tool calls are parsed, their arguments cast to the parameters' types.")
    var tools: String?

    @Flag(help: "Print {\"text\", \"ids\", \"prompt_tokens\"} as JSON at the end instead of streaming text; for --chat with a checkpoint that has a response template, also \"message\": the reply parsed into content, reasoning_content and tool_calls.")
    var json = false

    @Option(help: "A GBNF grammar file (llama.cpp's notation) the new text must follow, as llama-cli's --grammar-file.")
    var grammarFile: String?

    @Option(help: "A JSON schema the new text must follow, as llama-cli's --json-schema: inline JSON, or @FILE to read one.")
    var jsonSchema: String?

    func validate() throws {
        guard (prompt == nil) != (chat == nil) else { throw ValidationError("give either --prompt TEXT or --chat MESSAGES.json") }
        guard grammarFile == nil || jsonSchema == nil else { throw ValidationError("give --grammar-file or --json-schema, not both") }
        guard image.isEmpty || prompt != nil else { throw ValidationError("--image goes with --prompt TEXT (with --chat, put image parts in the messages)") }
        guard tools == nil || chat != nil else { throw ValidationError("--tools goes with --chat") }
    }

    private struct Result: Encodable {
        let text: String
        let ids: [Int]
        let promptTokens: Int
        /// A chat's reply as the assistant message the checkpoint's response template makes of it.
        var message: EncodableJSON?

        enum CodingKeys: String, CodingKey { case text, ids, promptTokens = "prompt_tokens", message }
    }

    /// The JSON result; for a chat with a checkpoint that declares a response template, also the reply parsed into
    /// the assistant message (content, reasoning_content, tool_calls), as transformers' text-generation pipeline
    /// returns a chat's answer.
    private func result(_ generated: TextGenerationResult, pipeline: TextGenerationPipeline) throws -> Result {
        var result = Result(text: generated.text, ids: generated.ids, promptTokens: generated.promptTokens.count)
        if chat != nil, let message = try pipeline.message(replyIds: generated.ids, promptIds: generated.promptTokens,
                                                           tools: try tools.map(readTools)) {
            result.message = EncodableJSON(message)
        }
        return result
    }

    func run() async throws {
        try await cache.building { try await runWithCacheType() }
    }

    private func runWithCacheType() async throws {
        let template = try chatTemplate.template(), context = try chatTemplate.context()
        let path = try await options.fileOrDirectory()
        if let mmproj {
            let pipeline = try precision.building { try ImageTextToTextPipeline(gguf: path, mmproj: URL(fileURLWithPath: mmproj)) }
            try cache.check(pipeline.text.model, path: path.path)
            try answer(with: panAndScan.apply(to: (template.map(pipeline.withChatTemplate) ?? pipeline).withChatTemplateContext(context)))
            return
        }
        if let checkpoint = try? ModelDirectory(url: path),
           case .imageToText = try ModelRegistry.family(of: checkpoint, for: .generate).builder {
            let pipeline = try precision.building {
                try ImageTextToTextPipeline(directory: path, chatTemplate: template).withChatTemplateContext(context)
            }
            try cache.check(pipeline.text.model, path: path.path)
            try answer(with: panAndScan.apply(to: pipeline))
            return
        }
        let loaded = try precision.building { try TextGenerationPipeline(path: path) }
        try cache.check(loaded.model, path: path.path)
        let pipeline = (template.map(loaded.withChatTemplate) ?? loaded).withChatTemplateContext(context)
        guard image.isEmpty, !panAndScan.panAndScan else { throw ChatError.readsNoImages(path.path) }
        let config = try settings.apply(to: pipeline.config)
        let messages = try chat.map(readMessages)
        let toolList = try tools.map(readTools)
        let seed = settings.samplerSeed
        let grammar = try outputGrammar(for: pipeline)
        if json || config.numBeams > 1 {
            let result = try messages.map { try pipeline.generate(messages: $0, tools: toolList, settings: config, seed: seed, grammar: grammar) }
                ?? pipeline.generate(prompt: prompt ?? "", settings: config, seed: seed, grammar: grammar)
            if json {
                try printJSON(self.result(result, pipeline: pipeline))
            } else {
                print(result.text)
            }
            return
        }
        let pieces = messages.map { pipeline.stream(messages: $0, tools: toolList, settings: config, seed: seed, grammar: grammar) }
            ?? pipeline.stream(prompt: prompt ?? "", settings: config, seed: seed, grammar: grammar)
        for try await piece in pieces { writeToStandardOutput(piece) }
        writeToStandardOutput("\n")
    }

    /// The image-text-to-text pipeline's answer to --chat's messages, or to one user turn of --image and --prompt
    /// (a prompt alone is that turn without images: chat models that read images answer conversations).
    private func answer(with pipeline: ImageTextToTextPipeline) throws {
        let config = try settings.apply(to: pipeline.text.config)
        let messages: [JSONValue] = try chat.map(readMessages) ?? [[
            "role": "user",
            "content": .array(image.map { ["type": "image", "path": .string($0)] } + [["type": "text", "text": .string(prompt ?? "")]]),
        ]]
        let streams = !json && config.numBeams == 1
        let result = try pipeline.generate(messages: messages, tools: try tools.map(readTools), settings: config, seed: settings.samplerSeed,
                                           grammar: try outputGrammar(for: pipeline.text), onText: streams ? { writeToStandardOutput($0) } : nil)
        if json {
            try printJSON(self.result(result, pipeline: pipeline.text))
        } else {
            writeToStandardOutput(streams ? "\n" : result.text + "\n")
        }
    }
}

extension Generate {
    /// --grammar-file's grammar (its tokens by text resolved in `pipeline`'s vocabulary), or --json-schema's converted
    /// as llama.cpp converts schemas; nil without either.
    func outputGrammar(for pipeline: TextGenerationPipeline) throws -> Grammar? {
        if let grammarFile {
            let text: String
            do { text = try String(contentsOf: URL(fileURLWithPath: grammarFile), encoding: .utf8) } catch {
                throw GrammarFileError.unreadable(grammarFile)
            }
            do { return try pipeline.grammar(gbnf: text) } catch { throw GrammarFileError.invalid(grammarFile, error) }
        }
        guard let jsonSchema else { return nil }
        let (data, source): (Data, String)
        if jsonSchema.hasPrefix("@") {
            let file = String(jsonSchema.dropFirst())
            do { data = try Data(contentsOf: URL(fileURLWithPath: file)) } catch { throw GrammarFileError.unreadable(file) }
            source = file
        } else {
            (data, source) = (Data(jsonSchema.utf8), "--json-schema")
        }
        do {
            let conversion = try JSONSchemaGrammar.convert(JSONValue(parsing: data, file: source))
            for warning in conversion.warnings { FileHandle.standardError.write(Data("warning: \(source): \(warning)\n".utf8)) }
            return try Grammar(gbnf: conversion.grammar)
        } catch {
            throw GrammarFileError.invalid(source, error)
        }
    }
}

enum GrammarFileError: Error, CustomStringConvertible {
    case unreadable(String)
    case invalid(String, any Error)

    var description: String {
        switch self {
        case .unreadable(let file): "\(file): cannot read the file"
        case .invalid(let source, let error): "\(source): \(error)"
        }
    }
}

/// Writes `text` and flushes, so a stream shows each piece as it comes.
func writeToStandardOutput(_ text: String) {
    FileHandle.standardOutput.write(Data(text.utf8))
}

/// A JSON list of tools (`[{"type": "function", "function": {…}}, …]`).
func readTools(_ file: String) throws -> [JSONValue] {
    let data: Data
    do { data = try Data(contentsOf: URL(fileURLWithPath: file)) } catch { throw TokenizeError.unreadable(file) }
    guard case let .array(tools) = try JSONValue(parsing: data, file: file) else { throw ToolsFileError.notAList(file) }
    return tools
}

enum ToolsFileError: Error, CustomStringConvertible {
    case notAList(String)
    var description: String {
        switch self {
        case .notAList(let file): "\(file): expected a JSON list of tools"
        }
    }
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
