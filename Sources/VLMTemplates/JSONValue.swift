import Foundation

/// A JSON value whose objects keep their keys in document order, as Python dicts do.
///
/// Chat templates iterate over message fields and print them with `tojson`, so the order of an object's keys is part
/// of the rendered text.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case int(Int)
    case double(Double)
    case string(String)
    case array([JSONValue])
    /// Key–value pairs in insertion order.
    case object([(String, JSONValue)])

    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case let (.bool(a), .bool(b)): a == b
        case let (.int(a), .int(b)): a == b
        case let (.double(a), .double(b)): a == b
        case let (.string(a), .string(b)): a.utf8.elementsEqual(b.utf8)
        case let (.array(a), .array(b)): a == b
        case let (.object(a), .object(b)):
            a.count == b.count && zip(a, b).allSatisfy { $0.0.utf8.elementsEqual($1.0.utf8) && $0.1 == $1.1 }
        default: false
        }
    }

    /// The value of `key` in an object, or nil.
    public subscript(key: String) -> JSONValue? {
        guard case let .object(pairs) = self else { return nil }
        return pairs.first { $0.0.utf8.elementsEqual(key.utf8) }?.1
    }

    /// Parses JSON text (RFC 8259), keeping object keys in order; integers that fit in `Int` stay integers, as in
    /// Python's `json.loads`.
    ///
    /// - Parameter file: named in errors.
    public init(parsing data: Data, file: String = "JSON") throws(ChatTemplateError) {
        let bytes = [UInt8](data)
        do {
            self = try JSONReader<TemplateJSON>.read(bytes)
        } catch {
            var line = 1
            var column = 1
            for byte in bytes[..<min(error.offset, bytes.count)] {
                if byte == UInt8(ascii: "\n") {
                    line += 1
                    column = 1
                } else if byte & 0xC0 != 0x80 {
                    column += 1
                }
            }
            throw .invalidJSON(file: file, line: line, column: column, message: error.reason)
        }
    }
}

extension JSONValue: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral,
    ExpressibleByDictionaryLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    /// Keeps the literal's key order.
    public init(dictionaryLiteral elements: (String, JSONValue)...) { self = .object(elements) }
}

/// How chat-template data reads, as Python's `json.loads` reads it: integers that fit in `Int` stay integers, other
/// numbers are correctly rounded doubles, a repeated key keeps its first position and its last value, lone
/// surrogates and invalid UTF-8 become U+FFFD, a byte order mark is skipped.
enum TemplateJSON: JSONReadingPolicy {
    static let maximumDepth = 512
    static let replacesInvalidText = true
    static let skipsByteOrderMark = true
    static let null = JSONValue.null
    static func bool(_ value: Bool) -> JSONValue { .bool(value) }
    static func string(_ value: String) -> JSONValue { .string(value) }
    static func array(_ elements: [JSONValue]) -> JSONValue { .array(elements) }

    static func object(_ members: [(key: String, value: JSONValue)]) -> JSONValue {
        var pairs: [(String, JSONValue)] = []
        // Keyed by the UTF-8 bytes: Swift's String equality would merge canonically equivalent keys Python keeps apart.
        var positions: [[UInt8]: Int] = [:]
        for (key, value) in members {
            let bytes = Array(key.utf8)
            if let index = positions[bytes] {
                pairs[index].1 = value
            } else {
                positions[bytes] = pairs.count
                pairs.append((key, value))
            }
        }
        return .object(pairs)
    }

    static func number(_ number: JSONNumberText) -> Result<JSONValue, JSONSyntaxError> {
        let text = number.text
        if number.isInteger, let value = Int(text) { return .success(.int(value)) }
        guard let value = Double(text) else { return .failure(JSONSyntaxError(offset: number.range.lowerBound, reason: "invalid number")) }
        return .success(.double(value))
    }
}
