import VLMCheckpoint
import VLMTensor

/// A model with an image tower and a text tower embedding into one space (CLIP; later SigLIP and friends).
public protocol ImageTextDualEncoder: AnyObject, Sendable {
    /// Projected image embeddings [B, embeddingSize] for pixel values [B, C, S, S].
    func imageFeatures(pixelValues: Tensor) throws -> Tensor
    /// Projected text embeddings [B, embeddingSize] for padded token ids and their attention mask.
    func textFeatures(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor
    /// Image–text logits [images, texts], as the model's forward returns them in `logits_per_image`.
    func logitsPerImage(imageFeatures: Tensor, textFeatures: Tensor) -> Tensor
    var imageSize: Int { get }
    var embeddingSize: Int { get }
}

/// Builds models from a checkpoint directory by config.json's `model_type`.
public enum ModelRegistry {
    static let dualEncoders: [String: @Sendable (ModelDirectory) throws -> any ImageTextDualEncoder] = [
        "clip": { try CLIPModel(directory: $0) },
    ]

    public static var supportedTypes: [String] { dualEncoders.keys.sorted() }

    /// The image–text dual encoder in `directory`; an unknown `model_type` is an error naming config.json.
    public static func dualEncoder(_ directory: ModelDirectory) throws -> any ImageTextDualEncoder {
        let type = try directory.modelType
        guard let build = dualEncoders[type] else {
            throw ModelError.unsupportedModelType(type, supported: supportedTypes, file: directory.url.appendingPathComponent("config.json").path)
        }
        return try build(directory)
    }
}
