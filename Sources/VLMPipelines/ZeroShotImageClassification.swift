import Foundation
import VLMImages
import VLMTensor

/// One candidate label and its probability for an image.
public struct LabelScore: Sendable, Codable, Equatable {
    public let label: String
    public let score: Float
}

/// transformers' "zero-shot-image-classification" pipeline: each label is put into the hypothesis template, and the
/// image's logits over those prompts become scores as the model's family has them (CLIP: a softmax over the labels;
/// SigLIP: each label's sigmoid, its prompts padded to 64 tokens).
public struct ZeroShotImageClassificationPipeline: Sendable {
    public static let defaultHypothesisTemplate = "This is a photo of {}."
    public let encoder: DualEncoderPipeline

    /// - Parameter precision: the precision of the model's linear layers; nil for the checkpoint's own.
    public init(directory: URL, precision: MatrixPrecision? = nil) throws {
        encoder = try DualEncoderPipeline(directory: directory, task: .classify, precision: precision)
    }

    public init(encoder: DualEncoderPipeline) {
        self.encoder = encoder
    }

    /// Scores per image, sorted high to low (ties keep the labels' order, as Python's stable sort does).
    ///
    /// - Throws: `PipelineError.noCandidateLabels`, `.noInputs`, and `.textTooLong` for a prompt longer than a model
    ///   with fixed-length texts takes (where transformers would truncate it and score another text).
    public func callAsFunction(_ images: [RGBImage], candidateLabels: [String],
                               hypothesisTemplate: String = defaultHypothesisTemplate) throws -> [[LabelScore]] {
        guard !candidateLabels.isEmpty else { throw PipelineError.noCandidateLabels }
        guard !images.isEmpty else { throw PipelineError.noInputs }
        let prompts = candidateLabels.map { hypothesisTemplate.replacingOccurrences(of: "{}", with: $0) }
        let textFeatures = try encoder.textEmbeddings(prompts, zeroShot: true)
        let imageFeatures = try encoder.imageEmbeddings(images)
        let logits = encoder.model.logitsPerImage(imageFeatures: imageFeatures, textFeatures: textFeatures)
        let probabilities = encoder.model.labelProbabilities(logitsPerImage: logits).scalars
        let labels = candidateLabels.count
        return images.indices.map { image in
            let row = probabilities[(image * labels)..<((image + 1) * labels)]
            return zip(candidateLabels, row).map { LabelScore(label: $0, score: $1) }
                .enumerated()
                .sorted { $0.element.score != $1.element.score ? $0.element.score > $1.element.score : $0.offset < $1.offset }
                .map(\.element)
        }
    }
}
