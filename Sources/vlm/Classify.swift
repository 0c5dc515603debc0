import ArgumentParser
import Foundation
import SwiftVLM

struct Classify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Zero-shot image classification: rank candidate labels for each image.")

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption

    @Option(help: "Comma-separated candidate labels, e.g. \"cat,dog,car\".")
    var labels: String

    @Option(help: "Prompt each label is put into; {} stands for the label.")
    var template: String = ZeroShotImageClassificationPipeline.defaultHypothesisTemplate

    @Flag(help: "Print JSON instead of a table.")
    var json = false

    @Argument(help: "Image files (JPEG, PNG, WebP, GIF, BMP or TIFF).")
    var images: [String]

    private struct ImageResult: Encodable {
        let image: String
        let scores: [LabelScore]
    }

    func run() async throws {
        let candidates = labels.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        guard !candidates.isEmpty else { throw PipelineError.noCandidateLabels }
        guard !images.isEmpty else { throw PipelineError.noInputs }
        let decoded = try images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let pipeline = try ZeroShotImageClassificationPipeline(directory: try await options.directory(), precision: precision.dtype)
        let results = try pipeline(decoded, candidateLabels: candidates, hypothesisTemplate: template)
        if json {
            try printJSON(zip(images, results).map { ImageResult(image: $0, scores: $1) })
            return
        }
        for (image, scores) in zip(images, results) {
            print(image)
            for entry in scores { print("  \(formatted(entry.score))  \(entry.label)") }
        }
    }
}
