import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTokenizers

/// A family's processor, like transformers' `Processor` classes: its image processor, its tokenizer, and how a prompt
/// is laid out around an image's tokens.
public protocol ImageToTextProcessor: Sendable {
    var imageProcessor: any ImageProcessor { get }
    var tokenizer: Tokenizer { get }
    /// The ids the model reads for one image and `prompt` (image tokens included where the family puts them); nil
    /// when there is no prompt and the model starts on its own.
    func promptIds(_ prompt: String?) throws -> [Int]?
    /// The prompt a visual question is asked in, as the family was trained to read it.
    func questionPrompt(_ question: String) -> String
}

/// Builds the processor of an image-to-text checkpoint by config.json's `model_type`.
enum ImageToTextProcessors {
    static let builders: [String: @Sendable (ModelDirectory) throws -> any ImageToTextProcessor] = [
        "blip-2": { try Blip2Processor(directory: $0) },
        "blip": { try BlipProcessor(directory: $0) },
    ]

    static func load(_ directory: ModelDirectory) throws -> any ImageToTextProcessor {
        let type = try directory.modelType
        guard let build = builders[type] else {
            throw ModelError.unsupportedModelType(type, supported: builders.keys.sorted(),
                                                  file: directory.url.appendingPathComponent("config.json").path)
        }
        return try build(directory)
    }
}

/// transformers' `Blip2Processor`: BLIP's image processor, and `num_query_tokens` image tokens put in front of the
/// tokenized text (which keeps its special tokens: OPT's tokenizer starts it with bos).
public struct Blip2Processor: ImageToTextProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer
    /// Image tokens per image: the Q-Former's query count.
    public let numQueryTokens: Int
    /// The id of the tokenizer's `<image>` token.
    public let imageTokenId: Int

    /// Reads the tokenizer files, the image processor config and `num_query_tokens` (processor_config.json's, else
    /// config.json's) of a checkpoint directory.
    ///
    /// - Throws: the loaders' errors; `PipelineError.invalidProcessor` when the tokenizer has no `<image>` token or no
    ///   query-token count is given.
    public init(directory: ModelDirectory) throws {
        tokenizer = try Tokenizer(directory: directory.url)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
        let count = try directory.jsonObject("processor_config.json")?["num_query_tokens"] as? Int
            ?? directory.jsonObject("config.json")?["num_query_tokens"] as? Int
        guard let count, count > 0 else {
            throw PipelineError.invalidProcessor(directory.url.path, "neither processor_config.json nor config.json gives a positive num_query_tokens")
        }
        guard let imageToken = tokenizer.tokenId("<image>") else {
            throw PipelineError.invalidProcessor(directory.url.path, "the tokenizer has no <image> token (Blip2Processor adds one)")
        }
        (numQueryTokens, imageTokenId) = (count, imageToken)
    }

    public func promptIds(_ prompt: String?) throws -> [Int]? {
        guard let prompt else { return nil }
        return Array(repeating: imageTokenId, count: numQueryTokens) + tokenizer.encode(prompt).ids
    }

    /// BLIP-2's VQA prompt, as in its paper and model cards.
    public func questionPrompt(_ question: String) -> String {
        "Question: \(question) Answer:"
    }
}

/// transformers' `BlipProcessor`: BLIP's image processor and its BERT tokenizer, the text framed as `[CLS] … [SEP]`
/// (the captioning model turns that into its decoder prompt; the VQA model encodes it as the question).
public struct BlipProcessor: ImageToTextProcessor {
    public let imageProcessor: any ImageProcessor
    public let tokenizer: Tokenizer

    public init(directory: ModelDirectory) throws {
        tokenizer = try Tokenizer(directory: directory.url)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
    }

    public func promptIds(_ prompt: String?) throws -> [Int]? {
        prompt.map { tokenizer.encode($0).ids }
    }

    /// BLIP's VQA model reads the question as it is.
    public func questionPrompt(_ question: String) -> String { question }
}
