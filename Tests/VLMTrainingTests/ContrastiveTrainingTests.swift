import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor
import VLMTraining

/// oracle/contrastive_training.py's record of transformers and torch training a CLIP or SigLIP fixture on its four
/// photos and labels, some modules frozen.
struct ContrastiveTrainingFixture {
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
        let frozen: [String]
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

    /// - Parameter run: the record under Tests/Fixtures, e.g. "lit/clip-tiny-quickgelu-argmax" for the checkpoint
    ///   "clip/tiny-quickgelu-argmax", or "contrastive-training/clip-tiny-quickgelu-argmax-frozen-text_model".
    init(_ run: String) throws {
        name = run
        let record = Self.fixtures.appendingPathComponent(run)
        self.record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: record.appendingPathExtension("json")))
        tensors = try SafetensorsFile(url: record.appendingPathExtension("safetensors"))
        // The checkpoint's name: the record's up to its first dash is the family, the rest up to "-frozen" the fixture.
        let base = record.lastPathComponent.components(separatedBy: "-frozen-")[0]
        let family = base.prefix { $0 != "-" }
        let directory = Self.fixtures.appendingPathComponent("\(family)/\(base.dropFirst(family.count + 1))")
        checkpoint = try ModelDirectory(url: directory)
        inputs = try JSONDecoder().decode(Inputs.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let processor = try ImageProcessorRegistry.load(directory: directory, modelType: checkpoint.modelType)
        // Photos named by file are in Tests/Fixtures/photos, the others by their path under Tests/Fixtures.
        images = try processor.preprocess(inputs.photos.map {
            try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0.contains("/") ? $0 : "photos/\($0)"))
        })
    }

    var frozen: Set<ImageTextContrastiveTraining.Module> {
        Set(record.frozen.map { ImageTextContrastiveTraining.Module(rawValue: $0)! })
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

/// The elements of a parameter whose gradient is zero but for rounding: the key projections' biases (`k_proj.bias`, and
/// the key rows of SigLIP's pooling head's `in_proj_bias`) shift every score of a query's row alike, which the softmax
/// cancels.
private func keyBiasElements(_ name: String, count: Int) -> Range<Int> {
    name.hasSuffix("k_proj.bias") ? 0..<count : name.hasSuffix("in_proj_bias") ? (count / 3)..<(2 * count / 3) : 0..<0
}

@Suite struct ContrastiveTrainingTests {
    static let runs = ["lit/clip-tiny-quickgelu-argmax", "lit/clip-tiny-gelu-eos-fp16", "lit/siglip-tiny-tanh-fp16",
                       "lit/siglip-tiny-gelu-bf16", "lit/siglip2-tiny-naflex-fp16",
                       "contrastive-training/clip-tiny-quickgelu-argmax", "contrastive-training/clip-tiny-gelu-eos-fp16",
                       "contrastive-training/siglip-tiny-tanh-fp16", "contrastive-training/siglip-tiny-gelu-bf16",
                       "contrastive-training/siglip2-tiny-naflex-fp16",
                       "contrastive-training/clip-tiny-quickgelu-argmax-frozen-vision_model",
                       "contrastive-training/clip-tiny-quickgelu-argmax-frozen-text_model"]

    /// Every step's loss and gradient norm, the first step's gradients of every learning parameter, and the
    /// parameters after the last step, against torch's autograd and AdamW under transformers' Trainer's grouping,
    /// clipping and schedule: CLIP's softmax loss through a causal text transformer pooled at its end-of-text token and
    /// a vision transformer pooled at its class token, SigLIP's and SigLIP 2's sigmoid loss with its bias through a
    /// text transformer that attends both ways and pools the last position and a vision transformer pooled by its
    /// attention head (SigLIP 2's over NaFlex patches, its positions resized to each image's grid, the padding masked); LiT with the image tower frozen, run_clip.py's whole model, and each of its frozen towers.
    @Test(arguments: runs) func trainingMatchesTransformers(run: String) throws {
        let fixture = try ContrastiveTrainingFixture(run)
        let training = try ImageTextContrastiveTraining(directory: fixture.checkpoint, frozen: fixture.frozen)
        #expect(training.parameters.filter(\.decays).map(\.name).sorted() == fixture.record.decayed)
        #expect(training.parameters.filter { !$0.decays }.map(\.name).sorted() == fixture.record.not_decayed)
        let images: ContrastiveImages = try training.encodesImagesOnce ? .encoded(training.encodedImages(fixture.images)) : .pixels(fixture.images)
        let optimizer = AdamW(parameters: training.parameters, settings: fixture.settings, totalSteps: fixture.record.settings.steps)
        for step in 0..<fixture.record.settings.steps {
            let loss = try training.lossAndGradients(images: images, inputIds: fixture.record.input_ids,
                                                     attentionMask: fixture.record.attention_mask)
            #expect(abs(loss - fixture.record.losses[step]) < 1e-4, "\(run) step \(step): loss \(loss) against \(fixture.record.losses[step])")
            if step == 0 {
                for parameter in training.parameters {
                    let expected = try fixture.tensors.tensor("gradient.\(parameter.name)")
                    let gradient = try #require(parameter.gradient, "\(parameter.name) has no gradient")
                    #expect(maxDifference(gradient, expected) < 1e-4, "\(run): gradient of \(parameter.name) off by \(maxDifference(gradient, expected))")
                }
            }
            let norm = optimizer.step()
            let expectedNorm = fixture.record.gradient_norms[step]
            #expect(abs(norm - expectedNorm) < 1e-4 * max(1, expectedNorm), "\(run) step \(step): gradient norm \(norm) against \(expectedNorm)")
        }
        try expectTrainedAsRecorded(name: run, parameters: training.parameters, tensors: fixture.tensors,
                                    learningRate: fixture.settings.learningRate, steps: fixture.record.settings.steps) { name, count in
            keyBiasElements(name, count: count)
        }
        let final = try training.loss(images: images, inputIds: fixture.record.input_ids, attentionMask: fixture.record.attention_mask)
        #expect(abs(final - fixture.record.final_loss) < 1e-4, "\(run): final loss \(final) against \(fixture.record.final_loss)")
    }
}

@Suite struct ContrastiveTrainingInputTests {
    let clip = try! ContrastiveTrainingFixture("contrastive-training/clip-tiny-quickgelu-argmax")

    private func message(_ body: () throws -> Any) -> String? {
        do { _ = try body() } catch { return "\(error)" }
        return nil
    }

    /// A batch's images as the recipe takes them, as many as its texts, of the size the tower was built for: anything
    /// else is one error naming what was expected, not a crash.
    @Test func batchesOfTheWrongKindAreRefused() throws {
        let learning = try ImageTextContrastiveTraining(directory: clip.checkpoint)
        let frozen = try ImageTextContrastiveTraining(directory: clip.checkpoint, frozen: [.visionModel])
        let ids = clip.record.input_ids, mask = clip.record.attention_mask
        #expect(message { try learning.loss(images: .encoded(Tensor(zeros: [4, 32])), inputIds: ids, attentionMask: mask) }
                == "the image tower learns: pass the batch's pixels, not encoded images")
        #expect(message { try frozen.loss(images: .pixels(clip.images), inputIds: ids, attentionMask: mask) }
                == "the image tower is frozen: pass the images encoded once (encodedImages), not pixels")
        #expect(message { try learning.loss(images: .pixels(clip.images), inputIds: Array(ids.prefix(3)), attentionMask: mask.map { Array($0.prefix(3)) }) }
                == "a contrastive loss needs pairs, one image per text: got 3 texts and images [4, 32]")
        let small = ProcessedImages(pixelValues: Tensor(zeros: [4, 3, 16, 16]), imageSizes: clip.images.imageSizes)
        #expect(message { try learning.loss(images: .pixels(small), inputIds: ids, attentionMask: mask) }
                == "pixel values must be [batch, 3, 32, 32], got [4, 3, 16, 16]")
        #expect(message { try frozen.loss(images: .encoded(Tensor(zeros: [4, 7])), inputIds: ids, attentionMask: mask) }
                == "encoded images are [4, 7], not [4, 32]")
        #expect(message { try learning.loss(images: .pixels(clip.images), inputIds: ids.map { $0.map { _ in 99_999 } }, attentionMask: mask) }
                == "token id 99999 is outside the vocabulary of 1514")
    }

    @Test func siglip2TakesTheProcessorsPatchesMaskAndGrids() throws {
        let fixture = try ContrastiveTrainingFixture("contrastive-training/siglip2-tiny-naflex-fp16")
        let training = try ImageTextContrastiveTraining(directory: fixture.checkpoint)
        let (ids, mask) = (fixture.record.input_ids, fixture.record.attention_mask)
        var unmasked = fixture.images
        unmasked.pixelAttentionMask = nil
        let shape = fixture.images.pixelValues.shape
        #expect(message { try training.loss(images: .pixels(unmasked), inputIds: ids, attentionMask: mask) }
                == "SigLIP 2 vision model needs a pixel attention mask [\(shape[0]), \(shape[1])] and \(shape[0]) spatial shapes, as Siglip2ImageProcessor makes them")
        var oversized = fixture.images
        oversized.spatialShapes = Array(repeating: ImageSize(height: shape[1], width: 2), count: shape[0])
        #expect(message { try training.loss(images: .pixels(oversized), inputIds: ids, attentionMask: mask) }
                == "spatial shape \(shape[1])×2 does not fit \(shape[1]) patches")
    }

    /// A checkpoint missing a tensor, or holding one of the wrong shape, is one error naming the file and the tensor.
    @Test func malformedCheckpointsAreRefusedByName() throws {
        let source = ContrastiveTrainingFixture.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("malformed-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.copyItem(at: source.appendingPathComponent("config.json"), to: directory.appendingPathComponent("config.json"))
        let original = try WeightStore(directory: source)
        var tensors = try Dictionary(uniqueKeysWithValues: original.names.map { ($0, try original.tensor($0)) })
        tensors["vision_model.post_layernorm.weight"] = nil
        let weights = directory.appendingPathComponent("model.safetensors")
        try SafetensorsFile.write(tensors, to: weights)
        let missing = message { try ImageTextContrastiveTraining(directory: ModelDirectory(url: directory)) }
        #expect(missing?.contains("vision_model.post_layernorm.weight") == true, "\(missing ?? "no error")")
        tensors["vision_model.post_layernorm.weight"] = Tensor(zeros: [7])
        try SafetensorsFile.write(tensors, to: weights)
        let misshapen = message { try ImageTextContrastiveTraining(directory: ModelDirectory(url: directory)) }
        #expect(misshapen?.contains("vision_model.post_layernorm.weight") == true, "\(misshapen ?? "no error")")
    }
}
