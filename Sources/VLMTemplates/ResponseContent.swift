import Foundation

/// Why a region's text did not become a value.
struct ResponseContentError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// transformers' content parsers (`utils/chat_parsing/content_parsers.py`): each turns a region's text into one
/// value of the message, with Python's own conversions (`int()`, `float()`, `json.loads`).
enum ResponseContent {
    /// The content parsers' names.
    static let parsers = ["text", "int", "float", "bool", "json", "xml-inline", "kv-lines"]
    /// Parsers whose value is the region's text itself: their chunks are part of the final value.
    static let streamable: Set<String> = ["text", "int", "float", "bool"]

    /// A region's value: its text through the field's parser, then the field's transform, fed the named captures
    /// of its open delimiter.
    static func process(_ body: String, field: ResponseTemplate.Field, captures: [(String, String)]) throws -> JSONValue {
        let value = try parse(body, parser: field.content, arguments: field.contentArguments)
        guard let transform = field.transform else { return value }
        let scope = captures.map { ($0.0, JSONValue.string($0.1)) }
        guard field.transformEach else { return try apply(transform, scope: scope + [("content", value)]) }
        guard case let .array(items) = value else {
            throw ResponseContentError("Field \(pythonStringRepr(field.name)): transform_each requires the parsed content to be a list, got \(pythonTypeName(value)).")
        }
        var results: [JSONValue] = []
        for item in items {
            guard case let .object(pairs) = item else {
                throw ResponseContentError("Field \(pythonStringRepr(field.name)): transform_each requires each list element to be a dict, got \(pythonTypeName(item)).")
            }
            results.append(try apply(transform, scope: scope + pairs))
        }
        return .array(results)
    }

    static func parse(_ text: String, parser: String, arguments: JSONValue) throws -> JSONValue {
        switch parser {
        case "text": return .string(strip(text, arguments))
        case "int":
            guard let number = pythonInt(strip(text, arguments)) else { throw ResponseContentError("invalid literal for int(): \(pythonStringRepr(strip(text, arguments)))") }
            return number
        case "float":
            guard let number = pythonFloat(strip(text, arguments)) else { throw ResponseContentError("could not convert string to float: \(pythonStringRepr(strip(text, arguments)))") }
            return .double(number)
        case "bool":
            let lowered = PythonStrings.lower(strip(text, arguments))
            return .bool(lowered == "true" || lowered == "1")
        case "json": return try json(text, arguments)
        case "xml-inline": return try xmlInline(text, arguments)
        default: return try keyValueLines(text, arguments)
        }
    }

    private static func strip(_ text: String, _ arguments: JSONValue) -> String {
        pythonTruthy(arguments["strip"] ?? .bool(true)) ? PythonStrings.strip(text, nil, leading: true, trailing: true) : text
    }

    // Control characters LLMs do not write, standing in for strings taken out before the JSON is read.
    private static let laxOpen: Unicode.Scalar = "\u{01}", laxClose: Unicode.Scalar = "\u{02}"
    private static let unquotedKey = try! PythonRegex(#"(?<=[{,])(\w+):"#)

    /// JSON with the dialect knobs models need: `string_delims` (strings between custom markers), `unquoted_keys`,
    /// `allow_non_json` (the stripped text when it does not parse).
    private static func json(_ text: String, _ arguments: JSONValue) throws -> JSONValue {
        var delimiters: [(String, String)] = []
        if case let .array(pairs)? = arguments["string_delims"] {
            for pair in pairs {
                guard case let .array(ends) = pair, ends.count == 2, case let .string(open) = ends[0], case let .string(close) = ends[1] else {
                    throw ResponseContentError("json: each string_delims entry must be [open, close]")
                }
                delimiters.append((open, close))
            }
        }
        let unquotedKeys = pythonTruthy(arguments["unquoted_keys"] ?? .bool(false))
        if !delimiters.isEmpty && text.unicodeScalars.contains(where: { $0 == laxOpen || $0 == laxClose }) {
            throw ResponseContentError("json: input contains reserved sentinel characters (\\x01/\\x02); cannot parse safely.")
        }
        var working = Array(text.unicodeScalars)
        var captured: [String] = []
        for (open, close) in delimiters {
            let pattern: PythonRegex
            do { pattern = try PythonRegex(PythonRegex.escape(open) + "(.*?)" + PythonRegex.escape(close), dotAll: true) } catch {
                throw ResponseContentError("json: string_delims: \(error)")
            }
            working = try substitute(pattern, in: working) { match, text in
                captured.append(String(String.UnicodeScalarView(text[match.groups[0]!])))
                return [laxOpen] + Array(String(captured.count - 1).unicodeScalars) + [laxClose]
            }
        }
        if unquotedKeys {
            working = try substitute(unquotedKey, in: working) { match, text in
                ["\""] + Array(text[match.groups[0]!]) + ["\"", ":"]
            }
        }
        var result = String(String.UnicodeScalarView(working))
        for (index, string) in captured.enumerated() {
            result = PythonStrings.replace(result, "\u{01}\(index)\u{02}", JSONValue.string(string).pythonJSONText(), count: -1)
        }
        do {
            return try JSONValue(parsing: Data(result.utf8), file: "region")
        } catch {
            if pythonTruthy(arguments["allow_non_json"] ?? .bool(false)) { return .string(strip(text, arguments)) }
            throw ResponseContentError("json parser could not parse region as JSON: \(error)")
        }
    }

    /// `re.sub(pattern, function, text)`.
    private static func substitute(_ pattern: PythonRegex, in text: [Unicode.Scalar],
                                   _ replacement: (PythonRegexMatch, [Unicode.Scalar]) -> [Unicode.Scalar]) throws -> [Unicode.Scalar] {
        let matches: [PythonRegexMatch]
        do { matches = try pattern.matches(in: text) } catch { throw ResponseContentError("\(error)") }
        var result: [Unicode.Scalar] = []
        var last = 0
        for match in matches {
            result += text[last..<match.range.lowerBound]
            result += replacement(match, text)
            last = match.range.upperBound
        }
        return result + text[last...]
    }

    /// Shallow XML-like tags into an object: `tag_pattern` (named groups `key` and `value`), each value through
    /// `value_parser` when given, repeated keys collected into a list with `merge_duplicates`.
    private static func xmlInline(_ text: String, _ arguments: JSONValue) throws -> JSONValue {
        guard case let .string(source)? = arguments["tag_pattern"] else {
            throw ResponseContentError("xml-inline: 'tag_pattern' content_arg is required")
        }
        let pattern: PythonRegex
        do { pattern = try PythonRegex(source, dotAll: true) } catch { throw ResponseContentError("xml-inline: \(error)") }
        let merge = pythonTruthy(arguments["merge_duplicates"] ?? .bool(false))
        let scalars = Array(text.unicodeScalars)
        let matches: [PythonRegexMatch]
        do { matches = try pattern.matches(in: scalars) } catch { throw ResponseContentError("xml-inline: \(error)") }
        var out: [(String, JSONValue)] = []
        for match in matches {
            guard let keyRange = match.named("key") else {
                throw ResponseContentError("xml-inline: tag_pattern must have a named group 'key'. Pattern: \(source)")
            }
            let key = String(String.UnicodeScalarView(scalars[keyRange]))
            let raw: String? = pattern.groupIndex["value"] == nil ? "" : match.named("value").map { String(String.UnicodeScalarView(scalars[$0])) }
            let value = try subParse(raw, arguments["value_parser"])
            if let at = out.firstIndex(where: { $0.0 == key }) {
                if merge {
                    if case var .array(items) = out[at].1 {
                        items.append(value)
                        out[at].1 = .array(items)
                    } else {
                        out[at].1 = [out[at].1, value]
                    }
                } else {
                    out[at].1 = value
                }
            } else {
                out.append((key, value))
            }
        }
        return .object(out)
    }

    /// Lines of `key<kv_sep>value` into an object.
    private static func keyValueLines(_ text: String, _ arguments: JSONValue) throws -> JSONValue {
        let lineSeparator = arguments["line_sep"].flatMap { if case let .string(s) = $0 { s } else { nil } } ?? "\n"
        let keySeparator = arguments["kv_sep"].flatMap { if case let .string(s) = $0 { s } else { nil } } ?? ":"
        guard !lineSeparator.isEmpty, !keySeparator.isEmpty else { throw ResponseContentError("kv-lines: empty separator") }
        var out: [(String, JSONValue)] = []
        for rawLine in PythonStrings.split(text, lineSeparator, maxSplit: -1) {
            let line = strip(rawLine, arguments)
            guard !line.isEmpty, line.contains(keySeparator) else { continue }
            let parts = PythonStrings.split(line, keySeparator, maxSplit: 1)
            let key = strip(parts[0], arguments)
            let value = try subParse(strip(parts[1], arguments), arguments["value_parser"])
            if let at = out.firstIndex(where: { $0.0 == key }) { out[at].1 = value } else { out.append((key, value)) }
        }
        return .object(out)
    }

    private static func subParse(_ raw: String?, _ valueParser: JSONValue?) throws -> JSONValue {
        guard let valueParser, valueParser != .null else { return raw.map(JSONValue.string) ?? .null }
        guard let raw else { throw ResponseContentError("'NoneType' object has no attribute 'strip'") }
        let name = valueParser["name"].flatMap { if case let .string(s) = $0 { s } else { nil } } ?? "text"
        guard parsers.contains(name) else {
            throw ResponseContentError("unknown value_parser \(pythonStringRepr(name))")
        }
        return try parse(raw, parser: name, arguments: valueParser["args"] ?? .object([]))
    }

    /// Fills a transform template's whole-string placeholders (`{name}`, `{content.args}`) from `scope`.
    static func apply(_ transform: JSONValue, scope: [(String, JSONValue)]) throws -> JSONValue {
        switch transform {
        case let .object(pairs):
            var out: [(String, JSONValue)] = []
            for (key, value) in pairs { out.append((key, try apply(value, scope: scope))) }
            return .object(out)
        case let .array(items):
            var out: [JSONValue] = []
            for item in items { out.append(try apply(item, scope: scope)) }
            return .array(out)
        case let .string(text):
            guard let path = TransformPlaceholder.path(text) else { return transform }
            let dotted = path.joined(separator: ".")
            guard var value = scope.last(where: { $0.0 == path[0] })?.1 else {
                var names: [String] = []
                for (name, _) in scope where !names.contains(name) { names.append(name) }
                throw ResponseContentError("transform placeholder '{\(dotted)}' is not defined. Available: \(pythonList(names.sorted(by: pythonLess)))")
            }
            for key in path.dropFirst() {
                guard case let .object(pairs) = value else {
                    throw ResponseContentError("transform placeholder '{\(dotted)}' cannot index into \(pythonTypeName(value)) at '\(key)'")
                }
                guard let next = pairs.first(where: { $0.0 == key })?.1 else {
                    throw ResponseContentError("transform placeholder '{\(dotted)}' is missing key '\(key)'. Available: \(pythonList(pairs.map(\.0).sorted(by: pythonLess)))")
                }
                value = next
            }
            return value
        default:
            return transform
        }
    }

    /// The types a parameter's schema allows (`type`, a list of types, `anyOf`/`oneOf`, `nullable`), transformers'
    /// `_schema_types`.
    static func schemaTypes(_ schema: JSONValue) -> [String] {
        guard case .object = schema else { return [] }
        var types: [String] = []
        switch schema["type"] {
        case let .string(name)?: types.append(name)
        case let .array(names)?: for case let .string(name) in names { types.append(name) }
        default: break
        }
        for union in ["anyOf", "oneOf"] {
            if case let .array(choices)? = schema[union] { for choice in choices { types += schemaTypes(choice) } }
        }
        if pythonTruthy(schema["nullable"] ?? .null) && !types.contains("null") { types.append("null") }
        return types
    }

    /// A string argument as the first of `types` it converts to, or the string itself, transformers' `_coerce`.
    static func coerce(_ raw: String, _ types: [String]) throws -> JSONValue {
        for type in types {
            switch type {
            case "integer":
                if let number = pythonInt(raw) { return number }
                if let number = pythonFloat(raw), number.isFinite, number.rounded() == number {
                    guard let integer = Int(exactly: number) else { throw ResponseContentError("\(raw) does not fit a 64-bit integer") }
                    return .int(integer)
                }
            case "number":
                guard let number = pythonFloat(raw), number.isFinite else { continue }
                if number.rounded() == number && !raw.contains(".") {
                    guard let integer = Int(exactly: number) else { throw ResponseContentError("\(raw) does not fit a 64-bit integer") }
                    return .int(integer)
                }
                return .double(number)
            case "boolean":
                let word = PythonStrings.lower(PythonStrings.strip(raw, nil, leading: true, trailing: true))
                if ["true", "1", "false", "0"].contains(word) { return .bool(word == "true" || word == "1") }
            case "null":
                let word = PythonStrings.strip(raw, nil, leading: true, trailing: true)
                if word == "null" || word == "None" { return .null }
            case "object", "array":
                if let decoded = try? JSONValue(parsing: Data(raw.utf8)) {
                    switch (type, decoded) {
                    case ("object", .object), ("array", .array): return decoded
                    default: break
                    }
                }
            default: break
            }
        }
        return .string(raw)
    }
}

// MARK: - Python's int() and float() of a string

/// The ASCII form of a number's text as Python reads it: surrounding whitespace stripped, Unicode decimal digits
/// as ASCII digits, single underscores between digits removed; nil where an underscore is misplaced.
private func pythonNumberText(_ text: String) -> String? {
    let stripped = Array(PythonStrings.strip(text, nil, leading: true, trailing: true).unicodeScalars)
    var out = ""
    for (index, scalar) in stripped.enumerated() {
        if scalar == "_" {
            guard index > 0, index + 1 < stripped.count, decimalValue(stripped[index - 1]) != nil,
                  decimalValue(stripped[index + 1]) != nil else { return nil }
            continue
        }
        if let digit = decimalValue(scalar) { out.append(Character(String(digit))) } else { out.unicodeScalars.append(scalar) }
    }
    return out
}

private func decimalValue(_ scalar: Unicode.Scalar) -> Int? {
    guard scalar.properties.generalCategory == .decimalNumber, let value = scalar.properties.numericValue else { return nil }
    return Int(value)
}

/// Python's `int(text)` for base 10, nil where it raises (or the value does not fit 64 bits).
func pythonInt(_ text: String) -> JSONValue? {
    guard let ascii = pythonNumberText(text), !ascii.isEmpty else { return nil }
    var digits = Substring(ascii)
    if digits.first == "+" || digits.first == "-" { digits = digits.dropFirst() }
    guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
    return Int(ascii.first == "+" ? String(ascii.dropFirst()) : ascii).map(JSONValue.int)
}

/// Python's `float(text)`, nil where it raises.
func pythonFloat(_ text: String) -> Double? {
    guard let ascii = pythonNumberText(text), !ascii.isEmpty else { return nil }
    var body = Substring(ascii)
    var negative = false
    if body.first == "+" || body.first == "-" {
        negative = body.first == "-"
        body = body.dropFirst()
    }
    switch body.lowercased() {
    case "inf", "infinity": return negative ? -.infinity : .infinity
    case "nan": return .nan
    default: break
    }
    // digits [. digits] [e [sign] digits], at least one digit in the mantissa.
    var index = body.startIndex
    var mantissaDigits = 0
    while index < body.endIndex, body[index].isASCII, body[index].isNumber { index = body.index(after: index); mantissaDigits += 1 }
    if index < body.endIndex, body[index] == "." {
        index = body.index(after: index)
        while index < body.endIndex, body[index].isASCII, body[index].isNumber { index = body.index(after: index); mantissaDigits += 1 }
    }
    guard mantissaDigits > 0 else { return nil }
    if index < body.endIndex, body[index] == "e" || body[index] == "E" {
        index = body.index(after: index)
        if index < body.endIndex, body[index] == "+" || body[index] == "-" { index = body.index(after: index) }
        var exponentDigits = 0
        while index < body.endIndex, body[index].isASCII, body[index].isNumber { index = body.index(after: index); exponentDigits += 1 }
        guard exponentDigits > 0 else { return nil }
    }
    guard index == body.endIndex, let magnitude = Double(String(body)) else { return nil }
    return negative ? -magnitude : magnitude
}
