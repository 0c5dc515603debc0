import VLMTensor

/// A model that answers a question about an image by scoring a fixed vocabulary of answers (ViLT), rather than by
/// generating text.
public protocol VisualQuestionClassifier: AnyObject, Sendable {
    /// The answers, by logit index.
    var labels: [String] { get }
    /// The most question tokens the model reads.
    var maxTextLength: Int { get }
    /// The answers' logits `[B, labels]` for questions `inputIds` (`[B][T]`) about images `pixelValues`
    /// `[B, 3, H, W]` whose valid pixels `pixelMask` `[B, H, W]` marks (nil: all valid).
    func logits(pixelValues: Tensor, pixelMask: Tensor?, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor
}
