import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers

/// One answer of ``VisualQuestionAnsweringPipeline``.
public struct VisualAnswer: Sendable, Equatable {
    public var answer: String
    /// A generating model's answer tokens (ending with the eos token that stopped it, if one did).
    public var ids: [Int]?
    /// A classifying model's probability for this answer (the sigmoid of its logit).
    public var score: Float?
}

/// transformers' "visual-question-answering" pipeline (removed in 5.23 in favour of "image-text-to-text"; its
/// behaviour kept here): families that answer by generating put the question in the form they were trained with
/// (BLIP-2: "Question: … Answer:") and give one answer per image; families that classify (ViLT) give their `topK`
/// best answers with sigmoid scores.
public struct VisualQuestionAnsweringPipeline: Sendable {
    enum Answerer: Sendable {
        case generator(ImageToTextPipeline)
        case classifier(any VisualQuestionClassifier, any ImageProcessor, Tokenizer)
    }
    let answerer: Answerer

    /// Loads the model and its processor from a checkpoint directory, by the family config.json names.
    public init(directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        if case .visualQuestionClassifier(let build) = try ModelRegistry.family(of: checkpoint, for: .ask).builder {
            answerer = .classifier(try build(checkpoint),
                                   try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType),
                                   try Tokenizer(directory: directory))
        } else {
            answerer = .generator(try ImageToTextPipeline(directory: directory, task: .ask))
        }
    }

    public init(generator: ImageToTextPipeline) {
        answerer = .generator(generator)
    }

    /// The same pipeline reading images with Gemma 3's pan and scan (``ImageToTextPipeline/withPanAndScan(_:)``).
    ///
    /// - Throws: `PipelineError.panAndScanNotSupported` for any other family.
    public func withPanAndScan(_ settings: PanAndScan = PanAndScan()) throws -> VisualQuestionAnsweringPipeline {
        guard case .generator(let pipeline) = answerer else { throw PipelineError.panAndScanNotSupported }
        return VisualQuestionAnsweringPipeline(generator: try pipeline.withPanAndScan(settings))
    }

    /// The generation settings a call without any uses; nil for a classifying model.
    public var generationConfig: GenerationConfig? {
        if case .generator(let pipeline) = answerer { return pipeline.config }
        return nil
    }

    /// The answers to `question` for each image: one generated answer, or the `topK` best-scored ones (best first;
    /// ties keep the labels' order).
    public func callAsFunction(_ images: [RGBImage], question: String, settings: GenerationConfig? = nil,
                               seed: UInt64 = 0, topK: Int = 5) throws -> [[VisualAnswer]] {
        guard !images.isEmpty else { throw PipelineError.noInputs }
        switch answerer {
        case .generator(let generator):
            return try generator(images, prompt: generator.processor.questionPrompt(question), settings: settings, seed: seed)
                .map { [VisualAnswer(answer: $0.text, ids: $0.ids)] }
        case .classifier(let model, let imageProcessor, let tokenizer):
            guard topK > 0 else { throw PipelineError.invalidTopK(topK) }
            let ids = tokenizer.encode(question).ids
            guard ids.count <= model.maxTextLength else {
                throw PipelineError.promptTooLong(tokens: ids.count, limit: model.maxTextLength)
            }
            // Each image on its own, as the pipeline runs them: no image is padded to another's size.
            return try images.map { image in
                let processed = try imageProcessor.preprocess([image])
                let logits = try model.logits(pixelValues: processed.pixelValues, pixelMask: processed.pixelMask,
                                              inputIds: [ids], attentionMask: nil)
                let scores = activation(logits, .sigmoid).scalars
                return scores.indices
                    .sorted { scores[$0] != scores[$1] ? scores[$0] > scores[$1] : $0 < $1 }
                    .prefix(topK)
                    .map { VisualAnswer(answer: model.labels[$0], score: scores[$0]) }
            }
        }
    }
}
