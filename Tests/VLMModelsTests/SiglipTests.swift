import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels
import VLMTensor

/// A SigLIP fixture checkpoint written by oracle/siglip.py, with what transformers computed on it.
struct SiglipFixture {
    struct Expected: Decodable {
        let input_ids: [[Int]]
        /// nil where the tokenizer's model_input_names leave the mask out ("tiny-gelu-bf16").
        let attention_mask: [[Int]]?
        let prompt_ids: [[Int]]
        let prompt_mask: [[Int]]?
        let hidden_state_indices: [Int]
    }

    static let names = ["tiny-tanh-fp16", "tiny-gelu-bf16"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/siglip")

    let directory: URL
    let expected: Expected
    let tensors: SafetensorsFile

    init(_ name: String) throws {
        directory = Self.root.appendingPathComponent(name)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
    }

    func model() throws -> SiglipModel { try SiglipModel(directory: ModelDirectory(url: directory)) }

    /// A copy of the checkpoint whose config.json `edit` rewrote; the caller removes it.
    func copy(editingConfig edit: (inout [String: Any]) -> Void) throws -> URL {
        let copy = FileManager.default.temporaryDirectory.appendingPathComponent("siglip-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: copy, withIntermediateDirectories: true)
        for file in ["config.json", "model.safetensors"] {
            try FileManager.default.copyItem(at: directory.appendingPathComponent(file), to: copy.appendingPathComponent(file))
        }
        let configURL = copy.appendingPathComponent("config.json")
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: configURL)) as? [String: Any])
        edit(&config)
        try JSONSerialization.data(withJSONObject: config).write(to: configURL)
        return copy
    }
}

@Suite struct SiglipModelTests {
    @Test(arguments: SiglipFixture.names)
    func imageFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try SiglipFixture(name)
        let features = try fixture.model().imageFeatures(pixelValues: fixture.tensors.tensor("pixel_values"))
        #expect(maxAbsDifference(features, try fixture.tensors.tensor("image_embeds")) < 1e-4)
    }

    @Test(arguments: SiglipFixture.names)
    func textFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try SiglipFixture(name)
        let features = try fixture.model().textFeatures(inputIds: fixture.expected.input_ids,
                                                        attentionMask: fixture.expected.attention_mask)
        #expect(maxAbsDifference(features, try fixture.tensors.tensor("text_embeds")) < 1e-4)
    }

    @Test(arguments: SiglipFixture.names)
    func logitsPerImageMatchTransformers(_ name: String) throws {
        let fixture = try SiglipFixture(name)
        let model = try fixture.model()
        let images = try model.imageFeatures(pixelValues: fixture.tensors.tensor("pixel_values"))
        let prompts = try model.textFeatures(inputIds: fixture.expected.prompt_ids, attentionMask: fixture.expected.prompt_mask)
        let logits = model.logitsPerImage(imageFeatures: images, textFeatures: prompts)
        #expect(maxAbsDifference(logits, try fixture.tensors.tensor("logits_per_image")) < 1e-4)
        try expectContrastiveLoss(model, logitsPerImage: logits, fixture: "siglip/\(name)")
    }

    /// What a VLM reads from the tower: transformers' `hidden_states` by index, 0 the embeddings, -1 the last
    /// layer's output before post_layernorm.
    @Test(arguments: SiglipFixture.names)
    func visionHiddenStatesByTransformersIndex(_ name: String) throws {
        let fixture = try SiglipFixture(name)
        let pixels = try fixture.tensors.tensor("pixel_values")
        let first = Tensor(shape: [1] + pixels.shape.dropFirst(), scalars: Array(pixels.scalars.prefix(pixels.count / pixels.shape[0])))
        let indices = fixture.expected.hidden_state_indices
        let states = try fixture.model().vision.hiddenStates(first, at: indices)
        for (state, index) in zip(states, indices) {
            #expect(maxAbsDifference(state, try fixture.tensors.tensor("vision_hidden_states.\(index)")) < 1e-4, "index \(index)")
        }
    }

    /// A headless tower (`vision_use_head` false, as VLMs embed it) loads without `head.…` and gives the same hidden
    /// states; SiglipModel itself needs the head.
    @Test func aHeadlessTowerServesHiddenStatesOnly() throws {
        let fixture = try SiglipFixture(SiglipFixture.names[0])
        let copy = try fixture.copy { config in
            var vision = config["vision_config"] as? [String: Any] ?? [:]
            vision["vision_use_head"] = false
            config["vision_config"] = vision
        }
        defer { try? FileManager.default.removeItem(at: copy) }
        let error = try #require(throws: ModelError.self) { try SiglipModel(directory: ModelDirectory(url: copy)) }
        #expect(error.description.contains("vision_use_head"))

        let config = try ModelDirectory(url: copy).decode(SiglipConfig.self).visionConfig
        let weights = try Weights(WeightStore(directory: fixture.directory)).scoped("vision_model")
        let tower = try SiglipVisionTransformer(config, weights: weights, file: "config.json")
        #expect(tower.head == nil)
        let pixels = try fixture.tensors.tensor("pixel_values")
        let first = Tensor(shape: [1] + pixels.shape.dropFirst(), scalars: Array(pixels.scalars.prefix(pixels.count / pixels.shape[0])))
        let last = try tower.hiddenStates(first, at: [-1])[0]
        #expect(maxAbsDifference(last, try fixture.tensors.tensor("vision_hidden_states.-1")) < 1e-4)
        #expect(throws: ModelError.self) { try tower.pooledOutput(first) }
    }

    @Test func pixelValuesOfTheWrongSizeAreRefused() throws {
        let model = try SiglipFixture(SiglipFixture.names[0]).model()
        #expect(throws: ModelError.self) { try model.imageFeatures(pixelValues: Tensor(zeros: [1, 3, 33, 33])) }
    }

    @Test func textsLongerThanThePositionsAreRefused() throws {
        let model = try SiglipFixture(SiglipFixture.names[0]).model()
        let error = try #require(throws: ModelError.self) {
            try model.textFeatures(inputIds: [Array(repeating: 2, count: 65)], attentionMask: nil)
        }
        #expect(error.description.contains("max_position_embeddings 64"))
        #expect(throws: ModelError.self) { try model.textFeatures(inputIds: [[5, 99999, 2]], attentionMask: nil) }
    }

    @Test func mismatchedTowerWidthsAreAConfigError() throws {
        let fixture = try SiglipFixture(SiglipFixture.names[0])
        let copy = try fixture.copy { config in
            var text = config["text_config"] as? [String: Any] ?? [:]
            text["projection_size"] = 16
            config["text_config"] = text
        }
        defer { try? FileManager.default.removeItem(at: copy) }
        let error = try #require(throws: ModelError.self) { try SiglipModel(directory: ModelDirectory(url: copy)) }
        #expect(error.description.contains("config.json") && error.description.contains("projection_size 16"))
    }
}
