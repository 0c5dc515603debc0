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

/// Decodes JSON, turning a failure into a one-line checkpoint error: `syntaxError` gets where the JSON is malformed,
/// `contentError` gets the dotted key path and what is wrong there.
func decodeJSON<T: Decodable>(
    _ type: T.Type, from data: Data,
    syntaxError: (_ reason: String) -> CheckpointError,
    contentError: (_ keyPath: String, _ reason: String) -> CheckpointError
) throws -> T {
    do {
        return try JSONDecoder().decode(type, from: data)
    } catch let error as DecodingError {
        switch error {
        case let .keyNotFound(key, context):
            throw contentError(dottedKeyPath(context.codingPath + [key]), "required key is missing")
        case let .valueNotFound(_, context), let .typeMismatch(_, context):
            throw contentError(dottedKeyPath(context.codingPath), context.debugDescription)
        case let .dataCorrupted(context) where context.codingPath.isEmpty:
            if let detail = jsonSyntaxDetail(data) { throw syntaxError(detail) }
            // Valid JSON that JSONDecoder still calls invalid, without a path: it does this for numbers that do not
            // fit the requested type, such as 1.5 or 1e300 for an Int.
            throw contentError("", "a number does not fit its field's type (a fraction or out-of-range value where an integer belongs?)")
        case let .dataCorrupted(context):
            throw contentError(dottedKeyPath(context.codingPath), context.debugDescription)
        @unknown default:
            throw contentError("", "\(error)")
        }
    }
}

/// Where `data` stops being JSON, e.g. "Invalid value around character 22." JSONDecoder only says "not valid JSON";
/// JSONSerialization says where.
func jsonSyntaxDetail(_ data: Data) -> String? {
    do {
        _ = try JSONSerialization.jsonObject(with: data, options: .fragmentsAllowed)
        return nil
    } catch {
        return (error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String
    }
}
