import ArgumentParser
import Foundation
import SwiftVLM

struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Model speed: image embedding for image-text models (random pixels, median of several runs); prompt prefill and greedy decoding for language models (a llama.cpp .gguf file or a checkpoint).")

    @OptionGroup var options: ModelOption

    @Option(help: "Images per forward pass (image-text models).")
    var batchSize = 1

    @Option(help: "Timed runs after the warm-up; the median counts.")
    var runs = 5

    @Option(help: "Prompt length in tokens (language models).")
    var promptTokens = 256

    @Option(help: "Tokens generated one at a time after the prompt (language models).")
    var newTokens = 128

    @Flag(help: "Print JSON instead of a sentence.")
    var json = false

    private struct ImageReport: Encodable {
        let task = "image-embedding"
        let batchSize: Int
        let msPerItem: Double

        enum CodingKeys: String, CodingKey {
            case task, batchSize = "batch_size", msPerItem = "ms_per_item"
        }
    }

    private struct TextReport: Encodable {
        let task = "text-generation"
        let promptTokens: Int
        let newTokens: Int
        let prefillTokensPerSecond: Double
        let decodeTokensPerSecond: Double

        enum CodingKeys: String, CodingKey {
            case task, promptTokens = "prompt_tokens", newTokens = "new_tokens"
            case prefillTokensPerSecond = "prefill_tokens_per_s", decodeTokensPerSecond = "decode_tokens_per_s"
        }
    }

    func validate() throws {
        guard batchSize > 0, runs > 0 else { throw ValidationError("--batch-size and --runs must be positive") }
        guard promptTokens > 0, newTokens > 0 else { throw ValidationError("--prompt-tokens and --new-tokens must be positive") }
    }

    func run() async throws {
        if options.model.hasSuffix(".gguf") {
            try benchLanguageModel(LlamaForCausalLM(gguf: URL(fileURLWithPath: options.model)))
            return
        }
        let directory = try ModelDirectory(url: try await options.directory())
        switch try ModelRegistry.family(of: directory).builder {
        case .causalLanguageModel(let build): try benchLanguageModel(build(directory))
        case .imageTextDualEncoder(let build): try benchImageModel(build(directory))
        }
    }

    private func benchImageModel(_ model: any ImageTextDualEncoder) throws {
        // Seeded: the system generator makes a system call per number, seconds for a batch of 32 images.
        var generator = SeededGenerator(seed: 0x5EED)
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
            try printJSON(ImageReport(batchSize: batchSize, msPerItem: median))
        } else {
            print("image-embedding, batch \(batchSize): \(String(format: "%.2f", median)) ms per image (median of \(runs) runs)")
        }
    }

    /// Prefills a prompt of fixed pseudo-random token ids through a KV cache, then feeds back the greedy token
    /// `newTokens` times (no stop token); one untimed warm-up run creates the primitives for every shape first.
    private func benchLanguageModel(_ model: any CausalLanguageModel) throws {
        var state: UInt64 = 0x5EED
        let prompt = (0..<promptTokens).map { _ in
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int(state >> 33) % model.vocabularySize
        }
        func timedRun() throws -> (prefill: Double, decode: Double) {
            let cache = try model.makeCache(batch: 1, capacity: promptTokens + newTokens)
            let start = DispatchTime.now().uptimeNanoseconds
            var logits = try model.logits(inputIds: [prompt], cache: cache, lastPositionOnly: true)
            var token = argmaxLastDimension(logits)[0]
            let prefilled = DispatchTime.now().uptimeNanoseconds
            for _ in 0..<newTokens {
                logits = try model.logits(inputIds: [[token]], cache: cache)
                token = argmaxLastDimension(logits)[0]
            }
            let end = DispatchTime.now().uptimeNanoseconds
            return (Double(prefilled - start) / 1e9, Double(end - prefilled) / 1e9)
        }
        _ = try timedRun()
        var prefill: [Double] = [], decode: [Double] = []
        for _ in 0..<runs {
            let times = try timedRun()
            prefill.append(times.prefill)
            decode.append(times.decode)
        }
        let report = TextReport(promptTokens: promptTokens, newTokens: newTokens,
                                prefillTokensPerSecond: Double(promptTokens) / prefill.sorted()[runs / 2],
                                decodeTokensPerSecond: Double(newTokens) / decode.sorted()[runs / 2])
        if json {
            try printJSON(report)
        } else {
            print(String(format: "text-generation: prefill %.1f tokens/s (%d-token prompt), decode %.1f tokens/s (%d tokens), median of %d runs",
                         report.prefillTokensPerSecond, promptTokens, report.decodeTokensPerSecond, newTokens, runs))
        }
    }
}
