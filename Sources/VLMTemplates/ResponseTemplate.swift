import Foundation

/// A chat model's `response_template` (a key of tokenizer_config.json since transformers 5): how its replies are laid
/// out, so that a generated text can be split back into the assistant message a chat template reads, its
/// `content`, `reasoning_content` (or `thinking`) and `tool_calls`, as `tokenizer.parse_response` splits it.
///
/// A template names fields. Each is a region of the reply between an `open` and a `close` delimiter (literal strings
/// or `*_pattern` regexes in Python's `regex` syntax); at most one field has no `open` and takes the text no other
/// region claims. A region's text goes through a content parser (`text`, `int`, `float`, `bool`, `json`,
/// `xml-inline`, `kv-lines`) and an optional `transform` that reshapes it (`{"type": "function", "function":
/// "{content}"}`). The `start_anchor` marks where the assistant's turn begins in the prompt, so a reply the chat
/// template already began (an opening `<think>`) is parsed from the right state.
///
/// Loading checks the template as `load_response_template` does, refusing what it refuses.
public struct ResponseTemplate: Sendable {
    /// A region boundary: a regex, and the literal strings it was built from when it was given as literals.
    struct Delimiter: Sendable {
        let regex: PythonRegex
        let literals: [String]?
        /// One literal is a strict prefix of another, so a match at the end of the text so far may still grow.
        let canExtend: Bool
    }

    struct Field: Sendable {
        let name: String
        let open: Delimiter?
        let close: Delimiter?
        /// The content parser's name.
        let content: String
        let contentArguments: JSONValue
        let repeats: Bool
        let join: String?
        let optional: Bool
        let transform: JSONValue?
        let transformEach: Bool
    }

    let defaults: [(String, JSONValue)]
    let fields: [Field]
    /// The field without an `open` delimiter, which takes the text outside every other region.
    let implicit: Int?
    let startAnchor: Delimiter
    /// The template as given.
    public let spec: JSONValue

    /// Loads and checks a template (the JSON object of tokenizer_config.json's `response_template`).
    public init(_ spec: JSONValue) throws {
        // Every check runs before any property is set: a typed throw out of a partly initialized struct crashes
        // this toolchain (Swift 6.3.1).
        self = try Self.load(spec)
    }

    private init(spec: JSONValue, defaults: [(String, JSONValue)], fields: [Field], implicit: Int?, startAnchor: Delimiter) {
        self.spec = spec
        self.defaults = defaults
        self.fields = fields
        self.implicit = implicit
        self.startAnchor = startAnchor
    }

    private static func load(_ spec: JSONValue) throws -> ResponseTemplate {
        guard case let .object(pairs) = spec else {
            throw ResponseTemplateError.invalid("response_template must be a dict, got \(pythonTypeName(spec))")
        }
        if let version = spec["version"], !pythonEquals(version, .int(1)) {
            throw ResponseTemplateError.invalid("Unsupported response_template version: \(pythonStr(version))")
        }
        let known: Set<String> = ["version", "defaults", "fields", "start_anchor", "start_anchor_pattern"]
        let unknown = pairs.map(\.0).filter { !known.contains($0) }
        if !unknown.isEmpty { throw ResponseTemplateError.invalid("Unknown keys in response_template: \(pythonList(unknown.sorted(by: pythonLess)))") }
        let defaultsValue = spec["defaults"] ?? .object([])
        guard case let .object(defaults) = defaultsValue else { throw ResponseTemplateError.invalid("response_template.defaults must be a dict") }
        guard case let .object(fieldSpecs) = spec["fields"] ?? .object([]), !fieldSpecs.isEmpty else {
            throw ResponseTemplateError.invalid("response_template.fields must be a non-empty dict")
        }
        var fields: [Field] = []
        for (name, field) in fieldSpecs {
            let built = try Self.field(name, field)
            if let at = fields.firstIndex(where: { $0.name == name }) { fields[at] = built } else { fields.append(built) }
        }
        let implicitFields = fields.indices.filter { fields[$0].open == nil }
        if implicitFields.count > 1 {
            throw ResponseTemplateError.invalid("At most one field may omit 'open'/'open_pattern' (that field becomes the implicit-open / leftover sink). Found: \(implicitFields.map { fields[$0].name }.joined(separator: ", "))")
        }
        guard let anchor = try Self.delimiter("response_template", spec, literalKey: "start_anchor", patternKey: "start_anchor_pattern") else {
            throw ResponseTemplateError.invalid("response_template must define 'start_anchor' or 'start_anchor_pattern'.")
        }
        return ResponseTemplate(spec: spec, defaults: defaults, fields: fields, implicit: implicitFields.first, startAnchor: anchor)
    }

    private static func field(_ name: String, _ field: JSONValue) throws -> Field {
        let scope = "Field \(pythonStringRepr(name))"
        guard case let .object(pairs) = field else { throw ResponseTemplateError.invalid("\(scope) must be a dict") }
        let allowed: Set<String> = ["open", "open_pattern", "close", "close_pattern", "content", "content_args", "repeats",
                                    "join", "optional", "transform", "transform_each"]
        let unknown = pairs.map(\.0).filter { !allowed.contains($0) }
        if !unknown.isEmpty { throw ResponseTemplateError.invalid("\(scope): unknown keys \(pythonList(unknown.sorted(by: pythonLess)))") }
        let contentValue = field["content"] ?? .string("text")
        guard case let .string(content) = contentValue, ResponseContent.parsers.contains(content) else {
            throw ResponseTemplateError.invalid("\(scope): unknown content parser \(pythonRepr(contentValue)). Available: \(pythonList(ResponseContent.parsers.sorted(by: pythonLess)))")
        }
        let open = try delimiter(scope, field, literalKey: "open", patternKey: "open_pattern")
        let close = try delimiter(scope, field, literalKey: "close", patternKey: "close_pattern")
        let repeats = pythonTruthy(field["repeats"] ?? .bool(false))
        var join: String?
        switch field["join"] {
        case nil, .null?: break
        case let .string(text)?: join = text
        case let other?: throw ResponseTemplateError.invalid("\(scope): 'join' must be a string, got \(pythonTypeName(other))")
        }
        if join != nil && !repeats { throw ResponseTemplateError.invalid("\(scope): 'join' requires 'repeats': true") }
        let transform = field["transform"].flatMap { $0 == .null ? nil : $0 }
        let transformEachValue = field["transform_each"] ?? .bool(false)
        guard case let .bool(transformEach) = transformEachValue else {
            throw ResponseTemplateError.invalid("\(scope): transform_each must be a bool, got \(pythonTypeName(transformEachValue))")
        }
        if transformEach && transform == nil { throw ResponseTemplateError.invalid("\(scope): transform_each is set but no transform was provided") }
        if let transform {
            try checkTransformStrings(scope, transform)
        } else {
            // Named captures reach the output only through a transform; a pattern declaring some without one is a mistake.
            let captured = Set((open?.regex.groupIndex.keys).map(Array.init) ?? []).union(close?.regex.groupIndex.keys ?? [:].keys)
            if !captured.isEmpty {
                throw ResponseTemplateError.invalid("\(scope): open_pattern/close_pattern declares named group(s) \(pythonList(captured.sorted(by: pythonLess))), but the field has no 'transform'. Named captures are only surfaced through a 'transform' template (where they appear alongside 'content'). Either add a 'transform' that uses the captures, or remove the named groups from the pattern.")
            }
        }
        return Field(name: name, open: open, close: close, content: content, contentArguments: field["content_args"] ?? .object([]),
                     repeats: repeats, join: join, optional: pythonTruthy(field["optional"] ?? .bool(true)),
                     transform: transform, transformEach: transformEach)
    }

    /// A delimiter given as a literal, a list of literals (any of them) or a pattern; nil when neither key is set.
    private static func delimiter(_ scope: String, _ spec: JSONValue, literalKey: String, patternKey: String) throws -> Delimiter? {
        if spec[literalKey] != nil && spec[patternKey] != nil {
            throw ResponseTemplateError.invalid("\(scope): cannot specify both '\(literalKey)' and '\(patternKey)'")
        }
        if let raw = spec[literalKey] {
            var literals: [String]
            switch raw {
            case let .string(text): literals = [text]
            case let .array(items):
                guard !items.isEmpty else { throw ResponseTemplateError.invalid("\(scope): '\(literalKey)' list must contain at least one literal") }
                literals = []
                for item in items {
                    guard case let .string(text) = item else { throw ResponseTemplateError.invalid("\(scope): '\(literalKey)' list must contain only strings") }
                    if !literals.contains(text) { literals.append(text) }
                }
            default:
                throw ResponseTemplateError.invalid("\(scope): '\(literalKey)' must be a string or list of strings, got \(pythonTypeName(raw))")
            }
            if literals.contains("") { throw ResponseTemplateError.invalid("\(scope): '\(literalKey)' literals cannot be empty strings") }
            // Longest first, so that the alternation prefers the longer of two literals that both match.
            let ordered = literals.enumerated().sorted { a, b in
                a.element.unicodeScalars.count != b.element.unicodeScalars.count
                    ? a.element.unicodeScalars.count > b.element.unicodeScalars.count : a.offset < b.offset
            }.map(\.element)
            let canExtend = literals.contains { a in literals.contains { b in a != b && a.unicodeScalars.starts(with: b.unicodeScalars) } }
            let pattern = ordered.map(PythonRegex.escape).joined(separator: "|")
            do {
                return Delimiter(regex: try PythonRegex(pattern, dotAll: true), literals: literals, canExtend: canExtend)
            } catch {
                throw ResponseTemplateError.invalid("\(scope): '\(literalKey)': \(error)")
            }
        }
        if let raw = spec[patternKey] {
            guard case let .string(pattern) = raw else { throw ResponseTemplateError.invalid("\(scope): \(patternKey) must be a string, got \(pythonTypeName(raw))") }
            do {
                return Delimiter(regex: try PythonRegex(pattern, dotAll: true), literals: nil, canExtend: false)
            } catch {
                throw ResponseTemplateError.invalid("\(scope): invalid \(patternKey) regex: \(error)")
            }
        }
        return nil
    }

    /// Refuses transform strings that mix a `{placeholder}` with other text (only whole-string placeholders are filled).
    private static func checkTransformStrings(_ scope: String, _ transform: JSONValue) throws {
        switch transform {
        case let .object(pairs): for (_, value) in pairs { try checkTransformStrings(scope, value) }
        case let .array(items): for item in items { try checkTransformStrings(scope, item) }
        case let .string(text):
            if TransformPlaceholder.contains(text) && TransformPlaceholder.path(text) == nil {
                throw ResponseTemplateError.invalid("\(scope): transform string \(pythonStringRepr(text)) mixes a {placeholder} with literal text. Use either a whole-string placeholder (e.g. \"{content}\") or a plain literal; string interpolation is not supported.")
            }
        default: break
        }
    }

    /// A checkpoint's response template: tokenizer_config.json's `response_template`, which transformers' tokenizers
    /// load with the rest of that file.
    ///
    /// - Returns: nil when the directory has no tokenizer_config.json or it sets no template.
    public static func load(directory: URL) throws -> ResponseTemplate? {
        let url = directory.appendingPathComponent("tokenizer_config.json")
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        let data: Data
        do { data = try Data(contentsOf: url) } catch { throw ResponseTemplateError.file(url.path, "cannot read: \(error.localizedDescription)") }
        let config: JSONValue
        do { config = try JSONValue(parsing: data, file: url.path) } catch { throw ResponseTemplateError.file(url.path, "\(error)") }
        guard let spec = config["response_template"], spec != .null else { return nil }
        do { return try ResponseTemplate(spec) } catch { throw ResponseTemplateError.file(url.path, "\(error)") }
    }

    /// `text` from the end of the last `start_anchor` match on: where the assistant's message being parsed begins
    /// (the whole text when the anchor is not in it).
    func truncatedPastLastAnchor(_ text: [Unicode.Scalar]) throws -> ArraySlice<Unicode.Scalar> {
        let matches: [PythonRegexMatch]
        do { matches = try startAnchor.regex.matches(in: text) } catch { throw ResponseTemplateError.regex("start_anchor", "\(error)") }
        guard let last = matches.last else { return text[...] }
        return text[last.range.upperBound...]
    }
}

/// Why a response template could not be loaded, or a reply could not be parsed with it.
public enum ResponseTemplateError: Error, CustomStringConvertible, Equatable {
    /// The template is not one transformers would load.
    case invalid(String)
    /// A region's text does not parse as its field's content (e.g. a tool call that is not JSON).
    case malformedRegion(field: String, reason: String)
    /// Fields the template marks `"optional": false` are not in the reply.
    case missingFields([String])
    /// A delimiter's regex gave up (too costly for the text).
    case regex(String, String)
    /// A file holding a template could not be read, or its template is invalid.
    case file(String, String)
    /// The parser was fed or finalized after ``ResponseParser/finalize()``.
    case finalized

    public var description: String {
        switch self {
        case let .invalid(message): "invalid response_template: \(message)"
        case let .malformedRegion(field, reason): "the reply's '\(field)' region does not parse: \(reason)"
        case let .missingFields(names): "Required response_template fields missing from parsed output: \(pythonList(names))"
        case let .regex(place, reason): "response_template \(place): \(reason)"
        case let .file(path, reason): "\(path): \(reason)"
        case .finalized: "ResponseParser already finalized"
        }
    }
}

// MARK: - Python's view of JSON values, for messages and checks that follow transformers' Python code.

func pythonTypeName(_ value: JSONValue) -> String {
    switch value {
    case .null: "NoneType"
    case .bool: "bool"
    case .int: "int"
    case .double: "float"
    case .string: "str"
    case .array: "list"
    case .object: "dict"
    }
}

/// Python's truth value of a JSON value.
func pythonTruthy(_ value: JSONValue) -> Bool {
    switch value {
    case .null: false
    case let .bool(flag): flag
    case let .int(number): number != 0
    case let .double(number): number != 0
    case let .string(text): !text.isEmpty
    case let .array(items): !items.isEmpty
    case let .object(pairs): !pairs.isEmpty
    }
}

/// Python's `==` between JSON values (True == 1 == 1.0).
func pythonEquals(_ a: JSONValue, _ b: JSONValue) -> Bool {
    func number(_ value: JSONValue) -> Double? {
        switch value {
        case let .bool(flag): flag ? 1 : 0
        case let .int(number): Double(number)
        case let .double(number): number
        default: nil
        }
    }
    if let x = number(a), let y = number(b) { return x == y }
    return a == b
}

/// Python's `repr` of a JSON value.
func pythonRepr(_ value: JSONValue) -> String {
    switch value {
    case .null: "None"
    case let .bool(flag): flag ? "True" : "False"
    case let .int(number): String(number)
    case let .double(number): pythonFloatRepr(number)
    case let .string(text): pythonStringRepr(text)
    case let .array(items): "[" + items.map(pythonRepr).joined(separator: ", ") + "]"
    case let .object(pairs): "{" + pairs.map { pythonStringRepr($0.0) + ": " + pythonRepr($0.1) }.joined(separator: ", ") + "}"
    }
}

/// Python's `str` of a JSON value.
func pythonStr(_ value: JSONValue) -> String {
    if case let .string(text) = value { return text }
    return pythonRepr(value)
}

func pythonList(_ names: [String]) -> String {
    "[" + names.map(pythonStringRepr).joined(separator: ", ") + "]"
}

/// Python's ordering of strings: by code point.
func pythonLess(_ a: String, _ b: String) -> Bool {
    a.unicodeScalars.lexicographicallyPrecedes(b.unicodeScalars)
}

/// transformers' transform placeholders: a whole string `{name}` or `{name.key.key}`, names of word characters.
enum TransformPlaceholder {
    // A fixed pattern the engine accepts; the force is checked by every test that loads a template.
    private static let pattern = try! PythonRegex(#"\{(\w+(?:\.\w+)*)\}"#)

    /// The dotted path of a string that is one placeholder, nil otherwise.
    static func path(_ text: String) -> [String]? {
        let scalars = Array(text.unicodeScalars)
        guard let match = try? pattern.fullMatch(scalars), let path = match.groups[0] else { return nil }
        return PythonStrings.split(String(String.UnicodeScalarView(scalars[path])), ".", maxSplit: -1)
    }

    /// Whether the text holds a placeholder anywhere (`re.search`).
    static func contains(_ text: String) -> Bool {
        (try? pattern.search(Array(text.unicodeScalars))) != nil
    }
}
