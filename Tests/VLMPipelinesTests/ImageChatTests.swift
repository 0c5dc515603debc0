import Foundation
import Testing
import VLMImages
import VLMModels
import VLMPipelines
import VLMTemplates

/// Conversations with images through a LLaVA checkpoint's chat template (Tests/Fixtures/image-chat, by
/// oracle/image_chat.py: transformers' `processor.apply_chat_template(..., tokenize=True)` and greedy `generate`).
@Suite struct ImageChatTests {
    struct Expected: Decodable {
        struct Answer: Decodable { let prompt: String; let input_ids: [Int]; let ids: [Int]; let text: String }
        struct Conversation: Decodable { let greedy: Answer; let beam: Answer? }
        struct Turn: Decodable { let images: [String]; let text: String; let input_ids: [Int]; let ids: [Int]; let answer: String }
        let max_new_tokens: Int
        let system: String?
        let conversations: [Conversation]
        let session: [Turn]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let cases = ["llava-1.5", "chatml"]

    /// The case's pipeline, what transformers answered, and its conversations with image paths made absolute.
    static func load(_ name: String) throws -> (ImageTextToTextPipeline, Expected, [[JSONValue]]) {
        let directory = fixtures.appendingPathComponent("image-chat/\(name)")
        let file = directory.appendingPathComponent("expected.json")
        let data = try Data(contentsOf: file)
        guard case let .array(conversations)? = try JSONValue(parsing: data)["conversations"] else {
            throw CocoaError(.fileReadCorruptFile)
        }
        let messages = conversations.map { conversation -> [JSONValue] in
            guard case let .array(messages)? = conversation["messages"] else { return [] }
            return messages.map { withImagePaths($0) { .string(fixtures.appendingPathComponent($0).path) } }
        }
        return (try ImageTextToTextPipeline(directory: directory), try JSONDecoder().decode(Expected.self, from: data), messages)
    }

    /// `message` with each image part's "path" rewritten by `rewrite`.
    static func withImagePaths(_ message: JSONValue, _ rewrite: (String) -> JSONValue) -> JSONValue {
        guard case let .object(fields) = message else { return message }
        return .object(fields.map { key, value in
            guard key == "content", case let .array(parts) = value else { return (key, value) }
            return (key, .array(parts.map { part in
                guard case let .object(partFields) = part, case let .string(path)? = part["path"] else { return part }
                return .object(partFields.map { $0.0 == "path" ? ($0.0, rewrite(path)) : $0 })
            }))
        })
    }

    static func settings(_ pipeline: ImageTextToTextPipeline, _ expected: Expected, beams: Int = 1) -> GenerationConfig {
        var settings = pipeline.text.config
        settings.maxNewTokens = expected.max_new_tokens
        settings.doSample = false
        settings.numBeams = beams
        return settings
    }

    @Test(arguments: cases)
    func answersConversationsLikeTransformers(_ name: String) throws {
        let (pipeline, expected, conversations) = try Self.load(name)
        for (messages, reference) in zip(conversations, expected.conversations) {
            let result = try pipeline.generate(messages: messages, settings: Self.settings(pipeline, expected))
            #expect(result.promptTokens == reference.greedy.input_ids, "\(reference.greedy.prompt)")
            #expect(result.ids == reference.greedy.ids, "\(reference.greedy.prompt)")
            #expect(result.text == reference.greedy.text)
            if let beam = reference.beam {
                let beamed = try pipeline.generate(messages: messages, settings: Self.settings(pipeline, expected, beams: 3))
                #expect(beamed.ids == beam.ids, "3 beams: \(beam.prompt)")
            }
        }
    }

    /// A session sends each turn's images once and runs only what its KV cache does not hold; the answers are
    /// transformers' for the whole conversation each turn.
    @Test(arguments: cases)
    func sessionKeepsItsCacheAndAnswersLikeTransformers(_ name: String) throws {
        let (pipeline, expected, _) = try Self.load(name)
        let session = try ChatSession(pipeline: pipeline, system: expected.system)
        for (index, turn) in expected.session.enumerated() {
            let images = try turn.images.map { try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0)) }
            var streamed = ""
            let answer = try session.send(turn.text, images: images, settings: Self.settings(pipeline, expected)) { streamed += $0 }
            #expect(answer.promptTokens == turn.input_ids, "turn \(index)")
            #expect(answer.ids == turn.ids, "turn \(index)")
            #expect(answer.text == turn.answer)
            #expect(streamed == turn.answer)
            if index > 0 {
                // At least the whole previous prompt was cached (the reply's tokens too where the template writes
                // them back as they were generated).
                #expect(answer.reusedTokens >= expected.session[index - 1].input_ids.count, "turn \(index)")
            }
        }
    }

    /// The same photo given as a path, a file:// URL, a data URL and base64 text gives the same answer.
    @Test func imageReferencesOfEveryKindReadTheSamePhoto() throws {
        let (pipeline, expected, conversations) = try Self.load("llava-1.5")
        let photo = Self.fixtures.appendingPathComponent("photos/chelsea.png")
        let base64 = try Data(contentsOf: photo).base64EncodedString()
        let reference = expected.conversations[0].greedy
        for (key, value) in [("url", URL(fileURLWithPath: photo.path).absoluteString), ("url", "data:image/png;base64," + base64),
                             ("base64", base64), ("image", photo.path)] {
            let messages = conversations[0].map { message -> JSONValue in
                guard case let .object(fields) = message, case let .array(parts)? = message["content"] else { return message }
                return .object(fields.map { $0.0 == "content"
                    ? ($0.0, .array(parts.map { $0["type"] == .string("image") ? .object([("type", "image"), (key, .string(value))]) : $0 }))
                    : $0 })
            }
            let result = try pipeline.generate(messages: messages, settings: Self.settings(pipeline, expected))
            #expect(result.ids == reference.ids, "\(key)")
        }
    }

    @Test func badConversationsAreRefusedWithOneLine() throws {
        let (pipeline, expected, conversations) = try Self.load("llava-1.5")
        let settings = Self.settings(pipeline, expected)
        func refusal(_ messages: [JSONValue]) -> String? {
            do {
                _ = try pipeline.generate(messages: messages, settings: settings)
                return nil
            } catch {
                return "\(error)"
            }
        }
        let question = conversations[0]
        // An image part that names no image: the template still writes its marker.
        let unnamed = question.map { Self.withImagePaths($0) { _ in .null } }
        #expect(refusal(unnamed) == "the chat template wrote 1 <image> markers for the 0 images of the messages; they must match")
        let missing = question.map { Self.withImagePaths($0) { _ in "/nonexistent/cat.png" } }
        #expect(refusal(missing)?.contains("/nonexistent/cat.png") == true)
        let web = question.map { Self.withImagePaths($0) { _ in "https://example.com/cat.png" } }
        #expect(refusal(web) == "message 0: image \"https://example.com/cat.png\": images are not downloaded: save it and give its path")
        let badData = question.map { Self.withImagePaths($0) { _ in "data:text/plain;base64,aGVsbG8=" } }
        #expect(refusal(badData)?.hasSuffix("a data URL must be data:image/<type>;base64,<data>") == true)
        // The language model alone reads no images.
        #expect(throws: PipelineError.self) { try pipeline.text.generate(messages: question, settings: settings) }
        for refused in [refusal(unnamed), refusal(missing), refusal(web), refusal(badData)] {
            #expect(refused?.contains("\n") == false)
        }
    }
}
