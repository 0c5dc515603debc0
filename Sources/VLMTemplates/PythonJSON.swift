/// Python's `json.dumps`, as transformers' `tojson` filter calls it.
struct PythonJSONEncoder {
    var ensureASCII = false
    /// nil: one line; otherwise the text of one indentation level.
    var indent: String?
    var itemSeparator: String
    var keySeparator: String
    var sortKeys = false

    init(ensureASCII: Bool, indent: String?, separators: (String, String)?, sortKeys: Bool) {
        self.ensureASCII = ensureASCII
        self.indent = indent
        self.sortKeys = sortKeys
        let separators = separators ?? (indent == nil ? (", ", ": ") : (",", ": "))
        itemSeparator = separators.0
        keySeparator = separators.1
    }

    enum Failure: Error {
        case notSerializable(String)
        case tooDeep
    }

    func encode(_ value: Value) throws(Failure) -> String {
        var output = ""
        try encode(value, level: 0, into: &output)
        return output
    }

    private func encode(_ value: Value, level: Int, into output: inout String) throws(Failure) {
        guard level < 512 else { throw .tooDeep }
        switch value {
        case .none: output += "null"
        case let .bool(flag): output += flag ? "true" : "false"
        case let .int(number): output += String(number)
        case let .double(number): output += floatText(number)
        case let .string(text), let .markup(text): appendString(text, to: &output)
        case let .list(values), let .tuple(values):
            guard !values.isEmpty else {
                output += "[]"
                return
            }
            output += "["
            for (index, element) in values.enumerated() {
                output += index == 0 ? newline(level + 1) : itemSeparator + newline(level + 1)
                try encode(element, level: level + 1, into: &output)
            }
            output += newline(level) + "]"
        case let .dict(pairs):
            guard !pairs.isEmpty else {
                output += "{}"
                return
            }
            var entries: [(String, Value)] = []
            for (key, element) in pairs { entries.append((try keyText(key), element)) }
            if sortKeys { entries.sort { $0.0.utf8.lexicographicallyPrecedes($1.0.utf8) } }
            output += "{"
            for (index, (key, element)) in entries.enumerated() {
                output += index == 0 ? newline(level + 1) : itemSeparator + newline(level + 1)
                appendString(key, to: &output)
                output += keySeparator
                try encode(element, level: level + 1, into: &output)
            }
            output += newline(level) + "}"
        default:
            throw .notSerializable(value.typeName)
        }
    }

    private func newline(_ level: Int) -> String {
        guard let indent else { return "" }
        return "\n" + String(repeating: indent, count: level)
    }

    private func floatText(_ number: Double) -> String {
        if number.isNaN { return "NaN" }
        if number.isInfinite { return number < 0 ? "-Infinity" : "Infinity" }
        return pythonFloatRepr(number)
    }

    private func keyText(_ key: Value) throws(Failure) -> String {
        switch key {
        case let .string(text), let .markup(text): return text
        case let .bool(flag): return flag ? "true" : "false"
        case .none: return "null"
        case let .int(number): return String(number)
        case let .double(number): return floatText(number)
        default: throw .notSerializable(key.typeName)
        }
    }

    private func appendString(_ text: String, to output: inout String) {
        var result = String.UnicodeScalarView()
        result.append("\"")
        func escapeHex(_ value: UInt32) {
            let hex = String(value, radix: 16)
            result.append(contentsOf: ("\\u" + String(repeating: "0", count: 4 - hex.count) + hex).unicodeScalars)
        }
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": result.append(contentsOf: "\\\"".unicodeScalars)
            case "\\": result.append(contentsOf: "\\\\".unicodeScalars)
            case "\n": result.append(contentsOf: "\\n".unicodeScalars)
            case "\r": result.append(contentsOf: "\\r".unicodeScalars)
            case "\t": result.append(contentsOf: "\\t".unicodeScalars)
            case "\u{08}": result.append(contentsOf: "\\b".unicodeScalars)
            case "\u{0C}": result.append(contentsOf: "\\f".unicodeScalars)
            default:
                if scalar.value < 0x20 {
                    escapeHex(scalar.value)
                } else if ensureASCII, scalar.value > 0x7E {
                    if scalar.value >= 0x10000 {
                        let value = scalar.value - 0x10000
                        escapeHex(0xD800 + (value >> 10))
                        escapeHex(0xDC00 + (value & 0x3FF))
                    } else {
                        escapeHex(scalar.value)
                    }
                } else {
                    result.append(scalar)
                }
            }
        }
        result.append("\"")
        output += String(result)
    }
}

extension JSONValue {
    /// This value as Python's `json.dumps(value, indent=indent, sort_keys=sortKeys)` writes it (floats by their
    /// `repr`, so `1.0` stays `1.0`): how transformers writes config.json (`indent=2, sort_keys=True`).
    public func pythonJSONText(indent: Int? = nil, sortKeys: Bool = false) -> String {
        let encoder = PythonJSONEncoder(ensureASCII: true, indent: indent.map { String(repeating: " ", count: $0) },
                                        separators: nil, sortKeys: sortKeys)
        // A parsed JSON value is always serializable and as deep as the parser allowed.
        return (try? encoder.encode(VLMTemplates.Value(self))) ?? ""
    }
}
