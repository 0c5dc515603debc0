/// Where a response template puts tool calls, and the JSON that calls each of a request's tools there: what lets
/// generation hold a call to the tools' schemas while writing it in the model's own format
/// (``ResponseTemplate/toolCallFormat(tools:)``).
public struct ToolCallFormat: Sendable {
    /// The field whose regions hold calls (`tool_calls`).
    public let field: String
    /// The literal delimiters that close a call's region.
    public let close: [String]
    /// The open delimiter's capture that names the tool, where the name is written there rather than in the JSON.
    public let nameCapture: String?
    /// Each tool's name and the schema of the JSON that calls it.
    let calls: [(name: String, schema: JSONValue)]

    /// The JSON schemas of a call region's content: by tool name where the open delimiter captures the name
    /// (``nameCapture``), else one under "" for every tool.
    public var contentSchemas: [String: JSONValue] {
        guard nameCapture == nil else { return Dictionary(calls.map { ($0.name, $0.schema) }, uniquingKeysWith: { first, _ in first }) }
        return ["": calls.count == 1 ? calls[0].schema : ["anyOf": .array(calls.map(\.schema))]]
    }

    /// Which of ``contentSchemas`` a region opened with `captures` holds ("" when the JSON names the tool).
    public func schemaKey(captures: [String: String]) -> String? {
        guard let nameCapture else { return "" }
        return captures[nameCapture]
    }
}

extension ResponseTemplate {
    /// The template's tool-call format for `tools` (OpenAI's `{"type": "function", "function": {"name",
    /// "parameters"}}`), found by reading the `tool_calls` field's transform backwards: which placeholder gives a
    /// call's function name and which its arguments (`"function": "{content}"`, `{"name": "{name}", "arguments":
    /// "{content}"}` with the name captured by the open delimiter, `{content.args}`).
    ///
    /// - Returns: nil where a call cannot be written as plain JSON between literal delimiters: regions of another
    ///   content parser (`xml-inline`, `kv-lines`) or of a JSON dialect (`unquoted_keys`, `string_delims`), a
    ///   pattern closing the region, a transform with placeholders beyond the name and arguments, no tools; and
    ///   regions holding a list of calls (`transform_each`), whose items carry keys the template does not read
    ///   (Cohere's `tool_call_id`, written first) that a schema of what it reads would keep the model from writing.
    public func toolCallFormat(tools: [JSONValue]) -> ToolCallFormat? {
        guard let field = fields.first(where: { $0.name == "tool_calls" }), let open = field.open,
              field.content == "json", !field.transformEach, let close = field.close?.literals,
              case let .object(arguments) = field.contentArguments, arguments.allSatisfy({ $0.0 == "allow_non_json" }),
              let transform = field.transform, let function = transform["function"] else { return nil }
        let captureNames = Set(open.regex.groupIndex.keys)
        var placeholders: [[String]] = []
        Self.collectPlaceholders(transform, into: &placeholders)

        enum Source: Equatable {
            case capture(String)
            /// A path into the region's JSON.
            case content([String])
        }
        func source(_ value: JSONValue?) -> Source? {
            guard case let .string(text)? = value, let path = TransformPlaceholder.path(text) else { return nil }
            // Lookups take the last binding: the content over a capture of the same name.
            if path[0] == "content" { return .content(Array(path.dropFirst())) }
            return captureNames.contains(path[0]) && path.count == 1 ? .capture(path[0]) : nil
        }

        let whole = source(function)
        let name = whole == nil ? source(function["name"]) : nil
        let argumentsSource = whole == nil ? source(function["arguments"]) : nil
        let used = Set([function, function["name"], function["arguments"]].compactMap { value -> [String]? in
            guard case let .string(text)? = value else { return nil }
            return TransformPlaceholder.path(text)
        })
        guard placeholders.allSatisfy(used.contains) else { return nil }

        var nameCapture: String?
        var calls: [(name: String, schema: JSONValue)] = []
        for tool in tools {
            guard case let .string(toolName)? = tool["function"]?["name"] else { return nil }
            let parameters = tool["function"]?["parameters"] ?? ["type": "object", "properties": .object([])]
            var requirements: [([String], JSONValue)] = []
            switch (whole, name, argumentsSource) {
            case let (.content(path)?, _, _):
                requirements.append((path, ["type": "object",
                                            "properties": ["name": ["const": .string(toolName)], "arguments": parameters],
                                            "required": ["name", "arguments"], "additionalProperties": false]))
            case let (nil, .capture(capture)?, .content(path)?):
                nameCapture = capture
                requirements.append((path, parameters))
            case let (nil, .content(namePath)?, .content(path)?):
                requirements.append((namePath, ["const": .string(toolName)]))
                requirements.append((path, parameters))
            default:
                return nil
            }
            guard let schema = Self.nested(requirements) else { return nil }
            calls.append((toolName, schema))
        }
        guard !calls.isEmpty else { return nil }
        return ToolCallFormat(field: field.name, close: close, nameCapture: nameCapture, calls: calls)
    }

    private static func collectPlaceholders(_ value: JSONValue, into paths: inout [[String]]) {
        switch value {
        case let .object(pairs): for (_, item) in pairs { collectPlaceholders(item, into: &paths) }
        case let .array(items): for item in items { collectPlaceholders(item, into: &paths) }
        case let .string(text): if let path = TransformPlaceholder.path(text) { paths.append(path) }
        default: break
        }
    }

    /// The schema of a JSON value holding each requirement's schema at its path (objects along the way, nothing else
    /// in them); nil when a requirement is the whole value and there are others.
    private static func nested(_ requirements: [([String], JSONValue)]) -> JSONValue? {
        if let whole = requirements.first(where: { $0.0.isEmpty }) { return requirements.count == 1 ? whole.1 : nil }
        var keys: [String] = []
        var groups: [String: [([String], JSONValue)]] = [:]
        for (path, schema) in requirements {
            if groups[path[0]] == nil { keys.append(path[0]) }
            groups[path[0], default: []].append((Array(path.dropFirst()), schema))
        }
        var properties: [(String, JSONValue)] = []
        for key in keys {
            guard let schema = nested(groups[key]!) else { return nil }
            properties.append((key, schema))
        }
        return ["type": "object", "properties": .object(properties), "required": .array(keys.map(JSONValue.string)),
                "additionalProperties": false]
    }
}
