import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

/// Tiny random-init LLaVA-OneVision checkpoints written by oracle/llava_onevision.py (SigLIP towers, Qwen2 language
/// models; anyres_max_9 and anyres_max_4), with what transformers computed on real photos of different aspect
/// ratios: each image's packed features (tiled, shrunk where the grid is large; read whole where a prompt holds two
/// images), logits and the greedy continuation.
struct LlavaOnevisionFixture {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int] }
        struct Request: Decodable {
            let images: [String]
            let input_ids: [Int]
            let image_sizes: [[Int]]
            let batch_num_images: [Int]
            let pixel_shape: [Int]
            let num_image_tokens: [Int]
            let image_features: [[[Float]]]
            let logits_positions: [Int]
            let logits: [[Float]]
            let greedy: Generated
        }
        let max_new_tokens: Int
        let image_token_index: Int
        /// The vocabulary entries the logits cover (all of them when absent).
        let logits_vocabulary: Int?
        let requests: [Request]
    }

    static let names = ["qwen2-smollm2-bf16", "qwen2-layers-fp16"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    let directory: URL
    let model: LlavaOnevisionForConditionalGeneration
    let expected: Expected

    init(_ name: String) throws {
        directory = Self.fixtures.appendingPathComponent("llava-onevision/\(name)")
        model = try LlavaOnevisionForConditionalGeneration(directory: ModelDirectory(url: directory))
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
    }

    /// A request's photos as one sample's images through the checkpoint's image processor (LlavaOnevisionImageProcessorTests
    /// checks its pixels on this config).
    func images(_ request: Expected.Request) throws -> ProcessedImages {
        let processor = try #require(try ImageProcessorRegistry.load(directory: directory) as? LlavaOnevisionImageProcessor)
        let images = try request.images.map { try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0)) }
        let processed = try processor.preprocess(conversation: images)
        #expect(processed.pixelValues.shape == request.pixel_shape)
        #expect(processed.imageSizes.map { [$0.height, $0.width] } == request.image_sizes)
        #expect(request.batch_num_images == [images.count])
        return processed
    }

    func generationConfig() throws -> GenerationConfig {
        var config = try GenerationConfig.load(directory: directory)
        config.maxNewTokens = expected.max_new_tokens
        config.doSample = false
        return config
    }
}

@Suite struct LlavaOnevisionTests {
    static let tolerance: Float = 1e-4

    @Test(arguments: LlavaOnevisionFixture.names)
    func imageFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try LlavaOnevisionFixture(name)
        for request in fixture.expected.requests {
            let features = try fixture.model.imageFeatures(fixture.images(request))
            #expect(features.map { $0.shape[0] } == request.num_image_tokens, "\(name) \(request.images)")
            for (actual, expected) in zip(features, request.image_features) {
                #expect(actual.shape == [expected.count, expected[0].count])
                #expect(maxDifference(actual.scalars, expected.flatMap { $0 }) < Self.tolerance, "\(name) \(request.images)")
            }
        }
    }

    @Test(arguments: LlavaOnevisionFixture.names)
    func logitsMatchTransformers(_ name: String) throws {
        let fixture = try LlavaOnevisionFixture(name)
        let vocabulary = fixture.model.vocabularySize
        let compared = fixture.expected.logits_vocabulary ?? vocabulary
        for request in fixture.expected.requests {
            let logits = try fixture.model.logits(images: fixture.images(request), inputIds: [request.input_ids])
            #expect(logits.shape == [1, request.input_ids.count, vocabulary])
            let all = logits.scalars
            for (position, expected) in zip(request.logits_positions, request.logits) {
                let row = Array(all[(position * vocabulary)..<(position * vocabulary + compared)])
                #expect(maxDifference(row, expected) < Self.tolerance, "\(name) \(request.images) position \(position)")
            }
        }
    }

    /// One image through the protocol's path (image embeddings computed once, then generate); two images, read whole,
    /// through their features kept per image.
    @Test(arguments: LlavaOnevisionFixture.names)
    func greedyContinuationsMatchTransformers(_ name: String) throws {
        let fixture = try LlavaOnevisionFixture(name)
        let config = try fixture.generationConfig()
        for request in fixture.expected.requests {
            let images = try fixture.images(request)
            let output: GenerationOutput
            if request.images.count == 1 {
                output = try fixture.model.generate(imageEmbeddings: fixture.model.imageEmbeddings(images),
                                                    inputIds: [request.input_ids], config: config)
            } else {
                let embeds = try fixture.model.inputsEmbeds(inputIds: [request.input_ids],
                                                            imageFeatures: fixture.model.imageFeatures(images))
                output = try fixture.model.languageModel.generate(inputsEmbeds: embeds, promptIds: [request.input_ids], config: config)
            }
            #expect(output.sequences == [request.greedy.ids], "\(name) \(request.images)")
        }
    }

    @Test func wrongInputsAreErrors() throws {
        let fixture = try LlavaOnevisionFixture("qwen2-layers-fp16")
        let single = try #require(fixture.expected.requests.first { $0.images.count == 1 })
        let pair = try #require(fixture.expected.requests.first { $0.images.count == 2 })
        let images = try fixture.images(single)
        let withoutImageTokens = single.input_ids.filter { $0 != fixture.expected.image_token_index }
        #expect(throws: ModelError.self) { try fixture.model.logits(images: images, inputIds: [withoutImageTokens]) }
        #expect(throws: ModelError.self) { try fixture.model.imageEmbeddings(pixelValues: images.pixelValues) }
        var truncated = images
        truncated.pixelValues = sequenceSlice(images.pixelValues, 0..<1)
        #expect(throws: ModelError.self) { try fixture.model.imageFeatures(truncated) }
        // Two images read whole come to the same count and stack; tiled, they would not.
        #expect(try fixture.model.imageEmbeddings(fixture.images(pair)).shape[0] == 2)
    }

    @Test func configTakesOnevisionsDefaults() throws {
        let config = try JSONDecoder().decode(LlavaOnevisionConfig.self, from: Data("{}".utf8))
        #expect(config.imageGridPinpoints.count == 36 && config.imageGridPinpoints[1] == ImageSize(height: 384, width: 768))
        #expect(config.visionConfig.imageSize == 384 && config.visionConfig.patchSize == 14 && config.visionConfig.hiddenSize == 1152)
        #expect(config.visionConfig.numHiddenLayers == 26 && !config.visionConfig.visionUseHead)
        #expect(config.textConfig.modelType == "qwen2" && config.imageTokenIndex == 151646 && !config.tieWordEmbeddings)
        #expect(config.visionFeatureLayers == [-1] && config.visionFeatureSelectStrategy == "full")
        #expect(config.visionAspectRatio == "anyres_max_9" && config.maxNumPatches == 9)
        #expect(LlavaOnevisionConfig.maxNumPatches("anyres") == nil)
        // The text config's tie_word_embeddings ties the head, as LlavaOnevisionConfig carries it up.
        let tied = try JSONDecoder().decode(LlavaOnevisionConfig.self,
                                            from: Data(#"{"text_config": {"model_type": "qwen2", "tie_word_embeddings": true}}"#.utf8))
        #expect(tied.tieWordEmbeddings)
    }

    @Test func unsupportedConfigsAreOneLineErrors() throws {
        let fixture = try LlavaOnevisionFixture("qwen2-smollm2-bf16")
        let weights = Weights(try WeightStore(directory: fixture.directory))
        var withDefault = fixture.model.config
        withDefault.visionFeatureSelectStrategy = "default"
        var offGrid = fixture.model.config
        offGrid.imageGridPinpoints = [ImageSize(height: 30, width: 60)]
        var aspect = fixture.model.config
        aspect.visionAspectRatio = "anyres"
        for config in [withDefault, offGrid, aspect] {
            let error = try #require(throws: ModelError.self) { try LlavaOnevisionForConditionalGeneration(config: config, weights: weights) }
            #expect(error.description.hasPrefix("config.json: ") && !error.description.contains("\n"))
        }
    }
}
