import ArgumentParser
import Foundation
import SwiftVLM

struct Ask: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Answer a question about each image (visual question answering).")

    @OptionGroup var options: ModelOption
    @OptionGroup var settings: GenerationSettings

    @Option(help: "The question, asked of every image.")
    var question: String

    @Flag(help: "Print JSON instead of one answer per line.")
    var json = false

    @Argument(help: "Image files (JPEG, PNG or WebP).")
    var images: [String]

    private struct Answer: Encodable {
        let answer: String
        let ids: [Int]
    }

    private struct Result: Encodable {
        let image: String
        let question: String
        let answers: [Answer]
    }

    func run() async throws {
        guard !images.isEmpty else { throw PipelineError.noInputs }
        let pipeline = try VisualQuestionAnsweringPipeline(directory: try await options.directory())
        let config = try settings.apply(to: pipeline.generator.config)
        let decoded = try images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let results = try pipeline(decoded, question: question, settings: config, seed: settings.samplerSeed)
        if json {
            try printJSON(zip(images, results).map {
                Result(image: $0, question: question, answers: [Answer(answer: $1.text, ids: $1.ids)])
            })
            return
        }
        for (image, result) in zip(images, results) { print("\(image): \(result.text)") }
    }
}
