import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

/// Tiny random-init LLaVA-NeXT checkpoints written by oracle/llava_next.py (a Llama and a Mistral language model),
/// with what transformers computed on real photos of different aspect ratios: each image's packed features, logits
/// at image-token positions and the last, and the greedy continuation; one request holds two images.
struct LlavaNextFixture {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int] }
        struct Request: Decodable {
            let images: [String]
            let input_ids: [Int]
            let image_sizes: [[Int]]
            let pixel_shape: [Int]
            let num_image_tokens: [Int]
            let image_features: [[[Float]]]
            let logits_positions: [Int]
            let logits: [[Float]]
            let greedy: Generated
        }
        let max_new_tokens: Int
        let image_token_index: Int
        let requests: [Request]
    }

    static let names = ["llama-tied-fp16", "mistral-layers-bf16"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    let directory: URL
    let model: LlavaNextForConditionalGeneration
    let expected: Expected

    init(_ name: String) throws {
        directory = Self.fixtures.appendingPathComponent("llava-next/\(name)")
        model = try LlavaNextForConditionalGeneration(directory: ModelDirectory(url: directory))
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
    }

    /// A request's photos through the checkpoint's image processor (the same pixels as transformers', as
    /// LlavaNextImageProcessorTests checks on this config).
    func images(_ request: Expected.Request) throws -> ProcessedImages {
        let processor = try ImageProcessorRegistry.load(directory: directory)
        let images = try request.images.map { try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0)) }
        let processed = try processor.preprocess(images)
        #expect(processed.pixelValues.shape == request.pixel_shape)
        #expect(processed.imageSizes.map { [$0.height, $0.width] } == request.image_sizes)
        return processed
    }

    func generationConfig() throws -> GenerationConfig {
        var config = try GenerationConfig.load(directory: directory)
        config.maxNewTokens = expected.max_new_tokens
        config.doSample = false
        return config
    }
}

@Suite struct LlavaNextTests {
    static let tolerance: Float = 1e-4

    @Test(arguments: LlavaNextFixture.names)
    func imageFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try LlavaNextFixture(name)
        for request in fixture.expected.requests {
            let features = try fixture.model.imageFeatures(fixture.images(request))
            #expect(features.map { $0.shape[0] } == request.num_image_tokens, "\(name) \(request.images)")
            for (actual, expected) in zip(features, request.image_features) {
                #expect(actual.shape == [expected.count, expected[0].count])
                #expect(maxDifference(actual.scalars, expected.flatMap { $0 }) < Self.tolerance, "\(name) \(request.images)")
            }
        }
    }

    @Test(arguments: LlavaNextFixture.names)
    func logitsMatchTransformers(_ name: String) throws {
        let fixture = try LlavaNextFixture(name)
        let vocabulary = fixture.model.vocabularySize
        for request in fixture.expected.requests {
            let logits = try fixture.model.logits(images: fixture.images(request), inputIds: [request.input_ids])
            #expect(logits.shape == [1, request.input_ids.count, vocabulary])
            let all = logits.scalars
            for (position, expected) in zip(request.logits_positions, request.logits) {
                let row = Array(all[(position * vocabulary)..<((position + 1) * vocabulary)])
                #expect(maxDifference(row, expected) < Self.tolerance, "\(name) \(request.images) position \(position)")
            }
        }
    }

    /// One image through the protocol's path (image embeddings computed once, then generate); two images of different
    /// token counts through their features kept per image.
    @Test(arguments: LlavaNextFixture.names)
    func greedyContinuationsMatchTransformers(_ name: String) throws {
        let fixture = try LlavaNextFixture(name)
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
        let fixture = try LlavaNextFixture("mistral-layers-bf16")
        let single = try #require(fixture.expected.requests.first { $0.images.count == 1 })
        let pair = try #require(fixture.expected.requests.first { $0.images.count == 2 })
        let images = try fixture.images(single)
        let withoutImageTokens = single.input_ids.filter { $0 != fixture.expected.image_token_index }
        #expect(throws: ModelError.self) { try fixture.model.logits(images: images, inputIds: [withoutImageTokens]) }
        // Pixel values alone do not say how large each image was.
        #expect(throws: ModelError.self) { try fixture.model.imageEmbeddings(pixelValues: images.pixelValues) }
        // Two images of different token counts do not stack.
        #expect(throws: ModelError.self) { try fixture.model.imageEmbeddings(fixture.images(pair)) }
        var truncated = images
        truncated.pixelValues = sequenceSlice(images.pixelValues, 0..<1)
        #expect(throws: ModelError.self) { try fixture.model.imageFeatures(truncated) }
    }

    @Test func configTakesLlavaNextsDefaults() throws {
        let config = try JSONDecoder().decode(LlavaNextConfig.self, from: Data("{}".utf8))
        #expect(config.imageGridPinpoints.map { [$0.height, $0.width] } == [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]])
        #expect(!config.tieWordEmbeddings && config.llava.visionConfig.imageSize == 336 && config.llava.imageTokenIndex == 32000)
        #expect(config.llava.visionFeatureLayers == [-2] && config.llava.visionFeatureSelectStrategy == "default")
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(LlavaNextConfig.self, from: Data(#"{"image_grid_pinpoints": [[336]]}"#.utf8))
        }
    }

    @Test func unsupportedConfigsAreOneLineErrors() throws {
        let fixture = try LlavaNextFixture("llama-tied-fp16")
        let weights = Weights(try WeightStore(directory: fixture.directory))
        var full = fixture.model.config
        full.llava.visionFeatureSelectStrategy = "full"
        var offGrid = fixture.model.config
        offGrid.imageGridPinpoints = [ImageSize(height: 30, width: 60)]
        for config in [full, offGrid] {
            let error = try #require(throws: ModelError.self) { try LlavaNextForConditionalGeneration(config: config, weights: weights) }
            #expect(error.description.hasPrefix("config.json: ") && !error.description.contains("\n"))
        }
    }
}
