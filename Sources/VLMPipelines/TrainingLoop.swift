import Foundation
import VLMCheckpoint
import VLMModels
import VLMTensor
import VLMTraining

// transformers' Trainer's loop, which every training pipeline runs: epochs over the examples in seeded orders,
// batches, a loss and its gradients per batch, an optimizer step, a log line.

/// One optimizer step of a training run, as transformers' Trainer logs it (and names its fields in JSON).
public struct TrainingLogEntry: Sendable, Equatable, Codable {
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

    enum CodingKeys: String, CodingKey {
        case step, epoch, loss, gradientNorm = "grad_norm", learningRate = "learning_rate"
    }
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

/// Trainer's checkpoints of a run: where and how often it writes them (`save_steps`), and the one it continues from
/// (`resume_from_checkpoint`).
public struct TrainingCheckpoints {
    /// Where `checkpoint-STEP` directories go (Trainer's `output_dir`).
    public var directory: URL
    /// A checkpoint after every this many steps and after the last; nil: none.
    public var saveSteps: Int?
    /// Writes the model into a checkpoint directory (the pipeline's `save(to:)`).
    public var saveModel: (URL) throws -> Void
    /// A checkpoint directory a run with the same data and settings wrote, to continue from: its
    /// `trainer_state.json` gives the steps taken and their log, its `training_state.safetensors` the learning
    /// parameters and AdamW's moments; the frozen ones come from the model as loaded.
    public var resumeFrom: URL?

    public init(directory: URL, saveSteps: Int?, resumeFrom: URL? = nil, saveModel: @escaping (URL) throws -> Void) {
        (self.directory, self.saveSteps, self.resumeFrom, self.saveModel) = (directory, saveSteps, resumeFrom, saveModel)
    }

    /// The file in a checkpoint that holds the learning parameters and the optimizer's moments.
    public static let trainingStateFile = "training_state.safetensors"
    /// Trainer's file of the steps taken and their log.
    public static let trainerStateFile = "trainer_state.json"
}

/// `trainer_state.json` as transformers' `TrainerState` writes it, the fields a resumed run reads and checks.
struct TrainerState: Codable {
    let global_step: Int
    let epoch: Double
    let max_steps: Int
    let num_train_epochs: Int
    let train_batch_size: Int
    let save_steps: Int?
    let log_history: [TrainingLogEntry]
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
/// mean loss. With `checkpoints`, Trainer's checkpoints are written (the model, the training state and
/// trainer_state.json, `checkpoint-STEP`) and one is resumed from: its steps' batches skipped in the same orders, as
/// Trainer skips them, their log entries kept at the head of the run's.
func runTraining(examples: Int, settings: TrainingSettings, parameters: [Parameter], imageEncodingTime: Double,
                 checkpoints: TrainingCheckpoints?, log: (TrainingLogEntry) throws -> Void,
                 lossAndGradients: ([Int]) throws -> BatchLoss) throws -> TrainingRun {
    guard settings.batchSize > 0, settings.gradientAccumulationSteps > 0 else {
        throw ModelError.invalidInput("the batch size and gradient accumulation steps must be positive")
    }
    // Each step's activations and gradients take the blocks the last step freed: up to an eighth of the machine's
    // memory kept for them.
    return try TensorStorage.reusingFreedBlocks(upTo: Int(min(ProcessInfo.processInfo.physicalMemory / 8, UInt64(Int.max)))) {
        try trainingSteps(examples: examples, settings: settings, parameters: parameters, imageEncodingTime: imageEncodingTime,
                          checkpoints: checkpoints, log: log, lossAndGradients: lossAndGradients)
    }
}

private func trainingSteps(examples: Int, settings: TrainingSettings, parameters: [Parameter], imageEncodingTime: Double,
                           checkpoints: TrainingCheckpoints?, log: (TrainingLogEntry) throws -> Void,
                           lossAndGradients: ([Int]) throws -> BatchLoss) throws -> TrainingRun {
    let start = DispatchTime.now().uptimeNanoseconds
    var samples = 0
    let totalSteps = settings.totalSteps(examples: examples)
    let batchesPerEpoch = settings.batchesPerEpoch(examples: examples)
    let optimizer = AdamW(parameters: parameters, settings: settings, totalSteps: totalSteps)
    let accumulator = settings.gradientAccumulationSteps > 1 ? GradientAccumulator(parameters: parameters) : nil
    var generator = settings.shuffleSeed.map { SeededGenerator(seed: $0) }
    var history: [TrainingLogEntry] = []
    if let resumed = checkpoints?.resumeFrom {
        history = try resume(optimizer, from: resumed, settings: settings, totalSteps: totalSteps)
    }
    var order: [Int] = []
    var (epochs, batchesDone, stepsPlanned) = (-1, 0, 0)
    while stepsPlanned < totalSteps {
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
        batchesDone += batches.count
        stepsPlanned += 1
        // A resumed run's steps: their batches drawn and skipped.
        if stepsPlanned <= optimizer.steps { continue }
        samples += batches.reduce(0) { $0 + $1.count }
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
        if let checkpoints, let every = checkpoints.saveSteps, entry.step % every == 0 || entry.step == totalSteps {
            try saveCheckpoint(checkpoints, optimizer: optimizer, history: history, settings: settings, totalSteps: totalSteps)
        }
        try log(entry)
    }
    let runtime = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
    return TrainingRun(history: history, runtime: runtime, imageEncodingTime: imageEncodingTime,
                       samplesPerSecond: Double(samples) / runtime)
}

/// Trainer's `checkpoint-STEP` after the optimizer's latest step: the model, the training state and trainer_state.json.
private func saveCheckpoint(_ checkpoints: TrainingCheckpoints, optimizer: AdamW, history: [TrainingLogEntry],
                            settings: TrainingSettings, totalSteps: Int) throws {
    let directory = checkpoints.directory.appendingPathComponent("checkpoint-\(optimizer.steps)")
    try checkpoints.saveModel(directory)
    try optimizer.writeState(to: directory.appendingPathComponent(TrainingCheckpoints.trainingStateFile))
    let state = TrainerState(
        global_step: optimizer.steps, epoch: history.last?.epoch ?? 0, max_steps: totalSteps, num_train_epochs: settings.epochs,
        train_batch_size: settings.batchSize, save_steps: checkpoints.saveSteps, log_history: history)
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
    let file = directory.appendingPathComponent(TrainingCheckpoints.trainerStateFile)
    do {
        try encoder.encode(state).write(to: file)
    } catch {
        throw CheckpointError.unwritable(path: file.path, reason: error.localizedDescription)
    }
}

/// Restores `optimizer` from a checkpoint a run with the same settings wrote, returning the log of its steps.
private func resume(_ optimizer: AdamW, from directory: URL, settings: TrainingSettings, totalSteps: Int) throws -> [TrainingLogEntry] {
    let file = directory.appendingPathComponent(TrainingCheckpoints.trainerStateFile)
    guard let data = FileManager.default.contents(atPath: file.path) else { throw CheckpointError.missingFile(path: file.path) }
    let state: TrainerState
    do {
        state = try JSONDecoder().decode(TrainerState.self, from: data)
    } catch {
        throw CheckpointError.unreadable(file: file.path, reason: "not a trainer state: \(error)")
    }
    guard state.train_batch_size == settings.batchSize, state.max_steps == totalSteps, (0...totalSteps).contains(state.global_step) else {
        throw ModelError.invalidInput("\(file.path): a run of \(state.max_steps) steps of batch size \(state.train_batch_size) wrote this checkpoint; this run is \(totalSteps) steps of batch size \(settings.batchSize)")
    }
    try optimizer.resume(from: directory.appendingPathComponent(TrainingCheckpoints.trainingStateFile), steps: state.global_step)
    return state.log_history
}
