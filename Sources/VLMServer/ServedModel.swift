import Foundation
import SwiftVLM

/// One model the server answers for, loaded once; requests name it by ``id`` or any of ``aliases``.
public final class ServedModel: Sendable {
    /// What the model can be asked through the API.
    public enum Role: Sendable {
        /// A language model: chat and text completions through continuous batching.
        case text(TextGenerationPipeline, ContinuousBatcher)
        /// A chat model that reads images (LLaVA family): chat completions with image parts.
        case imageChat(ImageTextToTextPipeline, ContinuousBatcher)
        /// A dual encoder (CLIP, SigLIP): embeddings of texts and images.
        case embeddings(DualEncoderPipeline)
    }

    /// The name `GET /v1/models` lists: the name the model was given on the command line.
    public let id: String
    /// Other names that address it: its directory or file name.
    public let aliases: [String]
    public let role: Role
    /// Unix time it was loaded (the models list's `created`).
    public let created: Int
    /// How the model's chat replies are parsed into content, `reasoning_content` and `tool_calls` (what
    /// `tool_choice: "auto"` needs); nil: replies are text.
    public let responseTemplate: ResponseTemplate?

    public init(id: String, aliases: [String] = [], role: Role, responseTemplate: ResponseTemplate? = nil) {
        self.id = id
        self.aliases = aliases
        self.role = role
        self.responseTemplate = responseTemplate
        created = Int(Date().timeIntervalSince1970)
    }

    /// The pipeline that generates its text; nil for a model that does not generate.
    var generationPipeline: TextGenerationPipeline? {
        switch role {
        case let .text(pipeline, _): pipeline
        case let .imageChat(pipeline, _): pipeline.text
        case .embeddings: nil
        }
    }

    /// Loads what `path` holds (a checkpoint directory or a GGUF file) for the role its family plays, with a
    /// continuous batcher for language models.
    ///
    /// - Parameters:
    ///   - name: how the user named it (a repo id, a path); the listed id.
    ///   - mmproj: llama.cpp's image encoder file for a GGUF language model (LLaVA-1.5/NeXT as its GGUF pair).
    ///   - precision: the linear layers' precision; nil for fp32, or for an embedding model its checkpoint's own.
    ///   - chatTemplate: the chat template of a model that chats, in place of its own.
    ///   - chatTemplateContext: variables every rendering of its chat template gets unless the request's
    ///     `chat_template_kwargs` set them (llama-server's `--chat-template-kwargs`).
    ///   - responseTemplate: how its chat replies are laid out; by default the checkpoint's own
    ///     (tokenizer_config.json's `response_template`), else the one transformers serve uses for its model type.
    public static func load(name: String, path: URL, mmproj: URL? = nil, precision: MatrixPrecision? = nil,
                            chatTemplate: ChatTemplate? = nil, chatTemplateContext: [String: JSONValue] = [:],
                            responseTemplate: ResponseTemplate? = nil, configuration: ServerConfiguration) throws -> ServedModel {
        // Embedding models follow their checkpoint's stored dtype unless told otherwise, as `vlm embed` does; the
        // generating ones run fp32 unless told otherwise, as `vlm chat` does.
        let model = try MatrixPrecision.$forNewLayers.withValue(precision ?? .float32) {
            try build(name: name, path: path, mmproj: mmproj, precision: precision, chatTemplate: chatTemplate,
                      chatTemplateContext: chatTemplateContext, configuration: configuration)
        }
        let template: ResponseTemplate?
        switch model.role {
        case .text(let pipeline, _):
            template = responseTemplate ?? pipeline.responseTemplate ?? modelType(path).flatMap(ResponseTemplate.servingFallback)
        case .imageChat(let pipeline, _):
            template = responseTemplate ?? pipeline.text.responseTemplate ?? modelType(path).flatMap(ResponseTemplate.servingFallback)
        case .embeddings:
            template = nil
        }
        return ServedModel(id: model.id, aliases: model.aliases, role: model.role, responseTemplate: template)
    }

    /// config.json's `model_type`, or a GGUF file's `general.architecture` (llama.cpp's names for the same types).
    private static func modelType(_ path: URL) -> String? {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path.path, isDirectory: &isDirectory) else { return nil }
        if isDirectory.boolValue { return try? ModelDirectory(url: path).modelType }
        return (try? GGUFFile(url: path))?.metadata["general.architecture"]?.string
    }

    private static func build(name: String, path: URL, mmproj: URL?, precision: MatrixPrecision?, chatTemplate: ChatTemplate?,
                              chatTemplateContext: [String: JSONValue],
                              configuration: ServerConfiguration) throws -> ServedModel {
        let aliases = [path.lastPathComponent, path.deletingPathExtension().lastPathComponent].filter { $0 != name }
        func batcher(_ model: any CausalLanguageModel) throws -> ContinuousBatcher {
            try ContinuousBatcher(model: model, maxBatch: configuration.maxBatch, maxQueue: configuration.maxQueue,
                                  cacheBytes: configuration.kvCacheBytes)
        }
        if let mmproj {
            let loaded = try ImageTextToTextPipeline(gguf: path, mmproj: mmproj)
            let pipeline = (chatTemplate.map(loaded.withChatTemplate) ?? loaded).withChatTemplateContext(chatTemplateContext)
            return ServedModel(id: name, aliases: aliases, role: .imageChat(pipeline, try batcher(pipeline.text.model)))
        }
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path.path, isDirectory: &isDirectory), isDirectory.boolValue {
            let checkpoint = try ModelDirectory(url: path)
            let family = try ModelRegistry.family(of: checkpoint)
            // A checkpoint that holds a dual encoder inside another model (CLIPSeg's CLIP) serves its embeddings.
            switch family.builder(for: .embed) {
            case .imageTextDualEncoder:
                return ServedModel(id: name, aliases: aliases, role: .embeddings(try DualEncoderPipeline(directory: path, task: .embed, precision: precision)))
            case .imageToText:
                let pipeline = try ImageTextToTextPipeline(directory: path, task: .generate, chatTemplate: chatTemplate)
                    .withChatTemplateContext(chatTemplateContext)
                return ServedModel(id: name, aliases: aliases, role: .imageChat(pipeline, try batcher(pipeline.text.model)))
            case .causalLanguageModel:
                break
            default:
                throw ServerError.unservable(path.path, family: family.name)
            }
        }
        let loaded = try TextGenerationPipeline(path: path)
        let pipeline = (chatTemplate.map(loaded.withChatTemplate) ?? loaded).withChatTemplateContext(chatTemplateContext)
        return ServedModel(id: name, aliases: aliases, role: .text(pipeline, try batcher(pipeline.model)))
    }

    func answers(to name: String) -> Bool { name == id || aliases.contains(name) }

    /// Stops its batcher once running sequences end.
    func shutdown() {
        switch role {
        case .text(_, let batcher), .imageChat(_, let batcher): batcher.shutdown()
        case .embeddings: break
        }
    }
}

/// Why the server cannot start.
public enum ServerError: Error, CustomStringConvertible {
    case unservable(String, family: String)
    case duplicateName(String)

    public var description: String {
        switch self {
        case let .unservable(path, family):
            "\(path): \(family) models answer no endpoint of the OpenAI API (the server serves language models, image chat models and CLIP/SigLIP embeddings)"
        case .duplicateName(let name): "two models are named \(name); give each --model once"
        }
    }
}
