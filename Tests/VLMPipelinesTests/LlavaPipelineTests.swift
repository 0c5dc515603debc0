import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines

/// LLaVA from files, as a user meets it: the checkpoints of oracle/llava.py with their processor config and the real
/// SmolLM2 tokenizer, real photos, against what transformers' LlavaProcessor, generate and decoding gave.
@Suite struct LlavaPipelineTests {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable {
            let image: String
            let prompt: String
            let input_ids: [Int]
            let greedy: Generated
            let beam: Generated
        }
        let max_new_tokens: Int
        let requests: [Request]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let names = ["llama-default-fp16", "qwen2-layers-full-bf16"]

    static func load(_ name: String) throws -> (URL, Expected) {
        let directory = fixtures.appendingPathComponent("llava/\(name)")
        return (directory, try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json"))))
    }

    @Test(arguments: names)
    func processorExpandsImageTokensLikeTransformers(_ name: String) throws {
        let (directory, expected) = try Self.load(name)
        let processor = try LlavaProcessor(directory: ModelDirectory(url: directory))
        for request in expected.requests {
            #expect(try processor.promptIds(request.prompt) == request.input_ids, "\(request.prompt)")
        }
        #expect(processor.questionPrompt("What is this?") == "USER: <image>\nWhat is this? ASSISTANT:")
        // A prompt without <image> reads the image first.
        #expect(try processor.promptIds("A photo of") == processor.promptIds("<image>\nA photo of"))
    }

    @Test(arguments: names, ["greedy", "beam"])
    func captionsWithAPromptLikeTransformers(_ name: String, _ mode: String) throws {
        let (directory, expected) = try Self.load(name)
        let pipeline = try ImageToTextPipeline(directory: directory)
        var settings = pipeline.config
        settings.maxNewTokens = expected.max_new_tokens
        settings.doSample = false
        settings.numBeams = mode == "beam" ? 3 : 1
        for request in expected.requests {
            let image = try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent("photos/\(request.image)"))
            let result = try pipeline([image], prompt: request.prompt, settings: settings)[0]
            let reference = mode == "beam" ? request.beam : request.greedy
            #expect(result.ids == reference.ids, "\(request.image) \(request.prompt)")
            #expect(result.text == reference.text)
        }
    }
}
