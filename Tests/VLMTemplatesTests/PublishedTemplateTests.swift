import Foundation
import Testing
@testable import VLMTemplates

/// oracle/published_chat_templates.py: llama.cpp's collection of published chat templates, each rendering a few
/// conversations (two also with tools) as transformers' apply_chat_template does, or the exception jinja2 raised.
private let publishedFixture = Result {
    let url = chatTemplateFixtures.appendingPathComponent("published.json")
    return try JSONValue(parsing: try Data(contentsOf: url), file: url.path)
}

private func text(_ value: JSONValue?) -> String? {
    if case let .string(text)? = value { return text }
    return nil
}

private func publishedTemplateNames() throws -> [String] {
    guard case let .array(templates)? = try publishedFixture.get()["templates"] else { return [] }
    return templates.compactMap { text($0["name"]) }
}

/// The fixture's "now" ("2025-03-05T14:30:15"), a local time like Python's naive `datetime.now()`.
private func fixedClock(_ isoLocalTime: String) throws -> Date {
    let numbers = isoLocalTime.split(whereSeparator: { "-T:".contains($0) }).compactMap { Int($0) }
    try #require(numbers.count == 6, "\(isoLocalTime)")
    let components = DateComponents(year: numbers[0], month: numbers[1], day: numbers[2], hour: numbers[3],
                                    minute: numbers[4], second: numbers[5])
    return try #require(Calendar(identifier: .gregorian).date(from: components))
}

@Test("Published chat templates render byte-identically to transformers, or fail where jinja2 raises",
      arguments: try publishedTemplateNames())
func publishedTemplate(name: String) throws {
    let fixture = try publishedFixture.get()
    guard case let .array(templates)? = fixture["templates"], case .object? = fixture["conversations"] else {
        Issue.record("published.json has no templates or conversations")
        return
    }
    let entry = try #require(templates.first { text($0["name"]) == name })
    let url = chatTemplateFixtures.appendingPathComponent("published").appendingPathComponent(name)
    let template = try ChatTemplate(source: String(decoding: try Data(contentsOf: url), as: UTF8.self), file: name)
    let now = try fixedClock(try #require(text(fixture["now"])))
    guard case let .array(cases)? = entry["cases"] else { Issue.record("\(name): no cases"); return }
    #expect(!cases.isEmpty)
    for testCase in cases {
        let conversation = try #require(text(testCase["conversation"]))
        let addGenerationPrompt = testCase["add_generation_prompt"] == .bool(true)
        guard case let .array(messages)? = fixture["conversations"]?[conversation] else {
            Issue.record("\(name): no conversation \(conversation)")
            continue
        }
        let withTools = testCase["tools"] == .bool(true)
        let continuing = testCase["continue_final_message"] == .bool(true)
        let label = "\(name) \(conversation)\(withTools ? " with tools" : "") add_generation_prompt=\(addGenerationPrompt)"
            + (continuing ? " continue_final_message" : "")
        let extraContext = withTools ? ["tools": try #require(fixture["tools"])] : [:]
        let render = { () throws(ChatTemplateError) -> String in
            try template.render(messages: messages, addGenerationPrompt: addGenerationPrompt, bosToken: text(fixture["bos_token"]),
                                eosToken: text(fixture["eos_token"]), extraContext: extraContext, now: now,
                                continueFinalMessage: continuing)
        }
        try check(testCase, file: name, label: label, render: render)
    }
}

/// Compares one case with jinja2's: the same bytes, or a one-line error of the same kind and message naming `file`.
private func check(_ testCase: JSONValue, file: String, label: String, render: () throws(ChatTemplateError) -> String) throws {
    if let raised = text(testCase["error"]) {
        do {
            let rendered = try render()
            Issue.record("\(label): rendered \(rendered.debugDescription), but jinja2 raises \(raised)")
        } catch {
            #expect(!error.description.contains("\n"), "\(label): \(error.description.debugDescription)")
            // "TemplateError: …" is raise_exception's; other exceptions are jinja2's or Python's while rendering.
            let (kind, message) = try #require(raised.firstRange(of: ": ").map { (raised[..<$0.lowerBound], String(raised[$0.upperBound...])) })
            let raisedByTemplate = kind == "TemplateError"
            switch error {
            case let .raised(errorFile, swiftMessage) where raisedByTemplate, let .render(errorFile, _, _, swiftMessage) where !raisedByTemplate:
                #expect(errorFile == file)
                #expect(swiftMessage == message, "\(label)")
            case let .cannotContinue(errorFile, swiftMessage) where kind == "ValueError":
                // transformers goes on with the final message and the whole rendering, on lines of their own.
                #expect(errorFile == file)
                #expect(message.hasPrefix(swiftMessage), "\(label): \(swiftMessage)")
            default:
                Issue.record("\(label): jinja2 raises \(raised), but the Swift error is \(error)")
            }
        }
    } else {
        let expected = try #require(text(testCase["expected"]))
        do {
            let rendered = try render()
            if let difference = firstDifference(Array(rendered.utf8), Array(expected.utf8)) {
                Issue.record("\(label): \(difference)")
            }
        } catch {
            Issue.record("\(label): \(error)")
        }
    }
}

/// Where two renderings first differ, with about 80 bytes of each around that offset; nil when they are equal.
private func firstDifference(_ rendered: [UInt8], _ expected: [UInt8]) -> String? {
    let common = min(rendered.count, expected.count)
    guard let offset = (0..<common).first(where: { rendered[$0] != expected[$0] })
        ?? (rendered.count == expected.count ? nil : common)
    else { return nil }
    func context(_ bytes: [UInt8]) -> String {
        let window = bytes[max(0, offset - 40)..<min(bytes.count, offset + 40)]
        return String(decoding: window, as: UTF8.self).debugDescription
    }
    return "differs at byte \(offset) of \(rendered.count) (jinja2: \(expected.count)):\n  rendered \(context(rendered))\n  jinja2   \(context(expected))"
}

@Test("Every published template file has its cases in published.json")
func publishedTemplatesAllCovered() throws {
    let directory = chatTemplateFixtures.appendingPathComponent("published")
    let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".jinja") }
    #expect(files.count == 70)
    #expect(Set(files) == Set(try publishedTemplateNames()))
}
