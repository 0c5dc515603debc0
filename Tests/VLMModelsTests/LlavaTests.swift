import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// Tiny random-init LLaVA checkpoints written by oracle/llava.py, with what transformers computed on them: the first
/// request's pixel values, image features and prompt logits, and every request's greedy and 3-beam continuation.
struct LlavaFixture {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int] }
        struct Request: Decodable {
            let input_ids: [Int]
            let greedy: Generated
            let beam: Generated
        }
        let max_new_tokens: Int
        let image_token_index: Int
        let pixel_values: [[[[Float]]]]
        let image_features: [[Float]]
        let logits_head: [[[Float]]]
        let last_top_ids: [Int]
        let last_top_logits: [Float]
        let requests: [Request]
    }

    static let names = ["llama-default-fp16", "qwen2-layers-full-bf16"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/llava")

    let directory: URL
    let model: LlavaForConditionalGeneration
    let expected: Expected

    init(_ name: String) throws {
        directory = Self.root.appendingPathComponent(name)
        model = try LlavaForConditionalGeneration(directory: ModelDirectory(url: directory))
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
    }

    var pixelValues: Tensor {
        let image = expected.pixel_values[0]
        return Tensor(shape: [1, image.count, image[0].count, image[0][0].count], scalars: image.flatMap { $0.flatMap { $0 } })
    }

    /// The checkpoint's generation_config.json (eos and pad as transformers used them), greedy or 3-beam.
    func generationConfig(beams: Int) throws -> GenerationConfig {
        var config = try GenerationConfig.load(directory: directory)
        config.maxNewTokens = expected.max_new_tokens
        config.doSample = false
        config.numBeams = beams
        return config
    }
}

@Suite struct LlavaTests {
    static let tolerance: Float = 1e-4

    @Test(arguments: LlavaFixture.names)
    func imageFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try LlavaFixture(name)
        let features = try fixture.model.imageEmbeddings(pixelValues: fixture.pixelValues)
        let expected = fixture.expected.image_features
        #expect(features.shape == [1, expected.count, expected[0].count])
        #expect(maxDifference(features.scalars, expected.flatMap { $0 }) < Self.tolerance, "\(name)")
    }

    @Test(arguments: LlavaFixture.names)
    func promptLogitsMatchTransformers(_ name: String) throws {
        let fixture = try LlavaFixture(name)
        let ids = fixture.expected.requests[0].input_ids
        let logits = try fixture.model.logits(pixelValues: fixture.pixelValues, inputIds: [ids])
        let vocabulary = fixture.model.vocabularySize
        #expect(logits.shape == [1, ids.count, vocabulary])
        let all = logits.scalars
        let head = fixture.expected.logits_head[0]
        let actualHead = (0..<ids.count).flatMap { position in all[(position * vocabulary)..<(position * vocabulary + head[0].count)] }
        #expect(maxDifference(Array(actualHead), head.flatMap { $0 }) < Self.tolerance, "\(name): first logits of every position")
        let last = (ids.count - 1) * vocabulary
        let top = fixture.expected.last_top_ids.map { all[last + $0] }
        #expect(maxDifference(top, fixture.expected.last_top_logits) < Self.tolerance, "\(name): the last position's largest logits")
    }

    @Test(arguments: LlavaFixture.names, [1, 3])
    func generationMatchesTransformers(_ name: String, beams: Int) throws {
        let fixture = try LlavaFixture(name)
        let request = fixture.expected.requests[0]
        let output = try fixture.model.generate(pixelValues: fixture.pixelValues, inputIds: [request.input_ids],
                                                config: fixture.generationConfig(beams: beams))
        #expect(output.sequences == [beams == 1 ? request.greedy.ids : request.beam.ids], "\(name)")
    }

    @Test func promptsMustHoldOneImageTokenPerFeatureRow() throws {
        let fixture = try LlavaFixture(LlavaFixture.names[0])
        let ids = fixture.expected.requests[0].input_ids.filter { $0 != fixture.expected.image_token_index }
        #expect(throws: ModelError.self) { try fixture.model.logits(pixelValues: fixture.pixelValues, inputIds: [ids]) }
    }

    @Test func configTakesLlavasDefaults() throws {
        let config = try JSONDecoder().decode(LlavaConfig.self, from: Data(#"{"vision_feature_layer": [-2, -5]}"#.utf8))
        #expect(config.visionConfig.hiddenSize == 1024 && config.visionConfig.imageSize == 336 && config.visionConfig.patchSize == 14)
        #expect(config.textConfig.modelType == "llama" && config.imageTokenIndex == 32000)
        #expect(config.visionFeatureLayers == [-2, -5] && config.visionFeatureSelectStrategy == "default")
        #expect(config.imageTokensPerImage == 576)
    }
}
