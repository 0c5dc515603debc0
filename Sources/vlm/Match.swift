import ArgumentParser
import Foundation
import SwiftVLM

struct Match: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Score how well each text describes each image, for image–text retrieval: CLIP, SigLIP and SigLIP 2 give the model's logits (logits_per_image) and the embeddings' cosine similarity; BLIP retrieval checkpoints the image–text matching probability (ITM) and the contrastive cosine similarity (ITC).")

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption

    @Option(help: "Comma-separated texts, e.g. \"a cat,a dog\".")
    var texts: String

    @Flag(help: "Print JSON instead of a table.")
    var json = false

    @Argument(help: "Image files (JPEG, PNG, WebP, GIF, BMP or TIFF).")
    var images: [String]

    private struct Matching: Encodable {
        let image: String
        let text: String
        let itm: Float
        let itc: Float
    }

    private struct Similarity: Encodable {
        let image: String
        let text: String
        let logit: Float
        let cosine: Float
    }

    func run() async throws {
        let candidates = texts.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        guard !candidates.isEmpty, !images.isEmpty else { throw PipelineError.noInputs }
        let directory = try await options.directory()
        if case .imageTextDualEncoder = try ModelRegistry.family(of: ModelDirectory(url: directory), for: .match).builder(for: .match) {
            let pipeline = try DualEncoderPipeline(directory: directory, task: .match, precision: precision.dtype)
            try report(pipeline.similarities(decodedImages(), texts: candidates),
                       row: { Similarity(image: $0, text: $1.text, logit: $1.logit, cosine: $1.cosine) },
                       line: { "logit \(formatted($0.logit))  cosine \(formatted($0.cosine))  \($0.text)" })
        } else {
            let pipeline = try precision.building { try ImageTextMatchingPipeline(directory: directory) }
            try report(pipeline(decodedImages(), texts: candidates),
                       row: { Matching(image: $0, text: $1.text, itm: $1.itm, itc: $1.itc) },
                       line: { "itm \(formatted($0.itm))  itc \(formatted($0.itc))  \($0.text)" })
        }
    }

    private func decodedImages() throws -> [RGBImage] {
        try images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
    }

    /// Each image's pairs as JSON rows, or as a line each under the image's path.
    private func report<Pair, Row: Encodable>(_ results: [[Pair]], row: (String, Pair) -> Row,
                                              line: (Pair) -> String) throws {
        if json {
            try printJSON(zip(images, results).flatMap { image, pairs in pairs.map { row(image, $0) } })
            return
        }
        for (image, pairs) in zip(images, results) {
            print(image)
            for pair in pairs { print("  " + line(pair)) }
        }
    }
}
