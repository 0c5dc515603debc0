import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTemplates

/// LLaVA-OneVision from files, as a user meets it: the checkpoints of oracle/llava_onevision.py with their processor
/// config, tokenizer and (SmolLM2 one) ChatML template, against what transformers' LlavaOnevisionProcessor,
/// `apply_chat_template(..., tokenize=True)`, generate and decoding gave; one image is tiled, two in a conversation
/// are read whole, including when a chat session's second image changes how its first is read.
@Suite struct LlavaOnevisionPipelineTests {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Request: Decodable {
            let images: [String]
            let prompt: String
            let input_ids: [Int]
            let num_image_tokens: [Int]
            let greedy: Generated
        }
        struct Answer: Decodable { let prompt: String; let input_ids: [Int]; let ids: [Int]; let text: String }
        struct Conversation: Decodable { let greedy: Answer }
        struct Turn: Decodable { let images: [String]; let text: String; let input_ids: [Int]; let ids: [Int]; let answer: String }
        struct Chat: Decodable {
            let max_new_tokens: Int
            let system: String
            let conversations: [Conversation]
            let session: [Turn]
        }
        let max_new_tokens: Int
        let requests: [Request]
        let chat: Chat?
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let names = ["qwen2-smollm2-bf16", "qwen2-layers-fp16"]
    static let chatModel = "qwen2-smollm2-bf16"

    static func load(_ name: String) throws -> (URL, Expected) {
        let directory = fixtures.appendingPathComponent("llava-onevision/\(name)")
        return (directory, try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json"))))
    }

    static func photos(_ names: [String]) throws -> [RGBImage] {
        try names.map { try ImageDecoder.decode(contentsOf: fixtures.appendingPathComponent($0)) }
    }

    @Test(arguments: names)
    func processorExpandsImageTokensLikeTransformers(_ name: String) throws {
        let (directory, expected) = try Self.load(name)
        let processor = try LlavaOnevisionProcessor(directory: ModelDirectory(url: directory))
        for request in expected.requests {
            let images = try processor.preprocess(Self.photos(request.images), conversationImageCount: request.images.count)
            #expect(processor.imageTokenCounts(images) == request.num_image_tokens, "\(request.images)")
            #expect(try processor.promptIds(request.prompt, images: images) == request.input_ids, "\(request.images)")
            if request.images.count == 1 {
                #expect(try processor.promptIds(request.prompt, for: images) == [request.input_ids])
            }
        }
        #expect(throws: ModelError.self) { try processor.promptIds("<image>\nA photo of") }
        #expect(processor.imageLayout(conversationImageCount: 1) != processor.imageLayout(conversationImageCount: 2))
        #expect(processor.questionPrompt("What is this?") == "<|im_start|>user <image>\nWhat is this?<|im_end|>\n<|im_start|>assistant\n")
    }

    /// image_processor.json's configs and layouts as a checkpoint directory (the fixture's tokenizer, the case's
    /// num_image_tokens): LlavaOnevisionProcessor's counts are transformers', tiled and read whole.
    @Test(arguments: ["defaults", "tiny"], ["single", "conversation"])
    func imageTokenCountsMatchTransformers(_ name: String, _ layout: String) throws {
        let data = try Data(contentsOf: Self.fixtures.appendingPathComponent("llava-onevision/image_processor.json"))
        let cases = try #require((try JSONSerialization.jsonObject(with: data) as? [String: Any])?["cases"] as? [[String: Any]])
        let entry = try #require(cases.first { $0["name"] as? String == name && $0["layout"] as? String == layout })
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("llava-onevision-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let checkpoint = Self.fixtures.appendingPathComponent("llava-onevision/qwen2-layers-fp16")
        for file in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
            try FileManager.default.copyItem(at: checkpoint.appendingPathComponent(file), to: directory.appendingPathComponent(file))
        }
        let imageProcessorConfig = try #require(entry["config"] as? [String: Any])
        let size = try #require((imageProcessorConfig["size"] as? [String: Int])?["height"])
        let patch = try #require(entry["patch_size"] as? Int)
        let settings: [String: Any] = ["image_processor": imageProcessorConfig, "num_image_tokens": (size / patch) * (size / patch),
                                       "vision_feature_select_strategy": "full",
                                       "vision_aspect_ratio": try #require(entry["vision_aspect_ratio"])]
        try JSONSerialization.data(withJSONObject: settings).write(to: directory.appendingPathComponent("processor_config.json"))
        let processor = try LlavaOnevisionProcessor(directory: ModelDirectory(url: directory))
        let sizes = try #require(entry["image_sizes"] as? [[Int]])
        let counts = sizes.map {
            processor.imageTokenCount(originalSize: ImageSize(height: $0[0], width: $0[1]), tiled: layout == "single")
        }
        #expect(counts == entry["num_image_tokens"] as? [Int])
    }

    /// Photos of different sizes get prompts of different lengths, so the pipeline takes them one at a time, each
    /// tiled.
    @Test func captionsWithAPromptLikeTransformers() throws {
        let (directory, expected) = try Self.load("qwen2-layers-fp16")
        let pipeline = try ImageToTextPipeline(directory: directory)
        var settings = pipeline.config
        settings.maxNewTokens = expected.max_new_tokens
        settings.doSample = false
        let single = expected.requests.filter { $0.images.count == 1 }
        let results = try pipeline(Self.photos(single.flatMap(\.images)), prompt: single[0].prompt, settings: settings)
        #expect(results.map(\.ids) == single.map(\.greedy.ids))
        #expect(results.map(\.text) == single.map(\.greedy.text))
    }

    static func chat() throws -> (ImageTextToTextPipeline, Expected.Chat, [[JSONValue]]) {
        let directory = fixtures.appendingPathComponent("llava-onevision/\(chatModel)")
        let data = try Data(contentsOf: directory.appendingPathComponent("expected.json"))
        guard case let .array(conversations)? = try JSONValue(parsing: data)["chat"]?["conversations"] else {
            throw CocoaError(.fileReadCorruptFile)
        }
        let messages = conversations.map { conversation -> [JSONValue] in
            guard case let .array(messages)? = conversation["messages"] else { return [] }
            return messages.map { ImageChatTests.withImagePaths($0) { .string(fixtures.appendingPathComponent($0).path) } }
        }
        let expected = try #require(try JSONDecoder().decode(Expected.self, from: data).chat)
        return (try ImageTextToTextPipeline(directory: directory), expected, messages)
    }

    static func settings(_ pipeline: ImageTextToTextPipeline, _ expected: Expected.Chat) -> GenerationConfig {
        var settings = pipeline.text.config
        settings.maxNewTokens = expected.max_new_tokens
        settings.doSample = false
        return settings
    }

    /// One image tiled; two images, in one turn or two, each read whole.
    @Test func answersConversationsLikeTransformers() throws {
        let (pipeline, expected, conversations) = try Self.chat()
        for (messages, reference) in zip(conversations, expected.conversations) {
            let result = try pipeline.generate(messages: messages, settings: Self.settings(pipeline, expected))
            #expect(result.promptTokens == reference.greedy.input_ids, "\(reference.greedy.prompt)")
            #expect(result.ids == reference.greedy.ids, "\(reference.greedy.prompt)")
            #expect(result.text == reference.greedy.text)
        }
    }

    /// The second turn's image makes transformers read the first one whole too: the session computes both again,
    /// and its cache holds only the text before the first image; the third turn reuses the whole second prompt.
    @Test func sessionRereadsItsImagesWhenASecondArrives() throws {
        let (pipeline, expected, _) = try Self.chat()
        let session = try ChatSession(pipeline: pipeline, system: expected.system)
        let imageToken = pipeline.model.imageTokenId
        for (index, turn) in expected.session.enumerated() {
            var streamed = ""
            let answer = try session.send(turn.text, images: Self.photos(turn.images),
                                          settings: Self.settings(pipeline, expected)) { streamed += $0 }
            #expect(answer.promptTokens == turn.input_ids, "turn \(index)")
            #expect(answer.ids == turn.ids, "turn \(index)")
            #expect(answer.text == turn.answer && streamed == turn.answer, "turn \(index)")
            switch index {
            case 1:
                let firstImageToken = try #require(turn.input_ids.firstIndex(of: imageToken))
                #expect(answer.reusedTokens == firstImageToken)
            case 2: #expect(answer.reusedTokens >= expected.session[1].input_ids.count)
            default: break
            }
        }
    }
}
