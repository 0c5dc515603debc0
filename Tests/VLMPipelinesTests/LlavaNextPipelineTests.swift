import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines

/// LLaVA-NeXT from files, as a user meets it: the checkpoints of oracle/llava_next.py with their processor config
/// and tokenizer, real photos of different aspect ratios, against what transformers' LlavaNextProcessor, generate and
/// decoding gave; and the image token counts LlavaNextProcessor computes at llava-hf's scale.
@Suite struct LlavaNextPipelineTests {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable {
            let images: [String]
            let prompt: String
            let input_ids: [Int]
            let num_image_tokens: [Int]
            let greedy: Generated
        }
        let max_new_tokens: Int
        let requests: [Request]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let names = ["llama-tied-fp16", "mistral-layers-bf16"]

    static func load(_ name: String) throws -> (URL, Expected) {
        let directory = fixtures.appendingPathComponent("llava-next/\(name)")
        return (directory, try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json"))))
    }

    static func photos(_ names: [String]) throws -> [RGBImage] {
        try names.map { try ImageDecoder.decode(contentsOf: fixtures.appendingPathComponent($0)) }
    }

    @Test(arguments: names)
    func processorExpandsImageTokensLikeTransformers(_ name: String) throws {
        let (directory, expected) = try Self.load(name)
        let processor = try LlavaNextProcessor(directory: ModelDirectory(url: directory))
        for request in expected.requests {
            let images = try processor.imageProcessor.preprocess(Self.photos(request.images))
            #expect(processor.imageTokenCounts(images) == request.num_image_tokens, "\(request.images)")
            #expect(try processor.promptIds(request.prompt, images: images) == request.input_ids, "\(request.images)")
            if request.images.count == 1 {
                #expect(try processor.promptIds(request.prompt, for: images) == [request.input_ids])
            } else {
                #expect(throws: ModelError.self) { try processor.promptIds(request.prompt + "<image>", images: images) }
            }
        }
        // The count depends on the image: without one there is no prompt.
        #expect(throws: ModelError.self) { try processor.promptIds("<image>\nA photo of") }
        #expect(processor.questionPrompt("What is this?") == "[INST] <image>\nWhat is this? [/INST]")
    }

    /// image_processor.json's configs, as a checkpoint directory (the fixtures' tokenizer, processor_config.json with
    /// llava-hf's settings and the case's patch size): LlavaNextProcessor's counts are transformers'.
    @Test(arguments: ["llava-hf", "tiny", "exact-size-no-crop"])
    func imageTokenCountsMatchTransformers(_ name: String) throws {
        let data = try Data(contentsOf: Self.fixtures.appendingPathComponent("llava-next/image_processor.json"))
        let cases = try #require((try JSONSerialization.jsonObject(with: data) as? [String: Any])?["cases"] as? [[String: Any]])
        let entry = try #require(cases.first { $0["name"] as? String == name })
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("llava-next-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let checkpoint = Self.fixtures.appendingPathComponent("llava-next/llama-tied-fp16")
        for file in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
            try FileManager.default.copyItem(at: checkpoint.appendingPathComponent(file), to: directory.appendingPathComponent(file))
        }
        let settings: [String: Any] = ["image_processor": try #require(entry["config"]), "patch_size": try #require(entry["patch_size"]),
                                       "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1]
        try JSONSerialization.data(withJSONObject: settings).write(to: directory.appendingPathComponent("processor_config.json"))
        let processor = try LlavaNextProcessor(directory: ModelDirectory(url: directory))
        let sizes = try #require(entry["image_sizes"] as? [[Int]])
        let counts = sizes.map { processor.imageTokenCount(originalSize: ImageSize(height: $0[0], width: $0[1])) }
        #expect(counts == entry["num_image_tokens"] as? [Int])
    }

    /// Photos of different sizes get prompts of different lengths, so the pipeline takes them one at a time.
    @Test(arguments: names)
    func captionsWithAPromptLikeTransformers(_ name: String) throws {
        let (directory, expected) = try Self.load(name)
        let pipeline = try ImageToTextPipeline(directory: directory)
        var settings = pipeline.config
        settings.maxNewTokens = expected.max_new_tokens
        settings.doSample = false
        let single = expected.requests.filter { $0.images.count == 1 }
        let results = try pipeline(Self.photos(single.flatMap(\.images)), prompt: single[0].prompt, settings: settings)
        #expect(results.map(\.ids) == single.map(\.greedy.ids))
        #expect(results.map(\.text) == single.map(\.greedy.text))
    }

    @Test func answersInTheMistralLayout() throws {
        let (directory, expected) = try Self.load("mistral-layers-bf16")
        let vqa = try VisualQuestionAnsweringPipeline(directory: directory)
        var settings = try #require(vqa.generationConfig)
        settings.maxNewTokens = expected.max_new_tokens
        let request = expected.requests[0]
        let processor = try LlavaNextProcessor(directory: ModelDirectory(url: directory))
        #expect(request.prompt == processor.questionPrompt("What is shown in this image?"))
        let answer = try vqa(Self.photos(request.images), question: "What is shown in this image?", settings: settings)
        #expect(answer.map { $0.map(\.ids) } == [[request.greedy.ids]])
    }
}
