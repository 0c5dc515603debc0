import ArgumentParser
import Foundation
import SwiftVLM

struct Caption: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Describe each image (image captioning); with --prompt, continue the prompt about each image.")

    @OptionGroup var options: ModelOption
    @OptionGroup var settings: GenerationSettings
    @OptionGroup var precision: PrecisionOption

    @Option(help: "Text the caption continues (prompted captioning); the output is the continuation only.")
    var prompt: String?

    @Option(help: "llama.cpp's image encoder file for a GGUF --model (LLaVA-1.5 or LLaVA-NeXT: the CLIP tower and projector, as llama-mtmd-cli's --mmproj).")
    var mmproj: String?

    @Flag(help: "Print JSON instead of one caption per line.")
    var json = false

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
        let pipeline = try mmproj.map { mmproj in try precision.building { try ggufPairPipeline(model: source, mmproj: mmproj) } }
            ?? precision.building(storedIn: source) { try ImageToTextPipeline(directory: source, task: .caption) }
        let config = try settings.apply(to: pipeline.config)
        let decoded = try images.map { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: $0)) }
        let results = try pipeline(decoded, prompt: prompt, settings: config, seed: settings.samplerSeed)
        if json {
            try printJSON(zip(images, results).map { Result(image: $0, text: $1.text, ids: $1.ids) })
            return
        }
        for (image, result) in zip(images, results) { print("\(image): \(result.text)") }
    }
}

/// The image-to-text pipeline over LLaVA-1.5 or LLaVA-NeXT from llama.cpp's GGUF pair (`--model LM.gguf --mmproj MMPROJ.gguf`).
func ggufPairPipeline(model: URL, mmproj: String) throws -> ImageToTextPipeline {
    let chat = try ImageTextToTextPipeline(gguf: model, mmproj: URL(fileURLWithPath: mmproj))
    return ImageToTextPipeline(model: chat.model, processor: chat.processor, config: chat.text.config)
}
