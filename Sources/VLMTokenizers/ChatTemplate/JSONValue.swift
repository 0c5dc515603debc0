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
        var parser = JSONParser(bytes: Array(data), file: file)
        self = try parser.parseDocument()
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

/// A strict JSON reader over UTF-8 bytes that bounds nesting, so hostile files cannot exhaust the stack.
struct JSONParser {
    static let maximumDepth = 512

    let bytes: [UInt8]
    let file: String
    var position = 0

    init(bytes: [UInt8], file: String) {
        self.bytes = bytes
        self.file = file
    }

    mutating func parseDocument() throws(ChatTemplateError) -> JSONValue {
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { position = 3 }
        let value = try parseValue(depth: 0)
        skipWhitespace()
        if position != bytes.count { throw failure("unexpected text after the JSON value") }
        return value
    }

    private func failure(_ message: String) -> ChatTemplateError {
        var line = 1
        var column = 1
        for byte in bytes[..<min(position, bytes.count)] {
            if byte == UInt8(ascii: "\n") {
                line += 1
                column = 1
            } else if byte & 0xC0 != 0x80 {
                column += 1
            }
        }
        return .invalidJSON(file: file, line: line, column: column, message: message)
    }

    private mutating func skipWhitespace() {
        while position < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[position]) { position += 1 }
    }

    private mutating func parseValue(depth: Int) throws(ChatTemplateError) -> JSONValue {
        guard depth < Self.maximumDepth else { throw failure("nesting deeper than \(Self.maximumDepth) levels") }
        skipWhitespace()
        guard position < bytes.count else { throw failure("unexpected end of JSON") }
        switch bytes[position] {
        case UInt8(ascii: "{"):
            position += 1
            var pairs: [(String, JSONValue)] = []
            skipWhitespace()
            if position < bytes.count, bytes[position] == UInt8(ascii: "}") {
                position += 1
                return .object(pairs)
            }
            while true {
                skipWhitespace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else {
                    throw failure("expected a string key")
                }
                let key = try parseString()
                skipWhitespace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: ":") else {
                    throw failure("expected ':' after an object key")
                }
                position += 1
                let value = try parseValue(depth: depth + 1)
                // Python's json.loads keeps the last value of a repeated key, at the key's first position.
                if let index = pairs.firstIndex(where: { $0.0.utf8.elementsEqual(key.utf8) }) {
                    pairs[index].1 = value
                } else {
                    pairs.append((key, value))
                }
                skipWhitespace()
                guard position < bytes.count else { throw failure("unexpected end of JSON in an object") }
                if bytes[position] == UInt8(ascii: ",") {
                    position += 1
                } else if bytes[position] == UInt8(ascii: "}") {
                    position += 1
                    return .object(pairs)
                } else {
                    throw failure("expected ',' or '}' in an object")
                }
            }
        case UInt8(ascii: "["):
            position += 1
            var elements: [JSONValue] = []
            skipWhitespace()
            if position < bytes.count, bytes[position] == UInt8(ascii: "]") {
                position += 1
                return .array(elements)
            }
            while true {
                elements.append(try parseValue(depth: depth + 1))
                skipWhitespace()
                guard position < bytes.count else { throw failure("unexpected end of JSON in an array") }
                if bytes[position] == UInt8(ascii: ",") {
                    position += 1
                } else if bytes[position] == UInt8(ascii: "]") {
                    position += 1
                    return .array(elements)
                } else {
                    throw failure("expected ',' or ']' in an array")
                }
            }
        case UInt8(ascii: "\""):
            return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectWord("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectWord("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectWord("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return try parseNumber()
        default:
            throw failure("unexpected character")
        }
    }

    private mutating func expectWord(_ word: String) throws(ChatTemplateError) {
        let utf8 = Array(word.utf8)
        guard bytes.count - position >= utf8.count, Array(bytes[position..<position + utf8.count]) == utf8 else {
            throw failure("unexpected character")
        }
        position += utf8.count
    }

    private mutating func parseNumber() throws(ChatTemplateError) -> JSONValue {
        let start = position
        var isInteger = true
        if bytes[position] == UInt8(ascii: "-") { position += 1 }
        func digits(_ p: inout Int, _ bytes: [UInt8]) -> Int {
            let s = p
            while p < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[p]) { p += 1 }
            return p - s
        }
        let integerDigits = digits(&position, bytes)
        guard integerDigits > 0 else { throw failure("invalid number") }
        if integerDigits > 1, bytes[position - integerDigits] == UInt8(ascii: "0") {
            throw failure("invalid number (leading zero)")
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            isInteger = false
            position += 1
            guard digits(&position, bytes) > 0 else { throw failure("invalid number") }
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: "e") || bytes[position] == UInt8(ascii: "E") {
            isInteger = false
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") {
                position += 1
            }
            guard digits(&position, bytes) > 0 else { throw failure("invalid number") }
        }
        let text = String(decoding: bytes[start..<position], as: UTF8.self)
        if isInteger, let value = Int(text) { return .int(value) }
        guard let value = Double(text) else { throw failure("invalid number") }
        return .double(value)
    }

    private mutating func parseHex4() throws(ChatTemplateError) -> UInt32 {
        guard bytes.count - position >= 4 else { throw failure("truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[position]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw failure("invalid \\u escape")
            }
            value = value * 16 + UInt32(digit)
            position += 1
        }
        return value
    }

    private mutating func parseString() throws(ChatTemplateError) -> String {
        position += 1
        var scalars = String.UnicodeScalarView()
        var runStart = position
        func flush(_ end: Int, _ scalars: inout String.UnicodeScalarView, _ bytes: [UInt8]) {
            if end > runStart { scalars.append(contentsOf: String(decoding: bytes[runStart..<end], as: UTF8.self).unicodeScalars) }
        }
        while true {
            guard position < bytes.count else { throw failure("unterminated string") }
            let byte = bytes[position]
            if byte == UInt8(ascii: "\"") {
                flush(position, &scalars, bytes)
                position += 1
                return String(scalars)
            }
            if byte < 0x20 { throw failure("control character in a string") }
            if byte != UInt8(ascii: "\\") {
                position += 1
                continue
            }
            flush(position, &scalars, bytes)
            position += 1
            guard position < bytes.count else { throw failure("unterminated string") }
            let escape = bytes[position]
            position += 1
            switch escape {
            case UInt8(ascii: "\""): scalars.append("\"")
            case UInt8(ascii: "\\"): scalars.append("\\")
            case UInt8(ascii: "/"): scalars.append("/")
            case UInt8(ascii: "b"): scalars.append("\u{08}")
            case UInt8(ascii: "f"): scalars.append("\u{0C}")
            case UInt8(ascii: "n"): scalars.append("\n")
            case UInt8(ascii: "r"): scalars.append("\r")
            case UInt8(ascii: "t"): scalars.append("\t")
            case UInt8(ascii: "u"):
                var code = try parseHex4()
                if (0xD800..<0xDC00).contains(code), bytes.count - position >= 6,
                    bytes[position] == UInt8(ascii: "\\"), bytes[position + 1] == UInt8(ascii: "u")
                {
                    let saved = position
                    position += 2
                    let low = try parseHex4()
                    if (0xDC00..<0xE000).contains(low) {
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    } else {
                        position = saved
                    }
                }
                // A lone surrogate cannot live in a Swift string; U+FFFD stands in for it.
                scalars.append(Unicode.Scalar(code) ?? "\u{FFFD}")
            default:
                throw failure("invalid escape in a string")
            }
            runStart = position
        }
    }
}
