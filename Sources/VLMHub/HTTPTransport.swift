import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A response whose body, when kept, is small (API JSON, error text).
struct HTTPResponse: Sendable {
    let url: URL
    let status: Int
    /// Header names lowercased.
    let headers: [String: String]
    let body: Data

    func header(_ name: String) -> String? { headers[name.lowercased()] }
}

/// Thrown by a streaming body handler to abort the transfer.
struct TransferAborted: Error {
    let error: HubError
}

/// URLSession without automatic redirects (the Hub's redirects carry metadata and decide where the token may go),
/// with bodies either collected up to a limit or streamed to a handler.
struct HTTPTransport: Sendable {
    let timeout: TimeInterval

    /// Sends the request and collects at most `bodyLimit` bytes of body; redirects are returned, not followed.
    func send(_ request: URLRequest, bodyLimit: Int) async throws -> HTTPResponse {
        let collector = BodyCollector(limit: bodyLimit)
        let response = try await run(request, onResponse: { _ in }, onData: { collector.append($0) })
        return HTTPResponse(url: response.url, status: response.status, headers: response.headers,
                            body: collector.data)
    }

    /// Sends the request; `onResponse` sees the status and headers before any body byte, `onData` every chunk.
    /// Either may throw ``TransferAborted`` to cancel the transfer.
    func stream(
        _ request: URLRequest,
        onResponse: @escaping @Sendable (HTTPResponse) throws -> Void,
        onData: @escaping @Sendable (Data) throws -> Void
    ) async throws -> HTTPResponse {
        try await run(request, onResponse: onResponse, onData: onData)
    }

    private func run(
        _ request: URLRequest,
        onResponse: @escaping @Sendable (HTTPResponse) throws -> Void,
        onData: @escaping @Sendable (Data) throws -> Void
    ) async throws -> HTTPResponse {
        var request = request
        request.timeoutInterval = timeout
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = timeout
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        configuration.httpShouldSetCookies = false
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        let delegate = TransferDelegate(onResponse: onResponse, onData: onData)
        let session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: queue)
        defer { session.finishTasksAndInvalidate() }
        let url = request.url?.absoluteString ?? "?"
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                delegate.start(continuation: continuation, url: url)
                let task = session.dataTask(with: request)
                delegate.setTask(task)
                task.resume()
            }
        } onCancel: {
            delegate.cancel()
        }
    }
}

private final class BodyCollector: @unchecked Sendable {
    private let lock = NSLock()
    private let limit: Int
    private var storage = Data()

    init(limit: Int) { self.limit = limit }

    func append(_ data: Data) {
        lock.withLock {
            if storage.count < limit { storage.append(data.prefix(limit - storage.count)) }
        }
    }

    var data: Data { lock.withLock { storage } }
}

/// Bridges one data task's delegate callbacks to a continuation. Callbacks arrive on a serial queue; the lock guards
/// against the cancellation handler, which runs elsewhere.
private final class TransferDelegate: NSObject, URLSessionDataDelegate, @unchecked Sendable {
    private let lock = NSLock()
    private let onResponse: @Sendable (HTTPResponse) throws -> Void
    private let onData: @Sendable (Data) throws -> Void
    private var continuation: CheckedContinuation<HTTPResponse, Error>?
    private var task: URLSessionTask?
    private var response: HTTPResponse?
    private var abort: HubError?
    private var url = "?"

    init(onResponse: @escaping @Sendable (HTTPResponse) throws -> Void,
         onData: @escaping @Sendable (Data) throws -> Void) {
        self.onResponse = onResponse
        self.onData = onData
    }

    func start(continuation: CheckedContinuation<HTTPResponse, Error>, url: String) {
        lock.withLock {
            self.continuation = continuation
            self.url = url
        }
    }

    func setTask(_ task: URLSessionTask) { lock.withLock { self.task = task } }

    func cancel() { lock.withLock { task }?.cancel() }

    func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                    newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void) {
        completionHandler(nil)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping (URLSession.ResponseDisposition) -> Void) {
        guard let http = response as? HTTPURLResponse else {
            fail(HubError.network(url: url, reason: "not an HTTP response"), task: dataTask)
            completionHandler(.cancel)
            return
        }
        var headers: [String: String] = [:]
        for (key, value) in http.allHeaderFields {
            if let key = key as? String, let value = value as? String { headers[key.lowercased()] = value }
        }
        let received = HTTPResponse(url: http.url ?? URL(string: url)!, status: http.statusCode, headers: headers,
                                    body: Data())
        lock.withLock { self.response = received }
        do {
            try onResponse(received)
            completionHandler(.allow)
        } catch {
            fail(error, task: dataTask)
            completionHandler(.cancel)
        }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        guard lock.withLock({ abort == nil }) else { return }
        do {
            try onData(data)
        } catch {
            fail(error, task: dataTask)
        }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        let (continuation, response, abort, url) = lock.withLock {
            defer { self.continuation = nil }
            return (self.continuation, self.response, self.abort, self.url)
        }
        guard let continuation else { return }
        if let abort {
            continuation.resume(throwing: abort)
        } else if let error {
            if (error as? URLError)?.code == .cancelled {
                continuation.resume(throwing: CancellationError())
            } else {
                continuation.resume(throwing: HubError.network(url: url, reason: error.localizedDescription))
            }
        } else if let response {
            continuation.resume(returning: response)
        } else {
            continuation.resume(throwing: HubError.network(url: url, reason: "no response"))
        }
    }

    private func fail(_ error: Error, task: URLSessionTask) {
        let hubError = (error as? TransferAborted)?.error ?? (error as? HubError)
            ?? .network(url: url, reason: "\(error)")
        lock.withLock { if abort == nil { abort = hubError } }
        task.cancel()
    }
}
