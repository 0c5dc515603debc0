import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTokenizers
import VLMTraining

/// Contrastive training of a CLIP, SigLIP or SigLIP 2 checkpoint on an image–text dataset
/// (``ImageTextContrastiveTraining``): batches of pairs, their images through the checkpoint's image processor (and,
/// when the image tower is frozen, through it once before training), their texts tokenized as the model's processor
/// does (CLIP: `padding=True, truncation=True`; SigLIP: `padding="max_length"`, SigLIP 2 to 64 tokens, a longer
/// caption refused), through the model's loss, gradients and AdamW.
public final class ContrastiveTrainingPipeline: @unchecked Sendable {
    public let training: ImageTextContrastiveTraining
    public let tokenizer: Tokenizer
    public let imageProcessor: any ImageProcessor

    /// The checkpoint's processor's text side: its tokenizer and padding.
    private let textInputs: DualEncoderTextInputs

    /// - Parameter frozen: the modules left as they are (``ImageTextContrastiveTraining/lockedImage`` for LiT).
    public init(directory: URL, frozen: Set<ImageTextContrastiveTraining.Module> = []) throws {
        let checkpoint = try ModelDirectory(url: directory)
        training = try ImageTextContrastiveTraining(directory: checkpoint, frozen: frozen)
        tokenizer = try Tokenizer(directory: directory)
        imageProcessor = try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType)
        textInputs = DualEncoderTextInputs(tokenizer: tokenizer, padding: training.textPadding)
    }

    /// Trains on `dataset` as `settings` say, calling `log` after each step; the trained parameters stay in
    /// ``training`` (``save(to:)`` writes them).
    ///
    /// Each epoch takes the pairs in an order drawn from `settings.shuffleSeed` (a permutation of its own, not torch's),
    /// or as given; the last batch of an epoch may be short, as Trainer's data loader leaves it. `checkpoints` writes
    /// Trainer's checkpoints along the way and resumes from one (``TrainingCheckpoints``).
    @discardableResult
    public func train(_ dataset: ImageTextDataset, settings: TrainingSettings,
                      checkpoints: TrainingCheckpoints? = nil,
                      log: (TrainingLogEntry) throws -> Void = { _ in }) throws -> TrainingRun {
        let encodingStart = DispatchTime.now().uptimeNanoseconds
        let images = try BatchImages(dataset, pipeline: self)
        let encodingTime = Double(DispatchTime.now().uptimeNanoseconds - encodingStart) / 1e9
        return try runTraining(examples: dataset.pairs.count, settings: settings, parameters: training.parameters,
                               imageEncodingTime: encodingTime, checkpoints: checkpoints, log: log) { batch in
            let texts = try textInputs(batch.map { dataset.pairs[$0].text }, zeroShot: false)
            return BatchLoss(try training.lossAndGradients(images: images(batch), inputIds: texts.ids, attentionMask: texts.attentionMask))
        }
    }

    /// The contrastive loss over `dataset` under the current parameters, in its order, `batchSize` pairs at a time,
    /// averaged over the pairs as Trainer's `evaluate` averages `eval_loss` (each batch's loss weighted by its size).
    public func loss(on dataset: ImageTextDataset, batchSize: Int) throws -> Float {
        guard batchSize > 0 else { throw ModelError.invalidInput("the batch size must be positive") }
        let images = try BatchImages(dataset, pipeline: self)
        var total = 0.0
        for start in stride(from: 0, to: dataset.pairs.count, by: batchSize) {
            let batch = Array(start..<min(start + batchSize, dataset.pairs.count))
            let texts = try textInputs(batch.map { dataset.pairs[$0].text }, zeroShot: false)
            let loss = try training.loss(images: images(batch), inputIds: texts.ids, attentionMask: texts.attentionMask)
            total += Double(loss) * Double(batch.count)
        }
        return Float(total / Double(dataset.pairs.count))
    }

    /// Writes the trained checkpoint (``ImageTextContrastiveTraining/save(to:)``).
    public func save(to directory: URL) throws {
        try training.save(to: directory)
    }

    /// A batch's images: a frozen tower's outputs, each distinct file decoded and encoded once (32 at a time) before
    /// training; otherwise the batch's files decoded and processed each time it comes.
    private struct BatchImages {
        let dataset: ImageTextDataset
        let pipeline: ContrastiveTrainingPipeline
        /// Every pair's encoded image `[pairs, width]`, when the image tower is frozen.
        let encoded: Tensor?

        init(_ dataset: ImageTextDataset, pipeline: ContrastiveTrainingPipeline) throws {
            (self.dataset, self.pipeline) = (dataset, pipeline)
            guard pipeline.training.encodesImagesOnce else {
                encoded = nil
                return
            }
            var files: [URL] = []
            var index: [URL: Int] = [:]
            for pair in dataset.pairs where index[pair.image] == nil {
                index[pair.image] = files.count
                files.append(pair.image)
            }
            var rows: [Float] = []
            var width = 0
            for start in stride(from: 0, to: files.count, by: 32) {
                let images = try files[start..<min(start + 32, files.count)].map { try ImageDecoder.decode(contentsOf: $0) }
                let outputs = try pipeline.training.encodedImages(pipeline.imageProcessor.preprocess(images))
                (rows, width) = (rows + outputs.scalars, outputs.shape[1])
            }
            encoded = embedding(Tensor(shape: [files.count, width], scalars: rows), ids: dataset.pairs.map { index[$0.image]! })
        }

        func callAsFunction(_ batch: [Int]) throws -> ContrastiveImages {
            if let encoded { return .encoded(embedding(encoded, ids: batch)) }
            let images = try batch.map { try ImageDecoder.decode(contentsOf: dataset.pairs[$0].image) }
            return .pixels(try pipeline.imageProcessor.preprocess(images))
        }
    }
}
