import Foundation
import Testing
import VLMTemplates

private let parsedFixtures = ["models.json", "language.json"].map { name in
    let url = chatTemplateFixtures.appendingPathComponent(name)
    return (name, Result { try JSONValue(parsing: try Data(contentsOf: url), file: url.path) })
}

private func fixture(_ name: String) throws -> JSONValue {
    try #require(parsedFixtures.first { $0.0 == name }).1.get()
}

private func strings(_ value: JSONValue?) -> [String: JSONValue] {
    guard case let .object(pairs)? = value else { return [:] }
    return Dictionary(pairs, uniquingKeysWith: { $1 })
}

private func string(_ value: JSONValue?) -> String? {
    if case let .string(text)? = value { return text }
    return nil
}

/// The names of the fixture's entries, so that each test case is named by its template.
private func names(_ file: String) throws -> [String] {
    guard case let .array(entries) = try fixture(file) else { return [] }
    return entries.compactMap { string($0["name"]) }
}

private func entry(_ file: String, _ name: String) throws -> JSONValue {
    guard case let .array(entries) = try fixture(file) else { throw ChatTemplateError.unreadable(file: file, message: "not a list") }
    return try #require(entries.first { string($0["name"]) == name })
}

@Test("Real chat templates render byte-identically to transformers' apply_chat_template", arguments: try names("models.json"))
func realTemplates(name: String) throws {
    let model = try entry("models.json", name)
    let template = try ChatTemplate(source: try #require(string(model["template"])), file: name)
    var specials = strings(model["special_tokens"])
    let bos = string(specials.removeValue(forKey: "bos_token"))
    let eos = string(specials.removeValue(forKey: "eos_token"))
    guard case let .array(cases)? = model["cases"] else { Issue.record("no cases"); return }
    #expect(cases.count >= 20)
    for (index, testCase) in cases.enumerated() {
        guard case let .array(messages)? = testCase["messages"] else { Issue.record("no messages"); continue }
        let addGenerationPrompt = testCase["add_generation_prompt"] == .bool(true)
        let extra = specials.merging(strings(testCase["extra"])) { $1 }
        let render = {
            try template.render(messages: messages, addGenerationPrompt: addGenerationPrompt, bosToken: bos,
                                eosToken: eos, extraContext: extra)
        }
        if let raised = string(testCase["raised"]) {
            #expect(throws: ChatTemplateError.raised(file: name, message: raised), "\(name) case \(index)") { try render() }
        } else {
            let expected = try #require(string(testCase["expected"]))
            let rendered = try render()
            #expect(Array(rendered.utf8) == Array(expected.utf8), "\(name) case \(index):\n\(rendered)\n--- expected ---\n\(expected)")
        }
    }
}

@Test("Each language feature renders as jinja2 configured like transformers", arguments: try names("language.json"))
func languageFeature(name: String) throws {
    let testCase = try entry("language.json", name)
    let source = try #require(string(testCase["template"]))
    let context = strings(testCase["context"])
    switch string(testCase["error"]) {
    case "syntax"?:
        do {
            let template = try ChatTemplate(source: source, file: name)
            Issue.record("\(name): parsed, but jinja2 reports a syntax error: \(template.source)")
        } catch let error {
            guard case let .syntax(file, line, _, _) = error else { Issue.record("\(name): \(error)"); return }
            #expect(file == name)
            if case let .int(expectedLine)? = testCase["line"] { #expect(line == expectedLine, "\(error)") }
        }
    case let kind?:
        let template = try ChatTemplate(source: source, file: name)
        do {
            let rendered = try template.render(messages: [], extraContext: context)
            Issue.record("\(name): rendered \(rendered.debugDescription), but jinja2 raises")
        } catch let error {
            switch (kind, error) {
            case let ("raised", .raised(file, message)):
                #expect(file == name)
                #expect(message == string(testCase["message"]))
            case ("render", .render(let file, _, _, _)):
                #expect(file == name)
            default:
                Issue.record("\(name): expected a \(kind) error, got \(error)")
            }
        }
    case nil:
        let template = try ChatTemplate(source: source, file: name)
        let expected = try #require(string(testCase["expected"]))
        let rendered = try template.render(messages: [], extraContext: context)
        #expect(Array(rendered.utf8) == Array(expected.utf8), "\(name): \(rendered.debugDescription) != \(expected.debugDescription)")
    }
}

/// `continue_final_message` refuses what transformers refuses, in its words (the renderings themselves are
/// published.json's continuation cases).
@Test func continuingTheFinalMessageRefusesWhatTransformersRefuses() throws {
    let template = try ChatTemplate(source: "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}", file: "t.jinja")
    let reply: [JSONValue] = [["role": "user", "content": "Hi"], ["role": "assistant", "content": "Hel"]]
    #expect(try template.render(messages: reply, continueFinalMessage: true) == "<user>Hi</user><assistant>Hel")
    func refusal(_ messages: [JSONValue], addGenerationPrompt: Bool = false, _ template: ChatTemplate = template) -> String? {
        do {
            _ = try template.render(messages: messages, addGenerationPrompt: addGenerationPrompt, continueFinalMessage: true)
            return nil
        } catch {
            guard case let .cannotContinue(file, message) = error, file == template.file else { return "\(error)" }
            return message
        }
    }
    #expect(refusal(reply, addGenerationPrompt: true)?.hasPrefix("continue_final_message and add_generation_prompt are not compatible.") == true)
    #expect(refusal([]) == "continue_final_message is set but the conversation is empty!")
    #expect(refusal([["role": "assistant", "content": .null]]) == #"continue_final_message is set but the final message has no "content" to continue!"#)
    #expect(refusal([["role": "assistant", "content": [["type": "image"]]]]) == "continue_final_message is set but we could not find any text to continue in the final message!")
    let dropping = try ChatTemplate(source: "{% for m in messages %}{{ m.role }}{% endfor %}{{ messages[0].content }}", file: "d.jinja")
    #expect(refusal(reply, dropping)?.hasPrefix("continue_final_message is set but the final message does not appear in the chat") == true)
}

/// A template's default variables (`--chat-template-kwargs`) reach every rendering as `extraContext` would, and a
/// rendering's own `extraContext` overrides them: SmolLM3's published template, whose `enable_thinking` switches its
/// reasoning mode.
@Test func defaultVariablesRenderAsExtraContextUnlessOverridden() throws {
    let url = chatTemplateFixtures.appendingPathComponent("published/HuggingFaceTB-SmolLM3-3B.jinja")
    let template = try ChatTemplate(source: String(contentsOf: url, encoding: .utf8), file: url.path)
    let messages: [JSONValue] = [["role": "user", "content": "Is water wet?"]]
    let thinking = try template.render(messages: messages, addGenerationPrompt: true)
    let notThinking = try template.render(messages: messages, addGenerationPrompt: true, extraContext: ["enable_thinking": false])
    #expect(thinking != notThinking)
    let defaulted = template.withDefaultContext(["enable_thinking": false])
    #expect(try defaulted.render(messages: messages, addGenerationPrompt: true) == notThinking)
    #expect(try defaulted.render(messages: messages, addGenerationPrompt: true, extraContext: ["enable_thinking": true])
            == template.render(messages: messages, addGenerationPrompt: true, extraContext: ["enable_thinking": true]))
}
