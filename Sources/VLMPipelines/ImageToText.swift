import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers

/// What ``ImageToTextPipeline`` wrote for one image.
public struct ImageToTextResult: Sendable, Equatable {
    /// The new text: the new tokens decoded with special tokens skipped, whitespace trimmed (a prompt's
    /// continuation only, without the prompt).
    public var text: String
    /// The new token ids, ending with the eos token that stopped generation, if one did.
    public var ids: [Int]
}

/// transformers' "image-to-text" pipeline (in 5.23 the "image-text-to-text" one it became): captions, or a prompt's
/// continuation, for each image, by a family's processor and model chosen from the checkpoint.
public final class ImageToTextPipeline: Sendable {
    public let model: any ImageToTextModel
    public let processor: any ImageToTextProcessor
    /// The settings used when a call gives none: the checkpoint's generation config, and at most 256 new tokens
    /// where it sets no length (the pipeline's default).
    public let config: GenerationConfig
    private let tokenTable = TokenTable()

    public init(model: any ImageToTextModel, processor: any ImageToTextProcessor, config: GenerationConfig) {
        self.model = model
        self.processor = processor
        self.config = config
    }

    /// Loads the model, its processor and its generation settings from a checkpoint directory, refusing a family that
    /// does not serve `task` before reading anything else.
    public convenience init(directory: URL, task: ModelTask = .caption) throws {
        let checkpoint = try ModelDirectory(url: directory)
        _ = try ModelRegistry.family(of: checkpoint, for: task)
        let processor = try ImageToTextProcessors.load(checkpoint)
        var config = try GenerationConfig.load(directory: directory)
        let keys = generationKeys(directory: directory)
        if !keys.contains("max_new_tokens") && !keys.contains("max_length") { config.maxNewTokens = 256 }
        self.init(model: try ModelRegistry.imageToTextModel(checkpoint, for: task), processor: processor, config: config)
    }

    /// The same pipeline reading images with Gemma 3's pan and scan (transformers' `do_pan_and_scan=True`).
    ///
    /// - Throws: `PipelineError.panAndScanNotSupported` for a model whose processor is not Gemma 3's.
    public func withPanAndScan(_ settings: PanAndScan = PanAndScan()) throws -> ImageToTextPipeline {
        guard var gemma = processor as? Gemma3Processor else { throw PipelineError.panAndScanNotSupported }
        gemma.panAndScan = settings
        return ImageToTextPipeline(model: model, processor: gemma, config: config)
    }

    /// One text per image: a caption, or with `prompt`, the prompt's continuation.
    public func callAsFunction(_ images: [RGBImage], prompt: String? = nil, settings: GenerationConfig? = nil,
                               seed: UInt64 = 0) throws -> [ImageToTextResult] {
        guard !images.isEmpty else { throw PipelineError.noInputs }
        let processed = try processor.preprocess(images)
        let prompts = try processor.promptIds(prompt, for: processed)
        if prompts?.contains(where: \.isEmpty) == true { throw PipelineError.emptyPrompt }
        // Prompts of different lengths (LLaVA-NeXT's, whose image tokens follow each image's size) do not batch:
        // each image goes alone, as transformers' pipeline takes them.
        if let prompts, Set(prompts).count > 1 {
            return try images.indices.map { index in
                let embedding = try model.imageEmbeddings(processor.preprocess([images[index]]))
                return try generate(embedding, count: 1, prompts: [prompts[index]], settings: settings, seed: seed)[0]
            }
        }
        return try generate(model.imageEmbeddings(processed), count: images.count, prompts: prompts, settings: settings,
                            seed: seed)
    }

    /// One text for each of the `count` images of `embeddings`, continuing its row of `prompts` (nil: the model starts
    /// on its own).
    private func generate(_ embeddings: Tensor, count: Int, prompts: [[Int]]?, settings: GenerationConfig?,
                          seed: UInt64) throws -> [ImageToTextResult] {
        let settings = try fitted(settings ?? config, promptLength: prompts?.first?.count)
        let output = try model.generate(imageEmbeddings: embeddings, inputIds: prompts, attentionMask: nil, config: settings,
                                        stoppingCriteria: stopCriteria(settings), seed: seed, onStep: nil)
        let stride = settings.numReturnSequences
        return (0..<count).map { result(output.sequences[$0 * stride]) }
    }

    /// What the model conditions on for each image, computed once (a conversation keeps them).
    public func imageEmbeddings(_ images: [RGBImage]) throws -> Tensor {
        try model.imageEmbeddings(processor.preprocess(images))
    }

    /// One image's text for prompt ids already laid out by the processor, streaming each piece of text to `onText`
    /// as it is generated (greedy decoding and sampling).
    func generate(imageEmbedding: Tensor, promptIds: [Int]?, settings: GenerationConfig, seed: UInt64,
                  onText: ((String) throws -> Void)?) throws -> ImageToTextResult {
        let settings = try fitted(settings, promptLength: promptIds?.count)
        var detokenizer = StreamingDetokenizer(tokenizer: processor.tokenizer)
        // The result's text is trimmed; the stream drops the leading whitespace too.
        var started = false
        func emit(_ piece: String) throws {
            let text = started ? piece : String(piece.drop { $0.unicodeScalars.allSatisfy(strippedCharacters.contains) })
            started = started || !text.isEmpty
            if let onText, !text.isEmpty { try onText(text) }
        }
        let output = try model.generate(
            imageEmbeddings: imageEmbedding, inputIds: promptIds.map { [$0] }, attentionMask: nil, config: settings,
            stoppingCriteria: stopCriteria(settings), seed: seed,
            onStep: onText.map { _ in { tokens in if let token = tokens[0] { try emit(detokenizer.append(token)) } } })
        if onText != nil { try emit(detokenizer.finish()) }
        return result(output.sequences.first ?? [])
    }

    /// `settings` with generation ending where the language model's positions run out, as a context window ends;
    /// a prompt that does not fit at all is an error.
    private func fitted(_ settings: GenerationConfig, promptLength: Int?) throws -> GenerationConfig {
        guard let left = model.positionsLeft(promptLength: promptLength) else { return settings }
        guard left > 0 else {
            throw PipelineError.promptTooLong(tokens: promptLength ?? 0, limit: (promptLength ?? 0) + left - 1)
        }
        var settings = settings
        settings.maxNewTokens = min(try settings.newTokenLimit(promptLength: promptLength ?? 0), left)
        return settings
    }

    private func stopCriteria(_ settings: GenerationConfig) -> [any StoppingCriterion] {
        tokenTable.stoppingCriteria(settings, tokenizer: processor.tokenizer, count: model.vocabularySize)
    }

    private func result(_ ids: [Int]) -> ImageToTextResult {
        ImageToTextResult(text: processor.tokenizer.decode(ids, skipSpecialTokens: true)
                            .trimmingCharacters(in: strippedCharacters), ids: ids)
    }
}

/// What a result's text is trimmed of: Python's `str.isspace` characters, Unicode's whitespace and newlines and the
/// ASCII separators U+001C–U+001F, as `.strip()` trims them.
private let strippedCharacters = CharacterSet.whitespacesAndNewlines.union(CharacterSet(charactersIn: "\u{1C}"..."\u{1F}"))
