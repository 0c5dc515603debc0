import ArgumentParser
import Foundation
import SwiftVLM

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

@main
struct VLM: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vlm",
        abstract: "Run vision-language models from Hugging Face checkpoints.",
        subcommands: [Classify.self, Segment.self, Detect.self, Embed.self, Caption.self, Ask.self, Match.self, Tokenize.self, Generate.self, Chat.self, PerplexityCommand.self, Train.self, Serve.self, Bench.self, BenchTokenizer.self, Download.self, Cache.self]
    )
}

/// `--model`: a local checkpoint directory, or a Hub repo id resolved through the Hugging Face cache.
struct ModelOption: ParsableArguments {
    @Option(name: .long, help: "A checkpoint directory, a GGUF file (language models), or a Hugging Face repo id (org/name[@revision]) found in or downloaded to the Hugging Face cache.")
    var model: String

    @Flag(help: "Use only the local cache, never the network (as HF_HUB_OFFLINE=1).")
    var offline = false

    @Flag(help: "No download progress bars.")
    var quiet = false

    /// The checkpoint directory, downloading what a repo id needs first.
    func directory() async throws -> URL {
        var options = HubOptions()
        if offline { options.offline = true }
        let bar = progressBar(quiet: quiet)
        defer { bar?.finish() }
        return try await resolveModel(model, options: options, progress: progressHandler(bar))
    }

    /// An existing file as given (a GGUF file carries its whole model); otherwise ``directory()``.
    func fileOrDirectory() async throws -> URL {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: model, isDirectory: &isDirectory), !isDirectory.boolValue {
            return URL(fileURLWithPath: model)
        }
        return try await directory()
    }
}

/// `--dtype`: the precision of the linear layers of the model a command builds.
struct PrecisionOption: ParsableArguments {
    @Option(help: "Precision of the model's linear layers: fp32; bf16 (weights in bf16, products through the CPU's bf16 instructions); or int8 (dynamic quantization: int8 weights per output channel, activations per token, VNNI products). Norms and softmax stay fp32 (bf16 also runs an encoder's attention products in bf16), and GGUF-quantized matrices keep their formats (with bf16 a prompt's products through them run in bf16; with int8 every product through them, prompts and decoding, runs on int8 activations per 32 values, as llama.cpp's); a CPU without the instructions runs fp32. Default: for classify, embed and serve of an image-text model, and caption, ask, image chat and bench of a checkpoint directory of an image model, bf16 for a checkpoint stored in bf16, else fp32; fp32 for the rest.")
    var dtype: MatrixPrecision?

    /// `body`'s model built with `--dtype`'s layers, fp32 when it is not given.
    func building<T>(_ body: () throws -> T) throws -> T {
        try MatrixPrecision.$forNewLayers.withValue(dtype ?? .float32, operation: body)
    }

    /// `body`'s model built with `--dtype`'s layers, or without it as the checkpoint in `directory` stores its
    /// weights (``WeightStore/defaultMatrixPrecision``: bf16 for a bf16 checkpoint, as transformers 5 loads one by
    /// default, `dtype="auto"`; fp32 otherwise).
    func building<T>(storedIn directory: URL, _ body: () throws -> T) throws -> T {
        let precision = try dtype ?? WeightStore(directory: directory).defaultMatrixPrecision
        return try MatrixPrecision.$forNewLayers.withValue(precision, operation: body)
    }
}

extension MatrixPrecision: ExpressibleByArgument {}

/// `--pan-and-scan`: Gemma 3's crops of wide and tall images, as transformers' `do_pan_and_scan=True`.
struct PanAndScanOption: ParsableArguments {
    @Flag(help: "Gemma 3: read an image much wider than tall (or taller than wide) also as crops side by side, as transformers' processor does with do_pan_and_scan=True: 2 to 4 crops of at least 256 pixels, for images at least 1.2 times as long one way as the other.")
    var panAndScan = false

    func apply(to pipeline: ImageToTextPipeline) throws -> ImageToTextPipeline {
        panAndScan ? try pipeline.withPanAndScan() : pipeline
    }

    func apply(to pipeline: ImageTextToTextPipeline) throws -> ImageTextToTextPipeline {
        panAndScan ? try pipeline.withPanAndScan() : pipeline
    }
}

/// `--cache-type`: what the KV caches of the decoder a command builds hold (llama.cpp's `--cache-type-k` and
/// `--cache-type-v` together).
struct CacheTypeOption: ParsableArguments {
    @Option(name: .customLong("cache-type"), help: "What the decoder's KV cache holds its keys and values in: f32 (the default: the same numbers as transformers) or f16 (half the memory and half the bytes each decoding step reads from the cache, as llama.cpp's default --cache-type-k f16 --cache-type-v f16; attention still computes in fp32). Llama-family, Gemma 3, OPT and GPT-2 decoders, GGUF ones included.")
    var cacheType: KVCache.ElementType = .float32

    /// `body` with the decoders it builds holding `--cache-type`'s caches.
    func building<T>(_ body: () async throws -> T) async rethrows -> T {
        try await KVCache.ElementType.$forNewModels.withValue(cacheType, operation: body)
    }

    /// An error unless `model` (the one at `path`) holds its caches as asked: decoders with fp32 caches only ignore
    /// the setting, and that should not pass unnoticed.
    func check(_ model: any CausalLanguageModel, path: String) throws {
        try check(model.cacheElementType, path: path)
    }

    func check(_ model: any ImageToTextModel, path: String) throws {
        try check(model.cacheElementType, path: path)
    }

    private func check(_ cacheElementType: KVCache.ElementType, path: String) throws {
        guard cacheElementType == cacheType else {
            throw CacheTypeError(path: path, held: cacheElementType, asked: cacheType)
        }
    }
}

struct CacheTypeError: Error, CustomStringConvertible {
    let path: String
    let held: KVCache.ElementType, asked: KVCache.ElementType

    var description: String {
        "\(path): this model's decoder holds its KV cache in \(held.rawValue) only, not --cache-type \(asked.rawValue) (Llama-family, Gemma 3, OPT and GPT-2 decoders take f16)"
    }
}

extension KVCache.ElementType: ExpressibleByArgument {}

/// `--chat-template FILE`: a chat template in place of the model's own (llama-server's `--chat-template-file`, vLLM's
/// `--chat-template`), and `--chat-template-kwargs JSON`: variables for it (llama.cpp's `--chat-template-kwargs`).
struct ChatTemplateOption: ParsableArguments {
    @Option(name: .customLong("chat-template"), help: "A chat template to use instead of the model's own: a Jinja file, or a .json file holding \"chat_template\" (as chat_template.json and tokenizer_config.json hold it). As llama-server's --chat-template-file and vLLM's --chat-template.")
    var file: String?

    @Option(name: .customLong("chat-template-kwargs"), help: "A JSON object of variables for the chat template, as apply_chat_template(**kwargs) takes them and llama.cpp's --chat-template-kwargs gives them, e.g. '{\"enable_thinking\": false}' for Qwen 3 (a request's own chat_template_kwargs override them in vlm serve).")
    var kwargs: String?

    /// The template, read and parsed (before any model is loaded, so that a bad file fails at once).
    func template() throws -> ChatTemplate? {
        try file.map { try ChatTemplate.load(file: URL(fileURLWithPath: $0)) }
    }

    /// --chat-template-kwargs' variables (empty without it); not an object, or one setting what each conversation
    /// sets itself, is an error.
    func context() throws -> [String: JSONValue] {
        guard let kwargs else { return [:] }
        guard case .object(let pairs) = try? JSONValue(parsing: Data(kwargs.utf8), file: "--chat-template-kwargs") else {
            throw ChatTemplateKwargsError(reason: "expected a JSON object, got \(kwargs)")
        }
        if let reserved = pairs.first(where: { ["messages", "tools", "documents", "add_generation_prompt"].contains($0.0) }) {
            throw ChatTemplateKwargsError(reason: "'\(reserved.0)' is set by the conversation itself")
        }
        return Dictionary(pairs, uniquingKeysWith: { $1 })
    }
}

struct ChatTemplateKwargsError: Error, CustomStringConvertible {
    let reason: String
    var description: String { "--chat-template-kwargs: \(reason)" }
}

/// A progress bar on stderr when it is a terminal and the user did not ask for quiet.
func progressBar(quiet: Bool) -> TerminalProgressBar? {
    quiet || isatty(STDERR_FILENO) == 0 ? nil : TerminalProgressBar()
}

func progressHandler(_ bar: TerminalProgressBar?) -> HubProgressHandler? {
    guard let bar else { return nil }
    return { bar.update($0) }
}
