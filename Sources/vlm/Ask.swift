import ArgumentParser
import Foundation
import SwiftVLM

struct Ask: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Answer a question about each image (visual question answering).",
        discussion: "Generating models (BLIP-2, BLIP, LLaVA) write one answer with the generation options. Classifying models (ViLT) score their answer vocabulary: --top-k is then how many answers to give, best first (5 by default), each with its sigmoid score.")

    @OptionGroup var options: ModelOption
    @OptionGroup var settings: GenerationSettings
    @OptionGroup var precision: PrecisionOption
    @OptionGroup var panAndScan: PanAndScanOption

    @Option(help: "The question, asked of every image.")
    var question: String

    @Option(help: "llama.cpp's image encoder file for a GGUF --model (LLaVA-1.5, LLaVA-NeXT or Gemma 3: the vision tower and projector, as llama-mtmd-cli's --mmproj).")
    var mmproj: String?

    @Flag(help: "Print JSON instead of one answer per line.")
    var json = false

    @Argument(help: "Image files (JPEG, PNG, WebP, GIF, BMP or TIFF).")
    var images: [String]

    private struct Answer: Encodable {
        let answer: String
        let ids: [Int]?
        let score: Float?

        // A generated answer has ids, a classified one a score; the other key is left out.
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(answer, forKey: .answer)
            try container.encodeIfPresent(ids, forKey: .ids)
            try container.encodeIfPresent(score, forKey: .score)
        }

        enum CodingKeys: String, CodingKey { case answer, ids, score }
    }

    private struct Result: Encodable {
        let image: String
        let question: String
        let answers: [Answer]
    }

    func run() async throws {
        guard !images.isEmpty else { throw PipelineError.noInputs }
        let source = mmproj == nil ? try await options.directory() : try await options.fileOrDirectory()
        let loaded = try mmproj.map { mmproj in
            try precision.building { VisualQuestionAnsweringPipeline(generator: try ggufPairPipeline(model: source, mmproj: mmproj)) }
        } ?? precision.building(storedIn: source) { try VisualQuestionAnsweringPipeline(directory: source) }
        let pipeline = panAndScan.panAndScan ? try loaded.withPanAndScan() : loaded
        let config = try pipeline.generationConfig.map(settings.apply)
        let decoded = try images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let results = try pipeline(decoded, question: question, settings: config, seed: settings.samplerSeed,
                                 topK: settings.topK ?? 5)
        if json {
            try printJSON(zip(images, results).map { image, answers in
                Result(image: image, question: question,
                       answers: answers.map { Answer(answer: $0.answer, ids: $0.ids, score: $0.score) })
            })
            return
        }
        for (image, answers) in zip(images, results) {
            let text = answers.map { answer in answer.score.map { "\(answer.answer) (\(String(format: "%.3f", $0)))" } ?? answer.answer }
            print("\(image): \(text.joined(separator: ", "))")
        }
    }
}
