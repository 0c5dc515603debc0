import ArgumentParser
import Foundation
import SwiftVLM

/// `vlm bench-tokenizer`: tokenizer throughput on a text file, one encode call per line, for
/// scripts/bench_tokenizers.py to set beside Rust tokenizers.
struct BenchTokenizer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-tokenizer",
        abstract: "Encode every line of a UTF-8 text file (special tokens added, one call per line) and report the throughput of the fastest of several passes.")

    @OptionGroup var options: ModelOption

    @Option(help: "The UTF-8 text file to tokenize, one text per line.")
    var file: String

    @Option(help: "How many passes over the file; the fastest counts.")
    var passes = 3

    @Flag(help: "Print JSON instead of a line.")
    var json = false

    private struct Report: Encodable {
        let task = "tokenize"
        let bytes: Int
        let tokens: Int
        let seconds: Double
        let mb_per_s: Double
    }

    func validate() throws {
        guard passes > 0 else { throw ValidationError("--passes must be at least 1") }
    }

    func run() async throws {
        let tokenizer = try Tokenizer(directory: try await options.directory())
        guard let data = FileManager.default.contents(atPath: file), String(validating: data, as: UTF8.self) != nil else {
            throw TokenizeError.unreadable(file)
        }
        // Split the bytes: as Characters, "\r\n" is one and would not split at "\n".
        let lines = data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
        var best = Double.infinity
        var tokens = 0
        for _ in 0..<passes {
            let clock = ContinuousClock()
            var count = 0
            let elapsed = clock.measure {
                for line in lines { count += tokenizer.encode(line).ids.count }
            }
            tokens = count
            best = min(best, Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18)
        }
        let report = Report(bytes: data.count, tokens: tokens, seconds: best, mb_per_s: Double(data.count) / 1e6 / best)
        if json {
            try printJSON(report)
        } else {
            print("\(report.bytes) bytes, \(report.tokens) tokens in \(String(format: "%.3f", report.seconds)) s: \(String(format: "%.2f", report.mb_per_s)) MB/s")
        }
    }
}
