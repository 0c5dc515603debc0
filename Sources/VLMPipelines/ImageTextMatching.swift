import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers

/// How well one text describes one image, as BLIP's retrieval model scores it.
public struct ImageTextMatch: Sendable, Equatable {
    public var text: String
    /// Image–text matching: the probability that the text describes the image (`softmax(itm_score)[:, 1]`).
    public var itm: Float
    /// Image–text contrastive: the cosine similarity of the projected image and text embeddings.
    public var itc: Float
}

/// Image–text retrieval as BLIP's `BlipForImageTextRetrieval` scores it, for every image and every text: the
/// processor's pixels and `[CLS] … [SEP]` texts (padded), both scores from one vision pass per image.
public final class ImageTextMatchingPipeline: Sendable {
    public let model: any ImageTextMatchingModel
    public let tokenizer: Tokenizer
    public let imageProcessor: any ImageProcessor

    public init(model: any ImageTextMatchingModel, tokenizer: Tokenizer, imageProcessor: any ImageProcessor) {
        self.model = model
        self.tokenizer = tokenizer
        self.imageProcessor = imageProcessor
    }

    /// Loads the model, the tokenizer and the image processor of a checkpoint directory, refusing a family that
    /// does not match images and texts before reading anything else.
    public convenience init(directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        _ = try ModelRegistry.family(of: checkpoint, for: .match)
        let imageProcessor = try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType)
        self.init(model: try ModelRegistry.imageTextMatchingModel(checkpoint), tokenizer: try Tokenizer(directory: directory),
                  imageProcessor: imageProcessor)
    }

    /// For each image, every text's scores in the order given.
    public func callAsFunction(_ images: [RGBImage], texts: [String]) throws -> [[ImageTextMatch]] {
        guard !images.isEmpty, !texts.isEmpty else { throw PipelineError.noInputs }
        let embeds = try model.imageEmbeddings(pixelValues: imageProcessor.preprocess(images).pixelValues)
        let encodings = tokenizer.encode(texts, padding: .longest)
        let (ids, mask) = (encodings.map(\.ids), encodings.map(\.attentionMask))
        let similarities = try model.cosineSimilarities(imageEmbeds: embeds, inputIds: ids, attentionMask: mask).scalars
        // Every text against every image in one pass: the texts once per image, image by image, which the model
        // reads as consecutive rows per image.
        let probabilities = try model.matchProbabilities(
            imageEmbeds: embeds, inputIds: Array(repeating: ids, count: images.count).flatMap { $0 },
            attentionMask: Array(repeating: mask, count: images.count).flatMap { $0 })
        return images.indices.map { image in
            texts.indices.map {
                let pair = image * texts.count + $0
                return ImageTextMatch(text: texts[$0], itm: probabilities[pair], itc: similarities[pair])
            }
        }
    }
}
