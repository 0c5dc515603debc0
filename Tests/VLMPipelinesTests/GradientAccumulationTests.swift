import Foundation
import Testing
import VLMCheckpoint
import VLMPipelines
import VLMTensor
import VLMTraining

/// Gradient accumulation against transformers' own `Trainer.train()` (oracle/gradient_accumulation.py): every step's
/// logged loss, gradient norm, learning rate and epoch, and every parameter after the last step.
@Suite struct GradientAccumulationTests {
    struct Record: Decodable {
        struct Settings: Decodable {
            let learning_rate, weight_decay, max_grad_norm: Float
            let warmup_steps, batch_size, gradient_accumulation_steps, epochs: Int
        }
        struct Step: Decodable {
            let step: Int
            let epoch: Double
            let loss, grad_norm, learning_rate: Float
        }
        let settings: Settings
        let log_history: [Step]
        let conversations: [[[String: String]]]?

        var trainingSettings: TrainingSettings {
            var settings = TrainingSettings()
            settings.learningRate = self.settings.learning_rate
            settings.weightDecay = self.settings.weight_decay
            settings.maxGradientNorm = self.settings.max_grad_norm
            settings.warmupSteps = self.settings.warmup_steps
            settings.batchSize = self.settings.batch_size
            settings.gradientAccumulationSteps = self.settings.gradient_accumulation_steps
            settings.epochs = self.settings.epochs
            settings.shuffleSeed = nil
            return settings
        }
    }

    static let fixtures = CaptionedPhotoDataset.fixtures

    static func record(_ name: String) throws -> (Record, SafetensorsFile) {
        let base = fixtures.appendingPathComponent("gradient-accumulation/\(name)")
        return (try JSONDecoder().decode(Record.self, from: Data(contentsOf: base.appendingPathExtension("json"))),
                try SafetensorsFile(url: base.appendingPathExtension("safetensors")))
    }

    static func expectAsRecorded(_ run: TrainingRun, _ record: Record, parameters: [Parameter], tensors: SafetensorsFile) throws {
        #expect(run.history.map(\.step) == record.log_history.map(\.step))
        for (entry, expected) in zip(run.history, record.log_history) {
            #expect(abs(entry.epoch - expected.epoch) < 1e-9, "step \(entry.step): epoch \(entry.epoch) against \(expected.epoch)")
            #expect(abs(entry.loss - expected.loss) < 1e-4, "step \(entry.step): loss \(entry.loss) against \(expected.loss)")
            #expect(abs(entry.gradientNorm - expected.grad_norm) < 1e-4 * max(1, expected.grad_norm),
                    "step \(entry.step): norm \(entry.gradientNorm) against \(expected.grad_norm)")
            #expect(abs(entry.learningRate - expected.learning_rate) <= 1e-6 * expected.learning_rate,
                    "step \(entry.step): learning rate \(entry.learningRate) against \(expected.learning_rate)")
        }
        // As in VLMTrainingTests' contrastive runs: AdamW turns the few-percent summation-order differences of tiny
        // gradients (the key projections' biases' rounding noise, and by chance a few more, under 1e-6 in the first
        // step) into steps of up to the learning rate; those elements are held to steps × learning rate.
        let smallGradientTolerance = record.settings.learning_rate * Float(record.log_history.count)
        var (elements, widened) = (0, 0)
        for parameter in parameters {
            let expected = try tensors.tensor("trained.\(parameter.name)").scalars
            let firstGradient = try tensors.tensor("gradient.\(parameter.name)").scalars
            let isKeyBias = parameter.name.hasSuffix("k_proj.bias")
            elements += expected.count
            for (index, (value, target)) in zip(parameter.value.scalars, expected).enumerated() {
                let small = isKeyBias || (firstGradient[index] != 0 && abs(firstGradient[index]) < 1e-6)
                widened += small && abs(value - target) >= 1e-4 ? 1 : 0
                guard abs(value - target) >= (small ? smallGradientTolerance : 1e-4) else { continue }
                Issue.record("\(parameter.name)[\(index)] after training \(value) against \(target)")
                break
            }
        }
        #expect(widened * 100 < elements, "\(widened) of \(elements) elements needed the wider tolerance")
    }

    /// A causal language model: each batch's summed token losses over the step's scored tokens (Trainer's
    /// `num_items_in_batch`), two one-conversation batches a step of very different lengths, an epoch of five batches
    /// ending in a step of one.
    @Test func languageModelStepsWeighBatchesByTheirScoredTokens() throws {
        let (record, tensors) = try Self.record("sft-qwen2-chatml")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("accumulation-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let lines = try (record.conversations ?? []).map {
            String(decoding: try JSONSerialization.data(withJSONObject: ["messages": $0]), as: UTF8.self)
        }
        let file = directory.appendingPathComponent("train.jsonl")
        try lines.joined(separator: "\n").write(to: file, atomically: true, encoding: .utf8)
        let pipeline = try SupervisedFineTuningPipeline(directory: Self.fixtures.appendingPathComponent("sft/qwen2-chatml"))
        let run = try pipeline.train(ConversationDataset(file: file), settings: record.trainingSettings)
        try Self.expectAsRecorded(run, record, parameters: pipeline.training.parameters, tensors: tensors)
    }

    /// A contrastive loss, without labels: each batch's loss over the step's number of batches, the one step of each
    /// epoch short of the three batches asked for.
    @Test func contrastiveStepsAverageTheirBatches() throws {
        let (record, tensors) = try Self.record("clip-tiny-quickgelu-argmax")
        let data = try CaptionedPhotoDataset(checkpoint: "clip/tiny-quickgelu-argmax")
        let pipeline = try ContrastiveTrainingPipeline(directory: Self.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax"))
        let run = try pipeline.train(ImageTextDataset(directory: data.url), settings: record.trainingSettings)
        try Self.expectAsRecorded(run, record, parameters: pipeline.training.parameters, tensors: tensors)
    }
}
