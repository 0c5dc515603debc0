import ArgumentParser
import Foundation
import SwiftVLM

struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Image-embedding speed on random pixel inputs (warm-up excluded, median of several runs).")

    @OptionGroup var options: ModelOption

    @Option(help: "Images per forward pass.")
    var batchSize = 1

    @Option(help: "Timed runs after the warm-up.")
    var runs = 5

    @Flag(help: "Print JSON instead of a sentence.")
    var json = false

    private struct Report: Encodable {
        let task = "image-embedding"
        let batchSize: Int
        let msPerItem: Double

        enum CodingKeys: String, CodingKey {
            case task, batchSize = "batch_size", msPerItem = "ms_per_item"
        }
    }

    func validate() throws {
        guard batchSize > 0, runs > 0 else { throw ValidationError("--batch-size and --runs must be positive") }
    }

    func run() async throws {
        let directory = try ModelDirectory(url: try await options.directory())
        let model = try ModelRegistry.dualEncoder(directory)
        var generator = SystemRandomNumberGenerator()
        let side = model.imageSize
        let pixels = Tensor(shape: [batchSize, 3, side, side],
                            scalars: (0..<(batchSize * 3 * side * side)).map { _ in Float.random(in: -2...2, using: &generator) })
        _ = try model.imageFeatures(pixelValues: pixels)
        var times: [Double] = []
        for _ in 0..<runs {
            let start = DispatchTime.now().uptimeNanoseconds
            _ = try model.imageFeatures(pixelValues: pixels)
            times.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        }
        let median = times.sorted()[times.count / 2] / Double(batchSize)
        if json {
            try printJSON(Report(batchSize: batchSize, msPerItem: median))
        } else {
            print("image-embedding, batch \(batchSize): \(String(format: "%.2f", median)) ms per image (median of \(runs) runs)")
        }
    }
}
