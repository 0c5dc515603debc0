import VLMTensor

/// What an open-vocabulary detector predicts for each image patch: a box, and a logit per query.
public struct ObjectDetectionOutput: Sendable {
    /// `logits` [B, patches, queries]: how well each patch's box matches each query.
    public let logits: Tensor
    /// `pred_boxes` [B, patches, 4]: (centre x, centre y, width, height), relative to the processed image's sides.
    public let predBoxes: Tensor
    /// `objectness_logits` [B, patches] of the models that have an objectness head (OWLv2); nil otherwise.
    public let objectnessLogits: Tensor?

    public init(logits: Tensor, predBoxes: Tensor, objectnessLogits: Tensor?) {
        self.logits = logits
        self.predBoxes = predBoxes
        self.objectnessLogits = objectnessLogits
    }
}

/// What image-guided detection predicts: the target images' boxes and their logits under each query image's
/// chosen patch embedding, and the boxes the query images were searched with.
public struct ImageGuidedDetectionOutput: Sendable {
    /// `logits` [B, patches, 1]: each target patch against its query image's embedding.
    public let logits: Tensor
    /// `target_pred_boxes` [B, patches, 4], (centre x, centre y, width, height), relative.
    public let targetPredBoxes: Tensor
    /// `query_pred_boxes` [B, patches, 4] of the query images.
    public let queryPredBoxes: Tensor
}

/// A model that finds boxes for free-text queries (OWL-ViT, OWLv2), as transformers' zero-shot object detection
/// models do, and boxes like an example image (image-guided detection).
public protocol ZeroShotObjectDetectionModel: AnyObject, Sendable {
    /// Logits and boxes of images `pixelValues` [B, C, S, S] under text queries (padded token ids and their mask),
    /// every query asked of every image.
    func detect(pixelValues: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> ObjectDetectionOutput
    /// transformers' `image_guided_detection`: target images `pixelValues` [B, C, S, S] searched for what query image
    /// `b` of `queryPixelValues` [B, C, S, S] shows.
    func imageGuidedDetection(pixelValues: Tensor, queryPixelValues: Tensor) throws -> ImageGuidedDetectionOutput
    /// The most tokens a text query may have (the text tower's positions).
    var maxTextLength: Int { get }
}
