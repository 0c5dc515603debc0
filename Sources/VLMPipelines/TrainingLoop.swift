import Foundation
import VLMModels
import VLMTensor
import VLMTraining

// transformers' Trainer's loop, which every training pipeline runs: epochs over the examples in seeded orders,
// batches, a loss and its gradients per batch, an optimizer step, a log line.

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

/// A batch's loss as a training recipe computes it, with what Trainer needs to weigh it in a step of several batches.
struct BatchLoss {
    let loss: Float
    /// The tokens the loss scored (a causal language model's labels, after the shift, that are not -100): Trainer's
    /// `num_items_in_batch` counts them over a step's batches and divides each batch's summed loss by their total.
    /// nil for a loss without labels (a contrastive one), which Trainer divides by the step's number of batches.
    let scoredTokens: Int?

    /// A language model's loss over `labels`, scored where a label after the first of its row is not -100.
    init(_ loss: Float, labels: [[Int]]) {
        self.loss = loss
        scoredTokens = labels.reduce(0) { $0 + $1.dropFirst().filter { $0 != ignoredLabel }.count }
    }

    /// A loss without labels.
    init(_ loss: Float) {
        (self.loss, scoredTokens) = (loss, nil)
    }
}

/// Token sequences and their labels right-padded to the longest (with `padding`, and -100 labels), with their
/// attention mask: a training batch as transformers' collators lay it out with `padding_side="right"`.
func rightPadded(_ examples: [(ids: [Int], labels: [Int])], padding: Int) -> (ids: [[Int]], attentionMask: [[Int]], labels: [[Int]]) {
    let length = examples.map(\.ids.count).max() ?? 0
    func padded(_ row: [Int], with value: Int) -> [Int] { row + Array(repeating: value, count: length - row.count) }
    return (examples.map { padded($0.ids, with: padding) },
            examples.map { padded(Array(repeating: 1, count: $0.ids.count), with: 0) },
            examples.map { padded($0.labels, with: ignoredLabel) })
}

/// Trainer's loop over `examples` examples: each epoch in an order drawn from `settings.shuffleSeed` (a permutation of
/// its own, not torch's) or as given, batches of `settings.batchSize` (an epoch's last may be short, as Trainer's data
/// loader leaves it), `lossAndGradients` setting the parameters' gradients for a batch's example indices, then
/// ``AdamW/step()`` and `log`, until `settings.totalSteps(examples:)` steps are taken. With gradient accumulation each
/// step sums the gradients of up to `settings.gradientAccumulationSteps` batches of one epoch, weighed as Trainer
/// weighs them (``BatchLoss``), and logs the step's loss: the scored tokens' mean over its batches, or the batches'
/// mean loss.
func runTraining(examples: Int, settings: TrainingSettings, parameters: [Parameter], imageEncodingTime: Double,
                 log: (TrainingLogEntry) throws -> Void, lossAndGradients: ([Int]) throws -> BatchLoss) throws -> TrainingRun {
    guard settings.batchSize > 0, settings.gradientAccumulationSteps > 0 else {
        throw ModelError.invalidInput("the batch size and gradient accumulation steps must be positive")
    }
    // Each step's activations and gradients take the blocks the last step freed: up to an eighth of the machine's
    // memory kept for them.
    return try TensorStorage.reusingFreedBlocks(upTo: Int(min(ProcessInfo.processInfo.physicalMemory / 8, UInt64(Int.max)))) {
        try trainingSteps(examples: examples, settings: settings, parameters: parameters, imageEncodingTime: imageEncodingTime,
                          log: log, lossAndGradients: lossAndGradients)
    }
}

private func trainingSteps(examples: Int, settings: TrainingSettings, parameters: [Parameter], imageEncodingTime: Double,
                           log: (TrainingLogEntry) throws -> Void, lossAndGradients: ([Int]) throws -> BatchLoss) throws -> TrainingRun {
    let start = DispatchTime.now().uptimeNanoseconds
    var samples = 0
    let totalSteps = settings.totalSteps(examples: examples)
    let batchesPerEpoch = settings.batchesPerEpoch(examples: examples)
    let optimizer = AdamW(parameters: parameters, settings: settings, totalSteps: totalSteps)
    let accumulator = settings.gradientAccumulationSteps > 1 ? GradientAccumulator(parameters: parameters) : nil
    var generator = settings.shuffleSeed.map { SeededGenerator(seed: $0) }
    var history: [TrainingLogEntry] = []
    var order: [Int] = []
    var (epochs, batchesDone) = (-1, 0)
    while optimizer.steps < totalSteps {
        if order.isEmpty {
            order = Array(0..<examples)
            if generator != nil {
                // Fisher–Yates spelled out: the standard library's shuffle may change its algorithm between releases.
                for i in stride(from: examples - 1, to: 0, by: -1) {
                    order.swapAt(i, Int(generator!.next() % UInt64(i + 1)))
                }
            }
            (epochs, batchesDone) = (epochs + 1, 0)
        }
        var batches: [[Int]] = []
        while batches.count < settings.gradientAccumulationSteps && !order.isEmpty {
            batches.append(Array(order.prefix(settings.batchSize)))
            order.removeFirst(batches[batches.count - 1].count)
        }
        samples += batches.reduce(0) { $0 + $1.count }
        batchesDone += batches.count
        let loss: Float
        if let accumulator {
            // Each batch's gradient is of its mean loss: times its scored tokens it is of their sum, which Trainer
            // divides by the step's scored tokens; a loss without labels Trainer divides by the step's batches.
            var results: [BatchLoss] = []
            for batch in batches {
                let result = try lossAndGradients(batch)
                accumulator.add(weight: result.scoredTokens.map(Float.init) ?? 1)
                results.append(result)
            }
            let total = results.compactMap(\.scoredTokens).reduce(0, +)
            let divisor = results.allSatisfy { $0.scoredTokens != nil } ? Float(total) : Float(results.count)
            accumulator.finish(scale: 1 / divisor)
            loss = results.reduce(Float(0)) { $0 + $1.loss * ($1.scoredTokens.map(Float.init) ?? 1) } / divisor
        } else {
            loss = try lossAndGradients(batches[0]).loss
        }
        let learningRate = optimizer.learningRate
        let norm = optimizer.step()
        let entry = TrainingLogEntry(step: optimizer.steps, epoch: Double(epochs) + Double(batchesDone) / Double(batchesPerEpoch),
                                     loss: loss, gradientNorm: norm, learningRate: learningRate)
        history.append(entry)
        try log(entry)
    }
    let runtime = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
    return TrainingRun(history: history, runtime: runtime, imageEncodingTime: imageEncodingTime,
                       samplesPerSecond: Double(samples) / runtime)
}
