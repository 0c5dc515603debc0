import Foundation
import Testing
import SwiftVLM
@testable import VLMServer

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Debian's nginx, which .ci/run installs; the test is skipped where it is missing.
private let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"].first { FileManager.default.isExecutableFile(atPath: $0) }

/// Two `vlm serve` replicas behind nginx on loopback, sessions pinned by the `X-Session-Id` header (the README's
/// configuration): every request answered through the balancer, streaming included, and each session served by one
/// replica only, so that its prompt prefixes stay cached there.
@Suite(.serialized) struct ReplicaTests {
    /// nginx's configuration for `replicas`, listening on `port`, with its files under `directory`.
    static func configuration(replicas: [Int], port: Int, directory: URL) -> String {
        let path = directory.path
        return """
        worker_processes 1;
        daemon off;
        pid \(path)/nginx.pid;
        error_log \(path)/error.log;
        events { worker_connections 512; }
        http {
            access_log off;
            client_body_temp_path \(path)/body;
            proxy_temp_path \(path)/proxy;
            fastcgi_temp_path \(path)/fastcgi;
            uwsgi_temp_path \(path)/uwsgi;
            scgi_temp_path \(path)/scgi;
            upstream vlm {
                hash $http_x_session_id consistent;
        \(replicas.map { "        server 127.0.0.1:\($0);" }.joined(separator: "\n"))
            }
            server {
                listen 127.0.0.1:\(port);
                client_max_body_size 32m;
                location / {
                    proxy_pass http://vlm;
                    proxy_http_version 1.1;
                    proxy_set_header Connection "";
                    proxy_buffering off;
                    proxy_read_timeout 600s;
                }
            }
        }
        """
    }

    /// A port nothing listens on right now.
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Int32 in
                guard bind(fd, pointer, length) == 0 else { return -1 }
                return getsockname(fd, pointer, &length)
            }
        }
        guard bound == 0 else { throw POSIXError(.EADDRINUSE) }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    static func requestCount(_ server: RunningServer) -> Int {
        server.server.metrics.exposition().split(separator: "\n")
            .filter { $0.hasPrefix("vlm_requests_total{endpoint=\"chat.completions\"") }
            .compactMap { $0.split(separator: " ").last.flatMap { Int($0) } }.reduce(0, +)
    }

    @Test(.enabled(if: nginx != nil, "nginx not installed (apt-get install nginx)"))
    func sessionsArePinnedBehindNginx() async throws {
        let replicas = [try await RunningServer(models: ServerTests.models()), try await RunningServer(models: ServerTests.models())]
        defer { Task { for replica in replicas { await replica.stop() } } }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-nginx-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let port = try Self.freePort()
        let file = directory.appendingPathComponent("nginx.conf")
        try Self.configuration(replicas: replicas.map(\.port), port: port, directory: directory)
            .write(to: file, atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try #require(nginx))
        process.arguments = ["-c", file.path, "-p", directory.path]
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
        }
        let balancer = Balancer(port: port)
        var ready = false
        for _ in 0..<200 where !ready {
            ready = (try? await balancer.send("GET", "/health").status) == 200
            if !ready { try await Task.sleep(for: .milliseconds(25)) }
        }
        #expect(ready, "nginx did not answer: \((try? String(contentsOf: directory.appendingPathComponent("error.log"), encoding: .utf8)) ?? "")")

        let body: JSONValue = ["model": "chatml-tiny", "messages": [["role": "user", "content": "hi"]], "max_tokens": 4, "temperature": 0]
        var servedBy: [String: Set<Int>] = [:]
        for session in 0..<32 {
            let name = "session-\(session)"
            for _ in 0..<2 {
                let before = replicas.map(Self.requestCount)
                let (status, answer) = try await balancer.post("/v1/chat/completions", body, headers: ["X-Session-Id": name])
                #expect(status == 200, "\(answer)")
                let after = replicas.map(Self.requestCount)
                for (index, (was, now)) in zip(before, after).enumerated() where now > was { servedBy[name, default: []].insert(index) }
            }
        }
        #expect(servedBy.count == 32)
        #expect(servedBy.values.allSatisfy { $0.count == 1 }, "\(servedBy)")
        // Both replicas take sessions (32 sessions on a consistent hash ring of two: all on one is a chance of about
        // 2⁻³² for an even ring, about 10⁻⁴ for one split 3:1).
        #expect(Set(servedBy.values.flatMap { $0 }).count == 2, "\(servedBy)")

        var streamed = body
        streamed.set("stream", true)
        let (events, done) = try await balancer.stream("/v1/chat/completions", streamed)
        #expect(done && !events.isEmpty)
    }
}

/// The nginx front: the same client as ``RunningServer``, on its port.
private struct Balancer {
    let port: Int

    func send(_ method: String, _ path: String) async throws -> (status: Int, headers: [String: String], body: Data) {
        try await client().send(method, path)
    }

    func post(_ path: String, _ object: JSONValue, headers: [String: String]) async throws -> (status: Int, body: JSONValue) {
        try await client().post(path, object, headers: headers)
    }

    func stream(_ path: String, _ object: JSONValue) async throws -> (events: [JSONValue], done: Bool) {
        try await client().stream(path, object)
    }

    private func client() -> HTTPTestClient { HTTPTestClient(base: "http://127.0.0.1:\(port)") }
}
