import Foundation
import Testing
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// CLIPSeg checkpoints as transformers' zero-shot-image-classification pipeline loads them (`CLIPSegModel`: CLIP with
/// position embeddings interpolated to the processor's size), against oracle/clipseg_zero_shot.py.
@Suite struct CLIPSegZeroShotTests {
    struct Expected: Decodable {
        struct Classified: Decodable { let label: String; let score: Float }
        let photos: [String]
        let labels: [String]
        let template: String
        let texts: [String]
        let zero_shot: [[Classified]]
        let image_embeds: [[Float]]
        let text_embeds: [[Float]]
        let logits_per_image: [[Float]]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    static func load(_ name: String) throws -> (URL, Expected, [RGBImage]) {
        let directory = fixtures.appendingPathComponent("clipseg/\(name)")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("zero_shot.json")))
        let photos = try expected.photos.map { try ImageDecoder.decode(contentsOf: fixtures.appendingPathComponent("photos/\($0)")) }
        return (directory, expected, photos)
    }

    static func largestDifference(_ tensor: Tensor, _ rows: [[Float]]) -> Float {
        #expect(tensor.shape == [rows.count, rows.first?.count ?? 0])
        return zip(tensor.scalars, rows.joined()).reduce(0) { max($0, abs($1.0 - $1.1)) }
    }

    @Test(arguments: ["tiny-fp16", "tiny-refined-bf16"])
    func classifiesEmbedsAndMatchesAsTransformers(_ name: String) throws {
        let (directory, expected, photos) = try Self.load(name)
        let classifier = try ZeroShotImageClassificationPipeline(directory: directory, precision: .float32)
        let results = try classifier(photos, candidateLabels: expected.labels, hypothesisTemplate: expected.template)
        for (result, want) in zip(results, expected.zero_shot) {
            #expect(result.map(\.label) == want.map(\.label))
            for (got, score) in zip(result, want) { #expect(abs(got.score - score.score) < 1e-4) }
        }
        let encoder = try DualEncoderPipeline(directory: directory, task: .embed, precision: .float32)
        #expect(Self.largestDifference(try encoder.imageEmbeddings(photos), expected.image_embeds) < 1e-4)
        #expect(Self.largestDifference(try encoder.textEmbeddings(expected.texts), expected.text_embeds) < 1e-4)
        let prompts = expected.labels.map { expected.template.replacingOccurrences(of: "{}", with: $0) }
        let logits = try encoder.similarities(photos, texts: prompts).joined().map(\.logit)
        #expect(zip(logits, expected.logits_per_image.joined()).allSatisfy { abs($0 - $1) < 1e-4 })
        // Segmentation still gets the whole model.
        #expect(try ZeroShotImageSegmentationPipeline(directory: directory)(photos[0], labels: ["a cat"]).count == 1)
    }
}
