import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTraining

/// oracle/lit.py's record of transformers and torch training a CLIP or SigLIP fixture's text side on its four photos
/// and labels.
struct LiTFixture {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    struct Record: Decodable {
        struct Settings: Decodable {
            let learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm: Float
            let warmup_steps, steps: Int
        }
        let settings: Settings
        /// The captions as the model's processor tokenizes them for training.
        let input_ids: [[Int]]
        let attention_mask: [[Int]]?
        let losses: [Float]
        let gradient_norms: [Float]
        let final_loss: Float
        let decayed: [String]
        let not_decayed: [String]
    }

    struct Inputs: Decodable {
        let photos: [String]
    }

    let name: String
    let checkpoint: ModelDirectory
    let record: Record
    /// `gradient.<name>`: the first step's gradients; `trained.<name>`: the parameters after the last step.
    let tensors: SafetensorsFile
    let inputs: Inputs
    /// The fixture's photos through its checkpoint's image processor.
    let images: ProcessedImages

    /// - Parameter name: the checkpoint under Tests/Fixtures, e.g. "clip/tiny-quickgelu-argmax".
    init(_ name: String) throws {
        self.name = name
        let directory = Self.fixtures.appendingPathComponent(name)
        checkpoint = try ModelDirectory(url: directory)
        let lit = Self.fixtures.appendingPathComponent("lit/" + name.replacingOccurrences(of: "/", with: "-"))
        record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: lit.appendingPathExtension("json")))
        tensors = try SafetensorsFile(url: lit.appendingPathExtension("safetensors"))
        inputs = try JSONDecoder().decode(Inputs.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let processor = try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType)
        // Photos named by file are in Tests/Fixtures/photos, the others by their path under Tests/Fixtures.
        images = try processor.preprocess(inputs.photos.map {
            try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0.contains("/") ? $0 : "photos/\($0)"))
        })
    }

    var settings: TrainingSettings {
        var settings = TrainingSettings()
        settings.maxSteps = record.settings.steps
        settings.learningRate = record.settings.learning_rate
        settings.weightDecay = record.settings.weight_decay
        settings.beta1 = record.settings.adam_beta1
        settings.beta2 = record.settings.adam_beta2
        settings.epsilon = record.settings.adam_epsilon
        settings.maxGradientNorm = record.settings.max_grad_norm
        settings.warmupSteps = record.settings.warmup_steps
        return settings
    }
}

/// The largest |a − b| over two tensors of one shape (scalars stored as [1] on one side compare with shape []).
private func maxDifference(_ a: Tensor, _ b: Tensor) -> Float {
    precondition(a.count == b.count)
    return zip(a.scalars, b.scalars).map { abs($0 - $1) }.max() ?? 0
}

@Suite struct LockedImageTextTuningTests {
    static let names = ["clip/tiny-quickgelu-argmax", "clip/tiny-gelu-eos-fp16", "siglip/tiny-tanh-fp16",
                        "siglip/tiny-gelu-bf16", "siglip2/tiny-naflex-fp16"]

    /// Every step's loss and gradient norm, the first step's gradients of every text-side parameter, and the parameters
    /// after the last step, against torch's autograd and AdamW under transformers' Trainer's grouping, clipping and
    /// schedule: CLIP's softmax loss through a causal text transformer pooled at its end-of-text token, SigLIP's and
    /// SigLIP 2's sigmoid loss with its bias through one that attends both ways and pools the last position.
    @Test(arguments: names) func trainingMatchesTransformers(name: String) throws {
        let fixture = try LiTFixture(name)
        let tuning = try LockedImageTextTuning(directory: fixture.checkpoint)
        #expect(tuning.parameters.filter(\.decays).map(\.name).sorted() == fixture.record.decayed)
        #expect(tuning.parameters.filter { !$0.decays }.map(\.name).sorted() == fixture.record.not_decayed)
        let images = try tuning.imageFeatures(fixture.images)
        let optimizer = AdamW(parameters: tuning.parameters, settings: fixture.settings, totalSteps: fixture.record.settings.steps)
        for step in 0..<fixture.record.settings.steps {
            let loss = try tuning.lossAndGradients(imageFeatures: images, inputIds: fixture.record.input_ids,
                                                   attentionMask: fixture.record.attention_mask)
            #expect(abs(loss - fixture.record.losses[step]) < 1e-4, "\(name) step \(step): loss \(loss) against \(fixture.record.losses[step])")
            if step == 0 {
                for parameter in tuning.parameters {
                    let expected = try fixture.tensors.tensor("gradient.\(parameter.name)")
                    let gradient = try #require(parameter.gradient, "\(parameter.name) has no gradient")
                    #expect(maxDifference(gradient, expected) < 1e-4, "\(name): gradient of \(parameter.name) off by \(maxDifference(gradient, expected))")
                }
            }
            let norm = optimizer.step()
            let expectedNorm = fixture.record.gradient_norms[step]
            #expect(abs(norm - expectedNorm) < 1e-4 * max(1, expectedNorm), "\(name) step \(step): gradient norm \(norm) against \(expectedNorm)")
        }
        for parameter in tuning.parameters {
            let expected = try fixture.tensors.tensor("trained.\(parameter.name)")
            // The key projections' biases shift every score of a query's row alike, which the softmax cancels: their
            // gradient is zero but for rounding (under 1e-8 here, in both), and AdamW, dividing the noise by its own
            // running magnitude, moves them by up to the learning rate each step in either implementation.
            let roundingOnly = try fixture.tensors.tensor("gradient.\(parameter.name)").scalars.allSatisfy { abs($0) < 1e-6 }
            let tolerance = roundingOnly ? fixture.settings.learningRate * Float(fixture.record.settings.steps) : 1e-4
            #expect(roundingOnly == parameter.name.hasSuffix("k_proj.bias"), "\(name): \(parameter.name)")
            #expect(maxDifference(parameter.value, expected) < tolerance, "\(name): \(parameter.name) after training off by \(maxDifference(parameter.value, expected))")
        }
        let final = try tuning.loss(imageFeatures: images, inputIds: fixture.record.input_ids,
                                    attentionMask: fixture.record.attention_mask)
        #expect(abs(final - fixture.record.final_loss) < 1e-4, "\(name): final loss \(final) against \(fixture.record.final_loss)")
    }
}
