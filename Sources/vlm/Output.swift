import Foundation

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
