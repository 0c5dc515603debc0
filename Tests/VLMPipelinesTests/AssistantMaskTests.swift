import Foundation
import Testing
import VLMModels
import VLMPipelines
import VLMTemplates
import VLMTokenizers

/// `apply_chat_template(..., return_assistant_tokens_mask=True)` (oracle/assistant_masks.py): two templates with
/// `{% generation %}` blocks (one inside a macro, where transformers' marks land before the reply), three
/// conversations, SmolLM2's real tokenizer; and SmolLM2's supervised fine-tuning loss over the marked tokens.
@Suite struct AssistantMaskTests {
    struct Expected: Decodable {
        struct Case: Decodable {
            let template: String
            let messages: [[String: String]]
            let text: String
            let generation_indices: [[Int]]
            let input_ids: [Int]
            let assistant_masks: [Int]
        }
        let cases: [Case]
        let smollm2_sft_loss: Float
    }

    static let directory = SmolLM2Pipeline.packageRoot.appendingPathComponent("Tests/Fixtures/chat-templates/assistant-masks")
    static let expected = Result {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
    }
    static let tokenizer = Result {
        try Tokenizer(directory: SmolLM2Pipeline.packageRoot.appendingPathComponent("Tests/Fixtures/tokenizers/real/smollm2"))
    }

    static func messages(_ messages: [[String: String]]) -> [JSONValue] {
        messages.map { .object([("role", .string($0["role"] ?? "")), ("content", .string($0["content"] ?? ""))]) }
    }

    static func template(_ name: String) throws -> ChatTemplate {
        let url = directory.appendingPathComponent(name)
        return try ChatTemplate(source: String(decoding: try Data(contentsOf: url), as: UTF8.self), file: url.path)
    }

    @Test func generationBlocksMarkWhatTransformersMarks() throws {
        let expected = try Self.expected.get(), tokenizer = try Self.tokenizer.get()
        #expect(expected.cases.count == 6)
        for test in expected.cases {
            let messages = Self.messages(test.messages)
            let rendered = try Self.template(test.template).renderMarkingGenerations(messages: messages)
            #expect(rendered.text == test.text, "\(test.template)")
            #expect(rendered.generations.map { [$0.lowerBound, $0.upperBound] } == test.generation_indices, "\(test.template)")
            let encoding = tokenizer.encode(rendered.text, addSpecialTokens: false)
            #expect(encoding.ids == test.input_ids, "\(test.template)")
            #expect(encoding.mask(covering: rendered.generations) == test.assistant_masks, "\(test.template): \(test.text)")
        }
    }

    @Test func aTemplateWithoutGenerationBlocksMarksNothing() throws {
        let template = try ChatTemplate(source: "{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
        let rendered = try template.renderMarkingGenerations(messages: [["role": "assistant", "content": "Hi"]])
        #expect(rendered.generations.isEmpty)
        #expect(try Self.tokenizer.get().encode(rendered.text, addSpecialTokens: false).mask(covering: []).allSatisfy { $0 == 0 })
    }

    /// Supervised fine-tuning's loss: the conversation's ids through the pipeline, every unmarked label -100.
    @Test(.enabled(if: SmolLM2Pipeline.ggufURL != nil, "SmolLM2 GGUF not found"))
    func supervisedLossOverTheAssistantsTokens() throws {
        let expected = try Self.expected.get()
        let test = expected.cases[0]
        let messages = Self.messages(test.messages)
        let (smolLM2, _) = try SmolLM2Pipeline.make()
        let pipeline = TextGenerationPipeline(model: smolLM2.model, tokenizer: try Self.tokenizer.get(), config: smolLM2.config,
                                              chatTemplate: try Self.template(test.template))
        let (ids, mask) = try pipeline.chatIdsWithAssistantMask(messages: messages)
        #expect(ids == test.input_ids && mask == test.assistant_masks)
        let labels = zip(ids, mask).map { $1 == 1 ? $0 : ignoredLabel }
        let loss = try pipeline.model.loss(inputIds: [ids], labels: [labels])
        #expect(abs(loss - expected.smollm2_sft_loss) < 1e-3, "\(loss) against \(expected.smollm2_sft_loss)")
    }
}
