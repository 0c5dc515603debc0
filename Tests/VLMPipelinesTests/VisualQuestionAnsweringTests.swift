import Foundation
import Testing
import VLMImages
import VLMPipelines

/// ViLT through the visual-question-answering pipeline (oracle/vilt.py: `logits.sigmoid().topk(5)`, as the pipeline
/// of transformers 4 computed its answers), on real photos.
@Suite struct VisualQuestionAnsweringTests {
    struct Expected: Decodable {
        struct Scored: Decodable { let answer: String; let score: Float }
        struct Answers: Decodable { let top: [Scored] }
        struct Question: Decodable { let question: String; let answers: [String: Answers] }
        let questions: [Question]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    @Test(arguments: ["b16-gelu", "b32-noqkvbias"])
    func vilsTopAnswersMatchTransformers(_ name: String) throws {
        let directory = Self.fixtures.appendingPathComponent("vilt/\(name)")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let pipeline = try VisualQuestionAnsweringPipeline(directory: directory)
        #expect(pipeline.generationConfig == nil)
        let names = ["chelsea.png", "camera.png", "coffee.png transposed"]
        let photos = try names.map { name -> RGBImage in
            let image = try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent("photos/" + name.components(separatedBy: " ")[0]))
            return name.hasSuffix(" transposed") ? image.transposed(exifOrientation: 5) : image
        }
        for question in expected.questions {
            let results = try pipeline(photos, question: question.question)
            for (name, answers) in zip(names, results) {
                let reference = try #require(question.answers[name]).top
                #expect(answers.map(\.answer) == reference.map(\.answer), "\(name): \(question.question)")
                #expect(zip(answers, reference).allSatisfy { abs(($0.score ?? -1) - $1.score) <= 1e-5 && $0.ids == nil })
            }
            #expect(try pipeline([photos[0]], question: question.question, topK: 2)[0].map(\.answer)
                    == question.answers["chelsea.png"]!.top.prefix(2).map(\.answer))
        }
        #expect(throws: PipelineError.self) {
            try pipeline([photos[0]], question: Array(repeating: "cat", count: 50).joined(separator: " "))
        }
    }
}
