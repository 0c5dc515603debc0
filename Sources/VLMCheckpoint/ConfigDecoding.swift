import Foundation

extension KeyedDecodingContainer {
    /// The value at `key`, or `defaultValue` when the key is absent or JSON `null`.
    ///
    /// This is how transformers fills a config: every field has a default in the config class, and a config.json
    /// mentions only some of them. A typed config writes its `init(from:)` as one line per field:
    /// ```swift
    /// hiddenSize = try container.value(.hiddenSize, default: 768)
    /// ```
    /// A present value of the wrong type still throws, naming the key.
    public func value<T: Decodable>(_ key: Key, default defaultValue: T) throws -> T {
        try decodeIfPresent(T.self, forKey: key) ?? defaultValue
    }
}

/// A coding key for any string, for JSON objects whose keys are data (safetensors headers, weight maps).
struct AnyKey: CodingKey {
    let stringValue: String
    let intValue: Int?

    init(stringValue: String) {
        self.stringValue = stringValue
        intValue = nil
    }

    init(intValue: Int) {
        stringValue = String(intValue)
        self.intValue = intValue
    }
}

/// `vision_config.layers[2].hidden_size` for a coding path.
func dottedKeyPath(_ path: [any CodingKey]) -> String {
    var result = ""
    for key in path {
        if let index = key.intValue, key.stringValue == String(index) || key.stringValue.hasPrefix("Index ") {
            result += "[\(index)]"
        } else {
            result += result.isEmpty ? key.stringValue : ".\(key.stringValue)"
        }
    }
    return result
}

/// The key path a decoding error is about (including a missing key itself) and a one-line reason.
func keyPathAndReason(_ error: DecodingError) -> (keyPath: String, reason: String) {
    switch error {
    case let .keyNotFound(key, context):
        return (dottedKeyPath(context.codingPath + [key]), "required key is missing")
    case let .valueNotFound(type, context):
        return (dottedKeyPath(context.codingPath), "expected \(jsonTypeName(type)) but found null")
    case let .typeMismatch(type, context):
        return (dottedKeyPath(context.codingPath), "expected \(jsonTypeName(type)): \(context.debugDescription)")
    case let .dataCorrupted(context):
        return (dottedKeyPath(context.codingPath), syntaxDetail(context))
    @unknown default:
        return ("", "\(error)")
    }
}

/// A decoding error as one line: `'key.path': reason`.
func describe(_ error: DecodingError) -> String {
    let (keyPath, reason) = keyPathAndReason(error)
    return keyPath.isEmpty ? reason : "'\(keyPath)': \(reason)"
}

/// Maps a decoding error of `file` to a checkpoint error: malformed JSON stays a JSON error, the rest name the key.
func checkpointError(_ error: DecodingError, file: String) -> CheckpointError {
    if case let .dataCorrupted(context) = error, context.codingPath.isEmpty {
        return .invalidJSON(file: file, reason: syntaxDetail(context))
    }
    let (keyPath, reason) = keyPathAndReason(error)
    return .invalidConfig(file: file, keyPath: keyPath, reason: reason)
}

/// The parser's own message (which says where the syntax error is) rather than the generic "not valid JSON".
private func syntaxDetail(_ context: DecodingError.Context) -> String {
    if let underlying = context.underlyingError as NSError?,
       let detail = underlying.userInfo[NSDebugDescriptionErrorKey] as? String {
        return detail
    }
    return context.debugDescription
}

private func jsonTypeName(_ type: Any.Type) -> String {
    switch type {
    case is String.Type: return "a string"
    case is Bool.Type: return "a boolean"
    case is any BinaryInteger.Type: return "an integer"
    case is any BinaryFloatingPoint.Type: return "a number"
    default:
        let name = String(describing: type)
        if name.hasPrefix("Array<") || name.hasPrefix("[") { return "an array" }
        if name.hasPrefix("Dictionary<") { return "an object" }
        return name
    }
}
