import VLMTensor

/// A model that scores how well texts describe images, both ways BLIP was trained to: image–text matching (ITM, a
/// classifier over the text encoded against the image) and image–text contrastive similarity (ITC, cosine of
/// projected embeddings).
public protocol ImageTextMatchingModel: AnyObject, Sendable {
    /// The side of the square images the vision tower takes.
    var imageSize: Int { get }
    /// The vision tower's output for `pixelValues` `[N, 3, H, W]`, which both scores read.
    func imageEmbeddings(pixelValues: Tensor) throws -> Tensor
    /// The probability that text `b` (`inputIds [B][T]`, right-padded) describes image `b` of `imageEmbeds`, or the
    /// one image when `imageEmbeds` holds one.
    func matchProbabilities(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> [Float]
    /// The cosine similarity of every image with every text, `[images, texts]`.
    func cosineSimilarities(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor
}
