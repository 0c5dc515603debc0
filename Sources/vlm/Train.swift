import ArgumentParser
import Foundation
import SwiftVLM

struct Train: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Train a checkpoint with one of transformers' training recipes.",
        subcommands: [LockedImageTextTuningCommand.self])
}

struct LockedImageTextTuningCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lit",
        abstract: "Locked-image text tuning: train a CLIP, SigLIP or SigLIP 2 checkpoint's text side on image-text pairs, its image tower frozen.",
        discussion: """
            The data is a directory laid out as datasets' imagefolder: the images and a metadata.jsonl (or \
            metadata.csv) whose file_name column names each image and whose text column holds its caption. The \
            text transformer, its projection and the logit scale (and SigLIP's logit bias) are trained by the model's \
            contrastive loss (CLIP's softmax loss, SigLIP's sigmoid loss) with AdamW as \
            transformers' Trainer does it (weight decay on all but biases and LayerNorm parameters, gradients clipped \
            to --max-grad-norm, linear schedule after --warmup-steps); the defaults are TrainingArguments'. The tuned \
            checkpoint (config, fp32 weights, tokenizer and preprocessor files) is written to --out.
            """)

    @OptionGroup var options: ModelOption

    @Option(help: "The dataset directory (imagefolder layout with metadata.jsonl or metadata.csv).")
    var data: String

    @Option(help: "The metadata column holding each image's caption.")
    var textColumn = "text"

    @Option(help: "Where to write the tuned checkpoint (a directory).")
    var out: String

    @Flag(help: "Write into --out even if it holds a checkpoint already.")
    var force = false

    @Option(help: "Pairs per step.")
    var batchSize = 8

    @Option(help: "Passes over the data.")
    var epochs = 3

    @Option(help: "Steps to take, whatever --epochs says.")
    var maxSteps: Int?

    @Option(help: "The peak learning rate.")
    var learningRate: Float = 5e-5

    @Option(help: "AdamW's decoupled weight decay.")
    var weightDecay: Float = 0

    @Option(help: "Steps over which the learning rate rises from 0.")
    var warmupSteps = 0

    @Option(help: "Clip the gradients' global norm to this (0: no clipping).")
    var maxGradNorm: Float = 1

    @Option(help: "The seed of each epoch's order of the pairs.")
    var seed: UInt64 = 42

    @Flag(help: "Keep the pairs in the metadata's order.")
    var noShuffle = false

    @Flag(help: "Print the log and the run's times as JSON at the end instead of a line per step.")
    var json = false

    func validate() throws {
        guard batchSize > 0 else { throw ValidationError("--batch-size must be positive") }
        guard epochs > 0 else { throw ValidationError("--epochs must be positive") }
        if let maxSteps, maxSteps <= 0 { throw ValidationError("--max-steps must be positive") }
        guard learningRate >= 0, weightDecay >= 0, maxGradNorm >= 0, warmupSteps >= 0 else {
            throw ValidationError("--learning-rate, --weight-decay, --max-grad-norm and --warmup-steps must not be negative")
        }
    }

    func run() async throws {
        let output = URL(fileURLWithPath: out)
        let existing = output.appendingPathComponent("config.json")
        if !force, FileManager.default.fileExists(atPath: existing.path) {
            throw TrainError.exists(existing.path)
        }
        let dataset = try ImageTextDataset(directory: URL(fileURLWithPath: data), textColumn: textColumn)
        let pipeline = try LockedImageTextTuningPipeline(directory: try await options.directory())
        var settings = TrainingSettings()
        settings.batchSize = batchSize
        settings.epochs = epochs
        settings.maxSteps = maxSteps
        settings.learningRate = learningRate
        settings.weightDecay = weightDecay
        settings.warmupSteps = warmupSteps
        settings.maxGradientNorm = maxGradNorm > 0 ? maxGradNorm : nil
        settings.shuffleSeed = noShuffle ? nil : seed
        let totalSteps = settings.totalSteps(examples: dataset.pairs.count)
        let run = try pipeline.train(dataset, settings: settings) { entry in
            guard !json else { return }
            print("step \(entry.step)/\(totalSteps)  epoch \(String(format: "%.2f", entry.epoch))  loss \(formatted(entry.loss))  grad_norm \(formatted(entry.gradientNorm))  learning_rate \(String(format: "%.3g", Double(entry.learningRate)))")
        }
        try pipeline.save(to: output)
        if json {
            try printJSON(Summary(
                log_history: run.history.map {
                    LogLine(step: $0.step, epoch: $0.epoch, loss: $0.loss, grad_norm: $0.gradientNorm, learning_rate: $0.learningRate)
                },
                train_runtime: run.runtime, train_samples_per_second: run.samplesPerSecond,
                train_steps_per_second: run.stepsPerSecond, image_encoding_runtime: run.imageEncodingTime))
        } else {
            print("train_runtime \(String(format: "%.3f", run.runtime)) s (\(String(format: "%.2f", run.stepsPerSecond)) steps/s, \(String(format: "%.1f", run.samplesPerSecond)) samples/s); images encoded in \(String(format: "%.3f", run.imageEncodingTime)) s")
            print("wrote \(out)")
        }
    }

    /// Trainer's `log_history` and closing metrics.
    private struct Summary: Encodable {
        let log_history: [LogLine]
        let train_runtime: Double
        let train_samples_per_second: Double
        let train_steps_per_second: Double
        let image_encoding_runtime: Double
    }

    private struct LogLine: Encodable {
        let step: Int
        let epoch: Double
        let loss: Float
        let grad_norm: Float
        let learning_rate: Float
    }
}

enum TrainError: Error, CustomStringConvertible {
    case exists(String)

    var description: String {
        switch self {
        case .exists(let path): "\(path) exists; pass --force to overwrite the checkpoint there"
        }
    }
}
