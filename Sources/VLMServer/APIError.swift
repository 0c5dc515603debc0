import Foundation
import VLMTemplates

/// A refusal as the OpenAI API words it: an HTTP status and `{"error": {"message", "type", "param", "code"}}`.
public struct APIError: Error, Sendable, Equatable {
    public var status: Int
    public var message: String
    public var type: String
    public var param: String?
    public var code: String?
    /// Seconds after which the client may retry (503 when the queue is full).
    public var retryAfter: Int?

    public init(status: Int, message: String, type: String, param: String? = nil, code: String? = nil, retryAfter: Int? = nil) {
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retryAfter = retryAfter
    }

    static func invalid(_ message: String, param: String? = nil, code: String? = nil) -> APIError {
        APIError(status: 400, message: message, type: "invalid_request_error", param: param, code: code)
    }

    static func modelNotFound(_ name: String) -> APIError {
        APIError(status: 404, message: "The model `\(name)` does not exist", type: "invalid_request_error", param: "model",
                 code: "model_not_found")
    }

    static let unauthorized = APIError(status: 401, message: "Incorrect API key provided", type: "invalid_request_error",
                                       code: "invalid_api_key")

    static func tooLarge(_ limit: Int) -> APIError {
        APIError(status: 413, message: "The request body is larger than the server's limit of \(limit) bytes",
                 type: "invalid_request_error", code: "request_too_large")
    }

    static func overloaded(_ message: String) -> APIError {
        APIError(status: 503, message: message, type: "server_error", code: "server_overloaded", retryAfter: 1)
    }

    static func internalError(_ message: String) -> APIError {
        APIError(status: 500, message: message, type: "server_error")
    }

    /// The error object's JSON.
    var body: Data {
        let error: JSONValue = [
            "message": .string(message), "type": .string(type),
            "param": param.map(JSONValue.string) ?? .null, "code": code.map(JSONValue.string) ?? .null,
        ]
        return JSONWriter.data(["error": error])
    }
}

/// Reads a request's JSON body field by field, refusing wrong types with the field's name as `param`.
struct RequestFields {
    let object: [(String, JSONValue)]

    init(_ data: Data) throws {
        let value: JSONValue
        do { value = try JSONValue(parsing: data, file: "request body") } catch {
            throw APIError.invalid("We could not parse the JSON body of your request: \(error)")
        }
        guard case .object(let pairs) = value else { throw APIError.invalid("The request body must be a JSON object") }
        object = pairs
    }

    subscript(name: String) -> JSONValue? {
        guard let value = object.last(where: { $0.0 == name })?.1, value != .null else { return nil }
        return value
    }

    func string(_ name: String) throws -> String? {
        guard let value = self[name] else { return nil }
        guard case .string(let text) = value else { throw APIError.invalid("'\(name)' must be a string", param: name) }
        return text
    }

    func requiredString(_ name: String) throws -> String {
        guard let text = try string(name) else { throw APIError.invalid("'\(name)' is a required property", param: name) }
        return text
    }

    func int(_ name: String, in range: ClosedRange<Int>) throws -> Int? {
        guard let value = self[name] else { return nil }
        let number: Int
        switch value {
        case .int(let n): number = n
        case .double(let d) where d == d.rounded() && abs(d) < 1e15: number = Int(d)
        default: throw APIError.invalid("'\(name)' must be an integer", param: name)
        }
        guard range.contains(number) else {
            throw APIError.invalid("'\(name)' must be between \(range.lowerBound) and \(range.upperBound), got \(number)", param: name)
        }
        return number
    }

    func double(_ name: String, in range: ClosedRange<Double>) throws -> Double? {
        guard let value = self[name] else { return nil }
        let number: Double
        switch value {
        case .int(let n): number = Double(n)
        case .double(let d): number = d
        default: throw APIError.invalid("'\(name)' must be a number", param: name)
        }
        guard range.contains(number) else {
            throw APIError.invalid("'\(name)' must be between \(range.lowerBound) and \(range.upperBound), got \(number)", param: name)
        }
        return number
    }

    func bool(_ name: String) throws -> Bool? {
        guard let value = self[name] else { return nil }
        guard case .bool(let flag) = value else { throw APIError.invalid("'\(name)' must be a boolean", param: name) }
        return flag
    }

    /// `stop`: a string or a list of at most 4 strings.
    func stopStrings() throws -> [String] {
        switch self["stop"] {
        case nil: return []
        case .string(let text)?: return try checked([text])
        case .array(let items)? where items.count <= 4:
            return try checked(items.map {
                guard case .string(let text) = $0 else { throw APIError.invalid("'stop' must be a string or a list of strings", param: "stop") }
                return text
            })
        default: throw APIError.invalid("'stop' must be a string or a list of at most 4 strings", param: "stop")
        }

        /// Every token is matched against every stop string: each is held to a length no real stop sequence needs.
        func checked(_ stops: [String]) throws -> [String] {
            guard stops.allSatisfy({ $0.utf8.count <= 1024 }) else {
                throw APIError.invalid("a 'stop' string is longer than 1024 bytes", param: "stop")
            }
            return stops
        }
    }
}

/// Compact JSON text of a ``JSONValue`` (no spaces, keys in order, non-ASCII kept as UTF-8).
enum JSONWriter {
    static func data(_ value: JSONValue) -> Data {
        var out = [UInt8]()
        out.reserveCapacity(256)
        write(value, to: &out)
        return Data(out)
    }

    static func write(_ value: JSONValue, to out: inout [UInt8]) {
        switch value {
        case .null: out += Array("null".utf8)
        case .bool(let flag): out += Array((flag ? "true" : "false").utf8)
        case .int(let n): out += Array(String(n).utf8)
        case .double(let d): out += Array((d.isFinite ? "\(d)" : "null").utf8)
        case .string(let text): writeString(text, to: &out)
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (index, item) in items.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                write(item, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let pairs):
            out.append(UInt8(ascii: "{"))
            for (index, (key, item)) in pairs.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                writeString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                write(item, to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    private static func writeString(_ text: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
            case UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
            case UInt8(ascii: "\n"): out += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case UInt8(ascii: "\r"): out += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case UInt8(ascii: "\t"): out += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
            case 0..<0x20: out += Array(String(format: "\\u%04x", byte).utf8)
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

extension JSONValue {
    /// A float as JSON writes it: the shortest text that reads back as the same float.
    static func float(_ value: Float) -> JSONValue {
        value.isFinite ? .double(Double("\(value)")!) : .null
    }
}
