import Foundation
import SwiftVLM

/// Prints a JSON document on stdout, keys sorted so the output is the same on every platform.
func printJSON<T: Encodable>(_ value: T) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.withoutEscapingSlashes, .sortedKeys]
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

/// Fixed-width decimal for human-readable tables.
func formatted(_ value: Float, digits: Int = 4) -> String {
    String(format: "%.\(digits)f", Double(value))
}

/// A JSON value written by `JSONEncoder` (object keys as the encoder orders them).
struct EncodableJSON: Encodable {
    let value: JSONValue

    init(_ value: JSONValue) { self.value = value }

    private struct Key: CodingKey {
        let stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    func encode(to encoder: any Encoder) throws {
        switch value {
        case .null:
            var container = encoder.singleValueContainer()
            try container.encodeNil()
        case let .bool(flag):
            var container = encoder.singleValueContainer()
            try container.encode(flag)
        case let .int(number):
            var container = encoder.singleValueContainer()
            try container.encode(number)
        case let .double(number):
            var container = encoder.singleValueContainer()
            try container.encode(number)
        case let .string(text):
            var container = encoder.singleValueContainer()
            try container.encode(text)
        case let .array(items):
            var container = encoder.unkeyedContainer()
            for item in items { try container.encode(EncodableJSON(item)) }
        case let .object(pairs):
            var container = encoder.container(keyedBy: Key.self)
            for (key, item) in pairs { try container.encode(EncodableJSON(item), forKey: Key(stringValue: key)) }
        }
    }
}
