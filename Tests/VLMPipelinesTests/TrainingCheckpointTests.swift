import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMPipelines
import VLMTraining

/// Trainer's checkpoints: a run resumed from one takes the same steps as the run that never stopped.
@Suite struct TrainingCheckpointTests {
    let output = FileManager.default.temporaryDirectory.appendingPathComponent("checkpoints-\(UUID().uuidString)")

    /// Three epochs of four pairs, a batch each and two batches a step, shuffled: six steps, a checkpoint every
    /// three. Resumed from checkpoint-3 (the middle of the second epoch's order), a fresh pipeline logs the first run's
    /// six steps exactly (the first three from trainer_state.json) and ends with the same parameters; the checkpoint
    /// holds the model, the training state and Trainer's state file.
    @Test func aResumedRunTakesTheStepsOfOneThatNeverStopped() throws {
        defer { try? FileManager.default.removeItem(at: output) }
        let dataset = try CaptionedPhotoDataset(checkpoint: "clip/tiny-quickgelu-argmax")
        let pairs = try ImageTextDataset(directory: dataset.url)
        let checkpoint = CaptionedPhotoDataset.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
        var settings = TrainingSettings()
        (settings.batchSize, settings.gradientAccumulationSteps, settings.epochs) = (1, 2, 3)
        (settings.learningRate, settings.warmupSteps, settings.shuffleSeed) = (1e-3, 2, 7)

        let whole = try ContrastiveTrainingPipeline(directory: checkpoint, frozen: [])
        let checkpoints = TrainingCheckpoints(directory: output, saveSteps: 3) { try whole.save(to: $0) }
        let uninterrupted = try whole.train(pairs, settings: settings, checkpoints: checkpoints)
        #expect(uninterrupted.history.map(\.step) == Array(1...6))
        let third = output.appendingPathComponent("checkpoint-3")
        for file in ["config.json", "model.safetensors", TrainingCheckpoints.trainingStateFile, TrainingCheckpoints.trainerStateFile] {
            #expect(FileManager.default.fileExists(atPath: third.appendingPathComponent(file).path), "\(file)")
        }

        let resumed = try ContrastiveTrainingPipeline(directory: checkpoint, frozen: [])
        let run = try resumed.train(pairs, settings: settings, checkpoints: TrainingCheckpoints(
            directory: output.appendingPathComponent("resumed"), saveSteps: nil, resumeFrom: third) { try resumed.save(to: $0) })
        #expect(run.history == uninterrupted.history)
        for (parameter, expected) in zip(resumed.training.parameters, whole.training.parameters) {
            #expect(parameter.value.scalars == expected.value.scalars, "\(parameter.name)")
        }

        // Another batch size is another run: one line naming the checkpoint's state file.
        settings.batchSize = 2
        let error = try #require(throws: ModelError.self) {
            try resumed.train(pairs, settings: settings, checkpoints: TrainingCheckpoints(
                directory: output, saveSteps: nil, resumeFrom: third) { _ in })
        }
        #expect("\(error)".contains("trainer_state.json: a run of 6 steps of batch size 1 wrote this checkpoint; this run is 3 steps of batch size 2"),
                "\(error)")
    }
}
