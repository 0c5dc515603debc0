import VLMTensor

/// A model that segments an image by prompts, one map of per-pixel logits per prompt, where a prompt is a text or
/// an example image, each turned into a conditional embedding first (CLIPSeg).
public protocol ZeroShotSegmentationModel: AnyObject, Sendable {
    /// The embeddings text prompts condition the masks on, [texts, D], from padded token ids and their mask.
    func conditionalEmbeddings(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor
    /// The embeddings example images condition the masks on, [images, D], from their pixel values.
    func conditionalEmbeddings(pixelValues: Tensor) throws -> Tensor
    /// Per-pixel logits [B, H', W'] of query images `pixelValues` [B, C, H, W] under `conditionalEmbeddings` [B, D],
    /// item by item; a single query image ([1, C, H, W]) is read once and segmented under each of the B embeddings.
    func segmentationLogits(pixelValues: Tensor, conditionalEmbeddings: Tensor) throws -> Tensor
    /// The most tokens a text prompt may have (the text tower's positions).
    var maxTextLength: Int { get }
}
