import ArgumentParser
import Foundation
import SwiftVLM
import VLMServer

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "An OpenAI-compatible HTTP server: chat and text completions (continuous batching), chat with images, embeddings of texts and images.")

    @Option(name: .customLong("model"), help: "A model to serve (repeatable): a checkpoint directory, a GGUF file or a Hugging Face repo id; requests name it by this, or by its directory or file name.")
    var models: [String] = []

    @Option(help: "llama.cpp's image encoder file for the one GGUF --model (LLaVA-1.5, LLaVA-NeXT or Gemma 3 as llama.cpp's GGUF pair, as llama-server's --mmproj).")
    var mmproj: String?

    @OptionGroup var precision: PrecisionOption
    @OptionGroup var cache: CacheTypeOption
    @OptionGroup var chatTemplate: ChatTemplateOption
    @OptionGroup var panAndScan: PanAndScanOption

    @Option(help: "A JSON file holding a response template (transformers' tokenizer_config.json \"response_template\", or a file with that key): how the models' chat replies are split into content, reasoning_content and tool_calls, for models that ship none. Default: the checkpoint's own, else transformers serve's for its model type (Qwen 2/3/3.5, Gemma 4).")
    var responseTemplate: String?

    @Option(help: "Address to listen on.")
    var host = "127.0.0.1"

    @Option(help: "Port to listen on (0: any free port, printed at start).")
    var port = 8080

    @Option(help: "Require 'Authorization: Bearer KEY' on every /v1 request.")
    var apiKey: String?

    @Option(help: "Read file:// image URLs from under this directory (refused otherwise).")
    var allowLocalFiles: String?

    @Flag(help: "Download http(s):// image URLs (refused otherwise).")
    var allowRemoteImages = false

    @Option(help: "KV cache budget per language model, in MiB (running sequences and reused prompt prefixes).")
    var kvCacheMb = 1024

    @Option(help: "The most sequences decoded together per language model.")
    var maxBatch = 8

    @Option(help: "The most requests waiting per model; more are answered 503 with Retry-After.")
    var maxQueue = 64

    @Option(help: "The largest max_tokens a request may ask for (and the cap when it asks for none).")
    var maxTokens = 4096

    @Option(help: "The most choices (n) per request.")
    var maxChoices = 8

    @Option(help: "The largest request body, in MiB.")
    var maxBodyMb = 32

    @Option(help: "Images with more pixels are refused before decoding (Pillow's MAX_IMAGE_PIXELS by default).")
    var maxImagePixels = ImageDecoder.maxPixels

    @Option(help: "Seconds after which a generation ends (finish_reason \"length\").")
    var timeout = 600

    @Flag(help: "Use only the local Hugging Face cache for repo ids.")
    var offline = false

    func validate() throws {
        guard !models.isEmpty else { throw ValidationError("give at least one --model") }
        guard mmproj == nil || (models.count == 1 && models[0].hasSuffix(".gguf")) else {
            throw ValidationError("--mmproj goes with one GGUF --model (its language model)")
        }
        guard (0...65535).contains(port) else { throw ValidationError("--port must be in 0...65535") }
        for (name, value) in [("--kv-cache-mb", kvCacheMb), ("--max-batch", maxBatch), ("--max-tokens", maxTokens),
                              ("--max-choices", maxChoices), ("--max-body-mb", maxBodyMb), ("--timeout", timeout),
                              ("--max-image-pixels", maxImagePixels)] where value <= 0 {
            throw ValidationError("\(name) must be positive")
        }
        guard maxQueue >= 0 else { throw ValidationError("--max-queue must not be negative") }
    }

    func run() async throws {
        try await cache.building { try await runWithCacheType() }
    }

    private func runWithCacheType() async throws {
        var configuration = ServerConfiguration()
        configuration.host = host
        configuration.port = port
        configuration.apiKey = apiKey
        if let allowLocalFiles {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: allowLocalFiles, isDirectory: &isDirectory), isDirectory.boolValue else {
                throw ValidationError("--allow-local-files: \(allowLocalFiles) is not a directory")
            }
            configuration.allowLocalFiles = URL(fileURLWithPath: allowLocalFiles)
        }
        configuration.allowRemoteImages = allowRemoteImages
        configuration.kvCacheBytes = kvCacheMb << 20
        configuration.maxBatch = maxBatch
        configuration.maxQueue = maxQueue
        configuration.maxTokens = maxTokens
        configuration.maxChoices = maxChoices
        configuration.maxBodyBytes = maxBodyMb << 20
        configuration.maxImagePixels = maxImagePixels
        configuration.requestTimeout = .seconds(timeout)
        configuration.panAndScan = panAndScan.panAndScan
        let template = try responseTemplate.map(Self.loadResponseTemplate)
        let chatTemplateContext = try chatTemplate.context()
        let chatTemplate = try chatTemplate.template()
        var served: [ServedModel] = []
        for name in models {
            let path = try await modelPath(name)
            let model = try ServedModel.load(name: name, path: path, mmproj: mmproj.map { URL(fileURLWithPath: $0) },
                                             precision: precision.dtype, chatTemplate: chatTemplate,
                                             chatTemplateContext: chatTemplateContext, responseTemplate: template,
                                             configuration: configuration)
            switch model.role {
            case .text(let pipeline, _): try cache.check(pipeline.model, path: name)
            case .imageChat(let pipeline, _): try cache.check(pipeline.text.model, path: name)
            case .embeddings: break
            }
            served.append(model)
        }
        if panAndScan.panAndScan && !served.contains(where: {
            if case .imageChat(let pipeline, _) = $0.role { return pipeline.processor is Gemma3Processor }
            return false
        }) {
            throw ValidationError("--pan-and-scan is for Gemma 3 image chat models, and none of \(models.joined(separator: ", ")) is one")
        }
        let server = try VLMServer(models: served, configuration: configuration)
        let names = served.map(\.id).joined(separator: ", ")
        try await server.run { port in
            writeToStandardError("vlm serve: listening on http://\(host):\(port) (\(names))\n")
        }
    }

    /// The template in a JSON file: the object itself, or the `response_template` of a tokenizer_config.json.
    private static func loadResponseTemplate(_ path: String) throws -> ResponseTemplate {
        let data: Data
        do { data = try Data(contentsOf: URL(fileURLWithPath: path)) } catch {
            throw ResponseTemplateError.file(path, "cannot read: \(error.localizedDescription)")
        }
        let json = try JSONValue(parsing: data, file: path)
        do { return try ResponseTemplate(json["response_template"] ?? json) } catch {
            throw ResponseTemplateError.file(path, "\(error)")
        }
    }

    /// A GGUF file as given; otherwise a checkpoint directory or a repo id resolved through the Hugging Face cache.
    private func modelPath(_ name: String) async throws -> URL {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: name, isDirectory: &isDirectory), !isDirectory.boolValue {
            return URL(fileURLWithPath: name)
        }
        var options = HubOptions()
        if offline { options.offline = true }
        return try await resolveModel(name, options: options, progress: nil)
    }
}

func writeToStandardError(_ text: String) {
    FileHandle.standardError.write(Data(text.utf8))
}
