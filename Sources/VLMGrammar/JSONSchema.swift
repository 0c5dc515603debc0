import VLMTemplates

/// A JSON schema reduced to what the grammar converter acts on, as llama.cpp's `common_chat_schema` reduces it:
/// keywords outside that subset are ignored, keywords inside it that are malformed fail with the schema path.
indirect enum JSONSchemaNode {
    /// Any JSON value.
    case any
    /// `{"$ref": "#/..."}`: the target is in `JSONSchemaDocument.references` under this text.
    case reference(String)
    /// `oneOf` / `anyOf`, or a `type` array expanded to one alternative per type.
    case anyOf([JSONSchemaNode])
    case allOf([JSONSchemaNode])
    case constant(JSONValue)
    case enumeration([JSONValue])
    case null
    case boolean
    case number
    /// Inclusive bounds with exclusive ones folded in; `Int64.min` and `Int64.max` stand for no bound, as in llama.cpp
    /// (so a bound of exactly one of them is none).
    case integer(minimum: Int64, maximum: Int64)
    /// An empty `pattern` is none, as in llama.cpp.
    case string(pattern: String, format: StringFormat?, minLength: Int, maxLength: Int?)
    case array(items: JSONSchemaNode, minItems: Int, maxItems: Int?)
    /// `items` (or `prefixItems`) given as an array: exactly these elements.
    case tuple([JSONSchemaNode])
    /// Properties in document order; `additional` is nil when other keys are not allowed.
    case object(properties: [JSONSchemaProperty], additional: JSONSchemaNode?)

    enum StringFormat {
        case uuid, date, time, dateTime
    }
}

struct JSONSchemaProperty {
    var name: String
    var schema: JSONSchemaNode
    var required: Bool
}

/// A string that compares and hashes by its UTF-8 bytes, as `std::string` does: `String` equates canonically
/// equivalent texts, which would merge names and values that llama.cpp keeps apart.
struct ExactString: Hashable, Comparable {
    let bytes: [UInt8]

    init(_ text: String) { bytes = Array(text.utf8) }

    static func < (lhs: ExactString, rhs: ExactString) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }
}

/// A schema and the targets of its `$ref`s, which may refer back to themselves.
struct JSONSchemaDocument {
    var root: JSONSchemaNode
    var references: [ExactString: JSONSchemaNode]

    /// Reads `schema` as llama.cpp's `common_chat_schema_from_json` does; `Failure` carries its message.
    init(_ schema: JSONValue) throws(Failure) {
        var builder = Builder(root: schema)
        root = try builder.node(schema, path: "#")
        references = builder.references
    }

    struct Failure: Error {
        let message: String
    }
}

private struct Builder {
    typealias Failure = JSONSchemaDocument.Failure

    let root: JSONValue
    var references: [ExactString: JSONSchemaNode] = [:]
    /// `$ref`s whose target is being built: a cycle back to one of them stops there.
    var pending: Set<ExactString> = []
    /// Schemas within schemas being built, `$ref` targets included: building (and converting) recurses into each,
    /// and a chain of thousands of `$ref`s would overflow a thread's stack, where llama.cpp crashes.
    var depth = 0
    static let depthLimit = 512

    private func fail(_ path: String, _ message: String) -> Failure {
        Failure(message: "JSON schema error at \(path): \(message)")
    }

    mutating func node(_ schema: JSONValue, path: String) throws(Failure) -> JSONSchemaNode {
        depth += 1
        defer { depth -= 1 }
        guard depth <= Self.depthLimit else { throw fail(path, "schemas nested deeper than \(Self.depthLimit), $ref targets included") }
        guard case let .object(members) = schema else { throw fail(path, "schema must be an object") }
        if let reference = schema["$ref"] { return try self.reference(reference, path: path) }
        for key in ["oneOf", "anyOf"] {
            if let alternatives = schema[key] {
                return .anyOf(try nodes(alternatives, path: "\(path)/\(key)"))
            }
        }
        let type = schema["type"] ?? .null
        if case let .array(types) = type {
            // {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}.
            guard !types.isEmpty else { throw fail(path, "type must not be empty") }
            var alternatives: [JSONSchemaNode] = []
            for (index, type) in types.enumerated() {
                let alternative = members.map { key, value in (key, key.utf8.elementsEqual("type".utf8) ? type : value) }
                alternatives.append(try node(.object(alternative), path: "\(path)/type/\(index)"))
            }
            return .anyOf(alternatives)
        }
        if let value = schema["const"] { return .constant(value) }
        if let values = schema["enum"] {
            guard case let .array(values) = values, !values.isEmpty else {
                throw fail(path, "enum must be a non-empty array")
            }
            return .enumeration(values)
        }
        let typeName: String
        switch type {
        case .null: typeName = ""
        case let .string(name): typeName = name
        default: throw fail(path, "type must be a string or an array of strings")
        }
        let hasProperties = schema["properties"] != nil
            || schema["additionalProperties"].map { $0 != .bool(true) } ?? false
        switch typeName {
        case "":
            // Without a type the structural keywords decide, in the converter's order.
            if hasProperties { return try object(schema, path: path) }
            if let children = schema["allOf"] { return .allOf(try nodes(children, path: "\(path)/allOf")) }
            if schema["items"] != nil || schema["prefixItems"] != nil { return try array(schema, path: path) }
            if schema["pattern"] != nil || schema["minLength"] != nil || schema["maxLength"] != nil {
                return try string(schema, path: path)
            }
            // "format" is read (and must be a string) only when nothing before decided.
            if try format(schema, path: path) != nil { return try string(schema, path: path) }
            return .any
        case "object":
            if !hasProperties, let children = schema["allOf"] {
                return .allOf(try nodes(children, path: "\(path)/allOf"))
            }
            return try object(schema, path: path)
        case "string":
            if let children = schema["allOf"] { return .allOf(try nodes(children, path: "\(path)/allOf")) }
            return try string(schema, path: path)
        case "array": return try array(schema, path: path)
        case "integer": return try integer(schema, path: path)
        case "number": return .number
        case "boolean": return .boolean
        case "null": return .null
        default: throw fail(path, "unrecognized type \(typeName)")
        }
    }

    private mutating func nodes(_ list: JSONValue, path: String) throws(Failure) -> [JSONSchemaNode] {
        guard case let .array(schemas) = list else { throw fail(path, "must be an array of schemas") }
        guard !schemas.isEmpty else { throw fail(path, "must not be empty") }
        var nodes: [JSONSchemaNode] = []
        for (index, schema) in schemas.enumerated() { nodes.append(try node(schema, path: "\(path)/\(index)")) }
        return nodes
    }

    private mutating func reference(_ value: JSONValue, path: String) throws(Failure) -> JSONSchemaNode {
        guard case let .string(reference) = value else { throw fail(path, "$ref must be a string") }
        guard reference.utf8.starts(with: "#/".utf8) else {
            throw fail(path, "unsupported $ref \(reference), only references into the same document are supported")
        }
        let key = ExactString(reference)
        if references[key] == nil && !pending.contains(key) {
            pending.insert(key)
            references[key] = try node(resolve(reference, path: path), path: reference)
            pending.remove(key)
        }
        return .reference(reference)
    }

    /// Follows the `/`-separated steps of `#/...` (no `~` or percent decoding, as in llama.cpp).
    private func resolve(_ reference: String, path: String) throws(Failure) -> JSONValue {
        var target = root
        let steps = reference.utf8.dropFirst().split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false)
        for step in steps.dropFirst() {
            let selector = String(decoding: step, as: UTF8.self)
            if case .object = target, let value = target[selector] {
                target = value
            } else if case let .array(elements) = target {
                guard let index = Self.arrayIndex(selector), index < elements.count else {
                    throw fail(path, "cannot resolve $ref \(reference), \(selector) is out of range")
                }
                target = elements[index]
            } else {
                throw fail(path, "cannot resolve $ref \(reference), \(selector) not found")
            }
        }
        return target
    }

    /// `std::stoull`: leading white space, a sign, digits, anything after them ignored; nil where it throws or where
    /// the value (a negative one wraps around) is past any array.
    private static func arrayIndex(_ text: String) -> Int? {
        var bytes = Substring(text).utf8.drop { [0x20, 0x09, 0x0A, 0x0B, 0x0C, 0x0D].contains($0) }
        var negative = false
        if let sign = bytes.first, sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-") {
            negative = sign == UInt8(ascii: "-")
            bytes = bytes.dropFirst()
        }
        let digits = bytes.prefix { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
        guard !digits.isEmpty, let value = Int(String(decoding: digits, as: UTF8.self)) else { return nil }
        return negative && value != 0 ? nil : value
    }

    private mutating func object(_ schema: JSONValue, path: String) throws(Failure) -> JSONSchemaNode {
        var required: Set<ExactString> = []
        if case let .array(names) = schema["required"] {
            for case let .string(name) in names { required.insert(ExactString(name)) }
        }
        var properties: [JSONSchemaProperty] = []
        if let list = schema["properties"] {
            guard case let .object(members) = list else { throw fail(path, "properties must be an object") }
            for (name, property) in members {
                let schema = try node(property, path: "\(path)/properties/\(name)")
                properties.append(JSONSchemaProperty(name: name, schema: schema, required: required.contains(ExactString(name))))
            }
        }
        let additional: JSONSchemaNode?
        switch schema["additionalProperties"] {
        case .bool(let allowed)?: additional = allowed ? .any : nil
        case let value? where value.isObject: additional = try node(value, path: "\(path)/additionalProperties")
        case .some: throw fail(path, "additionalProperties must be a boolean or a schema")
        // {"type": "object"} on its own accepts any object.
        case nil: additional = schema["properties"] == nil ? .any : nil
        }
        return .object(properties: properties, additional: additional)
    }

    private mutating func array(_ schema: JSONValue, path: String) throws(Failure) -> JSONSchemaNode {
        // "items" wins over "prefixItems"; either is the item schema when it is not an array.
        let key = schema["items"] != nil ? "items" : "prefixItems"
        let items: JSONSchemaNode
        switch schema[key] {
        case let .array(schemas)?:
            var elements: [JSONSchemaNode] = []
            for (index, item) in schemas.enumerated() { elements.append(try node(item, path: "\(path)/\(key)/\(index)")) }
            return .tuple(elements)
        case let item?: items = try node(item, path: "\(path)/\(key)")
        case nil: items = .any
        }
        return .array(items: items, minItems: try count(schema, "minItems", path: path) ?? 0,
                      maxItems: try count(schema, "maxItems", path: path))
    }

    private func string(_ schema: JSONValue, path: String) throws(Failure) -> JSONSchemaNode {
        var pattern = ""
        if let value = schema["pattern"] {
            guard case let .string(text) = value else { throw fail(path, "pattern must be a string") }
            pattern = text
        }
        return .string(pattern: pattern, format: try format(schema, path: path),
                       minLength: try count(schema, "minLength", path: path) ?? 0,
                       maxLength: try count(schema, "maxLength", path: path))
    }

    private func integer(_ schema: JSONValue, path: String) throws(Failure) -> JSONSchemaNode {
        var minimum = Int64.min
        var maximum = Int64.max
        // Integer overflow wraps, as it does in llama.cpp's build.
        if schema["minimum"] != nil {
            minimum = try bound(schema, "minimum", path: path, roundingUp: true)
        } else if schema["exclusiveMinimum"] != nil {
            minimum = try bound(schema, "exclusiveMinimum", path: path, roundingUp: false) &+ 1
        }
        if schema["maximum"] != nil {
            maximum = try bound(schema, "maximum", path: path, roundingUp: false)
        } else if schema["exclusiveMaximum"] != nil {
            maximum = try bound(schema, "exclusiveMaximum", path: path, roundingUp: true) &- 1
        }
        return .integer(minimum: minimum, maximum: maximum)
    }

    /// A count keyword as C++'s `get<int>()` reads it: an integer, truncated to 32 bits, that must not be negative.
    private func count(_ schema: JSONValue, _ key: String, path: String) throws(Failure) -> Int? {
        guard let value = schema[key] else { return nil }
        guard case let .int(number) = value, Int32(truncatingIfNeeded: number) >= 0 else {
            throw fail(path, "\(key) must be a non-negative integer")
        }
        return Int(Int32(truncatingIfNeeded: number))
    }

    /// A fractional bound is rounded inwards, towards the integers it still admits. A double outside `Int64`'s range
    /// converts to `Int64.min`, as x86-64 converts it in llama.cpp (the conversion is undefined in C++).
    private func bound(_ schema: JSONValue, _ key: String, path: String, roundingUp: Bool) throws(Failure) -> Int64 {
        switch schema[key] {
        case let .int(number)?: return Int64(number)
        case let .double(number)?:
            let rounded = roundingUp ? number.rounded(.up) : number.rounded(.down)
            return Int64(exactly: rounded) ?? .min
        default: throw fail(path, "\(key) must be a number")
        }
    }

    private func format(_ schema: JSONValue, path: String) throws(Failure) -> JSONSchemaNode.StringFormat? {
        guard let value = schema["format"] else { return nil }
        guard case let .string(format) = value else { throw fail(path, "format must be a string") }
        switch Array(format.utf8) {
        case Array("date".utf8): return .date
        case Array("time".utf8): return .time
        case Array("date-time".utf8): return .dateTime
        case Array("uuid".utf8): return .uuid
        case let bytes where bytes.count == 5 && bytes.starts(with: "uuid".utf8)
            && (UInt8(ascii: "1")...UInt8(ascii: "5")).contains(bytes[4]):
            return .uuid
        default: return nil
        }
    }
}

extension JSONValue {
    fileprivate var isObject: Bool {
        if case .object = self { return true }
        return false
    }
}
