import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// An OWL-ViT fixture checkpoint written by oracle/owlvit.py, with what transformers computed on it.
struct OwlViTFixture {
    struct Expected: Decodable {
        let labels: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
    }

    static let names = ["tiny-patch16-fp16", "tiny-patch32-bf16", "v2-patch16-fp16", "v2-patch32-bf16"]
    static let photos = ["landscape", "portrait", "small"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/owlvit")

    let expected: Expected
    let tensors: SafetensorsFile
    let model: OwlViTForObjectDetection

    init(_ name: String) throws {
        let directory = Self.root.appendingPathComponent(name)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
        model = try OwlViTForObjectDetection(directory: ModelDirectory(url: directory))
    }
}

/// The largest absolute difference of two tensors of one shape.
private func worstError(_ actual: Tensor, _ expected: Tensor) -> Float {
    precondition(actual.shape == expected.shape, "shapes \(actual.shape) and \(expected.shape) differ")
    return zip(actual.scalars, expected.scalars).reduce(0) { max($0, abs($1.0 - $1.1)) }
}

@Suite struct OwlViTTests {
    @Test(arguments: OwlViTFixture.names)
    func textEmbeddingsMatchTransformers(_ name: String) throws {
        let fixture = try OwlViTFixture(name)
        let embeddings = try fixture.model.textEmbeddings(inputIds: fixture.expected.input_ids,
                                                          attentionMask: fixture.expected.attention_mask)
        #expect(worstError(embeddings, try fixture.tensors.tensor("text_embeds")) < 1e-5)
    }

    @Test(arguments: OwlViTFixture.names, OwlViTFixture.photos)
    func logitsAndBoxesMatchTransformers(_ name: String, photo: String) throws {
        let fixture = try OwlViTFixture(name)
        let output = try fixture.model.detect(pixelValues: fixture.tensors.tensor("\(photo).pixel_values"),
                                              inputIds: fixture.expected.input_ids,
                                              attentionMask: fixture.expected.attention_mask)
        #expect(worstError(output.logits, try fixture.tensors.tensor("\(photo).logits")) < 1e-4, "\(name) \(photo)")
        #expect(worstError(output.predBoxes, try fixture.tensors.tensor("\(photo).pred_boxes")) < 1e-4, "\(name) \(photo)")
        if name.hasPrefix("v2") {
            #expect(fixture.model.generation == .owlv2)
            let objectness = try #require(output.objectnessLogits)
            #expect(worstError(objectness, try fixture.tensors.tensor("\(photo).objectness_logits")) < 1e-4)
        } else {
            #expect(fixture.model.generation == .owlViT)
            #expect(output.objectnessLogits == nil)
        }
    }

    @Test(arguments: OwlViTFixture.names)
    func imageGuidedDetectionMatchesTransformers(_ name: String) throws {
        let fixture = try OwlViTFixture(name)
        let output = try fixture.model.imageGuidedDetection(
            pixelValues: fixture.tensors.tensor("landscape.pixel_values"),
            queryPixelValues: fixture.tensors.tensor("guided.query_pixel_values"))
        #expect(worstError(output.logits, try fixture.tensors.tensor("guided.logits")) < 1e-4)
        #expect(worstError(output.targetPredBoxes, try fixture.tensors.tensor("guided.target_pred_boxes")) < 1e-4)
        #expect(worstError(output.queryPredBoxes, try fixture.tensors.tensor("guided.query_pred_boxes")) < 1e-4)
    }

    /// transformers' defaults: 16 text positions, 768-pixel images, patch 32 for OWL-ViT and 16 for OWLv2.
    @Test func configDefaultsAreTransformers() throws {
        let owlViT = try JSONDecoder().decode(OwlViTConfig.self, from: Data(#"{"model_type": "owlvit"}"#.utf8))
        #expect(owlViT.textConfig.maxPositionEmbeddings == 16)
        #expect(owlViT.textConfig.hiddenSize == 512)
        #expect(owlViT.visionConfig.imageSize == 768)
        #expect(owlViT.visionConfig.patchSize == 32)
        #expect(owlViT.visionConfig.hiddenSize == 768)
        #expect(owlViT.projectionDim == 512)
        let owlv2 = try JSONDecoder().decode(OwlViTConfig.self, from: Data(#"{"model_type": "owlv2", "text_config": {"max_position_embeddings": 20}, "vision_config": {"image_size": 960}}"#.utf8))
        #expect(owlv2.textConfig.maxPositionEmbeddings == 20)
        #expect(owlv2.visionConfig.imageSize == 960)
        #expect(owlv2.visionConfig.patchSize == 16)
    }

    @Test func paddingQueriesAreRefused() throws {
        let fixture = try OwlViTFixture(OwlViTFixture.names[0])
        #expect(throws: ModelError.self) {
            try fixture.model.textEmbeddings(inputIds: [[0, 49407]], attentionMask: nil)
        }
    }
}
