import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTemplates
import VLMTensor

/// LLaVA's two training stages (Liu et al. 2023) on a LLaVA, LLaVA-NeXT or LLaVA-OneVision checkpoint, as
/// transformers computes `model(input_ids, pixel_values, attention_mask, labels=labels).loss` (with `image_sizes` for
/// the tiling families) with the frozen parts' parameters not requiring gradients and `Trainer` steps the rest: the
/// vision tower always frozen, the multimodal projector always learning, the language model (and the tiling
/// families' `image_newline`) frozen in projector alignment and learning in instruction tuning, wholly or through
/// LoRA's updates as LLaVA's LoRA recipe trains them with PEFT (the projector saved whole beside them,
/// `image_newline` frozen). The vision features the projector reads never change, so each image is encoded once;
/// the tiling families' packing of the projected tiles (a gather, OneVision's also a bilinear shrink) hands its
/// gradient back through its transpose.
///
/// The language model (Llama, Mistral, Qwen2, Qwen3 or SmolLM3) is held once, in fp32 and unpacked: it runs forward keeping each
/// layer's activations and backward to the projector's output (and, when it learns, to its own weights).
public final class LlavaTraining: @unchecked Sendable {
    /// What learns.
    public enum Stage: Sendable {
        /// Stage 1, feature alignment: the projector alone.
        case projectorAlignment
        /// Stage 2, visual instruction tuning: the projector and the language model.
        case instructionTuning
    }

    public let directory: ModelDirectory
    public let stage: Stage
    /// The frozen vision tower the projector's inputs come from, and the family's layout of its outputs.
    public let visionEncoder: LlavaVisionEncoder
    /// What the optimizer steps: the projector's `linear_1` and `linear_2` under the checkpoint's own names, then in
    /// instruction tuning `image_newline` (LLaVA-NeXT, LLaVA-OneVision) and every tensor of the language model (a
    /// head tied to the token embedding once, as the embedding), or with LoRA the updates' `A` and `B` under PEFT's
    /// names.
    public let parameters: [Parameter]
    public let lora: LoraSettings?
    private let store: WeightStore
    private let projector: [String: Parameter]
    /// `image_newline`, in the families whose layouts read it.
    private let imageNewline: Parameter?
    private let languageModel: DecoderTraining
    private let activation: Activation

    /// Loads a checkpoint directory of `model_type` `llava`, `llava_next` or `llava_onevision` (a Llama, Mistral or
    /// Qwen2 language model); `lora`, for instruction tuning, trains LoRA's updates of the language model instead of
    /// its weights.
    public init(directory: ModelDirectory, stage: Stage, lora: LoraSettings? = nil) throws {
        self.directory = directory
        self.stage = stage
        self.lora = lora
        if lora != nil, stage != .instructionTuning {
            throw ModelError.invalidInput("LoRA trains the language model: instruction tuning, not projector alignment")
        }
        let file = directory.url.appendingPathComponent("config.json").path
        visionEncoder = try MatrixPrecision.$forNewLayers.withValue(.float32) { try LlavaVisionEncoder(directory: directory) }
        store = try WeightStore(directory: directory.url)
        let weights = Weights(store)
        let scope = weights.scoped(firstOf: ["multi_modal_projector", "model.multi_modal_projector"], holding: "linear_1.weight")
        let names = ["linear_1.weight", "linear_2.weight"] + (visionEncoder.multimodalProjectorBias ? ["linear_1.bias", "linear_2.bias"] : [])
        projector = try Dictionary(uniqueKeysWithValues: names.map { name in
            (name, Parameter(name: scope.fullName(name), value: try scope(name), decays: !name.hasSuffix("bias")))
        })
        let textConfig = visionEncoder.textConfig
        if visionEncoder.readsImageNewline {
            let name = weights.contains("model.image_newline") ? "model.image_newline" : "image_newline"
            imageNewline = Parameter(name: name, value: try weights(name, shape: [textConfig.hiddenSize]), decays: true)
        } else {
            imageNewline = nil
        }
        activation = try Activation(huggingFaceName: visionEncoder.projectorHiddenAct, file: file)
        let languageModel = try DecoderTraining(config: textConfig, weights: weights, file: file, lora: lora,
                                                moduleName: Self.moduleName)
        let projector = self.projector
        let learning = stage == .projectorAlignment ? [] : lora == nil ? [imageNewline].compactMap { $0 } + languageModel.parameters
            : languageModel.loraParameters
        parameters = names.map { projector[$0]! } + learning
        self.languageModel = languageModel
    }

    /// The frozen vision tower's features for the projector and their layout, per image, from the family's processed
    /// images.
    public func imageRows(_ images: ProcessedImages) throws -> [LlavaImageRows] {
        try visionEncoder.imageRows(images)
    }

    /// The language model's loss on `labels` (-100 where nothing is scored; transformers shifts them by one) for
    /// prompts holding their images' tokens, with the learning parameters' gradients set for the optimizer.
    ///
    /// - Parameters:
    ///   - images: from ``imageRows(_:)``, the images of the rows in order.
    ///   - inputIds: token sequences of one length, right-padded.
    ///   - attentionMask: their padding mask (nil: no padding).
    public func lossAndGradients(images: [LlavaImageRows], inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]]) throws -> Float {
        try loss(images: images, inputIds: inputIds, attentionMask: attentionMask, labels: labels, settingGradients: true)
    }

    /// The loss as ``lossAndGradients(images:inputIds:attentionMask:labels:)`` computes it, without the backward
    /// pass.
    public func loss(images: [LlavaImageRows], inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]]) throws -> Float {
        try loss(images: images, inputIds: inputIds, attentionMask: attentionMask, labels: labels, settingGradients: false)
    }

    private func loss(images: [LlavaImageRows], inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]],
                      settingGradients: Bool) throws -> Float {
        let imageToken = visionEncoder.imageTokenIndex
        try languageModel.validate(inputIds: inputIds, labels: labels, placeholder: imageToken)
        let (batch, length) = (inputIds.count, inputIds[0].count)
        let vocabulary = visionEncoder.textConfig.vocabSize
        let ids = inputIds.flatMap { $0 }
        let imageRows = ids.indices.filter { ids[$0] == imageToken }
        // Every image's features through the projector at once; the images' layouts read them, and the newline
        // after them all, as one table.
        let features = concatenate(images.map(\.visionFeatures), axis: 0)
        let featureRows = images.map { $0.visionFeatures.shape[0] }
        let starts = featureRows.reduce(into: [0]) { $0.append($0.last! + $1) }
        let tableRows = starts.last! + (imageNewline == nil ? 0 : 1)
        let layout = RowCombination.stacking(images.map(\.layout), inputRows: tableRows) { image, row in
            row < featureRows[image] ? starts[image] + row : starts.last!
        }
        guard imageRows.count == layout.outputRows else {
            throw ModelError.invalidInput("the prompts hold \(imageRows.count) image tokens (id \(imageToken)) for \(layout.outputRows) image feature rows")
        }
        // The image tokens' own embeddings are replaced, so any row stands in for an id beyond the vocabulary.
        let lookedUp = ids.map { $0 == imageToken && $0 >= vocabulary ? 0 : $0 }
        let bias = visionEncoder.multimodalProjectorBias

        // Forward: the projector, its rows laid out, the image rows in their tokens' places, the language model.
        let first = projector["linear_1.weight"]!, second = projector["linear_2.weight"]!
        let hidden = linear(features, weight: first.value, bias: bias ? projector["linear_1.bias"]!.value : nil)
        let activated = VLMTensor.activation(hidden, activation)
        let projected = linear(activated, weight: second.value, bias: bias ? projector["linear_2.bias"]!.value : nil)
        let width = projected.shape[1]
        let table = imageNewline.map { concatenate([projected, $0.value.reshaped([1, width])], axis: 0) } ?? projected
        let embeddings = replacingRows(of: languageModel.embed([lookedUp]).reshaped([batch, length, -1]), at: imageRows,
                                       with: layout(table))
        // Backward through the language model to its input rows: the image rows' gradient goes on through the
        // projector, the text rows' to the token embedding when it learns.
        let trainsLanguageModel = stage == .instructionTuning && lora == nil
        let (loss, gradient) = try languageModel.loss(embeddings, attentionMask: attentionMask, labels: labels,
                                                      backward: settingGradients, weightGradients: trainsLanguageModel)
        guard let embeddingGradient = gradient else { return loss }
        let rows = embeddingGradient.reshaped([-1, embeddingGradient.shape.last ?? 0])
        if trainsLanguageModel {
            languageModel.embeddingBackward(rows, ids: lookedUp, replaced: imageRows)
        }
        let tableGradient = layout.backward(embedding(rows, ids: imageRows))
        let projectedGradient = sequenceSlice(tableGradient.reshaped([1, tableRows, width]), 0..<starts.last!)
            .reshaped([starts.last!, width])
        if trainsLanguageModel, let imageNewline {
            imageNewline.gradient = sequenceSlice(tableGradient.reshaped([1, tableRows, width]), starts.last!..<tableRows)
                .reshaped([width])
        }
        let secondGradients = linearBackward(projectedGradient, input: activated, weight: second.value)
        let firstGradients = linearBackward(activationBackward(secondGradients.input, input: hidden, activation), input: features,
                                            weight: first.value)
        first.gradient = firstGradients.weight
        second.gradient = secondGradients.weight
        projector["linear_1.bias"]?.gradient = firstGradients.bias
        projector["linear_2.bias"]?.gradient = secondGradients.bias
        return loss
    }

    /// Writes the trained checkpoint to `output` as ``ImageTextContrastiveTraining/save(to:)`` writes one: every tensor of
    /// the original in fp32 with the trained ones replaced, config.json with `dtype` float32, the processor files.
    /// With LoRA, the adapter as PEFT saves LLaVA's (the updates, and the projector whole as a module to save), or
    /// with `mergingLora` the checkpoint with each update merged into its weight (`merge_and_unload()`).
    public func save(to output: URL, mergingLora: Bool = false) throws {
        let projected = projector.values.map { ($0.name, $0.value) }
        guard let lora else {
            return try writeCheckpoint(from: directory, store: store,
                                       replacing: Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.value) }), to: output)
        }
        if mergingLora {
            return try writeCheckpoint(from: directory, store: store,
                                       replacing: languageModel.mergedLoraWeights().merging(projected) { $1 }, to: output)
        }
        let updates = languageModel.loraParameters.map { ($0.name, $0.value) }
        let whole = projected.map { ("base_model.model." + Self.moduleName($0.0), $0.1) }
        let modules = lora.targetModules.joined(separator: "|")
        try writeLoraAdapter(Dictionary(uniqueKeysWithValues: updates + whole), settings: lora,
                             targetModules: .string(#".*language_model.*\.("# + modules + ")"), modulesToSave: ["multi_modal_projector"],
                             taskType: nil, base: directory, to: output)
    }

    /// A tensor's module path in transformers' `LlavaForConditionalGeneration` from its name in the checkpoint, which
    /// may be the layout saved before transformers 4.52 (`language_model.model.…`, `multi_modal_projector.…`).
    private static func moduleName(_ name: String) -> String {
        if name.hasPrefix("language_model.model.") { return "model.language_model." + name.dropFirst("language_model.model.".count) }
        if name.hasPrefix("multi_modal_projector.") { return "model." + name }
        return name
    }
}
