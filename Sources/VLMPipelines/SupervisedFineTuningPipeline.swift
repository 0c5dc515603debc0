import Foundation
import VLMCheckpoint
import VLMModels
import VLMTemplates
import VLMTokenizers
import VLMTraining

/// Supervised fine-tuning of a chat language model (``CausalLanguageModelTraining``) on conversations, as TRL's
/// `SFTTrainer` runs it with `assistant_only_loss=True`: each conversation laid out as
/// `tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)` lays
/// it out (the checkpoint's chat template, the text tokenized without added special tokens), labelled -100 wherever
/// the template's `{% generation %}` blocks do not mark the assistant's replies (or, with `assistantOnly` false, only
/// over the padding: TRL's default, for templates without generation blocks), right-padded in batches.
public final class SupervisedFineTuningPipeline: @unchecked Sendable {
    public let training: CausalLanguageModelTraining
    private let tokenizer: Tokenizer
    private let template: ChatTemplate

    /// Loads a Llama, Mistral, Qwen2, Qwen3 or SmolLM3 checkpoint directory with a tokenizer and a chat template; with `lora`, only
    /// LoRA's updates learn (see ``LoraSettings``).
    public init(directory: URL, lora: LoraSettings? = nil) throws {
        training = try CausalLanguageModelTraining(directory: try ModelDirectory(url: directory), lora: lora)
        let loaded = try loadTokenizer(path: directory)
        guard let template = loaded.chatTemplate else { throw PipelineError.noChatTemplate }
        (tokenizer, self.template) = (loaded.tokenizer, template)
    }

    /// Trains on `dataset` as `settings` say (Trainer's loop, see ``ContrastiveTrainingPipeline/train(_:settings:checkpoints:log:)``),
    /// calling `log` after each step; the fine-tuned weights stay in ``training`` (``save(to:)`` writes them).
    @discardableResult
    public func train(_ dataset: ConversationDataset, assistantOnly: Bool = true, settings: TrainingSettings,
                      checkpoints: TrainingCheckpoints? = nil,
                      log: (TrainingLogEntry) throws -> Void = { _ in }) throws -> TrainingRun {
        let examples = try prepare(dataset, assistantOnly: assistantOnly)
        return try runTraining(examples: examples.count, settings: settings, parameters: training.parameters,
                               imageEncodingTime: 0, checkpoints: checkpoints, log: log) { rows in
            let batch = padded(rows.map { examples[$0] })
            return BatchLoss(try training.lossAndGradients(inputIds: batch.ids, attentionMask: batch.attentionMask, labels: batch.labels),
                             labels: batch.labels)
        }
    }

    /// The loss over `dataset` under the current weights, in its order, `batchSize` conversations at a time, each
    /// batch's loss weighted by its size.
    public func loss(on dataset: ConversationDataset, assistantOnly: Bool = true, batchSize: Int) throws -> Float {
        guard batchSize > 0 else { throw ModelError.invalidInput("the batch size must be positive") }
        let examples = try prepare(dataset, assistantOnly: assistantOnly)
        var total = 0.0
        for start in stride(from: 0, to: examples.count, by: batchSize) {
            let batch = padded(Array(examples[start..<min(start + batchSize, examples.count)]))
            let loss = try training.loss(inputIds: batch.ids, attentionMask: batch.attentionMask, labels: batch.labels)
            total += Double(loss) * Double(batch.ids.count)
        }
        return Float(total / Double(examples.count))
    }

    /// Writes the fine-tuned checkpoint, or the LoRA adapter (``CausalLanguageModelTraining/save(to:mergingLora:)``).
    public func save(to directory: URL, mergingLora: Bool = false) throws {
        try training.save(to: directory, mergingLora: mergingLora)
    }

    /// Each conversation's ids and labels.
    private func prepare(_ dataset: ConversationDataset, assistantOnly: Bool) throws -> [(ids: [Int], labels: [Int])] {
        try dataset.conversations.enumerated().map { index, messages in
            let rendered = try template.renderMarkingGenerations(
                messages: messages, addGenerationPrompt: false,
                bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token), eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
            let encoding = tokenizer.encode(rendered.text, addSpecialTokens: false)
            guard assistantOnly else { return (encoding.ids, encoding.ids) }
            let mask = encoding.mask(covering: rendered.generations)
            guard mask.contains(1) else {
                throw PipelineError.invalidProcessor(training.directory.url.path,
                                                     "the chat template marks no assistant tokens in conversation \(index + 1) (supervised fine-tuning scores the replies its {% generation %} blocks mark; --all-tokens scores every token)")
            }
            return (encoding.ids, zip(encoding.ids, mask).map { $1 == 1 ? $0 : ignoredLabel })
        }
    }

    /// `examples` right-padded to the longest with the pad token (else eos), their padding mask and -100 labels.
    private func padded(_ examples: [(ids: [Int], labels: [Int])]) -> (ids: [[Int]], attentionMask: [[Int]], labels: [[Int]]) {
        rightPadded(examples, padding: tokenizer.padTokenId ?? tokenizer.eosTokenId ?? 0)
    }
}
