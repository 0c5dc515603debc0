import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One parsed request.
struct ServedRequest: Sendable {
    let method: String
    let path: String
    let query: String
    /// Header names lowercased.
    let headers: [String: String]
}

/// What to send back. `dropAfter` sends the announced Content-Length but closes after that many body bytes, as a
/// connection lost mid-file does.
struct ServedResponse: Sendable {
    var status: Int
    var headers: [(String, String)] = []
    var body = Data()
    var dropAfter: Int?
}

/// A minimal HTTP/1.1 server on POSIX sockets: 127.0.0.1 on an ephemeral port, one thread per connection,
/// `Connection: close`. It stops when `stop()` is called, when it is deinitialized, or after `lifetime` seconds, so a
/// failing test cannot leave it running.
final class TestHTTPServer: @unchecked Sendable {
    let port: UInt16
    private let listener: Int32
    private let handler: @Sendable (ServedRequest) -> ServedResponse
    private let lock = NSLock()
    private var stopped = false
    private var requests: [ServedRequest] = []

    init(lifetime: TimeInterval = 600, handler: @escaping @Sendable (ServedRequest) -> ServedResponse) throws {
        self.handler = handler
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw ServerError.socket("socket") }
        var reuse: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &reuse, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(listener, 64) == 0 else {
            close(listener)
            throw ServerError.socket("bind/listen")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        self.listener = listener
        port = UInt16(bigEndian: address.sin_port)
        let deadline = Date().addingTimeInterval(lifetime)
        Thread.detachNewThread { [self] in acceptLoop(until: deadline) }
    }

    deinit { stop() }

    var endpoint: URL { URL(string: "http://127.0.0.1:\(port)")! }

    /// Every request served so far, in arrival order.
    var log: [ServedRequest] { lock.withLock { requests } }

    func stop() {
        let wasRunning = lock.withLock {
            defer { stopped = true }
            return !stopped
        }
        if wasRunning {
            shutdown(listener, Int32(SHUT_RDWR))
        }
    }

    private func acceptLoop(until deadline: Date) {
        defer { close(listener) }
        while !lock.withLock({ stopped }), Date() < deadline {
            var descriptor = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 100) > 0 else { continue }
            let connection = accept(listener, nil, nil)
            guard connection >= 0 else { continue }
            Thread.detachNewThread { [self] in serve(connection) }
        }
        lock.withLock { stopped = true }
    }

    private func serve(_ connection: Int32) {
        defer { close(connection) }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var received = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while received.range(of: Data("\r\n\r\n".utf8)) == nil, received.count < 65536 {
            let count = recv(connection, &buffer, buffer.count, 0)
            guard count > 0 else { return }
            received.append(buffer, count: count)
        }
        guard let end = received.range(of: Data("\r\n\r\n".utf8)) else { return }
        let lines = String(decoding: received[..<end.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        let parts = lines[0].split(separator: " ")
        guard parts.count >= 2 else { return }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let target = String(parts[1])
        let pathPart = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let request = ServedRequest(
            method: String(parts[0]), path: String(pathPart[0]).removingPercentEncoding ?? String(pathPart[0]),
            query: pathPart.count > 1 ? String(pathPart[1]) : "", headers: headers)
        lock.withLock { requests.append(request) }
        let response = handler(request)
        var head = "HTTP/1.1 \(response.status) \(Self.reason(response.status))\r\n"
        for (name, value) in response.headers { head += "\(name): \(value)\r\n" }
        head += "Content-Length: \(response.body.count)\r\nConnection: close\r\n\r\n"
        guard sendAll(connection, Data(head.utf8)), request.method != "HEAD" else { return }
        _ = sendAll(connection, response.body.prefix(response.dropAfter ?? response.body.count))
    }

    private func sendAll(_ connection: Int32, _ data: Data) -> Bool {
        data.withUnsafeBytes { bytes in
            var sent = 0
            while sent < bytes.count {
                let count = send(connection, bytes.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL))
                guard count > 0 else { return false }
                sent += count
            }
            return true
        }
    }

    private static func reason(_ status: Int) -> String {
        [200: "OK", 206: "Partial Content", 302: "Found", 307: "Temporary Redirect", 401: "Unauthorized",
         403: "Forbidden", 404: "Not Found", 416: "Range Not Satisfiable", 500: "Internal Server Error"][status]
            ?? "Status"
    }

    enum ServerError: Error {
        case socket(String)
    }
}
