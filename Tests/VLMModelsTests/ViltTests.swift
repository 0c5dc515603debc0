import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

/// ViltForQuestionAnswering against transformers (oracle/vilt.py): answer logits for real photos of three shapes,
/// whose patch grids differ from the one the position embeddings were learned on, and for a padded batch.
@Suite struct ViltTests {
    struct Expected: Decodable {
        struct Pixels: Decodable { let shape: [Int]; let file: String }
        struct Batch: Decodable { let photos: [String]; let shape: [Int]; let file: String; let pixel_mask: [[[Int]]] }
        struct Answers: Decodable { let logits: [Float] }
        struct Question: Decodable {
            let question: String
            let input_ids: [Int]
            let answers: [String: Answers]
            let batch_logits: [[Float]]
        }
        let labels: [String]
        let images: [String: Pixels]
        let batch: Batch
        let questions: [Question]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    static func floats(_ url: URL) throws -> [Float] {
        let data = try Data(contentsOf: url)
        return data.withUnsafeBytes { raw in (0..<(data.count / 4)).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) } }
    }

    @Test(arguments: ["b16-gelu", "b32-noqkvbias"])
    func answerLogitsMatchTransformers(_ name: String) throws {
        let directory = Self.fixtures.appendingPathComponent("vilt/\(name)")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let model = try ViltForQuestionAnswering(directory: ModelDirectory(url: directory))
        #expect(model.labels == expected.labels)
        for question in expected.questions {
            for (photo, reference) in expected.images {
                let pixels = Tensor(shape: reference.shape, scalars: try Self.floats(directory.appendingPathComponent(reference.file)))
                let logits = try model.logits(pixelValues: pixels, pixelMask: nil, inputIds: [question.input_ids], attentionMask: nil)
                let answers = try #require(question.answers[photo])
                #expect(logits.shape == [1, expected.labels.count])
                #expect(zip(logits.scalars, answers.logits).allSatisfy { abs($0 - $1) <= 1e-4 }, "\(photo): \(question.question)")
            }
            // Two photos of different sizes in one batch: the smaller one's padding is masked out.
            let batch = Tensor(shape: expected.batch.shape, scalars: try Self.floats(directory.appendingPathComponent(expected.batch.file)))
            let mask = Tensor(shape: [expected.batch.shape[0], expected.batch.shape[2], expected.batch.shape[3]],
                              scalars: expected.batch.pixel_mask.flatMap { $0.flatMap { $0.map(Float.init) } })
            let logits = try model.logits(pixelValues: batch, pixelMask: mask, inputIds: [question.input_ids, question.input_ids],
                                          attentionMask: nil)
            #expect(zip(logits.scalars, question.batch_logits.flatMap { $0 }).allSatisfy { abs($0 - $1) <= 1e-4 }, "batch: \(question.question)")
        }
    }

    @Test func tooLongAQuestionIsRefused() throws {
        let model = try ViltForQuestionAnswering(directory: ModelDirectory(url: Self.fixtures.appendingPathComponent("vilt/b16-gelu")))
        let pixels = Tensor(zeros: [1, 3, 64, 64])
        #expect(throws: ModelError.self) {
            try model.logits(pixelValues: pixels, pixelMask: nil, inputIds: [Array(repeating: 1000, count: 41)], attentionMask: nil)
        }
        #expect(throws: ModelError.self) {
            try model.logits(pixelValues: Tensor(zeros: [1, 3, 8, 8]), pixelMask: nil, inputIds: [[101, 102]], attentionMask: nil)
        }
    }
}
