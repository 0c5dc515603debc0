import Foundation
import VLMCheckpoint
import VLMModels
import VLMTemplates
import VLMTensor

/// Supervised fine-tuning of a Llama, Mistral, Qwen2, Qwen3 or SmolLM3 checkpoint (`LlamaForCausalLM` and its kin) from the causal LM
/// loss on `labels`, as transformers computes `model(input_ids, attention_mask, labels=labels).loss` and `Trainer`
/// (TRL's `SFTTrainer`) steps it: every parameter learning, or with LoRA only the updates PEFT's `get_peft_model`
/// puts beside the targeted projections. The weights are held once, in fp32 and unpacked.
public final class CausalLanguageModelTraining: @unchecked Sendable {
    public let directory: ModelDirectory
    public let config: LlamaConfig
    /// Every tensor of the model under the checkpoint's own names (a head tied to the token embedding once, as the
    /// embedding); with LoRA, its `A` and `B` matrices under PEFT's names instead.
    public let parameters: [Parameter]
    public let lora: LoraSettings?
    private let store: WeightStore
    private let decoder: DecoderTraining

    /// Loads a checkpoint directory of `model_type` `llama`, `mistral`, `qwen2`, `qwen3` or `smollm3`, with LoRA's updates when `lora`
    /// is given.
    public init(directory: ModelDirectory, lora: LoraSettings? = nil) throws {
        self.directory = directory
        self.lora = lora
        let file = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard LlamaConfig.supportedModelTypes.contains(type) else {
            throw ModelError.unsupportedModelType(type, supported: LlamaConfig.supportedModelTypes, file: file)
        }
        config = try directory.decode(LlamaConfig.self)
        store = try WeightStore(directory: directory.url)
        decoder = try DecoderTraining(config: config, weights: Weights(store), file: file, lora: lora)
        parameters = lora == nil ? decoder.parameters : decoder.loraParameters
    }

    /// The loss on `labels` (-100 where nothing is scored; transformers shifts them by one) with every parameter's
    /// gradient set for the optimizer.
    ///
    /// - Parameters:
    ///   - inputIds: token sequences of one length, right-padded.
    ///   - attentionMask: their padding mask (nil: no padding).
    public func lossAndGradients(inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]]) throws -> Float {
        try loss(inputIds: inputIds, attentionMask: attentionMask, labels: labels, settingGradients: true)
    }

    /// The loss as ``lossAndGradients(inputIds:attentionMask:labels:)`` computes it, without the backward pass.
    public func loss(inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]]) throws -> Float {
        try loss(inputIds: inputIds, attentionMask: attentionMask, labels: labels, settingGradients: false)
    }

    private func loss(inputIds: [[Int]], attentionMask: [[Int]]?, labels: [[Int]], settingGradients: Bool) throws -> Float {
        try decoder.validate(inputIds: inputIds, labels: labels)
        let (loss, gradient) = try decoder.loss(decoder.embed(inputIds), attentionMask: attentionMask, labels: labels,
                                                backward: settingGradients, weightGradients: lora == nil)
        if let gradient, lora == nil {
            decoder.embeddingBackward(gradient.reshaped([-1, config.hiddenSize]), ids: inputIds.flatMap { $0 }, replaced: [])
        }
        return loss
    }

    /// Writes the fine-tuned checkpoint to `output` as ``ImageTextContrastiveTraining/save(to:)`` writes one: every tensor in
    /// fp32, config.json with `dtype` float32, the tokenizer, chat template and generation files. With LoRA, the
    /// adapter as PEFT saves one (adapter_model.safetensors, adapter_config.json, the tokenizer files), or with
    /// `mergingLora` the checkpoint with each update merged into its weight, as `merge_and_unload()` then
    /// `save_pretrained` write it.
    public func save(to output: URL, mergingLora: Bool = false) throws {
        if let lora, !mergingLora {
            return try writeLoraAdapter(Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.value) }), settings: lora,
                                        targetModules: .array(lora.targetModules.map(JSONValue.string)), modulesToSave: nil,
                                        taskType: "CAUSAL_LM", base: directory, to: output)
        }
        let trained = lora == nil ? Dictionary(uniqueKeysWithValues: parameters.map { ($0.name, $0.value) }) : decoder.mergedLoraWeights()
        try writeCheckpoint(from: directory, store: store, replacing: trained, to: output)
    }
}
