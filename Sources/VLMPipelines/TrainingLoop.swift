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
/// ``AdamW/step()`` and `log`, until `settings.totalSteps(examples:)` steps are taken.
func runTraining(examples: Int, settings: TrainingSettings, parameters: [Parameter], imageEncodingTime: Double,
                 log: (TrainingLogEntry) -> Void, lossAndGradients: ([Int]) throws -> Float) throws -> TrainingRun {
    guard settings.batchSize > 0 else { throw ModelError.invalidInput("the batch size must be positive") }
    // Each step's activations and gradients take the blocks the last step freed: up to an eighth of the machine's
    // memory kept for them.
    return try TensorStorage.reusingFreedBlocks(upTo: Int(min(ProcessInfo.processInfo.physicalMemory / 8, UInt64(Int.max)))) {
        try trainingSteps(examples: examples, settings: settings, parameters: parameters, imageEncodingTime: imageEncodingTime,
                          log: log, lossAndGradients: lossAndGradients)
    }
}

private func trainingSteps(examples: Int, settings: TrainingSettings, parameters: [Parameter], imageEncodingTime: Double,
                           log: (TrainingLogEntry) -> Void, lossAndGradients: ([Int]) throws -> Float) throws -> TrainingRun {
    let start = DispatchTime.now().uptimeNanoseconds
    var samples = 0
    let totalSteps = settings.totalSteps(examples: examples)
    let stepsPerEpoch = (examples + settings.batchSize - 1) / settings.batchSize
    let optimizer = AdamW(parameters: parameters, settings: settings, totalSteps: totalSteps)
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
        let loss = try lossAndGradients(batch)
        let learningRate = optimizer.learningRate
        let norm = optimizer.step()
        let entry = TrainingLogEntry(step: optimizer.steps, epoch: Double(optimizer.steps) / Double(stepsPerEpoch),
                                     loss: loss, gradientNorm: norm, learningRate: learningRate)
        history.append(entry)
        log(entry)
    }
    let runtime = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
    return TrainingRun(history: history, runtime: runtime, imageEncodingTime: imageEncodingTime,
                       samplesPerSecond: Double(samples) / runtime)
}
