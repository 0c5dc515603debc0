import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers

/// How well one text describes one image, as a dual encoder scores the pair.
public struct ImageTextSimilarity: Sendable, Equatable {
    public var text: String
    /// transformers' `logits_per_image`: the cosine similarity scaled by exp(`logit_scale`) (SigLIP's, SigLIP 2's:
    /// plus `logit_bias`; their `sigmoid` is the probability that the text describes the image).
    public var logit: Float
    /// The cosine similarity of the projected image and text embeddings.
    public var cosine: Float
}

/// What the image–text pipelines share: a dual-encoder model with its tokenizer and image processor, all read from
/// one checkpoint directory.
public final class DualEncoderPipeline: Sendable {
    public let model: any ImageTextDualEncoder
    public let tokenizer: Tokenizer
    public let imageProcessor: any ImageProcessor

    /// The precision the model's matrix products run in.
    public let precision: MatrixPrecision

    /// Loads config.json, the weights, the tokenizer files and the image processor config of `directory`, for
    /// `task` (a checkpoint of a family that does not serve it is refused before anything else is read).
    ///
    /// - Parameter precision: the precision of the model's linear layers; nil for the checkpoint's own
    ///   (``WeightStore/defaultMatrixPrecision``). A CPU without bf16 instructions runs bf16 layers in fp32.
    public init(directory: URL, task: ModelTask = .embed, precision: MatrixPrecision? = nil) throws {
        let checkpoint = try ModelDirectory(url: directory)
        // A checkpoint of a family that does not serve `task` is refused before its weights are opened.
        _ = try ModelRegistry.family(of: checkpoint, for: task)
        let requested = try precision ?? WeightStore(directory: directory).defaultMatrixPrecision
        model = try MatrixPrecision.$forNewLayers.withValue(requested) {
            try ModelRegistry.dualEncoder(checkpoint, for: task)
        }
        self.precision = requested.available
        tokenizer = try Tokenizer(directory: directory)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType)
    }

    /// Projected image embeddings [images, D], like `get_image_features` on the processor's pixel values.
    public func imageEmbeddings(_ images: [RGBImage]) throws -> Tensor {
        try model.imageFeatures(imageProcessor.preprocess(images))
    }

    /// Projected text embeddings [texts, D], like `get_text_features` on the processor's output, padded as the model
    /// wants (``DualEncoderTextPadding``): CLIP's `tokenizer(texts, padding=True, truncation=True)`, SigLIP's
    /// `tokenizer(texts, padding="max_length")`, SigLIP 2's with `max_length=64` as its processor passes; the
    /// attention mask goes with the ids unless the tokenizer's `model_input_names` leave it out.
    ///
    /// - Throws: `PipelineError.textTooLong` for a text longer than the length every text is padded to.
    public func textEmbeddings(_ texts: [String]) throws -> Tensor {
        try textEmbeddings(texts, zeroShot: false)
    }

    /// The projected embedding [1, D] of one text given as token ids (special tokens included, as the tokenizer
    /// gives them), for models whose texts are padded to the longest of a batch (CLIP), where one text needs no
    /// padding at all.
    ///
    /// - Throws: `PipelineError.tokenIdsNotAccepted` for models that pad every text to a fixed length (SigLIP),
    ///   `PipelineError.textTooLong` past the tokenizer's `model_max_length`.
    public func textEmbeddings(tokenIds ids: [Int]) throws -> Tensor {
        guard model.textPadding == .longest else { throw PipelineError.tokenIdsNotAccepted }
        if let limit = tokenizer.modelMaxLength, ids.count > limit {
            throw PipelineError.textTooLong("<\(ids.count) token ids>", tokens: ids.count, limit: limit)
        }
        return try model.textFeatures(inputIds: [ids], attentionMask: [Array(repeating: 1, count: ids.count)])
    }

    /// How well each text describes each image, as the model's forward pass scores every pair (transformers'
    /// `model(**processor(text=texts, images=images, padding=…))`), the texts padded as ``textEmbeddings(_:)`` pads
    /// them: for image–text retrieval, rank the images by a text's logits or the texts by an image's.
    ///
    /// - Returns: for each image, every text's scores in the order given.
    /// - Throws: `PipelineError.noInputs` without images or texts, `textTooLong` as ``textEmbeddings(_:)``.
    public func similarities(_ images: [RGBImage], texts: [String]) throws -> [[ImageTextSimilarity]] {
        guard !images.isEmpty, !texts.isEmpty else { throw PipelineError.noInputs }
        let imageFeatures = try imageEmbeddings(images), textFeatures = try textEmbeddings(texts)
        let logits = model.logitsPerImage(imageFeatures: imageFeatures, textFeatures: textFeatures).scalars
        let cosines = matmul(l2Normalized(imageFeatures), l2Normalized(textFeatures), transposeB: true).scalars
        return images.indices.map { image in
            texts.indices.map {
                let pair = image * texts.count + $0
                return ImageTextSimilarity(text: texts[$0], logit: logits[pair], cosine: cosines[pair])
            }
        }
    }

    /// The text embeddings of the zero-shot pipeline's prompts when `zeroShot`, which it tokenizes with a length of
    /// its own for models that pad to one (SigLIP: `max_length=64`, whatever model_max_length says).
    func textEmbeddings(_ texts: [String], zeroShot: Bool) throws -> Tensor {
        let inputs = try DualEncoderTextInputs(tokenizer: tokenizer, padding: model.textPadding)(texts, zeroShot: zeroShot)
        return try model.textFeatures(inputIds: inputs.ids, attentionMask: inputs.attentionMask)
    }
}

/// Texts as a dual encoder's processor hands them to its text tower: tokenized, padded as the model wants
/// (``DualEncoderTextPadding``), with the attention mask unless the tokenizer's `model_input_names` leave it out.
struct DualEncoderTextInputs {
    let tokenizer: Tokenizer
    let padding: DualEncoderTextPadding

    /// - Parameter zeroShot: the zero-shot pipeline's prompts, which it tokenizes with a length of its own for
    ///   models that pad to one (SigLIP: `max_length=64`, whatever model_max_length says).
    /// - Throws: `PipelineError.textTooLong` for a text longer than the length every text is padded to.
    func callAsFunction(_ texts: [String], zeroShot: Bool) throws -> (ids: [[Int]], attentionMask: [[Int]]?) {
        // The length every text is padded to, nil for CLIP's padding to the longest.
        let fixedLength: Int? = switch padding {
        case .longest: nil
        case .maxLength(let zeroShotLength): zeroShot ? zeroShotLength : tokenizer.modelMaxLength ?? zeroShotLength
        case .fixed(let length): length
        }
        let encodings: [Encoding]
        if let length = fixedLength {
            encodings = tokenizer.encode(texts, padding: .maxLength, maxLength: length)
            if let (text, encoding) = zip(texts, encodings).first(where: { $0.1.ids.count > length }) {
                throw PipelineError.textTooLong(text, tokens: encoding.ids.count, limit: length)
            }
        } else {
            encodings = tokenizer.encode(texts, padding: .longest, truncation: true)
        }
        // A tokenizer whose model_input_names leave out the attention mask (SigLIP's checkpoints) hands the model none.
        let passesMask = tokenizer.modelInputNames?.contains("attention_mask") ?? true
        return (encodings.map(\.ids), passesMask ? encodings.map(\.attentionMask) : nil)
    }
}
