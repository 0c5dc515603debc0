import Foundation
import Testing
import VLMCheckpoint
import VLMImages
@testable import VLMModels
import VLMTensor

/// A SigLIP 2 fixture checkpoint written by oracle/siglip2.py, with what transformers computed on it.
struct Siglip2Fixture {
    struct Expected: Decodable {
        let spatial_shapes: [[Int]]
        let input_ids: [[Int]]
        /// nil where the tokenizer's model_input_names leave the mask out ("tiny-naflex-fp16").
        let attention_mask: [[Int]]?
        let prompt_ids: [[Int]]
        let prompt_mask: [[Int]]?
    }

    static let names = ["tiny-naflex-fp16", "tiny-naflex-bf16"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/siglip2")

    let directory: URL
    let expected: Expected
    let tensors: SafetensorsFile

    init(_ name: String) throws {
        directory = Self.root.appendingPathComponent(name)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
    }

    func model() throws -> Siglip2Model { try Siglip2Model(directory: ModelDirectory(url: directory)) }

    /// The processor's outputs as transformers made them.
    func processed() throws -> ProcessedImages {
        let pixels = try tensors.tensor("pixel_values")
        return ProcessedImages(pixelValues: pixels, imageSizes: [], pixelAttentionMask: try tensors.tensor("pixel_attention_mask"),
                               spatialShapes: expected.spatial_shapes.map { ImageSize(height: $0[0], width: $0[1]) })
    }

    /// Image `index` of the processed batch alone, as the zero-shot pipeline runs it.
    func processed(image index: Int) throws -> ProcessedImages {
        let all = try processed()
        let patches = all.pixelValues.shape[1]
        let (batch, width) = (all.pixelValues.shape[0], all.pixelValues.shape[2])
        let rows = (index * patches)..<((index + 1) * patches)
        return ProcessedImages(pixelValues: sequenceSlice(all.pixelValues.reshaped([1, batch * patches, width]), rows),
                               imageSizes: [],
                               pixelAttentionMask: sequenceSlice(all.pixelAttentionMask!.reshaped([1, batch * patches]), rows),
                               spatialShapes: [all.spatialShapes![index]])
    }
}

@Suite struct Siglip2ModelTests {
    @Test(arguments: Siglip2Fixture.names)
    func imageFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try Siglip2Fixture(name)
        let features = try fixture.model().imageFeatures(fixture.processed())
        #expect(maxAbsDifference(features, try fixture.tensors.tensor("image_embeds")) < 1e-4)
    }

    /// Each image alone, padded to max_num_patches, gives the same features as in the batch.
    @Test(arguments: Siglip2Fixture.names)
    func imagesAloneMatchTransformers(_ name: String) throws {
        let fixture = try Siglip2Fixture(name)
        let model = try fixture.model()
        let expected = try fixture.tensors.tensor("image_embeds_alone")
        let width = expected.shape[1]
        for index in 0..<expected.shape[0] {
            let features = try model.imageFeatures(fixture.processed(image: index))
            let row = Tensor(shape: [1, width], scalars: Array(expected.scalars[(index * width)..<((index + 1) * width)]))
            #expect(maxAbsDifference(features, row) < 1e-4, "image \(index)")
        }
    }

    /// The whole last hidden state, padded patches included (they attend to the real ones only).
    @Test(arguments: Siglip2Fixture.names)
    func lastHiddenStateMatchesTransformers(_ name: String) throws {
        let fixture = try Siglip2Fixture(name)
        let (hidden, _) = try fixture.model().vision.lastHiddenState(fixture.processed())
        #expect(maxAbsDifference(hidden, try fixture.tensors.tensor("last_hidden_state")) < 1e-4)
    }

    @Test(arguments: Siglip2Fixture.names)
    func textFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try Siglip2Fixture(name)
        let features = try fixture.model().textFeatures(inputIds: fixture.expected.input_ids,
                                                        attentionMask: fixture.expected.attention_mask)
        #expect(maxAbsDifference(features, try fixture.tensors.tensor("text_embeds")) < 1e-4)
    }

    @Test(arguments: Siglip2Fixture.names)
    func logitsPerImageMatchTransformers(_ name: String) throws {
        let fixture = try Siglip2Fixture(name)
        let model = try fixture.model()
        let images = try model.imageFeatures(fixture.processed())
        let prompts = try model.textFeatures(inputIds: fixture.expected.prompt_ids, attentionMask: fixture.expected.prompt_mask)
        let logits = model.logitsPerImage(imageFeatures: images, textFeatures: prompts)
        #expect(maxAbsDifference(logits, try fixture.tensors.tensor("logits_per_image")) < 1e-4)
        try expectContrastiveLoss(model, logitsPerImage: logits, fixture: "siglip2/\(name)")
    }

    /// F.interpolate(mode="bilinear", align_corners=False, antialias=True), shrinking, growing and both at once.
    @Test func antialiasedInterpolationMatchesPyTorch() throws {
        let cases = try SafetensorsFile(url: Siglip2Fixture.root.appendingPathComponent("interpolate.safetensors"))
        for index in 0..<6 {
            let input = try cases.tensor("\(index).input"), expected = try cases.tensor("\(index).output")
            let output = interpolateAntialiased(input, height: expected.shape[2], width: expected.shape[3])
            #expect(output.shape == expected.shape)
            #expect(maxAbsDifference(output, expected) < 1e-6, "case \(index)")
        }
    }

    @Test func configDefaultsAreTransformers() throws {
        let config = try JSONDecoder().decode(Siglip2Config.self, from: Data(#"{"model_type": "siglip2"}"#.utf8))
        let vision = config.visionConfig
        #expect(vision.hiddenSize == 768 && vision.patchSize == 16 && vision.numPatches == 256 && vision.visionUseHead)
        #expect(config.textConfig.vocabSize == 32000 && config.textConfig.maxPositionEmbeddings == 64)
    }

    @Test func pixelValuesWithoutTheirMaskAreRefused() throws {
        let fixture = try Siglip2Fixture("tiny-naflex-fp16")
        var processed = try fixture.processed()
        processed.pixelAttentionMask = nil
        #expect(throws: ModelError.self) { try fixture.model().imageFeatures(processed) }
        #expect(throws: ModelError.self) {
            try fixture.model().imageFeatures(ProcessedImages(pixelValues: Tensor(zeros: [1, 3, 32, 32]), imageSizes: []))
        }
    }

    @Test func aSpatialShapeLargerThanThePatchesIsRefused() throws {
        let fixture = try Siglip2Fixture("tiny-naflex-fp16")
        var processed = try fixture.processed()
        processed.spatialShapes![0] = ImageSize(height: 9, width: 9)
        #expect(throws: ModelError.self) { try fixture.model().imageFeatures(processed) }
    }

    @Test func aNonSquarePositionCountIsRefused() throws {
        let fixture = try Siglip2Fixture("tiny-naflex-fp16")
        let directory = try ModelDirectory(url: fixture.directory)
        var config = try directory.decode(Siglip2Config.self)
        config.visionConfig.numPatches = 15
        #expect(throws: ModelError.self) {
            try Siglip2Model(config: config, weights: Weights(WeightStore(directory: fixture.directory)))
        }
    }

    @Test func registryBuildsSiglip2ForClassifyAndEmbed() throws {
        let directory = try ModelDirectory(url: try Siglip2Fixture("tiny-naflex-bf16").directory)
        #expect(try ModelRegistry.family(of: directory).name == "SigLIP 2")
        #expect(try ModelRegistry.dualEncoder(directory, for: .classify) is Siglip2Model)
        #expect(throws: ModelError.self) { try ModelRegistry.imageToTextModel(directory, for: .caption) }
    }
}
