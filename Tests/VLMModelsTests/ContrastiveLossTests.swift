import Foundation
import Testing
import VLMModels
import VLMTensor

/// What `model(..., return_loss=True).loss` gave for each dual-encoder fixture's four photos and four templated
/// labels, image i paired with label i (oracle/contrastive_loss.py), keyed by the fixture's directory.
let transformersContrastiveLosses = Result {
    try JSONDecoder().decode([String: Float].self, from: Data(contentsOf: URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Fixtures/contrastive_loss.json")))
}

/// Expects `model`'s loss for its logits within 1e-4 of transformers' for `fixture` ("clip/tiny-quickgelu-argmax").
func expectContrastiveLoss(_ model: any ImageTextDualEncoder, logitsPerImage: Tensor, fixture: String) throws {
    let expected = try #require(try transformersContrastiveLosses.get()[fixture])
    let loss = try model.contrastiveLoss(logitsPerImage: logitsPerImage)
    #expect(abs(loss - expected) < 1e-4, "\(fixture): \(loss) against \(expected)")
}

@Suite struct ContrastiveLossTests {
    @Test func logitsThatAreNotPairsAreRefused() throws {
        let model = try CLIPModel(directory: .init(url: CLIPFixture.root.appendingPathComponent(CLIPFixture.names[0])))
        #expect(throws: ModelError.self) { try model.contrastiveLoss(logitsPerImage: Tensor(zeros: [2, 3])) }
        #expect(throws: ModelError.self) { try model.contrastiveLoss(logitsPerImage: Tensor(zeros: [4])) }
        #expect(throws: ModelError.self) { try model.contrastiveLoss(logitsPerImage: Tensor(zeros: [0, 0])) }
    }
}
