import Foundation

/// A JSON object read from a tokenizer file, with typed accessors whose errors carry the file and the field path.
struct JSONObject {
    let file: String
    let path: String
    let values: [String: Any]
    /// The members in file order with their keys byte for byte (vocabularies).
    let members: [(key: String, value: Any)]

    init(file: String, path: String, members: JSONMembers) {
        self.file = file
        self.path = path
        self.values = members.dictionary
        self.members = members.pairs
    }

    static func read(_ url: URL) throws -> JSONObject {
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw TokenizerError.unreadable(file: url.path, reason: "\(error)")
        }
        return try parse(data, file: url.path)
    }

    static func parse(_ data: Data, file: String) throws -> JSONObject {
        let any: Any
        do {
            any = try TokenizerJSONParser.parse(data)
        } catch {
            throw TokenizerError.malformedJSON(file: file, reason: "\(error)")
        }
        guard let members = any as? JSONMembers else {
            throw TokenizerError.malformedJSON(file: file, reason: "the top level is not an object")
        }
        return JSONObject(file: file, path: "$", members: members)
    }

    func invalid(_ key: String, _ reason: String) -> TokenizerError {
        .invalidField(file: file, path: "\(path).\(key)", reason: reason)
    }

    func isNull(_ key: String) -> Bool { values[key] == nil || values[key] is NSNull }

    func object(_ key: String) throws -> JSONObject {
        guard let value = values[key] as? JSONMembers else { throw invalid(key, "expected an object") }
        return JSONObject(file: file, path: "\(path).\(key)", members: value)
    }

    func optionalObject(_ key: String) throws -> JSONObject? { isNull(key) ? nil : try object(key) }

    func objects(_ key: String) throws -> [JSONObject] {
        guard let array = values[key] as? [Any] else { throw invalid(key, "expected an array") }
        return try array.enumerated().map { index, element in
            guard let object = element as? JSONMembers else { throw invalid("\(key)[\(index)]", "expected an object") }
            return JSONObject(file: file, path: "\(path).\(key)[\(index)]", members: object)
        }
    }

    func string(_ key: String) throws -> String {
        guard let value = values[key] as? String else { throw invalid(key, "expected a string") }
        return value
    }

    func optionalString(_ key: String) throws -> String? { isNull(key) ? nil : try string(key) }

    func bool(_ key: String, default defaultValue: Bool) throws -> Bool {
        if isNull(key) { return defaultValue }
        guard let value = values[key] as? Bool else { throw invalid(key, "expected a boolean") }
        return value
    }

    func int(_ key: String) throws -> Int {
        guard let value = JSONObject.integer(values[key]) else { throw invalid(key, "expected an integer") }
        return value
    }

    /// An integer that JSON may have written as 1 or 1.0; nil for fractions, huge values and non-numbers.
    static func integer(_ any: Any?) -> Int? {
        guard let double = (any as? NSNumber)?.doubleValue, !(any is String) else { return nil }
        guard double.isFinite, double.rounded() == double, abs(double) < 9.0e18 else { return nil }
        return Int(double)
    }

    /// The string of a token that configuration files write either as "text" or as {"content": "text", ...}.
    func tokenContent(_ key: String) throws -> String? {
        if isNull(key) { return nil }
        if let text = values[key] as? String { return text }
        if let object = values[key] as? JSONMembers, let text = object.dictionary["content"] as? String { return text }
        throw invalid(key, "expected a token string or an object with \"content\"")
    }
}
