import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers
import VLMTraining

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
        let encodingStart = DispatchTime.now().uptimeNanoseconds
        let imageFeatures = try encodeImages(dataset)
        let encodingTime = Double(DispatchTime.now().uptimeNanoseconds - encodingStart) / 1e9
        return try runTraining(examples: dataset.pairs.count, settings: settings, parameters: tuning.parameters,
                               imageEncodingTime: encodingTime, log: log) { batch in
            let texts = try textInputs(batch.map { dataset.pairs[$0].text }, zeroShot: false)
            return try tuning.lossAndGradients(imageFeatures: embedding(imageFeatures, ids: batch), inputIds: texts.ids,
                                               attentionMask: texts.attentionMask)
        }
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
