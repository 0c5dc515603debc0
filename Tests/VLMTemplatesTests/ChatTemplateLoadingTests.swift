import Foundation
import Testing
import VLMTemplates

/// A fresh directory holding `files`, removed by the caller.
private func directory(_ files: [String: String]) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("chat-template-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    for (name, contents) in files {
        try Data(contents.utf8).write(to: url.appendingPathComponent(name))
    }
    return url
}

private let user: [JSONValue] = [["role": "user", "content": "hi"]]

@Test func loadsEachPlaceTransformersLooks() throws {
    let cases: [([String: String], String?)] = [
        (["tokenizer_config.json": #"{"chat_template": "A{{ messages[0].content }}"}"#], "Ahi"),
        (["tokenizer_config.json": #"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]}"#], "D1"),
        (["chat_template.json": #"{"chat_template": "J"}"#, "tokenizer_config.json": #"{"chat_template": "no"}"#], "J"),
        (["chat_template.jinja": "{% for m in messages %}{{ m.role }}\n{% endfor %}\n", "chat_template.json": #"{"chat_template": "no"}"#], "user\n"),
        (["tokenizer_config.json": #"{"model_max_length": 77}"#], nil),
        ([:], nil),
    ]
    for (files, expected) in cases {
        let url = try directory(files)
        defer { try? FileManager.default.removeItem(at: url) }
        let template = try ChatTemplate.load(directory: url)
        #expect(try template?.render(messages: user) == expected, "\(files)")
    }
}

@Test func loadingErrorsNameTheFile() throws {
    let cases: [(String, String, (ChatTemplateError) -> Bool)] = [
        ("tokenizer_config.json", "{\n  \"chat_template\": \"x\",\n  oops\n}", {
            if case let .invalidJSON(file, line, column, _) = $0 { return file.hasSuffix("tokenizer_config.json") && line == 3 && column == 3 }
            return false
        }),
        ("tokenizer_config.json", #"{"chat_template": 5}"#, {
            if case let .invalidTemplateFile(file, _) = $0 { return file.hasSuffix("tokenizer_config.json") }
            return false
        }),
        ("tokenizer_config.json", #"{"chat_template": [{"name": "other", "template": "x"}]}"#, {
            if case .invalidTemplateFile = $0 { return true }
            return false
        }),
        ("chat_template.jinja", "line 1\nline 2 {% if %}", {
            if case let .syntax(file, line, column, _) = $0 { return file.hasSuffix("chat_template.jinja") && line == 2 && column == 14 }
            return false
        }),
        ("chat_template.json", "[]", {
            if case .invalidTemplateFile = $0 { return true }
            return false
        }),
    ]
    for (name, contents, matches) in cases {
        let url = try directory([name: contents])
        defer { try? FileManager.default.removeItem(at: url) }
        do {
            _ = try ChatTemplate.load(directory: url)
            Issue.record("\(name) \(contents) loaded")
        } catch {
            #expect(matches(error), "\(error)")
        }
    }
}

@Test func syntaxErrorsGiveLineAndColumn() {
    #expect(throws: ChatTemplateError.syntax(file: "t.jinja", line: 3, column: 6, message: "unknown tag 'frobnicate'")) {
        try ChatTemplate(source: "a\nb\nc {% frobnicate %}", file: "t.jinja")
    }
    #expect(throws: ChatTemplateError.syntax(file: "t.jinja", line: 1, column: 4,
                                             message: "unexpected end of template: 'for' has no matching 'else' or 'endfor'")) {
        try ChatTemplate(source: "{% for x in y %}", file: "t.jinja")
    }
}

@Test func hostileTemplatesFailCleanly() throws {
    let sources = [
        "{{ " + String(repeating: "(", count: 5000) + "1" + String(repeating: ")", count: 5000) + " }}",
        "{{ " + String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000) + " }}",
        "{{ x" + String(repeating: "|trim", count: 5000) + " }}",
        "{{ " + String(repeating: "-", count: 100_000) + "1 }}",
        String(repeating: "{% if true %}", count: 1000) + String(repeating: "{% endif %}", count: 1000),
        "{{ 'x' * 100000000000 }}",
        "{{ [1] * 100000000000 }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{{ 9223372036854775807 + 1 }}",
        "{{ 2 ** 64 }}",
        "{{ 1 // 0 }}",
        "{{ '\\ud800' }}",
        "{% set ns = namespace(v='ab') %}{% for i in range(40) %}{% set ns.v = ns.v ~ ns.v %}{% endfor %}{{ ns.v }}",
    ]
    for source in sources {
        do {
            let output = try ChatTemplate(source: source, file: "hostile").render(messages: user)
            Issue.record("rendered \(output.utf8.count) bytes from \(source.prefix(80))")
        } catch {
            #expect(error.description.hasPrefix("hostile"), "\(error)")
        }
    }
}

@Test func jsonKeepsKeyOrderAndPythonNumbers() throws {
    let value = try JSONValue(parsing: Data(#"{"z": 1, "a": [1.0, -0, 1e2, "\u00e9\ud83d\ude00"], "m": {"k": null}, "z": 2}"#.utf8))
    #expect(value == ["z": 2, "a": [1.0, 0, 100.0, "é😀"], "m": ["k": nil]])
    let rendered = try ChatTemplate(source: "{% for k in d %}{{ k }}{{ d[k] }};{% endfor %}{{ d | tojson }}")
        .render(messages: [], extraContext: ["d": value])
    #expect(rendered == #"z2;a[1.0, 0, 100.0, 'é😀'];m{'k': None};{"z": 2, "a": [1.0, 0, 100.0, "é😀"], "m": {"k": null}}"#)
    for bad in ["{", "[1,]", "{\"a\" 1}", "01", "\"\\x\"", String(repeating: "[", count: 10_000)] {
        #expect(throws: ChatTemplateError.self, "\(bad.prefix(20))") { try JSONValue(parsing: Data(bad.utf8)) }
    }
}

/// A template named by a file (llama-server's `--chat-template-file`, vLLM's `--chat-template`): Jinja text, or a
/// `.json` file holding "chat_template" as chat_template.json or tokenizer_config.json hold it.
@Test func loadsATemplateFile() throws {
    let url = try directory([
        "plain.jinja": "J{{ messages[0].content }}",
        "named.json": #"{"chat_template": [{"name": "default", "template": "N{{ messages|length }}"}]}"#,
        "empty.json": #"{"model_max_length": 77}"#,
    ])
    defer { try? FileManager.default.removeItem(at: url) }
    #expect(try ChatTemplate.load(file: url.appendingPathComponent("plain.jinja")).render(messages: user) == "Jhi")
    #expect(try ChatTemplate.load(file: url.appendingPathComponent("named.json")).render(messages: user) == "N1")
    for (name, expected) in [("empty.json", ChatTemplateError.invalidTemplateFile(file: url.appendingPathComponent("empty.json").path, message: #"no "chat_template" field"#)),
                             ("missing.jinja", nil)] {
        do {
            _ = try ChatTemplate.load(file: url.appendingPathComponent(name))
            Issue.record("\(name) loaded")
        } catch {
            if let expected { #expect(error == expected) } else {
                guard case let .unreadable(file, _) = error else { Issue.record("\(error)"); continue }
                #expect(file.hasSuffix(name))
            }
        }
    }
}
