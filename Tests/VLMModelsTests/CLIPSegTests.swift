import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// A CLIPSeg fixture checkpoint written by oracle/clipseg.py, with what transformers computed on it.
struct CLIPSegFixture {
    struct Expected: Decodable {
        let labels: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let photos: [String: Photo]
    }

    struct Photo: Decodable {
        let file: String
    }

    static let names = ["tiny-fp16", "tiny-refined-bf16"]
    static let photos = ["landscape", "portrait", "small"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/clipseg")

    let directory: URL
    let expected: Expected
    let tensors: SafetensorsFile
    let model: CLIPSegForImageSegmentation

    init(_ name: String) throws {
        directory = Self.root.appendingPathComponent(name)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
        model = try CLIPSegForImageSegmentation(directory: ModelDirectory(url: directory))
    }
}

/// The largest difference, relative to the expected value where that exceeds 1 (logits reach ±150 here).
func worstRelativeError(_ actual: Tensor, _ expected: Tensor) -> Float {
    precondition(actual.shape == expected.shape, "shapes \(actual.shape) and \(expected.shape) differ")
    return zip(actual.scalars, expected.scalars).reduce(0) { max($0, abs($1.0 - $1.1) / max(1, abs($1.1))) }
}

@Suite struct CLIPSegTests {
    @Test(arguments: CLIPSegFixture.names)
    func textConditionalEmbeddingsMatchTransformers(_ name: String) throws {
        let fixture = try CLIPSegFixture(name)
        let embeddings = try fixture.model.conditionalEmbeddings(inputIds: fixture.expected.input_ids,
                                                                 attentionMask: fixture.expected.attention_mask)
        #expect(worstRelativeError(embeddings, try fixture.tensors.tensor("conditional_embeddings")) < 1e-4)
    }

    /// Each photo's pixel values, read once, under every label's embedding.
    @Test(arguments: CLIPSegFixture.names, CLIPSegFixture.photos)
    func logitsMatchTransformers(_ name: String, photo: String) throws {
        let fixture = try CLIPSegFixture(name)
        let logits = try fixture.model.segmentationLogits(pixelValues: fixture.tensors.tensor("\(photo).pixel_values"),
                                                          conditionalEmbeddings: fixture.tensors.tensor("conditional_embeddings"))
        let expected = try fixture.tensors.tensor("\(photo).logits")
        #expect(logits.shape == expected.shape)
        #expect(worstRelativeError(logits, expected) < 1e-4, "\(name) \(photo)")
    }

    /// One query image per embedding, as transformers is called, gives the same logits.
    @Test(arguments: CLIPSegFixture.names)
    func repeatedQueryImagesMatchTransformers(_ name: String) throws {
        let fixture = try CLIPSegFixture(name)
        let pixels = try fixture.tensors.tensor("small.pixel_values")
        let embeddings = try fixture.tensors.tensor("conditional_embeddings")
        let repeated = concatenate(Array(repeating: pixels, count: embeddings.shape[0]), axis: 0)
        let logits = try fixture.model.segmentationLogits(pixelValues: repeated, conditionalEmbeddings: embeddings)
        #expect(worstRelativeError(logits, try fixture.tensors.tensor("small.logits")) < 1e-4)
    }

    @Test(arguments: CLIPSegFixture.names)
    func imagePromptMatchesTransformers(_ name: String) throws {
        let fixture = try CLIPSegFixture(name)
        let embedding = try fixture.model.conditionalEmbeddings(pixelValues: fixture.tensors.tensor("prompt.conditional_pixel_values"))
        #expect(worstRelativeError(embedding, try fixture.tensors.tensor("prompt.conditional_embeddings")) < 1e-4)
        let logits = try fixture.model.segmentationLogits(pixelValues: fixture.tensors.tensor("landscape.pixel_values"),
                                                          conditionalEmbeddings: embedding)
        #expect(worstRelativeError(logits, try fixture.tensors.tensor("prompt.logits")) < 1e-4)
    }

    /// At the vision tower's own image_size the learned positions are used as they are.
    @Test(arguments: CLIPSegFixture.names)
    func nativeSizeMatchesTransformers(_ name: String) throws {
        let fixture = try CLIPSegFixture(name)
        let embeddings = try fixture.tensors.tensor("conditional_embeddings")
        let first = Tensor(shape: [1, embeddings.shape[1]], scalars: Array(embeddings.scalars[..<embeddings.shape[1]]))
        let logits = try fixture.model.segmentationLogits(pixelValues: fixture.tensors.tensor("native.pixel_values"),
                                                          conditionalEmbeddings: first)
        #expect(worstRelativeError(logits, try fixture.tensors.tensor("native.logits")) < 1e-4)
    }

    /// The 2022 layout: text_config_dict and vision_config_dict replace the stale text_config and vision_config.
    @Test func legacyConfigDictsWin() throws {
        let config = try CLIPSegFixture("tiny-refined-bf16").model.config
        #expect(config.textConfig.hiddenSize == 8 && config.textConfig.numAttentionHeads == 4)
        #expect(config.visionConfig.patchSize == 16 && config.visionConfig.imageSize == 48)
        #expect(config.extractLayers == [0, 2] && config.conditionalLayer == 1 && config.useComplexTransposedConvolution)
    }

    @Test func defaultsAreTransformers() throws {
        let config = try JSONDecoder().decode(CLIPSegConfig.self, from: Data(#"{"model_type": "clipseg"}"#.utf8))
        #expect(config.extractLayers == [3, 6, 9] && config.reduceDim == 64 && config.projectionDim == 512)
        #expect(config.decoderNumAttentionHeads == 4 && config.decoderIntermediateSize == 2048)
        #expect(config.conditionalLayer == 0 && !config.useComplexTransposedConvolution)
        #expect(config.visionConfig.imageSize == 224 && config.visionConfig.patchSize == 32)
        #expect(config.textConfig.maxPositionEmbeddings == 77)
    }

    @Test func badInputsAreRefused() throws {
        let fixture = try CLIPSegFixture("tiny-fp16")
        let embeddings = try fixture.tensors.tensor("conditional_embeddings")
        let pixels = try fixture.tensors.tensor("small.pixel_values")
        let two = concatenate([pixels, pixels], axis: 0)
        #expect(throws: ModelError.self) { try fixture.model.segmentationLogits(pixelValues: two, conditionalEmbeddings: embeddings) }
        #expect(throws: ModelError.self) {
            try fixture.model.segmentationLogits(pixelValues: pixels, conditionalEmbeddings: Tensor(zeros: [2, 5]))
        }
        // 48x40 pixels make a 6x5 patch grid, which the decoder cannot fold back into a square.
        #expect(throws: ModelError.self) {
            try fixture.model.segmentationLogits(pixelValues: Tensor(zeros: [1, 3, 48, 40]), conditionalEmbeddings: embeddings)
        }
    }

    @Test func extractLayersOutsideTheVisionModelAreRefused() throws {
        let fixture = try CLIPSegFixture("tiny-fp16")
        var config = fixture.model.config
        config.extractLayers = [1, 4]
        let weights = Weights(try WeightStore(directory: fixture.directory))
        #expect(throws: ModelError.self) { try CLIPSegForImageSegmentation(config: config, weights: weights) }
    }
}
