import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// A GroupViT fixture checkpoint written by oracle/groupvit.py, with what transformers computed on it.
struct GroupViTFixture {
    struct Expected: Decodable {
        let labels: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let photo_order: [String]
    }

    static let names = ["tiny-fp16", "tiny-legacy-bf16"]
    static let photos = ["landscape", "portrait", "small"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/groupvit")

    let directory: URL
    let expected: Expected
    let tensors: SafetensorsFile
    let model: GroupViTModel

    init(_ name: String) throws {
        directory = Self.root.appendingPathComponent(name)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
        model = try GroupViTModel(directory: ModelDirectory(url: directory))
    }

    func textFeatures() throws -> Tensor {
        try model.textFeatures(inputIds: expected.input_ids, attentionMask: expected.attention_mask)
    }
}

@Suite struct GroupViTTests {
    @Test(arguments: GroupViTFixture.names)
    func textFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try GroupViTFixture(name)
        #expect(worstRelativeError(try fixture.textFeatures(), try fixture.tensors.tensor("text_embeds")) < 1e-4)
    }

    /// All three photos in one batch: the grouping stages run item by item where they multiply matrices.
    @Test(arguments: GroupViTFixture.names)
    func imageFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try GroupViTFixture(name)
        let pixels = concatenate(try fixture.expected.photo_order.map { try fixture.tensors.tensor("\($0).pixel_values") }, axis: 0)
        let features = try fixture.model.imageFeatures(pixelValues: pixels)
        #expect(worstRelativeError(features, try fixture.tensors.tensor("image_embeds")) < 1e-4)
    }

    @Test(arguments: GroupViTFixture.names, GroupViTFixture.photos)
    func logitsPerImageMatchTransformers(_ name: String, photo: String) throws {
        let fixture = try GroupViTFixture(name)
        let image = try fixture.model.imageFeatures(pixelValues: fixture.tensors.tensor("\(photo).pixel_values"))
        let logits = fixture.model.logitsPerImage(imageFeatures: image, textFeatures: try fixture.textFeatures())
        #expect(worstRelativeError(logits, try fixture.tensors.tensor("\(photo).logits_per_image")) < 1e-4)
    }

    @Test(arguments: GroupViTFixture.names, GroupViTFixture.photos)
    func segmentationLogitsMatchTransformers(_ name: String, photo: String) throws {
        let fixture = try GroupViTFixture(name)
        let logits = try fixture.model.segmentationLogits(pixelValues: fixture.tensors.tensor("\(photo).pixel_values"),
                                                          conditionalEmbeddings: fixture.textFeatures())
        let expected = try fixture.tensors.tensor("\(photo).segmentation_logits")
        #expect([1] + logits.shape == expected.shape)
        #expect(worstRelativeError(logits.reshaped(expected.shape), expected) < 1e-4, "\(name) \(photo)")
    }

    /// One image per text, as CLIPSeg's callers may pass them, gives each text its map of that image.
    @Test func oneImagePerTextMatchesTransformers() throws {
        let fixture = try GroupViTFixture("tiny-legacy-bf16")
        let texts = try fixture.textFeatures()
        let pixels = try fixture.tensors.tensor("small.pixel_values")
        let logits = try fixture.model.segmentationLogits(
            pixelValues: concatenate(Array(repeating: pixels, count: texts.shape[0]), axis: 0), conditionalEmbeddings: texts)
        let expected = try fixture.tensors.tensor("small.segmentation_logits")
        #expect(worstRelativeError(logits.reshaped(expected.shape), expected) < 1e-4)
    }

    /// The 2022 layout: text_config_dict and vision_config_dict replace the stale text_config and vision_config.
    @Test func legacyConfigDictsWin() throws {
        let config = try GroupViTFixture("tiny-legacy-bf16").model.config
        #expect(config.textConfig.hiddenSize == 4 && config.textConfig.eosTokenId == 2)
        #expect(config.visionConfig.depths == [1, 1, 1] && config.visionConfig.numGroupTokens == [6, 3, 0])
        #expect(config.visionConfig.patchSize == 8 && config.visionConfig.imageSize == 48)
        #expect(config.visionConfig.assignEps == 0.5 && config.visionConfig.assignMlpRatio == [1, 2])
    }

    @Test func defaultsAreTransformers() throws {
        let config = try JSONDecoder().decode(GroupViTConfig.self, from: Data(#"{"model_type": "groupvit"}"#.utf8))
        #expect(config.projectionDim == 256 && config.projectionIntermediateDim == 4096)
        #expect(config.textConfig.hiddenSize == 256 && config.textConfig.intermediateSize == 1024)
        #expect(config.textConfig.numAttentionHeads == 4 && config.textConfig.hiddenAct == "quick_gelu")
        let vision = config.visionConfig
        #expect(vision.hiddenSize == 384 && vision.intermediateSize == 1536 && vision.numAttentionHeads == 6)
        #expect(vision.depths == [6, 3, 3] && vision.numGroupTokens == [64, 8, 0] && vision.numOutputGroups == [64, 8, 8])
        #expect(vision.imageSize == 224 && vision.patchSize == 16 && vision.hiddenAct == "gelu")
        #expect(vision.assignEps == 1 && vision.assignMlpRatio == [0.5, 4])
        let scalarRatio = try JSONDecoder().decode(GroupViTVisionConfig.self, from: Data(#"{"assign_mlp_ratio": 2}"#.utf8))
        #expect(scalarRatio.assignMlpRatio == [2, 2])
    }

    @Test func badInputsAreRefused() throws {
        let fixture = try GroupViTFixture("tiny-fp16")
        let texts = try fixture.textFeatures()
        let pixels = try fixture.tensors.tensor("small.pixel_values")
        #expect(throws: ModelError.self) {
            try fixture.model.segmentationLogits(pixelValues: concatenate([pixels, pixels], axis: 0), conditionalEmbeddings: texts)
        }
        #expect(throws: ModelError.self) {
            try fixture.model.segmentationLogits(pixelValues: pixels, conditionalEmbeddings: Tensor(zeros: [2, 5]))
        }
        // GroupViT's forward takes no other size than image_size (no position interpolation).
        #expect(throws: ModelError.self) { try fixture.model.imageFeatures(pixelValues: Tensor(zeros: [1, 3, 48, 48])) }
        #expect(throws: ModelError.self) { try fixture.model.conditionalEmbeddings(pixelValues: pixels) }
    }

    @Test func stagesThatDoNotLineUpAreRefused() throws {
        let fixture = try GroupViTFixture("tiny-fp16")
        var config = fixture.model.config
        config.visionConfig.numOutputGroups = [8]
        let weights = Weights(try WeightStore(directory: fixture.directory))
        #expect(throws: ModelError.self) { try GroupViTModel(config: config, weights: weights) }
    }
}
