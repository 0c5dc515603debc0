import ArgumentParser
import Foundation
import SwiftVLM

struct Embed: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Projected image or text embeddings (get_image_features / get_text_features).")

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption

    @Option(name: .customLong("image"), parsing: .upToNextOption, help: "Image files to embed.")
    var images: [String] = []

    @Option(name: .customLong("text"), parsing: .upToNextOption, help: "Texts to embed (CLIP truncates them to its context; SigLIP and SigLIP 2 take at most 64 tokens).")
    var texts: [String] = []

    @Flag(help: "Scale each embedding to unit L2 norm.")
    var normalize = false

    @Flag(help: "Print JSON instead of a summary.")
    var json = false

    func validate() throws {
        guard images.isEmpty != texts.isEmpty else {
            throw ValidationError("give exactly one of --image FILE... and --text TEXT...")
        }
    }

    func run() async throws {
        let pipeline = try DualEncoderPipeline(directory: try await options.directory(), task: .embed, precision: precision.dtype)
        var embeddings: Tensor
        if images.isEmpty {
            embeddings = try pipeline.textEmbeddings(texts)
        } else {
            embeddings = try pipeline.imageEmbeddings(images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) })
        }
        if normalize { embeddings = l2Normalized(embeddings) }
        let width = embeddings.shape[1]
        let values = embeddings.scalars
        let rows = (0..<embeddings.shape[0]).map { Array(values[($0 * width)..<(($0 + 1) * width)]) }
        if json {
            try printJSON(["embeddings": rows])
            return
        }
        for (input, row) in zip(images.isEmpty ? texts : images, rows) {
            let norm = row.reduce(0) { $0 + $1 * $1 }.squareRoot()
            print("\(input): \(width) dims, L2 norm \(formatted(norm))")
        }
    }
}
