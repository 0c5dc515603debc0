import ArgumentParser
import Foundation
import SwiftVLM

struct Match: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Score how well each text describes each image (BLIP retrieval checkpoints): the image–text matching probability (ITM) and the contrastive cosine similarity (ITC).")

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption

    @Option(help: "Comma-separated texts, e.g. \"a cat,a dog\".")
    var texts: String

    @Flag(help: "Print JSON instead of a table.")
    var json = false

    @Argument(help: "Image files (JPEG, PNG, WebP, GIF, BMP or TIFF).")
    var images: [String]

    private struct Pair: Encodable {
        let image: String
        let text: String
        let itm: Float
        let itc: Float
    }

    func run() async throws {
        let candidates = texts.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        guard !candidates.isEmpty, !images.isEmpty else { throw PipelineError.noInputs }
        let directory = try await options.directory()
        let pipeline = try precision.building { try ImageTextMatchingPipeline(directory: directory) }
        let decoded = try images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let results = try pipeline(decoded, texts: candidates)
        if json {
            try printJSON(zip(images, results).flatMap { image, matches in
                matches.map { Pair(image: image, text: $0.text, itm: $0.itm, itc: $0.itc) }
            })
            return
        }
        for (image, matches) in zip(images, results) {
            print(image)
            for match in matches { print("  itm \(formatted(match.itm))  itc \(formatted(match.itc))  \(match.text)") }
        }
    }
}
