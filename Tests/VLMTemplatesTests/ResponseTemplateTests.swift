import Foundation
import Testing
@testable import VLMTemplates

/// oracle/response_templates.py: every call vLLM's copy of transformers' response-parsing test suite makes
/// (tests/parser/test_chat_parsing.py of PyPI's vllm 0.33.0), answered by transformers 5.23 itself, and transformers
/// serve's fallback templates on replies in their formats.
private let responseFixture = Result {
    let url = chatTemplateFixtures.appendingPathComponent("response-templates.json")
    return try JSONValue(parsing: try Data(contentsOf: url), file: url.path)
}

/// The fixture's values with floats written as `{"float": repr}` (so that 1.0 and 1 stay apart) turned back.
private func typed(_ value: JSONValue) -> JSONValue {
    switch value {
    case let .object(pairs):
        if pairs.count == 1, pairs[0].0 == "float", case let .string(repr) = pairs[0].1 {
            switch repr {
            case "nan": return .double(.nan)
            case "inf": return .double(.infinity)
            case "-inf": return .double(-.infinity)
            default: return .double(Double(repr)!)
            }
        }
        return .object(pairs.map { ($0.0, typed($0.1)) })
    case let .array(items): return .array(items.map(typed))
    default: return value
    }
}

private func events(_ value: JSONValue?) -> [ResponseEvent] {
    guard case let .array(items)? = value else { return [] }
    return items.compactMap { item in
        guard case let .array(parts) = item, case let .string(kind)? = parts.first, case let .string(field) = parts[1] else { return nil }
        switch kind {
        case "open": return .open(field: field)
        case "chunk":
            guard case let .string(text) = parts[2], case let .bool(dirty) = parts[3] else { return nil }
            return .chunk(field: field, text: text, dirty: dirty)
        default: return .close(field: field, value: typed(parts[2]))
        }
    }
}

private func string(_ value: JSONValue?) -> String? {
    if case let .string(text)? = value { return text }
    return nil
}

private func tools(_ value: JSONValue?) -> [JSONValue]? {
    if case let .array(items)? = value { return items }
    return nil
}

private struct Replay {
    let fixture: JSONValue
    let templates: [JSONValue]

    init() throws {
        fixture = try responseFixture.get()
        guard case let .array(templates)? = fixture["templates"] else { throw ChatTemplateError.invalidTemplateFile(file: "response-templates.json", message: "no templates") }
        self.templates = templates
    }

    func template(_ call: JSONValue) throws -> JSONValue {
        guard case let .int(index)? = call["template"] else { throw ChatTemplateError.invalidTemplateFile(file: "response-templates.json", message: "no template index") }
        return templates[index]
    }

    /// Replays a stream: the parser's initial events, each feed's events, and finalize's message and events; a step
    /// where transformers raised must report a malformed region (or throw) here.
    func stream(_ template: ResponseTemplate, prefix: String, tools: [JSONValue]?, initial: JSONValue?, steps: [JSONValue], label: String) {
        var parser: ResponseParser
        do { parser = try ResponseParser(template: template, prefix: prefix, tools: tools) } catch {
            Issue.record("\(label): \(error)")
            return
        }
        #expect(parser.initialEvents == events(initial), "\(label): initial events")
        for (index, step) in steps.enumerated() {
            let raised = step["raised"] != nil
            do {
                if let chunk = string(step["feed"]) {
                    let got = try parser.feed(chunk)
                    if raised {
                        #expect(got.contains { if case .malformed = $0 { true } else { false } }, "\(label) step \(index): transformers raised \(step["raised"]!)")
                        return
                    }
                    #expect(got == events(step["events"]), "\(label) step \(index) feed \(pythonStringRepr(chunk))")
                } else if step["finalize"] != nil {
                    let (message, last) = try parser.finalize()
                    if raised {
                        #expect(last.contains { if case .malformed = $0 { true } else { false } }, "\(label): transformers raised \(step["raised"]!) at finalize")
                        return
                    }
                    #expect(message == typed(step["message"]!), "\(label): message")
                    #expect(last == events(step["events"]), "\(label): final events")
                }
            } catch {
                #expect(raised, "\(label) step \(index): \(error)")
                return
            }
        }
    }
}

@Test("Response templates load, or are refused, as transformers' load_response_template decides")
func responseTemplatesLoad() throws {
    let replay = try Replay()
    guard case let .array(calls)? = replay.fixture["calls"] else { Issue.record("no calls"); return }
    var checked = 0
    for call in calls where call["call"] == "load" {
        let spec = try replay.template(call)
        let label = string(call["test"]) ?? "?"
        do {
            _ = try ResponseTemplate(spec)
            #expect(call["raised"] == nil, "\(label): transformers refused it: \(call["raised"]!)")
        } catch {
            guard let raised = call["raised"] else {
                Issue.record("\(label): refused here: \(error)")
                continue
            }
            #expect(error as? ResponseTemplateError == .invalid(string(raised["message"]) ?? ""), "\(label): \(error)")
        }
        checked += 1
    }
    #expect(checked >= 1)
}

/// Where transformers refused a template, the same one-line reason.
private func expectSameRefusal(_ error: any Error, _ raised: JSONValue?, _ label: String) {
    guard case let .invalid(message)? = error as? ResponseTemplateError else { return }
    #expect(message == string(raised?["message"]), "\(label)")
}

@Test("parse_response calls of transformers' test suite give transformers' messages")
func responseTemplateParse() throws {
    let replay = try Replay()
    guard case let .array(calls)? = replay.fixture["calls"] else { Issue.record("no calls"); return }
    var checked = 0
    for call in calls where call["call"] == "parse" {
        let label = string(call["test"]) ?? "?"
        guard let prefix = string(call["prefix"]) else { continue }  // Swift's API takes no nil prefix.
        let spec = try replay.template(call)
        do {
            let template = try ResponseTemplate(spec)
            let message = try template.parse(string(call["text"]) ?? "", prefix: prefix, tools: tools(call["tools"]))
            if let raised = call["raised"] {
                Issue.record("\(label): transformers raised \(raised), here \(message)")
            } else {
                #expect(message == typed(call["message"]!), "\(label): \(string(call["text"]) ?? "")")
            }
        } catch {
            #expect(call["raised"] != nil, "\(label): \(error)")
            expectSameRefusal(error, call["raised"], label)
        }
        checked += 1
    }
    #expect(checked >= 50)
}

@Test("Streamed replies give transformers' events at every chunking the suite tries")
func responseTemplateStreams() throws {
    let replay = try Replay()
    guard case let .array(calls)? = replay.fixture["calls"] else { Issue.record("no calls"); return }
    var checked = 0
    for call in calls where call["call"] == "stream" {
        let label = string(call["test"]) ?? "?"
        guard let prefix = string(call["prefix"]), case let .array(steps)? = call["steps"] else { continue }
        if let raised = call["raised"] {
            // transformers refused the template (or the prefix) when the parser was made: so must this.
            do {
                _ = try ResponseParser(template: try ResponseTemplate(try replay.template(call)), prefix: prefix, tools: tools(call["tools"]))
                Issue.record("\(label): transformers raised \(raised)")
            } catch {
                expectSameRefusal(error, raised, label)
            }
            continue
        }
        let template: ResponseTemplate
        do { template = try ResponseTemplate(try replay.template(call)) } catch {
            #expect(call["raised"] != nil || (try? replay.template(call)) == nil, "\(label): \(error)")
            continue
        }
        replay.stream(template, prefix: prefix, tools: tools(call["tools"]), initial: call["initial_events"], steps: steps, label: label)
        checked += 1
    }
    #expect(checked >= 300)
}

@Test("Tool-call arguments are cast by their schemas' types as transformers' _coerce and _schema_types cast them")
func responseTemplateCoercion() throws {
    let replay = try Replay()
    guard case let .array(calls)? = replay.fixture["calls"] else { Issue.record("no calls"); return }
    var checked = 0
    for call in calls {
        switch call["call"] {
        case "coerce"?:
            guard case let .array(types)? = call["types"] else { continue }
            let names = types.compactMap(string)
            #expect(try ResponseContent.coerce(string(call["raw"]) ?? "", names) == typed(call["value"]!), "\(call)")
        case "schema_types"?:
            guard case let .array(types)? = call["types"] else { continue }
            #expect(ResponseContent.schemaTypes(call["schema"]!) == types.compactMap(string), "\(call)")
        default: continue
        }
        checked += 1
    }
    #expect(checked >= 10)
}

@Test("transformers serve's fallback templates are built in, and parse replies in their formats as there")
func servingFallbackTemplates() throws {
    let replay = try Replay()
    guard case let .array(cases)? = replay.fixture["serve_fallbacks"] else { Issue.record("no serve_fallbacks"); return }
    #expect(cases.count >= 10)
    for entry in cases {
        guard case let .array(modelTypes)? = entry["model_types"] else { continue }
        let spec = try replay.template(entry)
        for case let .string(modelType) in modelTypes {
            let template = try #require(ResponseTemplate.servingFallback(modelType: modelType), "\(modelType)")
            #expect(template.spec == spec, "\(modelType)")
        }
        let label = "\(modelTypes.first.flatMap(string) ?? "?") \(pythonStringRepr(string(entry["text"]) ?? ""))"
        let template = try ResponseTemplate(spec)
        let prefix = string(entry["prefix"]) ?? ""
        do {
            let message = try template.parse(string(entry["text"]) ?? "", prefix: prefix, tools: tools(entry["tools"]))
            #expect(entry["raised"] == nil, "\(label): transformers raised \(entry["raised"]!)")
            if let expected = entry["message"] { #expect(message == typed(expected), "\(label)") }
        } catch {
            #expect(entry["raised"] != nil, "\(label): \(error)")
        }
        guard case let .array(steps)? = entry["stream_steps"] else { continue }
        replay.stream(template, prefix: prefix, tools: tools(entry["tools"]), initial: entry["stream_initial_events"], steps: steps, label: label)
    }
    #expect(ResponseTemplate.servingFallback(modelType: "llama") == nil)
}
