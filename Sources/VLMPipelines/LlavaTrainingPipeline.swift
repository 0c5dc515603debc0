import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTemplates
import VLMTensor
import VLMTraining

/// What LLaVA training reads, and which of its tokens the loss scores.
public enum LlavaTrainingData: Sendable {
    /// Image–caption pairs for projector alignment: each pair one conversation, a user turn holding the image (and
    /// the instruction when given), the caption as the assistant's reply. The reply's tokens are scored: everything
    /// after the prompt `apply_chat_template(..., add_generation_prompt=True)` gives for the user turn alone (TRL's
    /// prompt–completion loss), so the template's end-of-turn tokens too.
    case captions(ImageTextDataset, instruction: String?)
    /// Conversations for instruction tuning, scored where the chat template's `{% generation %}` blocks put the
    /// assistant's replies (`apply_chat_template(..., return_assistant_tokens_mask=True)`, TRL's
    /// `assistant_only_loss`), or with `assistantOnly` false on every token but the images' and the padding (TRL's
    /// default, its vision collator masking the image tokens).
    case conversations(ImageConversationDataset, assistantOnly: Bool = true)

    var count: Int {
        switch self {
        case .captions(let dataset, _): dataset.pairs.count
        case .conversations(let dataset, _): dataset.conversations.count
        }
    }
}

/// LLaVA training (``LlavaTraining``) on a dataset: each example a conversation laid out as transformers' processor
/// lays it out (`apply_chat_template(..., tokenize=True)`: the checkpoint's chat template, each image marker expanded
/// into the image's tokens), right-padded in batches, labelled -100 where the loss does not score it. Each image goes
/// through the processor (LLaVA-NeXT's and LLaVA-OneVision's tiling it, as the row's only image) and the frozen vision
/// tower once.
public final class LlavaTrainingPipeline: @unchecked Sendable {
    public let training: LlavaTraining
    /// The checkpoint's processor and chat template.
    private let chat: ImageChatPromptLayout

    /// Loads a LLaVA, LLaVA-NeXT or LLaVA-OneVision checkpoint directory with a chat template; `lora`, for instruction tuning, trains LoRA's updates
    /// of the language model instead of its weights.
    public init(directory: URL, stage: LlavaTraining.Stage, lora: LoraSettings? = nil) throws {
        let checkpoint = try ModelDirectory(url: directory)
        training = try LlavaTraining(directory: checkpoint, stage: stage, lora: lora)
        guard let processor = try ImageToTextProcessors.load(checkpoint) as? any ImageChatProcessor else {
            throw ModelError.invalidConfig("this checkpoint's processor does not chat through a chat template",
                                           file: directory.appendingPathComponent("config.json").path)
        }
        guard let template = try ChatTemplate.load(directory: directory) else { throw PipelineError.noChatTemplate }
        chat = ImageChatPromptLayout(processor: processor, chatTemplate: template)
    }

    /// Trains on `data` as `settings` say (Trainer's loop, see ``ContrastiveTrainingPipeline/train(_:settings:checkpoints:log:)``),
    /// calling `log` after each step; the trained parameters stay in ``training`` (``save(to:)`` writes them).
    @discardableResult
    public func train(_ data: LlavaTrainingData, settings: TrainingSettings,
                      checkpoints: TrainingCheckpoints? = nil,
                      log: (TrainingLogEntry) throws -> Void = { _ in }) throws -> TrainingRun {
        let encodingStart = DispatchTime.now().uptimeNanoseconds
        let prepared = try prepare(data)
        let encodingTime = Double(DispatchTime.now().uptimeNanoseconds - encodingStart) / 1e9
        return try runTraining(examples: data.count, settings: settings, parameters: training.parameters,
                               imageEncodingTime: encodingTime, checkpoints: checkpoints, log: log) { batch in
            let inputs = prepared.batch(batch)
            return BatchLoss(try training.lossAndGradients(images: inputs.images, inputIds: inputs.ids,
                                                           attentionMask: inputs.attentionMask, labels: inputs.labels),
                             labels: inputs.labels)
        }
    }

    /// The loss over `data` under the current parameters, in its order, `batchSize` examples at a time, each batch's
    /// loss weighted by its size.
    public func loss(on data: LlavaTrainingData, batchSize: Int) throws -> Float {
        guard batchSize > 0 else { throw ModelError.invalidInput("the batch size must be positive") }
        let prepared = try prepare(data)
        var total = 0.0
        for start in stride(from: 0, to: data.count, by: batchSize) {
            let inputs = prepared.batch(Array(start..<min(start + batchSize, data.count)))
            let loss = try training.loss(images: inputs.images, inputIds: inputs.ids,
                                         attentionMask: inputs.attentionMask, labels: inputs.labels)
            total += Double(loss) * Double(inputs.ids.count)
        }
        return Float(total / Double(data.count))
    }

    /// Writes the trained checkpoint, or the LoRA adapter (``LlavaTraining/save(to:mergingLora:)``).
    public func save(to directory: URL, mergingLora: Bool = false) throws {
        try training.save(to: directory, mergingLora: mergingLora)
    }

    /// Every example's conversation ids and labels, and each distinct image's vision features.
    private struct Prepared {
        let ids: [[Int]]
        let labels: [[Int]]
        /// Per example, its image's features and their layout.
        let images: [LlavaImageRows]
        let padding: Int

        /// The examples `rows`, right-padded to the longest.
        func batch(_ rows: [Int]) -> (ids: [[Int]], attentionMask: [[Int]], labels: [[Int]], images: [LlavaImageRows]) {
            let batch = rightPadded(rows.map { (ids[$0], labels[$0]) }, padding: padding)
            return (batch.ids, batch.attentionMask, batch.labels, rows.map { images[$0] })
        }
    }

    private func prepare(_ data: LlavaTrainingData) throws -> Prepared {
        let processor = chat.processor
        var featuresByImage: [URL: (features: LlavaImageRows, tokens: Int)] = [:]
        func encoded(_ url: URL) throws -> (features: LlavaImageRows, tokens: Int) {
            if let known = featuresByImage[url] { return known }
            let processed = try processor.preprocess([ImageDecoder.decode(contentsOf: url)], conversationImageCount: 1)
            let image = (try training.imageRows(processed)[0], processor.imageTokenCounts(processed)[0])
            featuresByImage[url] = image
            return image
        }
        var ids: [[Int]] = [], labels: [[Int]] = [], features: [LlavaImageRows] = []
        switch data {
        case let .captions(dataset, instruction):
            for pair in dataset.pairs {
                let (image, tokens) = try encoded(pair.image)
                var user: [JSONValue] = [["type": "image"]]
                if let instruction { user.append(["type": "text", "text": .string(instruction)]) }
                let question: JSONValue = ["role": "user", "content": .array(user)]
                let reply: JSONValue = ["role": "assistant", "content": [["type": "text", "text": .string(pair.text)]]]
                let prompt = try chat.promptIds([question], imageTokenCounts: [tokens])
                let conversation = try chat.promptIds([question, reply], imageTokenCounts: [tokens], addGenerationPrompt: false)
                guard conversation.count > prompt.count, Array(conversation.prefix(prompt.count)) == prompt else {
                    throw PipelineError.invalidProcessor(training.directory.url.path,
                                                         "the chat template's conversation does not begin with its prompt, so the reply's tokens cannot be told apart (caption \(String(reflecting: String(pair.text.prefix(40)))))")
                }
                ids.append(conversation)
                labels.append(Array(repeating: ignoredLabel, count: prompt.count) + conversation.dropFirst(prompt.count))
                features.append(image)
            }
        case let .conversations(dataset, assistantOnly):
            for (index, conversation) in dataset.conversations.enumerated() {
                let (image, tokens) = try encoded(conversation.image)
                let (conversationIds, mask) = try chat.conversationIdsWithAssistantMask(conversation.messages, imageTokenCounts: [tokens])
                guard !assistantOnly || mask.contains(1) else {
                    throw PipelineError.invalidProcessor(training.directory.url.path,
                                                         "the chat template marks no assistant tokens in conversation \(index + 1) (instruction tuning scores the replies its {% generation %} blocks mark; --all-tokens scores every token)")
                }
                let imageToken = training.visionEncoder.imageTokenIndex
                ids.append(conversationIds)
                labels.append(zip(conversationIds, mask).map { id, marked in
                    assistantOnly ? (marked == 1 ? id : ignoredLabel) : (id == imageToken ? ignoredLabel : id)
                })
                features.append(image)
            }
        }
        let tokenizer = processor.tokenizer
        return Prepared(ids: ids, labels: labels, images: features, padding: tokenizer.padTokenId ?? tokenizer.eosTokenId ?? 0)
    }
}
