import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers

/// What to segment: a text label, or an example image of the thing (a visual prompt) named by a label.
public enum SegmentationPrompt: Sendable {
    case text(String)
    case image(RGBImage, label: String)

    /// The text, or the name given with the image.
    public var label: String {
        switch self {
        case .text(let text): text
        case .image(_, let label): label
        }
    }
}

/// One prompt's segmentation of an image.
public struct SegmentationMask: Sendable {
    /// The prompt's label.
    public let label: String
    /// The model's raw logits, [h, w] at its own output resolution (352×352 for the CIDAS CLIPSeg checkpoints; the
    /// pixel values' 224×224 for GroupViT's).
    public let logits: Tensor
    /// The probabilities resized to the image, [height, width]: `sigmoid(logits)` (CLIPSeg) or the softmax over the
    /// prompts of every prompt's logits (GroupViT), resized bilinearly, as
    /// `F.interpolate(probabilities, size=(height, width), mode="bilinear", align_corners=False)`, onto the part of
    /// the image the processor showed the model (all of it, or the centre crop's share; 0 outside it).
    public let probabilities: Tensor
    /// The fraction of the image's pixels whose probability exceeds 0.5.
    public let coverage: Double

    /// The probabilities as 8-bit grey levels, row by row (`round(p · 255)`): the mask as a picture.
    public var grayscale: [UInt8] {
        probabilities.withUnsafeBufferPointer { values in values.map { UInt8((min(max($0, 0), 1) * 255).rounded()) } }
    }
}

/// transformers' `CLIPSegProcessor` (the checkpoint's image processor, `ViTImageProcessor` for CLIPSeg, and its
/// tokenizer), as `CLIPSegProcessor(text=labels, images=…, padding="max_length")` calls them; with `.longest` padding,
/// GroupViT's `CLIPProcessor(text=labels, images=image, padding=True)`.
public struct CLIPSegProcessor: Sendable {
    public let tokenizer: Tokenizer
    public let imageProcessor: any ImageProcessor
    /// The most tokens a text may have, the text model's positions.
    public let maxTextLength: Int
    /// How the texts of one call are padded.
    public let padding: Padding

    public init(tokenizer: Tokenizer, imageProcessor: any ImageProcessor, maxTextLength: Int, padding: Padding = .maxLength) {
        self.tokenizer = tokenizer
        self.imageProcessor = imageProcessor
        self.maxTextLength = maxTextLength
        self.padding = padding
    }

    /// Token ids and attention masks of `texts`, padded (to the tokenizer's `model_max_length`, or to the longest
    /// text) and not truncated.
    ///
    /// - Throws: ``PipelineError/emptyLabel(position:)`` for a text of only spaces, ``PipelineError/labelTooLong(_:tokens:limit:)``
    ///   for one with more tokens than the text model takes.
    public func textInputs(_ texts: [String]) throws -> (ids: [[Int]], attentionMask: [[Int]]) {
        if let empty = texts.firstIndex(where: { $0.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty }) {
            throw PipelineError.emptyLabel(position: empty + 1)
        }
        let encodings = tokenizer.encode(texts, padding: padding)
        for (text, encoding) in zip(texts, encodings) where encoding.attentionMask.reduce(0, +) > maxTextLength {
            throw PipelineError.labelTooLong(text, tokens: encoding.attentionMask.reduce(0, +), limit: maxTextLength)
        }
        return (encodings.map(\.ids), encodings.map(\.attentionMask))
    }

    /// `pixel_values` of `images`, [N, 3, H, W].
    public func pixelValues(_ images: [RGBImage]) throws -> Tensor {
        try imageProcessor.preprocess(images).pixelValues
    }

    /// The rectangle of an image of `height`×`width` that its pixel values show (the centre crop's share of it, for
    /// the standard processor that crops), in its own pixels.
    public func shownRegion(height: Int, width: Int) -> (top: Int, left: Int, height: Int, width: Int) {
        (imageProcessor as? StandardImageProcessor)?.shownRegion(height: height, width: width) ?? (0, 0, height, width)
    }
}

/// Zero-shot (text prompts) and one-shot (example images) segmentation with CLIPSeg, and zero-shot segmentation with
/// GroupViT: one probability map per prompt, at the image's size.
///
/// CLIPSeg, as transformers' CLIPSeg usage computes it: `CLIPSegProcessor(text=labels, images=[image] * len(labels),
/// padding="max_length")`, the model, `torch.sigmoid(outputs.logits)`. GroupViT: `CLIPProcessor(text=labels,
/// images=image, padding=True)` (labels as given, as in transformers' GroupViT docs), `GroupViTModel(…,
/// output_segmentation=True).segmentation_logits`, and the softmax over the labels (a GroupViT user gives each pixel
/// its argmax label; with one label, it has every pixel). Each map is then resized bilinearly
/// (`F.interpolate(…, mode="bilinear")`, what a user overlaying it on the photo expects) onto the part of the photo
/// the model saw: all of it for CLIPSeg's processor, the centre crop's square for GroupViT's (0 outside it). The image
/// is read by the vision tower once for all prompts.
public final class ZeroShotImageSegmentationPipeline: Sendable {
    public let model: any ZeroShotSegmentationModel
    public let processor: CLIPSegProcessor

    /// Loads config.json, the weights, the tokenizer and the image processor of `directory` (a checkpoint of a
    /// family that does not segment is refused before anything else is read).
    public init(directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        model = try ModelRegistry.zeroShotSegmentationModel(checkpoint)
        processor = CLIPSegProcessor(
            tokenizer: try Tokenizer(directory: directory),
            imageProcessor: try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType),
            maxTextLength: model.maxTextLength,
            padding: model.textPadding == .longest ? .longest : .maxLength)
    }

    /// One mask per label, in order.
    public func callAsFunction(_ image: RGBImage, labels: [String]) throws -> [SegmentationMask] {
        try callAsFunction(image, prompts: labels.map { .text($0) })
    }

    /// One mask per prompt, in order; text and image prompts may be mixed.
    ///
    /// - Throws: ``PipelineError`` for no prompts, an empty or too long label, an image larger than
    ///   ``ImageDecoder/maxPixels``; the model's and processors' errors.
    public func callAsFunction(_ image: RGBImage, prompts: [SegmentationPrompt]) throws -> [SegmentationMask] {
        guard !prompts.isEmpty else { throw PipelineError.noCandidateLabels }
        for candidate in [image] + prompts.compactMap({ if case .image(let example, _) = $0 { example } else { nil } })
        where candidate.width * candidate.height > ImageDecoder.maxPixels {
            throw PipelineError.imageTooLarge(width: candidate.width, height: candidate.height, limit: ImageDecoder.maxPixels)
        }
        let embeddings = try conditionalEmbeddings(prompts)
        let logits = try model.segmentationLogits(pixelValues: processor.pixelValues([image]), conditionalEmbeddings: embeddings)
        let (rows, columns) = (logits.shape[1], logits.shape[2])
        let region = processor.shownRegion(height: image.height, width: image.width)
        let maps = pasted(interpolate(probabilities(logits), height: region.height, width: region.width, mode: .bilinear),
                          height: image.height, width: image.width, top: region.top, left: region.left)
        let plane = image.height * image.width
        let (allLogits, allMaps) = (logits.scalars, maps.scalars)
        return prompts.enumerated().map { index, prompt in
            let probabilities = Array(allMaps[(index * plane)..<((index + 1) * plane)])
            return SegmentationMask(
                label: prompt.label,
                logits: Tensor(shape: [rows, columns],
                               scalars: Array(allLogits[(index * rows * columns)..<((index + 1) * rows * columns)])),
                probabilities: Tensor(shape: [image.height, image.width], scalars: probabilities),
                coverage: Double(probabilities.reduce(0) { $0 + ($1 > 0.5 ? 1 : 0) }) / Double(plane))
        }
    }

    /// Per-pixel probabilities [prompts, h, w] of logits [prompts, h, w], as the model's users compute them.
    private func probabilities(_ logits: Tensor) -> Tensor {
        switch model.probabilities {
        case .sigmoid:
            return activation(logits, .sigmoid)
        case .softmaxOverPrompts:
            // Prompts last for the softmax, then back: [1, prompts, h·w] ⇄ [1, h·w, prompts].
            let shape = logits.shape
            return channelsFirst(softmax(channelsFirst(logits.reshaped([1, shape[0], -1])))).reshaped(shape)
        }
    }

    /// The prompts' conditional embeddings, [prompts, D], in order: texts in one batch, images in another.
    private func conditionalEmbeddings(_ prompts: [SegmentationPrompt]) throws -> Tensor {
        var texts: [(index: Int, text: String)] = [], images: [(index: Int, image: RGBImage)] = []
        for (index, prompt) in prompts.enumerated() {
            switch prompt {
            case .text(let text): texts.append((index, text))
            case .image(let image, let label):
                guard !label.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else {
                    throw PipelineError.emptyLabel(position: index + 1)
                }
                images.append((index, image))
            }
        }
        var rows = [Tensor?](repeating: nil, count: prompts.count)
        if !texts.isEmpty {
            let inputs = try processor.textInputs(texts.map(\.text))
            let embedded = try model.conditionalEmbeddings(inputIds: inputs.ids, attentionMask: inputs.attentionMask)
            for (row, entry) in texts.enumerated() { rows[entry.index] = self.row(row, of: embedded) }
        }
        if !images.isEmpty {
            let embedded = try model.conditionalEmbeddings(pixelValues: processor.pixelValues(images.map(\.image)))
            for (row, entry) in images.enumerated() { rows[entry.index] = self.row(row, of: embedded) }
        }
        return concatenate(rows.map { $0! }, axis: 0)
    }

    /// Row `index` of `matrix [N, D]`, as [1, D].
    private func row(_ index: Int, of matrix: Tensor) -> Tensor {
        sequenceSlice(matrix.reshaped([1] + matrix.shape), index..<(index + 1)).reshaped([1, -1])
    }
}
