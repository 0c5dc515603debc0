import Foundation
import VLMImages
import VLMModels
import VLMTensor

/// A conversation about one image with an image-to-text model that has no chat template (BLIP-2): each question is
/// asked after the earlier questions and answers, as BLIP-2's chat-style prompting does —
/// `"Question: q1 Answer: a1. Question: q2 Answer:"` — and the oldest turns are dropped when the prompt would pass
/// ``maximumPromptTokens``. The image's features are computed once, when the session starts.
public final class VisualChatSession {
    public let pipeline: ImageToTextPipeline
    /// Prompt tokens (image tokens included) the model is given at most.
    public let maximumPromptTokens: Int
    /// The questions and answers so far, oldest first.
    public private(set) var turns: [(question: String, answer: String)] = []
    private let imageEmbedding: Tensor

    public init(pipeline: ImageToTextPipeline, image: RGBImage, maximumPromptTokens: Int = 512) throws {
        self.pipeline = pipeline
        self.maximumPromptTokens = maximumPromptTokens
        imageEmbedding = try pipeline.imageEmbeddings([image])
    }

    /// Answers `question` in the light of the earlier turns, streaming the answer's text to `onText`, and keeps the
    /// turn.
    ///
    /// - Throws: `PipelineError.promptTooLong` when the question alone does not fit in ``maximumPromptTokens``.
    public func ask(_ question: String, settings: GenerationConfig? = nil, seed: UInt64 = 0,
                    onText: ((String) throws -> Void)? = nil) throws -> ImageToTextResult {
        let processor = pipeline.processor
        var kept = turns[...]
        var ids = try processor.promptIds(Self.prompt(kept, question, processor)) ?? []
        while ids.count > maximumPromptTokens, !kept.isEmpty {
            kept = kept.dropFirst()
            ids = try processor.promptIds(Self.prompt(kept, question, processor)) ?? []
        }
        guard ids.count <= maximumPromptTokens else {
            throw PipelineError.promptTooLong(tokens: ids.count, limit: maximumPromptTokens)
        }
        let result = try pipeline.generate(imageEmbedding: imageEmbedding, promptIds: ids, settings: settings ?? pipeline.config,
                                           seed: seed, onText: onText)
        turns.append((question, result.text))
        return result
    }

    /// The BLIP-2 model card's template: "Question: {} Answer: {}." per earlier turn, joined by spaces, then the
    /// question in the family's form.
    static func prompt(_ turns: ArraySlice<(question: String, answer: String)>, _ question: String,
                       _ processor: any ImageToTextProcessor) -> String {
        (turns.map { "Question: \($0.question) Answer: \($0.answer)." } + [processor.questionPrompt(question)])
            .joined(separator: " ")
    }
}
