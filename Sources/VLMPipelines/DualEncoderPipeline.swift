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
    public let imageProcessor: CLIPImageProcessor

    /// Loads config.json, the weights, the tokenizer files and preprocessor_config.json of `directory`.
    public init(directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        model = try ModelRegistry.dualEncoder(checkpoint)
        tokenizer = try Tokenizer(directory: directory)
        guard let processorFile = checkpoint.fileURL("preprocessor_config.json") else {
            throw PipelineError.missingFile("preprocessor_config.json", directory: directory.path)
        }
        imageProcessor = try CLIPImageProcessor(contentsOf: processorFile)
    }

    /// Projected image embeddings [images, D], like `get_image_features` on the processor's pixel values.
    public func imageEmbeddings(_ images: [RGBImage]) throws -> Tensor {
        try model.imageFeatures(pixelValues: imageProcessor(images))
    }

    /// Projected text embeddings [texts, D], like `get_text_features` on `tokenizer(texts, padding=True, truncation=True)`.
    public func textEmbeddings(_ texts: [String]) throws -> Tensor {
        let encodings = tokenizer.encode(texts, padding: .longest, truncation: true)
        return try model.textFeatures(inputIds: encodings.map(\.ids), attentionMask: encodings.map(\.attentionMask))
    }
}
