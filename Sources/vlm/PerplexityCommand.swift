import ArgumentParser
import Foundation
import SwiftVLM

struct PerplexityCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "perplexity",
        abstract: "How well a language model predicts a text: the perplexity (exp of the mean negative log-likelihood of every token after the first), by the strided sliding-window recipe of transformers' perplexity guide.")

    @OptionGroup var options: ModelOption
    @OptionGroup var precision: PrecisionOption

    @Option(help: "A UTF-8 text file to score.")
    var file: String?

    @Option(help: "The text to score (instead of --file).")
    var text: String?

    @Option(help: "Tokens per window the model reads at once (a window's logits take context × vocabulary × 4 bytes). Default: 512, or the model's positions where it has fewer.")
    var context: Int?

    @Option(help: "Tokens from one window's start to the next, less than the context; each window scores the tokens the one before did not reach. Default: half the context, so every token after the first window has at least that many before it.")
    var stride: Int?

    @Flag(help: "Print JSON instead of a sentence.")
    var json = false

    private struct Report: Encodable {
        let tokens: Int
        let scored: Int
        let windows: Int
        let nll: Double
        let perplexity: Double
    }

    func validate() throws {
        guard (file == nil) != (text == nil) else { throw ValidationError("give either --file or --text") }
    }

    func run() async throws {
        let source: String
        if let file {
            guard let data = FileManager.default.contents(atPath: file),
                  let decoded = String(validating: data, as: UTF8.self) else { throw TokenizeError.unreadable(file) }
            source = decoded
        } else {
            source = text ?? ""
        }
        let path = try await options.fileOrDirectory()
        let pipeline = try precision.building { try TextGenerationPipeline(path: path) }
        let window = context ?? min(512, pipeline.model.contextLength ?? 512)
        let result = try pipeline.perplexity(of: source, context: window, stride: stride ?? max(window / 2, 1))
        let nll = result.negativeLogLikelihood
        if json {
            try printJSON(Report(tokens: result.tokens, scored: nll.count, windows: result.windows, nll: nll.mean,
                                 perplexity: result.perplexity))
            return
        }
        print("perplexity \(String(format: "%.4f", result.perplexity)) (mean negative log-likelihood \(String(format: "%.6f", nll.mean)) over \(nll.count) tokens, \(result.windows) windows)")
    }
}
