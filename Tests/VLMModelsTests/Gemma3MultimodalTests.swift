import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

/// A tiny random-init Gemma 3 image chat checkpoint written by oracle/gemma3.py (SigLIP tower of 8×8 patches pooled
/// to 16 image tokens, a three-layer Gemma 3 decoder whose sliding layers' 8-token window is shorter than an image),
/// with what transformers computed on real photos: pixel values, image features, logits with the processor's
/// `token_type_ids` (each image's tokens attending to each other) and without them, greedy continuations.
struct Gemma3Fixture {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int] }
        struct Image: Decodable { let image: String; let shape: [Int]; let pixel_values: [Float] }
        struct Request: Decodable {
            let prompt: String
            let images: [String]
            let input_ids: [Int]
            let token_type_ids: [Int]
            let image_features: [[[Float]]]
            let logits_positions: [Int]
            let logits: [[Float]]
            let causal_logits: [[Float]]
            let greedy: Generated
        }
        let image_token_index: Int
        let mm_tokens_per_image: Int
        let max_new_tokens: Int
        let image_processor: [Image]
        let requests: [Request]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let expected = Result {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: fixtures.appendingPathComponent("gemma3/expected.json")))
    }

    let directory: URL
    let model: Gemma3ForConditionalGeneration
    let expected: Expected

    init(_ name: String = "tiny") throws {
        directory = Self.fixtures.appendingPathComponent("gemma3/\(name)")
        model = try Gemma3ForConditionalGeneration(directory: ModelDirectory(url: directory))
        expected = try Self.expected.get()
    }

    func images(_ names: [String]) throws -> ProcessedImages {
        let processor = try ImageProcessorRegistry.load(directory: directory, modelType: "gemma3")
        return try processor.preprocess(names.map { try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0)) })
    }

    /// The logits of a request's prompt with its images, the attention mask the model gives it (its image blocks)
    /// or `mask`.
    func logits(_ request: Expected.Request, mask: [Int]? = nil) throws -> Tensor {
        let embeds = try model.inputsEmbeds(inputIds: request.input_ids, imageFeatures: model.imageFeatures(images(request.images)))
        let attention = mask ?? model.attentionMask(promptIds: request.input_ids)
        return try model.languageModel.logits(inputsEmbeds: embeds, attentionMask: attention.map { [$0] }, positionIds: nil,
                                              cache: nil, lastPositionOnly: false)
    }
}

@Suite struct Gemma3MultimodalTests {
    static let tolerance: Float = 1e-4

    @Test func pixelValuesMatchTransformers() throws {
        let fixture = try Gemma3Fixture()
        for image in fixture.expected.image_processor {
            let processed = try fixture.images([image.image])
            #expect(processed.pixelValues.shape == image.shape)
            #expect(maxDifference(processed.pixelValues.scalars, image.pixel_values) == 0, "\(image.image)")
        }
    }

    @Test func imageFeaturesMatchTransformers() throws {
        let fixture = try Gemma3Fixture()
        for request in fixture.expected.requests {
            let features = try fixture.model.imageFeatures(fixture.images(request.images))
            #expect(features.count == request.image_features.count)
            for (actual, expected) in zip(features, request.image_features) {
                #expect(actual.shape == [fixture.expected.mm_tokens_per_image, expected[0].count])
                #expect(maxDifference(actual.scalars, expected.flatMap { $0 }) < Self.tolerance, "\(request.images)")
            }
        }
    }

    /// The mask numbers each image's tokens as the processor's token_type_ids mark them; with it the logits are
    /// transformers', and a plain causal mask gives transformers' logits without token_type_ids instead (which differ
    /// by more than 1 somewhere in every request: the image blocks are what the first comparison tests).
    @Test(arguments: ["tiny", "tiny-published-layout"])
    func logitsMatchTransformersWithImageBlocks(_ name: String) throws {
        let fixture = try Gemma3Fixture(name)
        let vocabulary = fixture.model.vocabularySize
        for request in fixture.expected.requests {
            let mask = try #require(fixture.model.attentionMask(promptIds: request.input_ids))
            #expect(mask.map { $0 >= 2 ? 1 : 0 } == request.token_type_ids)
            for (expectedRows, attention) in [(request.logits, mask), (request.causal_logits, Array(repeating: 1, count: mask.count))] {
                let logits = try fixture.logits(request, mask: attention).scalars
                for (position, expected) in zip(request.logits_positions, expectedRows) {
                    let row = Array(logits[(position * vocabulary)..<((position + 1) * vocabulary)])
                    #expect(maxDifference(row, expected) < Self.tolerance, "\(name) \(request.images) position \(position)")
                }
            }
            let gap = zip(request.logits.joined(), request.causal_logits.joined()).map { abs($0 - $1) }.max() ?? 0
            #expect(gap > 1)
        }
    }

    @Test func greedyContinuationsMatchTransformers() throws {
        let fixture = try Gemma3Fixture()
        var config = try GenerationConfig.load(directory: fixture.directory)
        config.maxNewTokens = fixture.expected.max_new_tokens
        config.doSample = false
        for request in fixture.expected.requests {
            let images = try fixture.images(request.images)
            let output = try fixture.model.generate(imageEmbeddings: fixture.model.imageEmbeddings(images).reshaped([1, -1, fixture.model.config.textConfig.hiddenSize]),
                                                    inputIds: [request.input_ids], attentionMask: nil, config: config,
                                                    stoppingCriteria: [], seed: 0, onStep: nil)
            #expect(output.sequences == [request.greedy.ids], "\(request.images)")
        }
    }

    /// A prompt run in two parts over a KV cache, cut before and inside the first image block: the second part's
    /// image tokens still see their whole block (its cached keys and its own), so the last logits are the whole
    /// prompt's.
    @Test func promptsRunInPartsSeeTheirWholeBlocks() throws {
        let fixture = try Gemma3Fixture()
        let request = try #require(fixture.expected.requests.first { $0.images.count == 2 })
        let ids = request.input_ids
        let embeds = try fixture.model.inputsEmbeds(inputIds: ids, imageFeatures: fixture.model.imageFeatures(fixture.images(request.images)))
        let mask = try #require(fixture.model.attentionMask(promptIds: ids))
        let language = fixture.model.languageModel
        let whole = try language.logits(inputsEmbeds: embeds, attentionMask: [mask], positionIds: nil, cache: nil, lastPositionOnly: true)
        let firstImage = try #require(ids.firstIndex(of: fixture.expected.image_token_index))
        for cut in [firstImage, ids.count - 3] {
            let cache = try language.makeCache(batch: 1, capacity: ids.count)
            _ = try language.logits(inputsEmbeds: sequenceSlice(embeds, 0..<cut), attentionMask: [Array(mask[..<cut])],
                                    positionIds: nil, cache: cache, lastPositionOnly: true)
            let rest = try language.logits(inputsEmbeds: sequenceSlice(embeds, cut..<ids.count), attentionMask: [mask],
                                           positionIds: nil, cache: cache, lastPositionOnly: true)
            #expect(maxDifference(rest.scalars, whole.scalars) < Self.tolerance, "cut at \(cut)")
        }
        // Rows of a batch whose blocks lie elsewhere cannot share one pass.
        var shifted = mask
        shifted.swapAt(firstImage - 1, firstImage + 15)
        #expect(throws: ModelError.self) {
            try language.logits(inputsEmbeds: concatenate([embeds, embeds], axis: 0), attentionMask: [mask, shifted],
                                positionIds: nil, cache: nil, lastPositionOnly: true)
        }
    }

    @Test func configTakesGemma3Defaults() throws {
        let config = try JSONDecoder().decode(Gemma3Config.self, from: Data("{}".utf8))
        #expect(config.mmTokensPerImage == 256 && config.imageTokenIndex == 262_144)
        #expect(config.boiTokenIndex == 255_999 && config.eoiTokenIndex == 256_000 && config.tieWordEmbeddings)
        #expect(config.textConfig.hiddenSize == 2304 && config.visionConfig.hiddenSize == 768)
        let aliased = try JSONDecoder().decode(Gemma3Config.self, from: Data(#"{"image_token_id": 7, "boi_token_id": 5}"#.utf8))
        #expect(aliased.imageTokenIndex == 7 && aliased.boiTokenIndex == 5)
    }

    @Test func tokenCountsAndPatchesThatDoNotPoolAreOneLineErrors() throws {
        let fixture = try Gemma3Fixture()
        let weights = Weights(try WeightStore(directory: fixture.directory))
        for (tokens, patch) in [(15, 4), (9, 4), (0, 4), (-4, 4), (1 << 62, 4), (16, 0), (16, -4)] {
            var config = fixture.model.config
            config.mmTokensPerImage = tokens
            config.visionConfig.patchSize = patch
            let error = try #require(throws: ModelError.self) { try Gemma3ForConditionalGeneration(config: config, weights: weights) }
            #expect(error.description.hasPrefix("config.json: ") && !error.description.contains("\n"), "\(tokens), patch \(patch)")
        }
    }
}
