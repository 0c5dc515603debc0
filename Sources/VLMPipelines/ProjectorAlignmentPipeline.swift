import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTemplates
import VLMTensor
import VLMTraining

/// LLaVA's projector alignment on an image–text dataset (``ProjectorAlignment``): each pair one conversation, a user
/// turn holding the image (and `instruction` when given) and the caption as the assistant's reply, laid out as
/// transformers' processor lays it out (`apply_chat_template(..., tokenize=True)`: the checkpoint's chat template,
/// each image marker expanded into the image's tokens), right-padded in batches; the reply's tokens, everything after
/// the prompt `apply_chat_template(..., add_generation_prompt=True)` gives for the user turn alone, are scored, the
/// rest labelled -100. Each image goes through the processor and the frozen vision tower once.
public final class ProjectorAlignmentPipeline: @unchecked Sendable {
    public let alignment: ProjectorAlignment
    /// The checkpoint's processor and chat template, over the alignment's frozen model.
    private let chat: ImageTextToTextPipeline

    /// Loads a LLaVA checkpoint directory with a chat template.
    public init(directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        alignment = try ProjectorAlignment(directory: checkpoint)
        guard let processor = try ImageToTextProcessors.load(checkpoint) as? any ImageChatProcessor else {
            throw ModelError.invalidConfig("this checkpoint's processor does not chat through a chat template",
                                           file: directory.appendingPathComponent("config.json").path)
        }
        guard let template = try ChatTemplate.load(directory: directory) else { throw PipelineError.noChatTemplate }
        chat = ImageTextToTextPipeline(model: alignment.frozen, processor: processor, chatTemplate: template,
                                       config: try GenerationConfig.load(directory: directory))
    }

    /// Trains on `dataset` as `settings` say (Trainer's loop, see ``LockedImageTextTuningPipeline/train(_:settings:log:)``),
    /// calling `log` after each step; the aligned projector stays in ``alignment`` (``save(to:)`` writes it).
    @discardableResult
    public func train(_ dataset: ImageTextDataset, instruction: String? = nil, settings: TrainingSettings,
                      log: (TrainingLogEntry) -> Void = { _ in }) throws -> TrainingRun {
        let encodingStart = DispatchTime.now().uptimeNanoseconds
        let prepared = try prepare(dataset, instruction: instruction)
        let encodingTime = Double(DispatchTime.now().uptimeNanoseconds - encodingStart) / 1e9
        return try runTraining(examples: dataset.pairs.count, settings: settings, parameters: alignment.parameters,
                               imageEncodingTime: encodingTime, log: log) { batch in
            let inputs = prepared.batch(batch)
            return try alignment.lossAndGradients(visionFeatures: inputs.features, inputIds: inputs.ids,
                                                  attentionMask: inputs.attentionMask, labels: inputs.labels)
        }
    }

    /// The loss over `dataset` under the current projector, in its order, `batchSize` pairs at a time, each batch's
    /// loss weighted by its size.
    public func loss(on dataset: ImageTextDataset, instruction: String? = nil, batchSize: Int) throws -> Float {
        guard batchSize > 0 else { throw ModelError.invalidInput("the batch size must be positive") }
        let prepared = try prepare(dataset, instruction: instruction)
        var total = 0.0
        for start in stride(from: 0, to: dataset.pairs.count, by: batchSize) {
            let inputs = prepared.batch(Array(start..<min(start + batchSize, dataset.pairs.count)))
            let loss = try alignment.loss(visionFeatures: inputs.features, inputIds: inputs.ids,
                                          attentionMask: inputs.attentionMask, labels: inputs.labels)
            total += Double(loss) * Double(inputs.ids.count)
        }
        return Float(total / Double(dataset.pairs.count))
    }

    /// Writes the aligned checkpoint (``ProjectorAlignment/save(to:)``).
    public func save(to directory: URL) throws {
        try alignment.save(to: directory)
    }

    /// Every pair's conversation ids and labels, and each distinct image's vision features.
    private struct Prepared {
        let ids: [[Int]]
        let labels: [[Int]]
        /// Per pair, its image's features `[tokens, features]`.
        let features: [Tensor]
        let padding: Int

        /// The examples `rows`, right-padded to the longest.
        func batch(_ rows: [Int]) -> (ids: [[Int]], attentionMask: [[Int]], labels: [[Int]], features: Tensor) {
            let length = rows.map { ids[$0].count }.max() ?? 0
            func padded(_ row: [Int], with value: Int) -> [Int] { row + Array(repeating: value, count: length - row.count) }
            let batchFeatures = rows.map { features[$0] }
            return (rows.map { padded(ids[$0], with: padding) },
                    rows.map { padded(Array(repeating: 1, count: ids[$0].count), with: 0) },
                    rows.map { padded(labels[$0], with: ignoredLabel) },
                    concatenate(batchFeatures.map { $0.reshaped([1] + $0.shape) }, axis: 0))
        }
    }

    private func prepare(_ dataset: ImageTextDataset, instruction: String?) throws -> Prepared {
        let processor = chat.processor
        var featuresByImage: [URL: (features: Tensor, tokens: Int)] = [:]
        var ids: [[Int]] = [], labels: [[Int]] = [], features: [Tensor] = []
        for pair in dataset.pairs {
            if featuresByImage[pair.image] == nil {
                let processed = try processor.preprocess([ImageDecoder.decode(contentsOf: pair.image)], conversationImageCount: 1)
                let vision = try alignment.visionFeatures(pixelValues: processed.pixelValues)
                featuresByImage[pair.image] = (vision.reshaped(Array(vision.shape.dropFirst())), processor.imageTokenCounts(processed)[0])
            }
            let (image, tokens) = featuresByImage[pair.image]!
            var user: [JSONValue] = [["type": "image"]]
            if let instruction { user.append(["type": "text", "text": .string(instruction)]) }
            let question: JSONValue = ["role": "user", "content": .array(user)]
            let reply: JSONValue = ["role": "assistant", "content": [["type": "text", "text": .string(pair.text)]]]
            let prompt = try chat.promptIds([question], imageTokenCounts: [tokens])
            let conversation = try chat.promptIds([question, reply], imageTokenCounts: [tokens], addGenerationPrompt: false)
            guard conversation.count > prompt.count, Array(conversation.prefix(prompt.count)) == prompt else {
                throw PipelineError.invalidProcessor(alignment.directory.url.path,
                                                     "the chat template's conversation does not begin with its prompt, so the reply's tokens cannot be told apart (caption \(String(reflecting: String(pair.text.prefix(40)))))")
            }
            ids.append(conversation)
            labels.append(Array(repeating: ignoredLabel, count: prompt.count) + conversation.dropFirst(prompt.count))
            features.append(image)
        }
        let tokenizer = processor.tokenizer
        return Prepared(ids: ids, labels: labels, features: features, padding: tokenizer.padTokenId ?? tokenizer.eosTokenId ?? 0)
    }
}
