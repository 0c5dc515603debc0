import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// A CLIP fixture checkpoint written by oracle/clip.py, with what transformers computed on it.
struct CLIPFixture {
    struct Expected: Decodable {
        let photos: [String]
        let texts: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let labels: [String]
        let prompt_ids: [[Int]]
        let prompt_mask: [[Int]]
        let template: String
    }

    static let names = ["tiny-quickgelu-argmax", "tiny-gelu-eos-fp16", "tiny-sharded-bf16"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/clip")

    let directory: URL
    let expected: Expected
    let tensors: SafetensorsFile

    init(_ name: String) throws {
        directory = Self.root.appendingPathComponent(name)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
    }
}

func maxAbsDifference(_ a: Tensor, _ b: Tensor) -> Float {
    precondition(a.shape == b.shape, "shapes \(a.shape) and \(b.shape) differ")
    return zip(a.scalars, b.scalars).reduce(0) { max($0, abs($1.0 - $1.1)) }
}

@Suite struct CLIPModelTests {
    @Test(arguments: CLIPFixture.names)
    func imageFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try CLIPFixture(name)
        let model = try CLIPModel(directory: ModelDirectory(url: fixture.directory))
        let features = try model.imageFeatures(pixelValues: fixture.tensors.tensor("pixel_values"))
        #expect(maxAbsDifference(features, try fixture.tensors.tensor("image_embeds")) < 1e-4)
    }

    @Test(arguments: CLIPFixture.names)
    func textFeaturesMatchTransformers(_ name: String) throws {
        let fixture = try CLIPFixture(name)
        let model = try CLIPModel(directory: ModelDirectory(url: fixture.directory))
        let features = try model.textFeatures(inputIds: fixture.expected.input_ids, attentionMask: fixture.expected.attention_mask)
        #expect(maxAbsDifference(features, try fixture.tensors.tensor("text_embeds")) < 1e-4)
    }

    @Test(arguments: CLIPFixture.names)
    func logitsPerImageMatchTransformers(_ name: String) throws {
        let fixture = try CLIPFixture(name)
        let model = try CLIPModel(directory: ModelDirectory(url: fixture.directory))
        let images = try model.imageFeatures(pixelValues: fixture.tensors.tensor("pixel_values"))
        let prompts = try model.textFeatures(inputIds: fixture.expected.prompt_ids, attentionMask: fixture.expected.prompt_mask)
        let logits = model.logitsPerImage(imageFeatures: images, textFeatures: prompts)
        #expect(maxAbsDifference(logits, try fixture.tensors.tensor("logits_per_image")) < 1e-4)
        try expectContrastiveLoss(model, logitsPerImage: logits, fixture: "clip/\(name)")
    }

    @Test func pixelValuesOfTheWrongSizeAreRefused() throws {
        let fixture = try CLIPFixture(CLIPFixture.names[0])
        let model = try CLIPModel(directory: ModelDirectory(url: fixture.directory))
        #expect(throws: ModelError.self) { try model.imageFeatures(pixelValues: Tensor(zeros: [1, 3, 33, 33])) }
    }

    @Test func tokenIdsOutsideTheVocabularyAreRefused() throws {
        let fixture = try CLIPFixture(CLIPFixture.names[0])
        let model = try CLIPModel(directory: ModelDirectory(url: fixture.directory))
        #expect(throws: ModelError.self) { try model.textFeatures(inputIds: [[1512, 99999, 1513]], attentionMask: nil) }
    }

    @Test func attentionMasksOfAnotherShapeAreRefused() throws {
        let fixture = try CLIPFixture(CLIPFixture.names[0])
        let model = try CLIPModel(directory: ModelDirectory(url: fixture.directory))
        let ids = [Array(fixture.expected.prompt_ids[0].prefix(3))]
        _ = try model.textFeatures(inputIds: ids, attentionMask: [[1, 1, 1]])
        for mask in [[[1, 1]], [[1, 1, 1], [1, 1, 1]], []] {
            #expect(throws: ModelError.self) { try model.textFeatures(inputIds: ids, attentionMask: mask) }
        }
    }
}
