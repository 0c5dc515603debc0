import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers

/// A box in an image's pixels, its corners as the pipeline gives them: integers, truncated toward zero (a box may
/// reach past the image's edges, as the model predicted it).
public struct DetectionBox: Sendable, Equatable, Codable {
    public var xmin: Int
    public var ymin: Int
    public var xmax: Int
    public var ymax: Int

    public init(xmin: Int, ymin: Int, xmax: Int, ymax: Int) {
        (self.xmin, self.ymin, self.xmax, self.ymax) = (xmin, ymin, xmax, ymax)
    }
}

/// One object found in an image: the query it answers, how sure the model is, and where it is.
public struct DetectedObject: Sendable, Equatable {
    public let label: String
    /// The sigmoid of the box's logit for the label (for image-guided detection, the box's display alpha as
    /// `post_process_image_guided_detection` gives it).
    public let score: Float
    public let box: DetectionBox

    public init(label: String, score: Float, box: DetectionBox) {
        self.label = label
        self.score = score
        self.box = box
    }
}

/// transformers' `OwlViTProcessor` / `Owlv2Processor`: the CLIP tokenizer padding each query to `max_length` (the
/// text tower's 16 positions), and the checkpoint's image processor.
public struct OwlViTProcessor: Sendable {
    public let tokenizer: Tokenizer
    public let imageProcessor: any ImageProcessor
    /// The most tokens a query may have, the text model's positions.
    public let maxTextLength: Int

    public init(tokenizer: Tokenizer, imageProcessor: any ImageProcessor, maxTextLength: Int) {
        self.tokenizer = tokenizer
        self.imageProcessor = imageProcessor
        self.maxTextLength = maxTextLength
    }

    /// Token ids and attention masks of `texts`, padded to ``maxTextLength`` and not truncated.
    ///
    /// - Throws: ``PipelineError/emptyLabel(position:)`` for a text of only spaces,
    ///   ``PipelineError/labelTooLong(_:tokens:limit:)`` for one with more tokens than the text model takes.
    public func textInputs(_ texts: [String]) throws -> (ids: [[Int]], attentionMask: [[Int]]) {
        if let empty = texts.firstIndex(where: { $0.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty }) {
            throw PipelineError.emptyLabel(position: empty + 1)
        }
        let encodings = try tokenizer.encode(texts, pairs: nil,
                                             options: EncodingOptions(padding: .maxLength, maxLength: maxTextLength))
        for (text, encoding) in zip(texts, encodings) where encoding.attentionMask.reduce(0, +) > maxTextLength {
            throw PipelineError.labelTooLong(text, tokens: encoding.attentionMask.reduce(0, +), limit: maxTextLength)
        }
        return (encodings.map(\.ids), encodings.map(\.attentionMask))
    }

    /// `pixel_values` of `images`, [N, 3, S, S].
    public func pixelValues(_ images: [RGBImage]) throws -> Tensor {
        try imageProcessor.preprocess(images).pixelValues
    }

    /// The width and height relative boxes are scaled by to reach an image's pixels (`_scale_boxes`): its own, or,
    /// for OWLv2, whose processor pads images to squares, its longer side for both (even with `do_pad` off, as
    /// `Owlv2ImageProcessorPil` does).
    public func boxScale(for image: RGBImage) -> (width: Int, height: Int) {
        guard imageProcessor is Owlv2ImageProcessor else { return (image.width, image.height) }
        let side = max(image.width, image.height)
        return (side, side)
    }
}

/// transformers' `zero-shot-object-detection` pipeline (OWL-ViT, OWLv2): boxes in an image for free-text labels,
/// each with the sigmoid of its logit for the label, those above a threshold, best first, in the image's pixels.
///
/// The pipeline runs the model once per label, its text unpadded; here the image is read once and all labels, padded
/// to 16 tokens as `OwlViTProcessor` pads them, are asked of it in one batch. That gives the same numbers: each
/// label's logits depend only on its own text, and the causal text tower's pooled token never sees the padding.
public final class ZeroShotObjectDetectionPipeline: Sendable {
    public let model: any ZeroShotObjectDetectionModel
    public let processor: OwlViTProcessor

    /// Loads config.json, the weights, the tokenizer and the image processor of `directory` (a checkpoint of a
    /// family that does not detect is refused before anything else is read).
    public init(directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        model = try ModelRegistry.zeroShotObjectDetectionModel(checkpoint)
        processor = OwlViTProcessor(
            tokenizer: try Tokenizer(directory: directory),
            imageProcessor: try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType),
            maxTextLength: model.maxTextLength)
    }

    /// The objects of `image` matching `labels` with a score above `threshold`, best first (ties in label order,
    /// then patch order), at most `topK` of them.
    ///
    /// - Throws: ``PipelineError`` for no labels, an empty or too long label, a non-positive `topK`, an image larger
    ///   than ``ImageDecoder/maxPixels``; the model's and processors' errors.
    public func callAsFunction(_ image: RGBImage, labels: [String], threshold: Float = 0.1,
                               topK: Int? = nil) throws -> [DetectedObject] {
        guard !labels.isEmpty else { throw PipelineError.noCandidateLabels }
        if let topK, topK <= 0 { throw PipelineError.invalidTopK(topK) }
        try checkSize(image)
        let text = try processor.textInputs(labels)
        let output = try model.detect(pixelValues: processor.pixelValues([image]), inputIds: text.ids,
                                      attentionMask: text.attentionMask)
        let scale = processor.boxScale(for: image)
        let boxes = Self.pixelBoxes(output.predBoxes.scalars, width: scale.width, height: scale.height)
        let scores = activation(output.logits, .sigmoid).scalars
        let patches = boxes.count
        var found: [DetectedObject] = []
        for (index, label) in labels.enumerated() {
            for patch in 0..<patches {
                let score = scores[patch * labels.count + index]
                // post_process_object_detection keeps scores above the threshold (cast to fp32, as torch compares a
                // float tensor with a Python number); the pipeline then drops any that are exactly zero.
                guard score > threshold, score != 0 else { continue }
                found.append(DetectedObject(label: label, score: score, box: Self.truncated(boxes[patch])))
            }
        }
        let sorted = Self.sortedByScore(found)
        return topK.map { Array(sorted.prefix($0)) } ?? sorted
    }

    /// Image-guided (one-shot) detection: the boxes of `image` like the object `query` shows, as transformers'
    /// `image_guided_detection` and `post_process_image_guided_detection(threshold:nms_threshold:)` find them,
    /// named `label`. Scores are that post-processing's display alphas (the best box 1, boxes at a tenth of its score
    /// or below dropped); boxes overlapping a better one by more than `nmsThreshold` (IoU) are suppressed. Results
    /// are sorted as the text pipeline's, and their boxes truncated to integers the same way.
    public func callAsFunction(_ image: RGBImage, query: RGBImage, label: String, threshold: Float = 0,
                               nmsThreshold: Float = 0.3) throws -> [DetectedObject] {
        try checkSize(image)
        try checkSize(query)
        guard !label.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else { throw PipelineError.emptyLabel(position: 1) }
        let output = try model.imageGuidedDetection(pixelValues: processor.pixelValues([image]),
                                                    queryPixelValues: processor.pixelValues([query]))
        let relative = Self.corners(output.targetPredBoxes.scalars)
        var scores = activation(output.logits, .sigmoid).scalars
        if nmsThreshold < 1 {
            // torch.argsort(-scores) is not stable; ties between distinct boxes' scores do not occur in practice.
            for best in scores.indices.sorted(by: { scores[$0] > scores[$1] }) where scores[best] != 0 {
                for other in scores.indices where other != best
                    && Self.intersectionOverUnion(relative[best], relative[other]) > nmsThreshold {
                    scores[other] = 0
                }
            }
        }
        guard scores.contains(where: { $0 != 0 }) else { return [] }
        scores = scores.map { $0 < threshold ? 0 : $0 }
        let maxScore = scores.max()! + 1e-6
        let scale = processor.boxScale(for: image)
        let boxes = Self.pixelBoxes(output.targetPredBoxes.scalars, width: scale.width, height: scale.height)
        let found = scores.indices.compactMap { patch -> DetectedObject? in
            let alpha = min(max((scores[patch] - maxScore * 0.1) / (maxScore * 0.9), 0), 1)
            return alpha > 0 ? DetectedObject(label: label, score: alpha, box: Self.truncated(boxes[patch])) : nil
        }
        return Self.sortedByScore(found)
    }

    private func checkSize(_ image: RGBImage) throws {
        if image.width * image.height > ImageDecoder.maxPixels {
            throw PipelineError.imageTooLarge(width: image.width, height: image.height, limit: ImageDecoder.maxPixels)
        }
    }

    typealias Corners = (x0: Float, y0: Float, x1: Float, y1: Float)

    /// `center_to_corners_format` of (cx, cy, w, h) boxes, in fp32 as torch computes it.
    static func corners(_ centres: [Float]) -> [Corners] {
        stride(from: 0, to: centres.count, by: 4).map { i in
            let (cx, cy, w, h) = (centres[i], centres[i + 1], centres[i + 2], centres[i + 3])
            return (cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h)
        }
    }

    /// Corners scaled to an image of `width`×`height` pixels (`_scale_boxes`), still fractional.
    static func pixelBoxes(_ centres: [Float], width: Int, height: Int) -> [Corners] {
        let (w, h) = (Float(width), Float(height))
        return corners(centres).map { ($0.x0 * w, $0.y0 * h, $0.x1 * w, $0.y1 * h) }
    }

    /// The pipeline's `box.int()`: each corner truncated toward zero.
    static func truncated(_ box: Corners) -> DetectionBox {
        DetectionBox(xmin: Int(box.x0), ymin: Int(box.y0), xmax: Int(box.x1), ymax: Int(box.y1))
    }

    /// `box_iou` of two corner boxes.
    static func intersectionOverUnion(_ a: Corners, _ b: Corners) -> Float {
        let inter = max(min(a.x1, b.x1) - max(a.x0, b.x0), 0) * max(min(a.y1, b.y1) - max(a.y0, b.y0), 0)
        let union = (a.x1 - a.x0) * (a.y1 - a.y0) + (b.x1 - b.x0) * (b.y1 - b.y0) - inter
        return inter / union
    }

    /// Python's `sorted(…, key=score, reverse=True)`: stable, so equal scores keep their order.
    static func sortedByScore(_ objects: [DetectedObject]) -> [DetectedObject] {
        objects.enumerated().sorted { $0.element.score > $1.element.score
            || ($0.element.score == $1.element.score && $0.offset < $1.offset) }.map(\.element)
    }
}
