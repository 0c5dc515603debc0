import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers
import VLMTraining

/// One optimizer step of a training run, as transformers' Trainer logs it.
public struct TrainingLogEntry: Sendable, Equatable {
    /// 1 for the first step.
    public let step: Int
    /// Epochs done at the end of the step: `step / steps per epoch`.
    public let epoch: Double
    /// The batch's loss before the step.
    public let loss: Float
    /// The gradients' global norm before clipping.
    public let gradientNorm: Float
    /// The learning rate the step applied.
    public let learningRate: Float
}

/// What a training run did: each step's log, and how long it took (Trainer's closing `train_runtime` and rates).
public struct TrainingRun: Sendable {
    public let history: [TrainingLogEntry]
    /// Seconds the steps took, from the first batch's tokenization to the last optimizer step.
    public let runtime: Double
    /// Seconds spent decoding, preprocessing and encoding the images before the first step.
    public let imageEncodingTime: Double
    /// Pairs trained on per second of ``runtime`` (a short last batch counts as its pairs).
    public let samplesPerSecond: Double

    public var stepsPerSecond: Double { Double(history.count) / runtime }
}

/// Locked-image text tuning of a CLIP, SigLIP or SigLIP 2 checkpoint on an image–text dataset
/// (``LockedImageTextTuning``): each image through the checkpoint's image processor and frozen image tower once, then
/// batches of pairs, their texts tokenized as the model's processor does (CLIP: `padding=True, truncation=True`;
/// SigLIP: `padding="max_length"`, SigLIP 2 to 64 tokens, a longer caption refused), through the text side's loss,
/// gradients and AdamW.
public final class LockedImageTextTuningPipeline: @unchecked Sendable {
    public let tuning: LockedImageTextTuning
    public let tokenizer: Tokenizer
    public let imageProcessor: any ImageProcessor

    /// The checkpoint's processor's text side: its tokenizer and padding.
    private let textInputs: DualEncoderTextInputs

    public init(directory: URL) throws {
        let checkpoint = try ModelDirectory(url: directory)
        tuning = try LockedImageTextTuning(directory: checkpoint)
        tokenizer = try Tokenizer(directory: directory)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType)
        textInputs = DualEncoderTextInputs(tokenizer: tokenizer, padding: tuning.frozen.textPadding)
    }

    /// Trains on `dataset` as `settings` say, calling `log` after each step; the tuned parameters stay in ``tuning``
    /// (``save(to:)`` writes them).
    ///
    /// Each epoch takes the pairs in an order drawn from `settings.shuffleSeed` (a permutation of its own, not torch's),
    /// or as given; the last batch of an epoch may be short, as Trainer's data loader leaves it.
    @discardableResult
    public func train(_ dataset: ImageTextDataset, settings: TrainingSettings,
                      log: (TrainingLogEntry) -> Void = { _ in }) throws -> TrainingRun {
        guard settings.batchSize > 0 else { throw ModelError.invalidInput("the batch size must be positive") }
        let encodingStart = DispatchTime.now().uptimeNanoseconds
        let imageFeatures = try encodeImages(dataset)
        let start = DispatchTime.now().uptimeNanoseconds
        var samples = 0
        let examples = dataset.pairs.count
        let totalSteps = settings.totalSteps(examples: examples)
        let stepsPerEpoch = (examples + settings.batchSize - 1) / settings.batchSize
        let optimizer = AdamW(parameters: tuning.parameters, settings: settings, totalSteps: totalSteps)
        var generator = settings.shuffleSeed.map { SeededGenerator(seed: $0) }
        var history: [TrainingLogEntry] = []
        var order: [Int] = []
        while optimizer.steps < totalSteps {
            if order.isEmpty {
                order = Array(0..<examples)
                if generator != nil {
                    // Fisher–Yates spelled out: the standard library's shuffle may change its algorithm between releases.
                    for i in stride(from: examples - 1, to: 0, by: -1) {
                        order.swapAt(i, Int(generator!.next() % UInt64(i + 1)))
                    }
                }
            }
            let batch = Array(order.prefix(settings.batchSize))
            order.removeFirst(batch.count)
            samples += batch.count
            let texts = try textInputs(batch.map { dataset.pairs[$0].text }, zeroShot: false)
            let loss = try tuning.lossAndGradients(imageFeatures: embedding(imageFeatures, ids: batch), inputIds: texts.ids,
                                                   attentionMask: texts.attentionMask)
            let learningRate = optimizer.learningRate
            let norm = optimizer.step()
            let entry = TrainingLogEntry(step: optimizer.steps, epoch: Double(optimizer.steps) / Double(stepsPerEpoch),
                                         loss: loss, gradientNorm: norm, learningRate: learningRate)
            history.append(entry)
            log(entry)
        }
        let end = DispatchTime.now().uptimeNanoseconds
        let runtime = Double(end - start) / 1e9
        return TrainingRun(history: history, runtime: runtime, imageEncodingTime: Double(start - encodingStart) / 1e9,
                           samplesPerSecond: Double(samples) / runtime)
    }

    /// The contrastive loss over `dataset` under the current parameters, in its order, `batchSize` pairs at a time,
    /// averaged over the pairs as Trainer's `evaluate` averages `eval_loss` (each batch's loss weighted by its size).
    public func loss(on dataset: ImageTextDataset, batchSize: Int) throws -> Float {
        guard batchSize > 0 else { throw ModelError.invalidInput("the batch size must be positive") }
        let imageFeatures = try encodeImages(dataset)
        var total = 0.0
        for start in stride(from: 0, to: dataset.pairs.count, by: batchSize) {
            let batch = Array(start..<min(start + batchSize, dataset.pairs.count))
            let texts = try textInputs(batch.map { dataset.pairs[$0].text }, zeroShot: false)
            let loss = try tuning.loss(imageFeatures: embedding(imageFeatures, ids: batch), inputIds: texts.ids,
                                       attentionMask: texts.attentionMask)
            total += Double(loss) * Double(batch.count)
        }
        return Float(total / Double(dataset.pairs.count))
    }

    /// Writes the tuned checkpoint (``LockedImageTextTuning/save(to:)``).
    public func save(to directory: URL) throws {
        try tuning.save(to: directory)
    }

    /// Every pair's image embedding `[pairs, projection_dim]`, each distinct file decoded and encoded once, 32 at a time.
    private func encodeImages(_ dataset: ImageTextDataset) throws -> Tensor {
        var files: [URL] = []
        var index: [URL: Int] = [:]
        for pair in dataset.pairs where index[pair.image] == nil {
            index[pair.image] = files.count
            files.append(pair.image)
        }
        var encoded: [Float] = []
        for start in stride(from: 0, to: files.count, by: 32) {
            let images = try files[start..<min(start + 32, files.count)].map { try ImageDecoder.decode(contentsOf: $0) }
            encoded += try tuning.imageFeatures(imageProcessor.preprocess(images)).scalars
        }
        let width = tuning.frozen.embeddingSize
        return embedding(Tensor(shape: [files.count, width], scalars: encoded), ids: dataset.pairs.map { index[$0.image]! })
    }
}
