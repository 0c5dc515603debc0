import Foundation
import VLMTemplates

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
enum TokenizerJSONParser: JSONReadingPolicy {
    typealias Failure = JSONSyntaxError

    static func parse(_ data: Data) throws(Failure) -> Any {
        try JSONReader<TokenizerJSONParser>.read([UInt8](data))
    }

    static let maximumDepth = 128
    static let replacesInvalidText = false
    static let skipsByteOrderMark = false
    static var null: Any { NSNull() }
    static func bool(_ value: Bool) -> Any { value }
    static func string(_ value: String) -> Any { value }
    static func array(_ elements: [Any]) -> Any { elements }

    static func object(_ members: [(key: String, value: Any)]) -> Any {
        var dictionary: [String: Any] = [:]
        dictionary.reserveCapacity(members.count)
        for (key, value) in members { dictionary[key] = value }
        return JSONMembers(pairs: members, dictionary: dictionary)
    }

    /// serde_json's (not always correctly rounded) conversion: up to 19-20 significant digits gathered in a UInt64,
    /// later digits ignored, then one multiplication or division by a power of ten.
    static func number(_ number: JSONNumberText) -> Result<Any, JSONSyntaxError> {
        func failure(_ reason: String) -> Result<Any, JSONSyntaxError> { .failure(JSONSyntaxError(offset: number.range.upperBound, reason: reason)) }
        let bytes = number.bytes
        func digit(_ index: Int) -> UInt64 { UInt64(bytes[index] - UInt8(ascii: "0")) }
        var significand: UInt64 = 0
        var exponent = 0
        var isInteger = number.isInteger
        var overflowed = false
        for index in number.integer {
            let next = digit(index)
            if overflowed || significand.multipliedReportingOverflow(by: 10).overflow || significand * 10 > UInt64.max - next {
                // A long integer: from the first digit that does not fit, digits only scale it.
                overflowed = true
                exponent += 1
                isInteger = false
            } else {
                significand = significand * 10 + next
            }
        }
        overflowed = false
        for index in number.fraction {
            let next = digit(index)
            if overflowed { continue }
            if significand.multipliedReportingOverflow(by: 10).overflow || significand * 10 > UInt64.max - next {
                overflowed = true
            } else {
                significand = significand * 10 + next
                exponent -= 1
            }
        }
        if let digits = number.exponent {
            var written = 0
            var exponentOverflowed = false
            for index in digits {
                let next = Int(digit(index))
                if written > (Int(Int32.max) - next) / 10 { exponentOverflowed = true } else { written = written * 10 + next }
            }
            if exponentOverflowed {
                if significand == 0 || number.negativeExponent { return .success(NSNumber(value: number.negative ? -0.0 : 0.0)) }
                return failure("number out of range")
            }
            exponent = number.negativeExponent ? exponent - written : exponent + written
        }
        if isInteger {
            if !number.negative { return .success(significand <= UInt64(Int64.max) ? NSNumber(value: Int(significand)) : NSNumber(value: significand)) }
            if significand != 0 && significand <= UInt64(Int64.max) + 1 { return .success(NSNumber(value: Int64(bitPattern: 0 &- significand))) }
            return .success(NSNumber(value: -Double(significand)))
        }
        var value = Double(significand)
        while true {
            if abs(exponent) < powersOfTen.count {
                if exponent >= 0 {
                    value *= powersOfTen[exponent]
                    if value.isInfinite { return failure("number out of range") }
                } else {
                    value /= powersOfTen[-exponent]
                }
                break
            }
            if value == 0 { break }
            if exponent >= 0 { return failure("number out of range") }
            value /= 1e308
            exponent += 308
        }
        return .success(NSNumber(value: number.negative ? -value : value))
    }

    /// 1e0 ... 1e308, each correctly rounded as Rust's literals are.
    private static let powersOfTen: [Double] = (0...308).map { Double("1e\($0)")! }
}
