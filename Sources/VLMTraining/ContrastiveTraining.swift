import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

/// Contrastive training of a CLIP, SigLIP or SigLIP 2 checkpoint on batches of image–text pairs by the model's own
/// loss (CLIP's softmax loss, SigLIP's sigmoid loss with its learned bias): what a transformers user gets from
/// `model(..., return_loss=True)` trained by `Trainer`, with some of the model's modules frozen (`requires_grad_(False)`).
///
/// Nothing frozen is transformers' run_clip.py example (both towers, their projections and the temperature learn);
/// its `--freeze_vision_model` and `--freeze_text_model` freeze one tower; ``lockedImage`` is locked-image text tuning
/// (LiT, Zhai et al. 2022; SigLiT with SigLIP's loss): the image tower and its projection stay as they are and the text
/// side learns to place each text where its image already is. A frozen image tower's outputs never change, so they
/// are computed once per image (``encodedImages(_:)``).
public final class ImageTextContrastiveTraining: @unchecked Sendable {
    /// The modules of transformers' `CLIPModel` and `SiglipModel` a recipe may freeze, by their attribute names.
    /// SigLIP has no projections outside its towers (its text projection is `text_model.head`).
    public enum Module: String, Sendable, CaseIterable {
        case visionModel = "vision_model"
        case visualProjection = "visual_projection"
        case textModel = "text_model"
        case textProjection = "text_projection"
    }

    /// LiT's frozen modules: the image tower and its projection.
    public static let lockedImage: Set<Module> = [.visionModel, .visualProjection]

    public let directory: ModelDirectory
    public let frozen: Set<Module>
    /// The learning parameters under their Hugging Face names: every parameter outside the frozen modules, the
    /// temperature `logit_scale` (and SigLIP's `logit_bias`) always among them.
    public let parameters: [Parameter]
    /// The width of the image and text embeddings the loss compares.
    public let embeddingSize: Int
    /// How the model's processor pads a batch of texts for training.
    public var textPadding: DualEncoderTextPadding { text.padding }

    private let text: TextTowerTraining
    private let vision: VisionTowerTraining
    private let visualProjection: String?
    private let sigmoidLoss: Bool
    private let store: WeightStore
    /// Every tensor the forward pass reads, frozen ones included, in fp32; the learning ones are the parameters'.
    private let weights: [String: Tensor]
    /// The token embedding table's gradient (vocabulary × width, 100 MB for CLIP), written over each step.
    private let tokenEmbeddingGradient: Tensor?

    /// Loads a checkpoint directory of `model_type` `clip`, `siglip` or `siglip2`, `frozen` modules left as they are.
    public init(directory: ModelDirectory, frozen: Set<Module> = []) throws {
        self.directory = directory
        self.frozen = frozen
        let file = directory.url.appendingPathComponent("config.json").path
        text = try TextTowerTraining(directory, file: file)
        vision = try VisionTowerTraining(directory, file: file)
        // The inference model's loading checks every tensor's presence and shape against the config, so that the
        // training passes below meet only well-formed weights; it is built and let go before the parameters load.
        _ = try MatrixPrecision.$forNewLayers.withValue(.float32) { try ModelRegistry.dualEncoder(directory, for: .embed) }
        store = try WeightStore(directory: directory.url)
        let type = try directory.modelType
        sigmoidLoss = type != "clip"
        visualProjection = type == "clip" ? "visual_projection.weight" : nil
        embeddingSize = try type == "clip" ? directory.decode(CLIPConfig.self).projectionDim
                                           : type == "siglip" ? directory.decode(SiglipConfig.self).visionConfig.hiddenSize
                                                              : directory.decode(Siglip2Config.self).visionConfig.hiddenSize

        let store = self.store
        let read = store.names.filter { !$0.hasSuffix(".position_ids") }
        let learning = read.filter { name in !frozen.contains { name.hasPrefix($0.rawValue + ".") } }
        parameters = try learning.map { name in
            // Trainer's get_decay_parameter_names: no decay for biases and for LayerNorm modules' parameters (named
            // `…layer_norm…`, `…layernorm…`, CLIP's `pre_layrnorm`: the module's name ends in `norm`, `norm1`, `norm2`).
            let module = name.split(separator: ".").dropLast().last ?? ""
            let normalization = module.contains("norm")
            return try Parameter(name: name, value: store.tensor(name), decays: !(name.contains("bias") || normalization))
        }
        var weights = Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.value) })
        for name in read where weights[name] == nil { weights[name] = try store.tensor(name) }
        self.weights = weights
        tokenEmbeddingGradient = frozen.contains(.textModel) ? nil : Tensor(zeros: [text.vocabSize, text.hiddenSize])
    }

    /// Whether the image tower is frozen, so that each image is encoded once by ``encodedImages(_:)``.
    public var encodesImagesOnce: Bool { frozen.contains(.visionModel) }

    /// The frozen image tower's pooled outputs of the image processor's output, `[B, width]` (CLIP's before its
    /// `visual_projection`; SigLIP's are its image features): what ``ContrastiveImages/encoded(_:)`` takes.
    public func encodedImages(_ images: ProcessedImages) throws -> Tensor {
        try vision.forward(images, keeping: false, weights: value).pooled
    }

    /// The contrastive loss of the pairs (image `i`, text `i`) under the current parameters, with every parameter's
    /// gradient set for the optimizer.
    ///
    /// - Parameters:
    ///   - images: the batch's pixel values, or (image tower frozen) their ``encodedImages(_:)``.
    ///   - inputIds: N token sequences of one length, as the tokenizer pads them.
    ///   - attentionMask: their padding mask (nil: no padding).
    public func lossAndGradients(images: ContrastiveImages, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Float {
        try loss(images: images, inputIds: inputIds, attentionMask: attentionMask, settingGradients: true)
    }

    /// The contrastive loss of the pairs under the current parameters without the backward pass (an evaluation's).
    public func loss(images: ContrastiveImages, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Float {
        try loss(images: images, inputIds: inputIds, attentionMask: attentionMask, settingGradients: false)
    }

    private func loss(images: ContrastiveImages, inputIds: [[Int]], attentionMask: [[Int]]?, settingGradients: Bool) throws -> Float {
        let batch = inputIds.count
        let mask = try text.checkedMask(inputIds: inputIds, attentionMask: attentionMask)
        let pooled: Tensor, visionActivations: VisionTowerTraining.Activations?
        switch images {
        case .pixels(let processed):
            guard !encodesImagesOnce else {
                throw ModelError.invalidInput("the image tower is frozen: pass the images encoded once (encodedImages), not pixels")
            }
            (pooled, visionActivations) = try vision.forward(processed, keeping: settingGradients, weights: value)
        case .encoded(let encoded):
            guard encodesImagesOnce else {
                throw ModelError.invalidInput("the image tower learns: pass the batch's pixels, not encoded images")
            }
            (pooled, visionActivations) = (encoded, nil)
        }
        guard pooled.rank == 2, pooled.shape[0] == batch else {
            throw ModelError.invalidInput("a contrastive loss needs pairs, one image per text: got \(batch) texts and images \(pooled.shape)")
        }
        let imageEmbeddings = try visualProjection.map { name in
            guard pooled.shape[1] == value(name).shape[1] else {
                throw ModelError.invalidInput("encoded images are [\(batch), \(pooled.shape[1])], not [\(batch), \(value(name).shape[1])]")
            }
            return linear(pooled, weight: value(name), bias: nil)
        } ?? pooled
        guard imageEmbeddings.shape[1] == embeddingSize else {
            throw ModelError.invalidInput("encoded images are [\(batch), \(imageEmbeddings.shape[1])], not [\(batch), \(embeddingSize)]")
        }
        let trainsText = !frozen.contains(.textModel)
        let (textEmbeddings, textActivations) = text.forward(inputIds: inputIds, mask: mask, keepingLayers: settingGradients && trainsText,
                                                             weights: value)
        let (normalizedImages, normalizedTexts) = (l2Normalized(imageEmbeddings), l2Normalized(textEmbeddings))
        let scale = Float(exp(Double(value("logit_scale").scalars[0])))
        let similarities = matmul(normalizedImages, normalizedTexts, transposeB: true)
        let bias = sigmoidLoss ? value("logit_bias").scalars[0] : 0
        let logitsPerImage = Tensor(shape: similarities.shape, scalars: similarities.scalars.map { $0 * scale + bias })
        let (loss, logitsGradient) = sigmoidLoss ? try sigmoidContrastiveLossGradient(logitsPerImage: logitsPerImage)
                                                 : try clipContrastiveLossGradient(logitsPerImage: logitsPerImage)
        guard settingGradients else { return loss }

        // Backward. L = e^s·S (+ b): dL/ds = Σ dL ⊙ e^s·S, dL/db = Σ dL.
        var gradients: [String: Tensor] = [:]
        let scaleGradient = zip(logitsGradient.scalars, similarities.scalars).reduce(Float(0)) { $0 + $1.0 * $1.1 * scale }
        gradients["logit_scale"] = Tensor(shape: value("logit_scale").shape, scalars: [scaleGradient])
        if sigmoidLoss {
            gradients["logit_bias"] = Tensor(shape: value("logit_bias").shape, scalars: [logitsGradient.scalars.reduce(0, +)])
        }
        let similarityGradient = scaled(logitsGradient, by: scale)
        if !(frozen.contains(.textModel) && (sigmoidLoss || frozen.contains(.textProjection))) {
            let textGradient = l2NormalizedBackward(matmul(similarityGradient, normalizedImages, transposeA: true), input: textEmbeddings)
            text.backward(textGradient, through: textActivations, tokenEmbeddingGradient: tokenEmbeddingGradient, weights: value,
                          into: &gradients)
        }
        if !(encodesImagesOnce && (visualProjection == nil || frozen.contains(.visualProjection))) {
            let imageGradient = l2NormalizedBackward(matmul(similarityGradient, normalizedTexts), input: imageEmbeddings)
            var pooledGradient = imageGradient
            if let visualProjection {
                let projected = linearBackward(imageGradient, input: pooled, weight: value(visualProjection))
                gradients[visualProjection] = projected.weight
                pooledGradient = projected.input
            }
            if let visionActivations { vision.backward(pooledGradient, through: visionActivations, weights: value, into: &gradients) }
        }
        for parameter in parameters { parameter.gradient = gradients[parameter.name] }
        return loss
    }

    /// Writes the trained checkpoint to `output` (created if needed): the original config.json (its `dtype` now
    /// float32), every tensor of the original with the learning ones replaced (all fp32, in one model.safetensors),
    /// and the tokenizer and preprocessor files copied, so that transformers, `vlm classify` and this class load it.
    public func save(to output: URL) throws {
        try writeCheckpoint(from: directory, store: store, replacing: Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.value) }),
                            to: output)
    }

    private func value(_ name: String) -> Tensor { weights[name]! }
}

/// The images of a contrastive training batch.
public enum ContrastiveImages: Sendable {
    /// The image processor's output, through a learning image tower.
    case pixels(ProcessedImages)
    /// A frozen image tower's outputs, `[B, width]` (``ImageTextContrastiveTraining/encodedImages(_:)``).
    case encoded(Tensor)
}
