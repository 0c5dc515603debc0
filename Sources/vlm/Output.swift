import Foundation

/// Prints a JSON document on stdout; keys keep the order the Encodable declares them in.
func printJSON<T: Encodable>(_ value: T) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.withoutEscapingSlashes]
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

/// Fixed-width decimal for human-readable tables.
func formatted(_ value: Float, digits: Int = 4) -> String {
    String(format: "%.\(digits)f", Double(value))
}
