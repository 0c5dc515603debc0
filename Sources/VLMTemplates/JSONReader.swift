/// Why a JSON text could not be read: what is wrong, and at which byte.
package struct JSONSyntaxError: Error, CustomStringConvertible {
    package let offset: Int
    package let reason: String
    package init(offset: Int, reason: String) {
        self.offset = offset
        self.reason = reason
    }

    package var description: String { "\(reason) at byte \(offset)" }
}

/// A number as written: where its digits are in the text. Readers convert it as their JSON library does.
package struct JSONNumberText {
    package let bytes: [UInt8]
    /// The whole number, sign included.
    package let range: Range<Int>
    package let negative: Bool
    package let integer: Range<Int>
    /// Empty without a fraction.
    package let fraction: Range<Int>
    package let negativeExponent: Bool
    /// nil without an exponent.
    package let exponent: Range<Int>?

    /// True when the number has neither fraction nor exponent.
    package var isInteger: Bool { fraction.isEmpty && exponent == nil }
    package var text: String { String(decoding: bytes[range], as: UTF8.self) }
}

/// What differs between the JSON libraries a `JSONReader` stands in for: the values it builds, how numbers convert,
/// how deep containers may nest and what becomes of text that is not valid Unicode.
package protocol JSONReadingPolicy {
    associatedtype Value
    /// Containers nested deeper than this are refused (the stack stays bounded on hostile files).
    static var maximumDepth: Int { get }
    /// Lone surrogate escapes and invalid UTF-8 become U+FFFD instead of failing.
    static var replacesInvalidText: Bool { get }
    /// A leading UTF-8 byte order mark is skipped instead of failing.
    static var skipsByteOrderMark: Bool { get }
    static var null: Value { get }
    static func bool(_ value: Bool) -> Value
    static func string(_ value: String) -> Value
    static func number(_ number: JSONNumberText) -> Result<Value, JSONSyntaxError>
    static func array(_ elements: [Value]) -> Value
    /// The members in document order, repeated keys included.
    static func object(_ members: [(key: String, value: Value)]) -> Value
}

/// One strict JSON (RFC 8259) reader over UTF-8 bytes for tokenizer files and chat-template data alike.
package struct JSONReader<Policy: JSONReadingPolicy> {
    private let bytes: [UInt8]
    private var position = 0
    private var depth = 0

    package static func read(_ bytes: [UInt8]) throws(JSONSyntaxError) -> Policy.Value {
        var reader = JSONReader(bytes: bytes)
        if Policy.skipsByteOrderMark && bytes.starts(with: [0xEF, 0xBB, 0xBF]) { reader.position = 3 }
        reader.skipWhitespace()
        let value = try reader.value()
        reader.skipWhitespace()
        guard reader.position == bytes.count else { throw reader.failure("trailing characters") }
        return value
    }

    private init(bytes: [UInt8]) { self.bytes = bytes }

    private func failure(_ reason: String) -> JSONSyntaxError { JSONSyntaxError(offset: position, reason: reason) }

    private var current: UInt8? { position < bytes.count ? bytes[position] : nil }

    private mutating func skipWhitespace() {
        while let byte = current, byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 { position += 1 }
    }

    private mutating func expect(_ literal: StaticString, _ result: Policy.Value) throws(JSONSyntaxError) -> Policy.Value {
        for index in 0..<literal.utf8CodeUnitCount {
            guard current == literal.utf8Start[index] else { throw failure("invalid literal") }
            position += 1
        }
        return result
    }

    private mutating func value() throws(JSONSyntaxError) -> Policy.Value {
        guard let byte = current else { throw failure("unexpected end of input") }
        switch byte {
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            depth += 1
            guard depth <= Policy.maximumDepth else { throw failure("nesting deeper than \(Policy.maximumDepth)") }
            defer { depth -= 1 }
            return byte == UInt8(ascii: "{") ? try object() : try array()
        case UInt8(ascii: "\""): return Policy.string(try string())
        case UInt8(ascii: "t"): return try expect("true", Policy.bool(true))
        case UInt8(ascii: "f"): return try expect("false", Policy.bool(false))
        case UInt8(ascii: "n"): return try expect("null", Policy.null)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            switch Policy.number(try numberText()) {
            case let .success(value): return value
            case let .failure(error): throw JSONSyntaxError(offset: position, reason: error.reason)
            }
        default: throw failure("expected a value")
        }
    }

    private mutating func object() throws(JSONSyntaxError) -> Policy.Value {
        position += 1
        var members: [(key: String, value: Policy.Value)] = []
        skipWhitespace()
        if current == UInt8(ascii: "}") {
            position += 1
            return Policy.object(members)
        }
        while true {
            skipWhitespace()
            guard current == UInt8(ascii: "\"") else { throw failure("expected a string key") }
            let key = try string()
            skipWhitespace()
            guard current == UInt8(ascii: ":") else { throw failure("expected ':'") }
            position += 1
            skipWhitespace()
            members.append((key, try value()))
            skipWhitespace()
            if current == UInt8(ascii: ",") { position += 1; continue }
            guard current == UInt8(ascii: "}") else { throw failure("expected ',' or '}'") }
            position += 1
            return Policy.object(members)
        }
    }

    private mutating func array() throws(JSONSyntaxError) -> Policy.Value {
        position += 1
        var elements: [Policy.Value] = []
        skipWhitespace()
        if current == UInt8(ascii: "]") {
            position += 1
            return Policy.array(elements)
        }
        while true {
            skipWhitespace()
            elements.append(try value())
            skipWhitespace()
            if current == UInt8(ascii: ",") { position += 1; continue }
            guard current == UInt8(ascii: "]") else { throw failure("expected ',' or ']'") }
            position += 1
            return Policy.array(elements)
        }
    }

    private mutating func string() throws(JSONSyntaxError) -> String {
        position += 1
        var utf8: [UInt8] = []
        var start = position
        while true {
            guard let byte = current else { throw failure("unterminated string") }
            if byte == UInt8(ascii: "\"") {
                utf8 += bytes[start..<position]
                position += 1
                break
            }
            if byte < 0x20 { throw failure("control character in a string") }
            guard byte == UInt8(ascii: "\\") else { position += 1; continue }
            utf8 += bytes[start..<position]
            position += 1
            guard let escape = current else { throw failure("unterminated escape") }
            position += 1
            switch escape {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): utf8.append(escape)
            case UInt8(ascii: "b"): utf8.append(0x08)
            case UInt8(ascii: "f"): utf8.append(0x0C)
            case UInt8(ascii: "n"): utf8.append(0x0A)
            case UInt8(ascii: "r"): utf8.append(0x0D)
            case UInt8(ascii: "t"): utf8.append(0x09)
            case UInt8(ascii: "u"): utf8 += UTF8.encode(try escapedScalar())!
            default: throw failure("invalid escape")
            }
            start = position
        }
        if Policy.replacesInvalidText { return String(decoding: utf8, as: UTF8.self) }
        guard let text = String(validating: utf8, as: UTF8.self) else { throw failure("invalid UTF-8 in a string") }
        return text
    }

    /// The scalar of a \u escape (its four digits next), with the low surrogate escape that must follow a high one.
    private mutating func escapedScalar() throws(JSONSyntaxError) -> Unicode.Scalar {
        let code = try hexQuad()
        if (0xD800..<0xDC00).contains(code) {
            if current == UInt8(ascii: "\\"), position + 1 < bytes.count, bytes[position + 1] == UInt8(ascii: "u") {
                let saved = position
                position += 2
                let low = try hexQuad()
                if (0xDC00..<0xE000).contains(low) { return Unicode.Scalar(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))! }
                // Python keeps what follows a lone high surrogate as an escape of its own.
                position = saved
            }
            guard Policy.replacesInvalidText else { throw failure("lone leading surrogate") }
            return "\u{FFFD}"
        }
        if (0xDC00..<0xE000).contains(code) {
            guard Policy.replacesInvalidText else { throw failure("lone trailing surrogate") }
            return "\u{FFFD}"
        }
        return Unicode.Scalar(code)!
    }

    private mutating func hexQuad() throws(JSONSyntaxError) -> UInt32 {
        var code: UInt32 = 0
        for _ in 0..<4 {
            guard let byte = current else { throw failure("unterminated \\u escape") }
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw failure("invalid \\u escape")
            }
            code = code << 4 | UInt32(digit)
            position += 1
        }
        return code
    }

    private mutating func digits() -> Range<Int> {
        let start = position
        while let byte = current, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") { position += 1 }
        return start..<position
    }

    /// The number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    private mutating func numberText() throws(JSONSyntaxError) -> JSONNumberText {
        let start = position
        let negative = current == UInt8(ascii: "-")
        if negative { position += 1 }
        let integer = digits()
        guard !integer.isEmpty else { throw failure("invalid number") }
        if integer.count > 1 && bytes[integer.lowerBound] == UInt8(ascii: "0") {
            throw JSONSyntaxError(offset: integer.lowerBound + 1, reason: "leading zero in a number")
        }
        var fraction = position..<position
        if current == UInt8(ascii: ".") {
            position += 1
            fraction = digits()
            guard !fraction.isEmpty else { throw failure("no digit after the decimal point") }
        }
        var negativeExponent = false
        var exponent: Range<Int>?
        if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
            position += 1
            if current == UInt8(ascii: "+") { position += 1 } else if current == UInt8(ascii: "-") { negativeExponent = true; position += 1 }
            exponent = digits()
            guard exponent?.isEmpty == false else { throw failure("no digit in the exponent") }
        }
        return JSONNumberText(bytes: bytes, range: start..<position, negative: negative, integer: integer, fraction: fraction,
                              negativeExponent: negativeExponent, exponent: exponent)
    }
}
