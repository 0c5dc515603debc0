import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTraining

@Suite struct LlavaTrainingTests {
    /// oracle/projector_alignment.py's or oracle/instruction_tuning.py's record of transformers and torch training a
    /// LLaVA fixture.
    struct Record: Decodable {
        struct Settings: Decodable {
            let learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm: Float
            let warmup_steps, steps: Int
        }
        let settings: Settings
        let photos: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let labels: [[Int]]
        let losses: [Float]
        let gradient_norms: [Float]
        let final_loss: Float
        let decayed: [String]
        /// Instruction tuning's: every trained tensor.
        let trained: [String]?
        /// Projector alignment's: the trained tensors without weight decay.
        let not_decayed: [String]?
    }

    /// The LLaVA fixtures, and LLaVA-NeXT's and LLaVA-OneVision's whose images are tiled and packed (OneVision's
    /// layers fixture shrinking its tile grids bilinearly under anyres_max_4), with chat templates.
    static let checkpoints = ["image-chat/llava-1.5", "image-chat/chatml", "llava-next/mistral-chat",
                              "llava-onevision/qwen2-smollm2-bf16", "llava-onevision/qwen2-layers-chat"]

    /// Projector alignment: every step's loss and gradient norm, the first step's gradients and the parameters after
    /// the last step, against torch's autograd through the frozen language model (a Llama decoder with grouped-query
    /// attention and projector biases; Qwen2 decoders with q/k/v biases, one reading three vision layers without
    /// projector biases; a Mistral one reading two of LLaVA-NeXT's tiled CLIP layers) and AdamW as Trainer steps it,
    /// on a right-padded batch of two chat-templated conversations about a photo each.
    @Test(arguments: checkpoints)
    func projectorAlignmentMatchesTransformers(checkpoint: String) throws {
        try trainAsRecorded(checkpoint: checkpoint, stage: .projectorAlignment, fixtures: "projector-alignment")
    }

    /// Instruction tuning: the same for the projector, every language-model weight (the Llama fixture's head tied
    /// to its token embedding, whose gradient sums both uses; the Qwen2 fixture's separate) and the tiling families'
    /// `image_newline`, on conversations of one and two exchanges whose replies alone are scored.
    @Test(arguments: checkpoints)
    func instructionTuningMatchesTransformers(checkpoint: String) throws {
        try trainAsRecorded(checkpoint: checkpoint, stage: .instructionTuning, fixtures: "instruction-tuning")
    }

    /// Instruction tuning with LoRA as PEFT runs LLaVA's recipe: from the oracle's `A` draws and zero `B`s beside the
    /// language model's q_proj, v_proj and down_proj, the projector learning whole; the merged checkpoint's loss is
    /// the adapter's.
    @Test func loraInstructionTuningMatchesPEFT() throws {
        var lora = LoraSettings()
        (lora.rank, lora.alpha, lora.targetModules) = (2, 4, ["q_proj", "v_proj", "down_proj"])
        let training = try trainAsRecorded(checkpoint: "image-chat/llava-1.5", stage: .instructionTuning,
                                           fixtures: "instruction-tuning", lora: lora)
        let merged = FileManager.default.temporaryDirectory.appendingPathComponent("llava-lora-merged-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: merged) }
        try training.save(to: merged, mergingLora: true)
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: ContrastiveTrainingFixture.fixtures.appendingPathComponent(
            "instruction-tuning/image-chat-llava-1.5-lora.json")))
        let reloaded = try LlavaTraining(directory: ModelDirectory(url: merged), stage: .projectorAlignment)
        let images = try reloaded.imageRows(ImageProcessorRegistry.load(directory: merged, modelType: "llava")
            .preprocess(record.photos.map { try ImageDecoder.decode(contentsOf: ContrastiveTrainingFixture.fixtures.appendingPathComponent($0)) }))
        let loss = try reloaded.loss(images: images, inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        #expect(abs(loss - record.final_loss) < 1e-4, "merged checkpoint's loss \(loss) against \(record.final_loss)")
    }

    @discardableResult
    private func trainAsRecorded(checkpoint: String, stage: LlavaTraining.Stage, fixtures folder: String,
                                 lora: LoraSettings? = nil) throws -> LlavaTraining {
        let fixtures = ContrastiveTrainingFixture.fixtures
        let name = checkpoint.replacingOccurrences(of: "/", with: "-") + (lora == nil ? "" : "-lora")
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: fixtures.appendingPathComponent("\(folder)/\(name).json")))
        let tensors = try SafetensorsFile(url: fixtures.appendingPathComponent("\(folder)/\(name).safetensors"))
        let directory = try ModelDirectory(url: fixtures.appendingPathComponent(checkpoint))
        let training = try LlavaTraining(directory: directory, stage: stage, lora: lora)
        if lora != nil {
            // PEFT's draws of A to start from (B starts at zero in both).
            for parameter in training.parameters where parameter.name.contains("lora_A") {
                let initial = try tensors.tensor("initial.\(parameter.name)")
                parameter.value.storage.pointer.update(from: initial.scalars, count: initial.count)
            }
        }
        #expect(training.parameters.filter(\.decays).map(\.name).sorted() == record.decayed)
        if let trained = record.trained { #expect(training.parameters.map(\.name).sorted() == trained) }
        if let notDecayed = record.not_decayed { #expect(training.parameters.filter { !$0.decays }.map(\.name).sorted() == notDecayed) }

        let processor = try ImageProcessorRegistry.load(directory: directory.url, modelType: directory.modelType)
        let pixels = try processor.preprocess(record.photos.map { try ImageDecoder.decode(contentsOf: fixtures.appendingPathComponent($0)) })
        let images = try training.imageRows(pixels)
        try expectTrainingAsRecorded(name: name, parameters: training.parameters, settings: record.settings,
                                     losses: record.losses, gradientNorms: record.gradient_norms, tensors: tensors) {
            try training.lossAndGradients(images: images, inputIds: record.input_ids,
                                          attentionMask: record.attention_mask, labels: record.labels)
        }
        let final = try training.loss(images: images, inputIds: record.input_ids, attentionMask: record.attention_mask,
                                      labels: record.labels)
        #expect(abs(final - record.final_loss) < 1e-4, "\(name): final loss \(final) against \(record.final_loss)")
        return training
    }
}

/// Steps `parameters` as oracle/projector_alignment.py's `trainer_steps` did (AdamW under `settings`, one batch each
/// step through `lossAndGradients`) and expects its record: every step's loss and gradient norm, the first step's
/// gradients (`gradient.<name>` in `tensors`) and the parameters after the last step (`trained.<name>`) within 1e-4.
func expectTrainingAsRecorded(name: String, parameters: [Parameter], settings recorded: LlavaTrainingTests.Record.Settings,
                              losses: [Float], gradientNorms: [Float], tensors: SafetensorsFile,
                              lossAndGradients: () throws -> Float) throws {
    var settings = TrainingSettings()
    settings.learningRate = recorded.learning_rate
    settings.weightDecay = recorded.weight_decay
    settings.maxGradientNorm = recorded.max_grad_norm
    settings.warmupSteps = recorded.warmup_steps
    let optimizer = AdamW(parameters: parameters, settings: settings, totalSteps: recorded.steps)
    for step in 0..<recorded.steps {
        let loss = try lossAndGradients()
        #expect(abs(loss - losses[step]) < 1e-4, "\(name) step \(step): loss \(loss) against \(losses[step])")
        if step == 0 {
            for parameter in parameters {
                let expected = try tensors.tensor("gradient.\(parameter.name)")
                let gradient = try #require(parameter.gradient)
                let difference = zip(gradient.scalars, expected.scalars).map { abs($0 - $1) }.max() ?? 0
                #expect(gradient.shape == expected.shape && difference < 1e-4, "\(name): gradient of \(parameter.name) off by \(difference) (largest \(expected.scalars.map(abs).max() ?? 0))")
            }
        }
        let norm = optimizer.step()
        #expect(abs(norm - gradientNorms[step]) < 1e-4 * max(1, gradientNorms[step]),
                "\(name) step \(step): gradient norm \(norm) against \(gradientNorms[step])")
    }
    try expectTrainedAsRecorded(name: name, parameters: parameters, tensors: tensors, learningRate: recorded.learning_rate,
                                steps: recorded.steps)
}

/// Expects every parameter as the record has it after training (`trained.<name>` in `tensors`) within 1e-4, but for
/// the elements whose first gradient (`gradient.<name>`) is tiny.
///
/// AdamW divides each element's running gradient by its own running magnitude: where the gradient is tiny, the step
/// is a ratio of two tiny numbers carrying fp32 summation-order error of a few percent in either implementation, and
/// may differ by a part of the learning rate each step. Such are the elements whose first gradient is under 1e-6 but
/// not zero (a few in a whole model, by chance; an unused token's embedding row is zero, not tiny), and those
/// `alsoTiny` names for a parameter of its count (the key projections' biases, whose gradient is rounding noise);
/// they are held to steps × learning rate, and those that need it (off by more than 1e-4) must be under 1% of the
/// elements (a language model has many more tiny first gradients, the head's for tokens the batch never predicts,
/// nearly all within 1e-4).
func expectTrainedAsRecorded(name run: String, parameters: [Parameter], tensors: SafetensorsFile, learningRate: Float,
                             steps: Int, alsoTiny: (_ name: String, _ count: Int) -> Range<Int> = { _, _ in 0..<0 }) throws {
    let smallGradientTolerance = learningRate * Float(steps)
    var (elements, widened) = (0, 0)
    for parameter in parameters {
        let expected = try tensors.tensor("trained.\(parameter.name)").scalars
        let firstGradient = try tensors.tensor("gradient.\(parameter.name)").scalars
        let noise = alsoTiny(parameter.name, firstGradient.count)
        #expect(noise.allSatisfy { abs(firstGradient[$0]) < 1e-6 }, "\(run): \(parameter.name)")
        var worst: (difference: Float, tolerance: Float) = (0, 1e-4)
        for (index, (value, target)) in zip(parameter.value.scalars, expected).enumerated() {
            let small = noise.contains(index) || (firstGradient[index] != 0 && abs(firstGradient[index]) < 1e-6)
            widened += small && abs(value - target) >= 1e-4 ? 1 : 0
            let tolerance = small ? max(smallGradientTolerance, 1e-4) : 1e-4
            if abs(value - target) / tolerance > worst.difference / worst.tolerance { worst = (abs(value - target), tolerance) }
        }
        elements += expected.count
        #expect(worst.difference < worst.tolerance, "\(run): \(parameter.name) after training off by \(worst.difference) (tolerance \(worst.tolerance))")
    }
    #expect(widened * 100 < elements, "\(run): \(widened) of \(elements) elements with a first gradient under 1e-6 are off by more than 1e-4")
}

