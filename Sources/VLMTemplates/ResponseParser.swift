/// What parsing a reply reports as text arrives: a field's region opening, text reaching it, and its parsed value
/// when it closes (transformers' `region_open`, `region_chunk`, `region_close` events).
public enum ResponseEvent: Equatable, Sendable {
    case open(field: String)
    /// Text routed into the open region; `dirty` when the field's parser is structured (`json`, `xml-inline`,
    /// `kv-lines`), whose raw text only becomes a value when the region closes.
    case chunk(field: String, text: String, dirty: Bool)
    case close(field: String, value: JSONValue)
    /// The region's text did not parse; the region is dropped and parsing goes on (transformers raises here and
    /// stops; vLLM's copy of the parser reports it and continues, which is what a server streaming a reply needs).
    case malformed(field: String, reason: String)
}

/// Parses a reply with a ``ResponseTemplate`` as it is generated, transformers' `ResponseParser`: text is routed to
/// the region that is open, delimiters are committed only once more text cannot change them (a partial delimiter
/// at the end is held back), and each region's value is parsed when it closes.
///
/// The prompt that came before the reply (`prefix`) is parsed first, from its last `start_anchor` on, because chat
/// templates often begin the assistant's message themselves (an opening `<think>`); its events are
/// ``initialEvents``.
public struct ResponseParser: Sendable {
    public let template: ResponseTemplate
    private var buffer: [Unicode.Scalar] = []
    private var position = 0
    private var output: [(String, JSONValue)]
    /// The field text is routed to: the implicit field, or an explicit one between its delimiters; nil when
    /// text outside every region is dropped (no implicit field).
    private var current: Int?
    private var captures: [(String, String)] = []
    private var body = String.UnicodeScalarView()
    private var opened = false
    private var finalized = false
    /// Tool name → its parameters' `properties`, to cast parsed arguments.
    private let toolParameters: [String: [(String, JSONValue)]]
    public private(set) var initialEvents: [ResponseEvent] = []

    /// The named groups the open region's delimiter captured (a tool's name in `<call:(?P<name>\w+)>`).
    public var openCaptures: [String: String] {
        Dictionary(captures, uniquingKeysWith: { _, last in last })
    }

    /// - Parameters:
    ///   - prefix: the prompt the reply continues ("" when the reply holds the whole message).
    ///   - tools: the request's tools (`{"type": "function", "function": {"name", "parameters"}}`); when given,
    ///     tool-call arguments are cast to the types their parameters declare ("7" → 7 for an integer).
    public init(template: ResponseTemplate, prefix: String, tools: [JSONValue]? = nil) throws {
        var parser = ResponseParser(template: template, tools: tools)
        try parser.consumePrefix(prefix)
        self = parser
    }

    private init(template: ResponseTemplate, tools: [JSONValue]?) {
        self.template = template
        output = template.defaults
        current = template.implicit
        var parameters: [String: [(String, JSONValue)]] = [:]
        for tool in tools ?? [] {
            guard case .object = tool else { continue }
            let function = tool["function"] ?? tool
            guard case .object = function, case let .string(name)? = function["name"] else { continue }
            if case let .object(properties)? = function["parameters"]?["properties"] {
                parameters[name] = properties
            } else {
                parameters[name] = []
            }
        }
        toolParameters = parameters
    }

    private mutating func consumePrefix(_ prefix: String) throws {
        guard !prefix.isEmpty else { return }
        let truncated = try template.truncatedPastLastAnchor(Array(prefix.unicodeScalars))
        guard !truncated.isEmpty else { return }
        buffer = Array(truncated)
        var events: [ResponseEvent] = []
        try process(&events, end: false)
        initialEvents = events
    }

    /// Takes the next piece of the reply; returns the events it causes.
    public mutating func feed(_ text: String) throws -> [ResponseEvent] {
        guard !finalized else { throw ResponseTemplateError.finalized }
        buffer.append(contentsOf: text.unicodeScalars)
        var events: [ResponseEvent] = []
        try process(&events, end: false)
        return events
    }

    /// Ends the reply: commits what was held back, closes the open region, and returns the message with the last
    /// events. Fields left empty are dropped unless the template's `defaults` name them.
    public mutating func finalize() throws -> (message: JSONValue, events: [ResponseEvent]) {
        guard !finalized else { throw ResponseTemplateError.finalized }
        var events: [ResponseEvent] = []
        try process(&events, end: true)
        let missing = template.fields.filter { field in !field.optional && !output.contains { $0.0 == field.name } }.map(\.name)
        if !missing.isEmpty { throw ResponseTemplateError.missingFields(missing) }
        output = output.filter { key, value in template.defaults.contains { $0.0 == key } || !Self.isEmpty(value) }
        finalized = true
        return (.object(output), events)
    }

    private static func isEmpty(_ value: JSONValue) -> Bool {
        switch value {
        case .null: true
        case let .string(text): text.isEmpty
        case let .array(items): items.isEmpty
        case let .object(pairs): pairs.isEmpty
        default: false
        }
    }

    private func text(_ range: Range<Int>) -> String {
        String(String.UnicodeScalarView(buffer[range]))
    }

    private enum Kind { case open, close }

    private mutating func process(_ events: inout [ResponseEvent], end: Bool) throws {
        while true {
            let (best, holdStart) = try scan(watchList(), end: end)
            if let (kind, field, match) = best {
                if match.range.lowerBound > position { accumulate(&events, text(position..<match.range.lowerBound)) }
                position = match.range.upperBound
                switch kind {
                case .open:
                    closeCurrent(&events)
                    openExplicit(&events, field: field, match: match)
                case .close:
                    // Only the implicit region's close is watched while in it: explicit regions expose their own.
                    let hadContent = opened
                    closeCurrent(&events)
                    // A zero-width close of a region that is still empty would fire again at once.
                    if !hadContent && match.range.isEmpty { return }
                }
                continue
            }
            if end {
                if position < buffer.count {
                    accumulate(&events, text(position..<buffer.count))
                    position = buffer.count
                }
                closeCurrent(&events)
                return
            }
            // Everything before the earliest delimiter that may still be completing can go out now.
            if holdStart > position {
                accumulate(&events, text(position..<holdStart))
                position = holdStart
            }
            return
        }
    }

    /// The delimiters that matter now: an explicit region's own close; otherwise every open, and the implicit
    /// region's close.
    private func watchList() -> [(Kind, Int)] {
        if let current, current != template.implicit {
            return template.fields[current].close != nil ? [(.close, current)] : []
        }
        var watch: [(Kind, Int)] = template.fields.indices.filter { template.fields[$0].open != nil }.map { (.open, $0) }
        if let implicit = template.implicit, template.fields[implicit].close != nil { watch.append((.close, implicit)) }
        return watch
    }

    /// The earliest delimiter that can be committed now (longest on ties, opens before closes, then by field name),
    /// and where the held-back text begins: the leftmost delimiter that more text could still complete or lengthen.
    private func scan(_ watch: [(Kind, Int)], end: Bool) throws -> (best: (Kind, Int, PythonRegexMatch)?, holdStart: Int) {
        var best: (Kind, Int, PythonRegexMatch)?
        var holdStart = buffer.count
        for (kind, fieldIndex) in watch {
            let field = template.fields[fieldIndex]
            guard let delimiter = kind == .open ? field.open : field.close else { continue }
            let found: PythonRegexMatch?
            do { found = try delimiter.regex.search(buffer, from: position, partial: !end) } catch {
                throw ResponseTemplateError.regex("\(field.name) \(kind == .open ? "open" : "close")", "\(error)")
            }
            guard let match = found else { continue }
            if !end && (match.partial || canGrow(delimiter, match)) {
                holdStart = min(holdStart, match.range.lowerBound)
                continue
            }
            if let (bestKind, bestField, bestMatch) = best {
                let key = (match.range.lowerBound, -match.range.count, kind == .open ? 0 : 1)
                let bestKey = (bestMatch.range.lowerBound, -bestMatch.range.count, bestKind == .open ? 0 : 1)
                let earlier = key < bestKey || (key == bestKey && pythonLess(field.name, template.fields[bestField].name))
                if !earlier { continue }
            }
            best = (kind, fieldIndex, match)
        }
        // A pending delimiter that starts no later might be the one that fires.
        if let (_, _, match) = best, match.range.lowerBound >= holdStart { best = nil }
        return (best, holdStart)
    }

    /// Whether a complete match could still change with more text: only one ending at the end of the text so far,
    /// and then zero-width ones, patterns, and literals another literal of the set extends.
    private func canGrow(_ delimiter: ResponseTemplate.Delimiter, _ match: PythonRegexMatch) -> Bool {
        guard match.range.upperBound == buffer.count else { return false }
        if match.range.isEmpty { return true }
        return delimiter.literals == nil || delimiter.canExtend
    }

    private mutating func accumulate(_ events: inout [ResponseEvent], _ text: String) {
        guard !text.isEmpty, let current else { return }
        let field = template.fields[current]
        if !opened {
            events.append(.open(field: field.name))
            opened = true
        }
        body.append(contentsOf: text.unicodeScalars)
        events.append(.chunk(field: field.name, text: text, dirty: !ResponseContent.streamable.contains(field.content)))
    }

    private mutating func openExplicit(_ events: inout [ResponseEvent], field: Int, match: PythonRegexMatch) {
        current = field
        let regex = template.fields[field].open!.regex
        captures = regex.groupIndex.sorted { $0.value < $1.value }.compactMap { name, _ in
            match.named(name).map { (name, text($0)) }
        }
        body = String.UnicodeScalarView()
        opened = true
        events.append(.open(field: template.fields[field].name))
    }

    private mutating func closeCurrent(_ events: inout [ResponseEvent]) {
        defer { resetToImplicit() }
        guard let current, opened else { return }
        let field = template.fields[current]
        var value: JSONValue
        do {
            value = try ResponseContent.process(String(body), field: field, captures: captures)
            if !toolParameters.isEmpty { value = try castToolCalls(value) }
        } catch {
            events.append(.malformed(field: field.name, reason: (error as? ResponseContentError)?.message ?? "\(error)"))
            return
        }
        let at = output.firstIndex { $0.0 == field.name }
        if let join = field.join {
            guard case let .string(text) = value else {
                events.append(.malformed(field: field.name, reason: "Field \(pythonStringRepr(field.name)): 'join' requires each match to parse to a string, got \(pythonTypeName(value))."))
                return
            }
            if let at, output[at].1 != .null {
                guard case let .string(previous) = output[at].1 else {
                    events.append(.malformed(field: field.name, reason: "cannot join onto the default \(pythonTypeName(output[at].1))"))
                    return
                }
                output[at].1 = .string(previous + join + text)
            } else if let at {
                output[at].1 = value
            } else {
                output.append((field.name, value))
            }
        } else if field.repeats {
            if let at {
                guard case var .array(items) = output[at].1 else {
                    events.append(.malformed(field: field.name, reason: "cannot append to the default \(pythonTypeName(output[at].1))"))
                    return
                }
                items.append(value)
                output[at].1 = .array(items)
            } else {
                output.append((field.name, [value]))
            }
        } else if let at {
            output[at].1 = value
        } else {
            output.append((field.name, value))
        }
        events.append(.close(field: field.name, value: value))
    }

    private mutating func resetToImplicit() {
        current = template.implicit
        captures = []
        body = String.UnicodeScalarView()
        opened = false
    }

    /// Casts tool-call arguments that are strings (or lists of strings, from repeated keys) to their parameters'
    /// declared types, transformers' `_coerce_tool_calls`.
    private func castToolCalls(_ value: JSONValue) throws -> JSONValue {
        if case let .array(items) = value {
            var cast: [JSONValue] = []
            for item in items { cast.append(try castToolCalls(item)) }
            return .array(cast)
        }
        guard case var .object(call) = value, let functionAt = call.firstIndex(where: { $0.0 == "function" }),
              case var .object(function) = call[functionAt].1,
              case let .string(name)? = function.first(where: { $0.0 == "name" })?.1,
              let argumentsAt = function.firstIndex(where: { $0.0 == "arguments" }),
              case var .object(arguments) = function[argumentsAt].1,
              let properties = toolParameters[name], !properties.isEmpty else { return value }
        for index in arguments.indices {
            guard let schema = properties.last(where: { $0.0 == arguments[index].0 })?.1 else { continue }
            let types = ResponseContent.schemaTypes(schema)
            guard !types.isEmpty else { continue }
            switch arguments[index].1 {
            case let .string(raw):
                arguments[index].1 = try ResponseContent.coerce(raw, types)
            case let .array(items) where !types.contains("array"):
                var cast: [JSONValue] = []
                for item in items {
                    if case let .string(raw) = item { cast.append(try ResponseContent.coerce(raw, types)) } else { cast.append(item) }
                }
                arguments[index].1 = .array(cast)
            default: break
            }
        }
        function[argumentsAt].1 = .object(arguments)
        call[functionAt].1 = .object(function)
        return .object(call)
    }
}

extension ResponseTemplate {
    /// The assistant message in `text`, a whole reply, as `tokenizer.parse_response(text, prefix=prefix,
    /// tools=tools)` gives it: `{"role": "assistant", "content": …, "reasoning_content": …, "tool_calls": […]}`
    /// in the shape the template's fields and transforms give. A region that does not parse is an error, as there.
    public func parse(_ text: String, prefix: String, tools: [JSONValue]? = nil) throws -> JSONValue {
        var parser = try ResponseParser(template: self, prefix: prefix, tools: tools)
        var events = parser.initialEvents
        events += try parser.feed(text)
        let (message, last) = try parser.finalize()
        for case let .malformed(field, reason) in events + last { throw ResponseTemplateError.malformedRegion(field: field, reason: reason) }
        return message
    }
}
