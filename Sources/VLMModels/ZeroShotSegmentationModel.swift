import VLMTensor

/// A model that segments an image by prompts, one map of per-pixel logits per prompt, where a prompt is a text or
/// an example image, each turned into a conditional embedding first (CLIPSeg; GroupViT, by texts only).
public protocol ZeroShotSegmentationModel: AnyObject, Sendable {
    /// The embeddings text prompts condition the masks on, [texts, D], from padded token ids and their mask.
    func conditionalEmbeddings(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor
    /// The embeddings example images condition the masks on, [images, D], from their pixel values; a model without
    /// image prompts throws.
    func conditionalEmbeddings(pixelValues: Tensor) throws -> Tensor
    /// Per-pixel logits [B, H', W'] of query images `pixelValues` [B, C, H, W] under `conditionalEmbeddings` [B, D],
    /// item by item; a single query image ([1, C, H, W]) is read once and segmented under each of the B embeddings.
    func segmentationLogits(pixelValues: Tensor, conditionalEmbeddings: Tensor) throws -> Tensor
    /// The most tokens a text prompt may have (the text tower's positions).
    var maxTextLength: Int { get }
    /// How a pixel's logits become probabilities.
    var probabilities: SegmentationProbabilities { get }
    /// How the text prompts of one call are padded, as the model's processor is called.
    var textPadding: SegmentationTextPadding { get }
}

/// How a segmentation model's per-pixel logits become probabilities.
public enum SegmentationProbabilities: Sendable {
    /// Each prompt on its own: `sigmoid(logits)` (CLIPSeg), so a pixel may belong to several prompts or none.
    case sigmoid
    /// The prompts compete for each pixel: the softmax over the prompts (GroupViT, whose users give each pixel its
    /// argmax prompt).
    case softmaxOverPrompts
}

/// How the text prompts of one call are padded for the text tower.
public enum SegmentationTextPadding: Sendable {
    /// To the tokenizer's `model_max_length` (`padding="max_length"`, CLIPSeg's usage).
    case maxLength
    /// To the longest prompt (`padding=True`, GroupViT's docs).
    case longest
}
