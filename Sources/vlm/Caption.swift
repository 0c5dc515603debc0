import ArgumentParser
import Foundation
import SwiftVLM

struct Caption: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Describe each image (image captioning); with --prompt, continue the prompt about each image.")

    @OptionGroup var options: ModelOption
    @OptionGroup var settings: GenerationSettings
    @OptionGroup var precision: PrecisionOption
    @OptionGroup var panAndScan: PanAndScanOption

    @Option(help: "Text the caption continues (prompted captioning); the output is the continuation only.")
    var prompt: String?

    @Option(help: "llama.cpp's image encoder file for a GGUF --model (LLaVA-1.5, LLaVA-NeXT or Gemma 3: the vision tower and projector, as llama-mtmd-cli's --mmproj).")
    var mmproj: String?

    @Flag(help: "Print JSON instead of one caption per line.")
    var json = false

    @Option(help: "Also write each image's logits for its first new token, before any logits processor, to this NumPy .npy file (float32, [images, vocabulary]; transformers' generate(output_logits=True).logits[0]). Greedy decoding or sampling; an existing file is not overwritten.")
    var logits: String?

    @Argument(help: "Image files (JPEG, PNG, WebP, GIF, BMP or TIFF).")
    var images: [String]

    private struct Result: Encodable {
        let image: String
        let text: String
        let ids: [Int]
    }

    func run() async throws {
        guard !images.isEmpty else { throw PipelineError.noInputs }
        let source = mmproj == nil ? try await options.directory() : try await options.fileOrDirectory()
        let pipeline = try panAndScan.apply(to: mmproj.map { mmproj in try precision.building { try ggufPairPipeline(model: source, mmproj: mmproj) } }
            ?? precision.building(storedIn: source) { try ImageToTextPipeline(directory: source, task: .caption) })
        let config = try settings.apply(to: pipeline.config)
        if let logits {
            guard config.numBeams == 1 else { throw CaptionError.logitsNeedOneBeam }
            guard !FileManager.default.fileExists(atPath: logits) else { throw CaptionError.exists(logits) }
        }
        let decoded = try images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let recorder = GenerationRecorder()
        let results = try GenerationRecorder.$current.withValue(logits == nil ? nil : recorder) {
            try pipeline(decoded, prompt: prompt, settings: config, seed: settings.samplerSeed)
        }
        if let logits {
            let rows = recorder.firstStepLogits
            guard rows.count == images.count, let width = rows.first?.count else {
                throw CaptionError.logitsMissing(expected: images.count, got: rows.count)
            }
            try Data(Tensor(shape: [rows.count, width], scalars: rows.flatMap { $0 }).npyBytes)
                .write(to: URL(fileURLWithPath: logits), options: .withoutOverwriting)
        }
        if json {
            try printJSON(zip(images, results).map { Result(image: $0, text: $1.text, ids: $1.ids) })
            return
        }
        for (image, result) in zip(images, results) { print("\(image): \(result.text)") }
    }
}

/// The image-to-text pipeline over LLaVA-1.5, LLaVA-NeXT or Gemma 3 from llama.cpp's GGUF pair (`--model LM.gguf --mmproj MMPROJ.gguf`).
func ggufPairPipeline(model: URL, mmproj: String) throws -> ImageToTextPipeline {
    let chat = try ImageTextToTextPipeline(gguf: model, mmproj: URL(fileURLWithPath: mmproj))
    return ImageToTextPipeline(model: chat.model, processor: chat.processor, config: chat.text.config)
}

enum CaptionError: Error, CustomStringConvertible {
    case logitsNeedOneBeam
    case exists(String)
    case logitsMissing(expected: Int, got: Int)

    var description: String {
        switch self {
        case .logitsNeedOneBeam: "--logits needs greedy decoding or sampling (--num-beams 1)"
        case .exists(let path): "\(path) exists; remove it first, --logits does not overwrite"
        case let .logitsMissing(expected, got): "--logits: generation gave first-step logits for \(got) of \(expected) images"
        }
    }
}
