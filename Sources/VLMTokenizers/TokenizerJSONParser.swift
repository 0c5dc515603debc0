import Foundation

/// A JSON object with its members in file order and their keys exactly as written. Tokenizer vocabularies need both:
/// Swift's `String` equality is canonical equivalence, so "Å" (U+212B) and "Å" (U+00C5) would be one dictionary key,
/// while tokenizers (serde_json) keeps them apart as different bytes.
struct JSONMembers {
    let pairs: [(key: String, value: Any)]
    /// The members by key, the last one winning (serde_json's maps); only for keys that are plain ASCII field names.
    let dictionary: [String: Any]
}

/// Reads JSON as serde_json (the parser tokenizers uses) does: numbers become the same `Double`s bit for bit, strings
/// must be valid UTF-8 without lone surrogates, nesting stops at serde_json's depth limit of 128. Numbers are
/// `NSNumber`s (integers when written without fraction or exponent and within Int64), booleans `Bool`, null `NSNull`,
/// arrays `[Any]`, objects `JSONMembers`.
struct TokenizerJSONParser {
    struct Failure: Error, CustomStringConvertible {
        let offset: Int
        let reason: String
        var description: String { "\(reason) at byte \(offset)" }
    }

    private let bytes: [UInt8]
    private var position = 0
    private var depth = 0
    private static let maximumDepth = 128

    static func parse(_ data: Data) throws(Failure) -> Any {
        var parser = TokenizerJSONParser(bytes: [UInt8](data))
        parser.skipWhitespace()
        let value = try parser.value()
        parser.skipWhitespace()
        guard parser.position == parser.bytes.count else { throw parser.failure("trailing characters") }
        return value
    }

    private init(bytes: [UInt8]) { self.bytes = bytes }

    private func failure(_ reason: String) -> Failure { Failure(offset: position, reason: reason) }

    private var current: UInt8? { position < bytes.count ? bytes[position] : nil }

    private mutating func skipWhitespace() {
        while let byte = current, byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 { position += 1 }
    }

    private mutating func expect(_ literal: String, _ result: Any) throws(Failure) -> Any {
        for byte in literal.utf8 {
            guard current == byte else { throw failure("invalid literal") }
            position += 1
        }
        return result
    }

    private mutating func value() throws(Failure) -> Any {
        guard let byte = current else { throw failure("unexpected end of input") }
        switch byte {
        case UInt8(ascii: "{"): return try nested { (parser: inout TokenizerJSONParser) throws(Failure) in try parser.object() }
        case UInt8(ascii: "["): return try nested { (parser: inout TokenizerJSONParser) throws(Failure) in try parser.array() }
        case UInt8(ascii: "\""): return try string()
        case UInt8(ascii: "t"): return try expect("true", true)
        case UInt8(ascii: "f"): return try expect("false", false)
        case UInt8(ascii: "n"): return try expect("null", NSNull())
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
        default: throw failure("expected a value")
        }
    }

    private mutating func nested(_ body: (inout TokenizerJSONParser) throws(Failure) -> Any) throws(Failure) -> Any {
        depth += 1
        guard depth <= TokenizerJSONParser.maximumDepth else { throw failure("nesting deeper than \(TokenizerJSONParser.maximumDepth)") }
        defer { depth -= 1 }
        return try body(&self)
    }

    private mutating func object() throws(Failure) -> Any {
        position += 1
        var pairs: [(key: String, value: Any)] = []
        skipWhitespace()
        if current == UInt8(ascii: "}") {
            position += 1
        } else {
            while true {
                skipWhitespace()
                guard current == UInt8(ascii: "\"") else { throw failure("expected a string key") }
                let key = try string()
                skipWhitespace()
                guard current == UInt8(ascii: ":") else { throw failure("expected ':'") }
                position += 1
                skipWhitespace()
                pairs.append((key, try value()))
                skipWhitespace()
                if current == UInt8(ascii: ",") { position += 1; continue }
                guard current == UInt8(ascii: "}") else { throw failure("expected ',' or '}'") }
                position += 1
                break
            }
        }
        var dictionary: [String: Any] = [:]
        dictionary.reserveCapacity(pairs.count)
        for (key, value) in pairs { dictionary[key] = value }
        return JSONMembers(pairs: pairs, dictionary: dictionary)
    }

    private mutating func array() throws(Failure) -> Any {
        position += 1
        var elements: [Any] = []
        skipWhitespace()
        if current == UInt8(ascii: "]") { position += 1; return elements }
        while true {
            skipWhitespace()
            elements.append(try value())
            skipWhitespace()
            if current == UInt8(ascii: ",") { position += 1; continue }
            guard current == UInt8(ascii: "]") else { throw failure("expected ',' or ']'") }
            position += 1
            return elements
        }
    }

    private mutating func string() throws(Failure) -> String {
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
            case UInt8(ascii: "u"):
                var code = try hexQuad()
                if (0xD800..<0xDC00).contains(code) {
                    guard current == UInt8(ascii: "\\"), position + 1 < bytes.count, bytes[position + 1] == UInt8(ascii: "u") else {
                        throw failure("lone leading surrogate")
                    }
                    position += 2
                    let low = try hexQuad()
                    guard (0xDC00..<0xE000).contains(low) else { throw failure("lone leading surrogate") }
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00..<0xE000).contains(code) {
                    throw failure("lone trailing surrogate")
                }
                utf8 += UTF8.encode(Unicode.Scalar(code)!)!
            default: throw failure("invalid escape")
            }
            start = position
        }
        guard let text = String(validating: utf8, as: UTF8.self) else { throw failure("invalid UTF-8 in a string") }
        return text
    }

    private mutating func hexQuad() throws(Failure) -> UInt32 {
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

    private var digit: UInt64? {
        guard let byte = current, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
        return UInt64(byte - UInt8(ascii: "0"))
    }

    /// serde_json's number grammar and its (not always correctly rounded) conversion: up to 19-20 significant digits
    /// gathered in a UInt64, later digits ignored, then one multiplication or division by a power of ten.
    private mutating func number() throws(Failure) -> Any {
        let negative = current == UInt8(ascii: "-")
        if negative { position += 1 }
        guard let first = digit else { throw failure("invalid number") }
        position += 1
        var significand = first
        var exponent = 0
        var isInteger = true
        if first == 0 {
            if digit != nil { throw failure("leading zero in a number") }
        } else {
            var overflowed = false
            while let next = digit {
                position += 1
                if overflowed || significand.multipliedReportingOverflow(by: 10).overflow || significand * 10 > UInt64.max - next {
                    // A long integer: from the first digit that does not fit, digits only scale it.
                    overflowed = true
                    exponent += 1
                    isInteger = false
                } else {
                    significand = significand * 10 + next
                }
            }
        }
        if current == UInt8(ascii: ".") {
            position += 1
            isInteger = false
            var fractionDigits = 0
            var overflowed = false
            while let next = digit {
                position += 1
                fractionDigits += 1
                if overflowed { continue }
                if significand.multipliedReportingOverflow(by: 10).overflow || significand * 10 > UInt64.max - next {
                    overflowed = true
                } else {
                    significand = significand * 10 + next
                    exponent -= 1
                }
            }
            guard fractionDigits > 0 else { throw failure("no digit after the decimal point") }
        }
        if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
            position += 1
            isInteger = false
            var positiveExponent = true
            if current == UInt8(ascii: "+") { position += 1 } else if current == UInt8(ascii: "-") { positiveExponent = false; position += 1 }
            guard digit != nil else { throw failure("no digit in the exponent") }
            var written = 0
            var overflowed = false
            while let next = digit {
                position += 1
                if written > (Int(Int32.max) - Int(next)) / 10 { overflowed = true } else { written = written * 10 + Int(next) }
            }
            if overflowed {
                if significand == 0 || !positiveExponent { return NSNumber(value: negative ? -0.0 : 0.0) }
                throw failure("number out of range")
            }
            exponent = positiveExponent ? exponent + written : exponent - written
        }
        if isInteger {
            if !negative { return significand <= UInt64(Int64.max) ? NSNumber(value: Int(significand)) : NSNumber(value: significand) }
            if significand != 0 && significand <= UInt64(Int64.max) + 1 { return NSNumber(value: Int64(bitPattern: 0 &- significand)) }
            return NSNumber(value: -Double(significand))
        }
        var value = Double(significand)
        while true {
            if abs(exponent) < TokenizerJSONParser.powersOfTen.count {
                if exponent >= 0 {
                    value *= TokenizerJSONParser.powersOfTen[exponent]
                    if value.isInfinite { throw failure("number out of range") }
                } else {
                    value /= TokenizerJSONParser.powersOfTen[-exponent]
                }
                break
            }
            if value == 0 { break }
            if exponent >= 0 { throw failure("number out of range") }
            value /= 1e308
            exponent += 308
        }
        return NSNumber(value: negative ? -value : value)
    }

    /// 1e0 ... 1e308, each correctly rounded as Rust's literals are.
    private static let powersOfTen: [Double] = (0...308).map { Double("1e\($0)")! }
}
