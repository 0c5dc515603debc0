import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers

/// What the image–text pipelines share: a dual-encoder model with its tokenizer and image processor, all read from
/// one checkpoint directory.
public final class DualEncoderPipeline: Sendable {
    public let model: any ImageTextDualEncoder
    public let tokenizer: Tokenizer
    public let imageProcessor: any ImageProcessor

    /// Loads config.json, the weights, the tokenizer files and the image processor config of `directory`, for
    /// `task` (a checkpoint of a family that does not serve it is refused before anything else is read).
    public init(directory: URL, task: ModelTask = .embed) throws {
        let checkpoint = try ModelDirectory(url: directory)
        model = try ModelRegistry.dualEncoder(checkpoint, for: task)
        tokenizer = try Tokenizer(directory: directory)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType)
    }

    /// Projected image embeddings [images, D], like `get_image_features` on the processor's pixel values.
    public func imageEmbeddings(_ images: [RGBImage]) throws -> Tensor {
        try model.imageFeatures(pixelValues: imageProcessor.preprocess(images).pixelValues)
    }

    /// Projected text embeddings [texts, D], like `get_text_features` on `tokenizer(texts, padding=True, truncation=True)`.
    public func textEmbeddings(_ texts: [String]) throws -> Tensor {
        let encodings = tokenizer.encode(texts, padding: .longest, truncation: true)
        return try model.textFeatures(inputIds: encodings.map(\.ids), attentionMask: encodings.map(\.attentionMask))
    }
}
