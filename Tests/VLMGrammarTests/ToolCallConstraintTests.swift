import Foundation
import Testing
import VLMGrammar
import VLMModels
import VLMTemplates

/// Tool calls held to their tools' schemas inside the regions a response template gives them, the rest of the reply
/// free, over a vocabulary of the 256 bytes (so every position of a text is a token boundary) and an end token.
struct ToolCallConstraintTests {
    static let end = 256
    static let tokenBytes: [[UInt8]] = (0..<256).map { [UInt8($0)] } + [Array("<|im_end|>".utf8)]
    static let vocabulary = GrammarVocabulary(tokenBytes: tokenBytes, specialTokens: [end])
    static func held(_ grammar: Grammar) -> GrammarConstraint {
        GrammarConstraint(grammar: grammar, vocabulary: vocabulary, endTokens: [])
    }
    static let weather: JSONValue = ["type": "function", "function": [
        "name": "get_weather",
        "parameters": ["type": "object", "properties": ["city": ["type": "string"], "days": ["type": "integer"]],
                       "required": ["city"]]]]
    static let time: JSONValue = ["type": "function", "function": ["name": "get_time"]]
    static let qwen = ResponseTemplate.servingFallback(modelType: "qwen2")!
    static let qwenPrompt = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"

    static func constraint(_ template: ResponseTemplate, tools: [JSONValue] = [weather, time], prompt: String = qwenPrompt,
                           parallelCalls: Bool = true) throws -> any TokenConstraint {
        let made = try ToolCallConstraint(template: template, tools: tools, prompt: prompt, tokenBytes: tokenBytes,
                                          grammarConstraint: held, endTokens: [end], parallelCalls: parallelCalls)
        return try #require(made).start()
    }

    /// The bytes that may come next.
    static func allowedBytes(_ constraint: any TokenConstraint) -> [UInt8] {
        var scores = [Float](repeating: 0, count: tokenBytes.count)
        _ = constraint.restrict(&scores)
        return (0..<256).filter { scores[$0] == 0 }.map(UInt8.init)
    }

    /// The bytes that may come next, as text.
    static func allowed(_ constraint: any TokenConstraint) -> String {
        String(decoding: allowedBytes(constraint), as: UTF8.self)
    }

    /// Feeds `text`, each byte checked against ``TokenConstraint/allows(_:)`` first; the first refused byte's offset.
    @discardableResult
    static func feed(_ constraint: any TokenConstraint, _ text: String) -> Int? {
        for (offset, byte) in text.utf8.enumerated() {
            guard constraint.allows(Int(byte)) else { return offset }
            constraint.accept(Int(byte))
        }
        return nil
    }

    @Test func aCallIsHeldToItsToolsSchemaAndTheRestIsFree() throws {
        let constraint = try Self.constraint(Self.qwen)
        // Free text: anything, the end included.
        #expect(Self.allowedBytes(constraint).count == 256)
        #expect(constraint.allows(Self.end))
        #expect(Self.feed(constraint, "Let me check }{ that.\n<tool_call>") == nil)
        // The open pattern (`\s*<tool_call>`) is committed once the next text comes: its first byte is still free.
        #expect(constraint.allows(Int(UInt8(ascii: "x"))))
        #expect(Self.feed(constraint, "\n{\"name\": \"get_") == nil)
        // Only the tools' names, then the arguments of the one chosen.
        #expect(Self.allowed(constraint) == "tw")
        #expect(!constraint.allows(Self.end))
        #expect(Self.feed(constraint, "weather\", \"arguments\": {\"city\": \"Paris\", \"days\": ") == nil)
        #expect(Self.allowed(constraint) == "-0123456789")
        #expect(Self.feed(constraint, "3}}\n</tool_call>") == nil)
        // Free again: text, another call, or the end.
        #expect(Self.allowedBytes(constraint).count == 256)
        #expect(constraint.allows(Self.end))
        #expect(Self.feed(constraint, "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}") == 48)
    }

    @Test func parallelCallsFalseEndsTheReplyAfterTheFirstCall() throws {
        let constraint = try Self.constraint(Self.qwen, parallelCalls: false)
        #expect(Self.feed(constraint, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>") == nil)
        #expect(Self.allowed(constraint).isEmpty)
        #expect(constraint.allows(Self.end))
    }

    @Test func regionsAreTheParsersRegions() throws {
        // A call written inside the reasoning is reasoning, as the parsed message has it: not constrained.
        let thinking = try Self.constraint(Self.qwen)
        #expect(Self.feed(thinking, "<think>\nI could write <tool_call>\nnot json here</think>\n\n<tool_call>\n") == nil)
        #expect(Self.allowed(thinking) == "\t\n {")
        // A prompt that opened the region constrains the reply from its first token.
        let prefilled = try Self.constraint(Self.qwen, prompt: Self.qwenPrompt + "<tool_call>\n")
        #expect(Self.allowed(prefilled) == "\t\n {")
        // Text the region already holds that is not a call leaves that region free, and the next one is held again.
        let late = try Self.constraint(Self.qwen)
        #expect(Self.feed(late, "<tool_call>[oops]</tool_call> <tool_call>\n") == nil)
        #expect(Self.allowed(late) == "\t\n {")
    }

    @Test func theToolNameCapturedByTheOpenDelimiterSelectsItsArguments() throws {
        // gpt-oss's template from transformers' test suite: the name is in the delimiter, the region holds the arguments.
        let template = try ResponseTemplate(JSONValue(parsing: Data(#"""
            {"defaults": {"role": "assistant"}, "start_anchor": "<|start|>assistant", "fields": {
             "tool_calls": {"open_pattern": "<\\|channel\\|>commentary to=functions\\.(?P<name>\\w+).*?<\\|message\\|>",
              "close": "<|call|>", "repeats": true, "content": "json",
              "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}},
             "content": {"open": "<|channel|>final<|message|>", "close": "<|return|>"}}}
            """#.utf8)))
        let known = try Self.constraint(template, prompt: "<|start|>assistant")
        #expect(Self.feed(known, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": ") == nil)
        #expect(Self.allowed(known) == "\"")
        #expect(Self.feed(known, "\"Oslo\"}<|call|>") == nil)
        #expect(known.allows(Self.end))
        // A name no tool has leaves the region free.
        let unknown = try Self.constraint(template, prompt: "<|start|>assistant")
        #expect(Self.feed(unknown, "<|channel|>commentary to=functions.get_stock <|message|>{\"ticker\": 3}<|call|>") == nil)
    }

    @Test func parametersThatAreNoSchemaAreRefused() {
        let broken: JSONValue = ["type": "function", "function": ["name": "f", "parameters": ["type": "strnig"]]]
        #expect(throws: GrammarError.self) {
            _ = try ToolCallConstraint(template: Self.qwen, tools: [broken], prompt: Self.qwenPrompt, tokenBytes: Self.tokenBytes,
                                       grammarConstraint: Self.held, endTokens: [Self.end])
        }
    }

    @Test func formatsTheTemplateCannotExpressAreNotConstrained() throws {
        // Qwen 3.5's XML-like parameters and Gemma 4's JSON dialect: parsed, not constrained.
        for modelType in ["qwen3_5", "gemma4"] {
            let template = try #require(ResponseTemplate.servingFallback(modelType: modelType))
            #expect(template.toolCallFormat(tools: [Self.weather]) == nil, "\(modelType)")
        }
        // Cohere's list of calls, whose items hold a `tool_call_id` the template does not read.
        let cohere = try ResponseTemplate(JSONValue(parsing: Data(#"""
            {"start_anchor": "<|CHATBOT_TOKEN|>", "fields": {"content": {"close": "<|END_OF_TURN_TOKEN|>"},
             "tool_calls": {"open": "<|START_ACTION|>", "close": "<|END_ACTION|>", "content": "json", "transform_each": true,
              "transform": {"type": "function", "function": {"name": "{tool_name}", "arguments": "{parameters}"}}}}}
            """#.utf8)))
        #expect(cohere.toolCallFormat(tools: [Self.weather]) == nil)
        #expect(Self.qwen.toolCallFormat(tools: []) == nil)
    }

    /// Every reply with tool calls in transformers' response-parsing test suite (oracle/response_templates.py) whose
    /// template writes calls as JSON between literal delimiters is one the constraint lets through, byte by byte,
    /// with the tools it calls (their schemas where the test gives them, else any object of arguments).
    @Test func theTestSuitesRepliesPass() throws {
        let url = LlamaCppGrammarCorpus.packageRoot.appendingPathComponent("Tests/Fixtures/chat-templates/response-templates.json")
        let fixture = try JSONValue(parsing: Data(contentsOf: url), file: url.path)
        guard case let .array(templates)? = fixture["templates"], case let .array(calls)? = fixture["calls"] else {
            Issue.record("no templates or calls")
            return
        }
        var checked = 0
        for call in calls where call["call"] == "parse" && call["raised"] == nil {
            guard case let .int(index)? = call["template"], case let .array(made)? = call["message"]?["tool_calls"],
                  case let .string(text)? = call["text"], case let .string(prefix)? = call["prefix"] else { continue }
            let template = try ResponseTemplate(templates[index])
            var tools: [JSONValue] = []
            if case let .array(given)? = call["tools"] { tools = given }
            for made in made {
                guard case let .string(name)? = made["function"]?["name"],
                      !tools.contains(where: { $0["function"]?["name"] == .string(name) }) else { continue }
                tools.append(["type": "function", "function": ["name": .string(name), "parameters": ["type": "object"]]])
            }
            guard template.toolCallFormat(tools: tools) != nil else { continue }
            let constraint = try Self.constraint(template, tools: tools, prompt: prefix)
            let label = "\(string(call["test"])): \(text)"
            if let refused = Self.feed(constraint, text) {
                Issue.record("\(label): refused at \(refused): \(String(decoding: Array(text.utf8)[refused...].prefix(40), as: UTF8.self))")
            }
            checked += 1
        }
        // ERNIE's and SmolLM3's `<tool_call>` JSON, gpt-oss's named channels, inkling's invoke blocks, dotted paths:
        // 16 replies. (Cohere's lists, Gemma 4's dialect and the XML-parameter formats are parsed, not constrained.)
        #expect(checked == 16)
    }

    private func string(_ value: JSONValue?) -> String {
        if case let .string(text)? = value { return text }
        return "?"
    }
}
