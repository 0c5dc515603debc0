import CoreMetrics
import Foundation
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle
import SwiftVLM
import Synchronization

/// What `vlm serve` is started with: where it listens, who may call it, and the limits every request is held to.
public struct ServerConfiguration: Sendable {
    public var host = "127.0.0.1"
    /// 0 picks a free port (see ``VLMServer/run(onListening:)``).
    public var port = 8080
    /// Requests must carry `Authorization: Bearer <apiKey>` when set.
    public var apiKey: String?
    /// `file://` image URLs are read only from under this directory; nil refuses them.
    public var allowLocalFiles: URL?
    /// Whether `http(s)://` image URLs are downloaded.
    public var allowRemoteImages = false
    public var maxBodyBytes = 32 << 20
    /// Images with more pixels are refused before they are decoded (Pillow's default limit).
    public var maxImagePixels = ImageDecoder.maxPixels
    /// The most bytes a downloaded image may have.
    public var maxRemoteImageBytes = 20 << 20
    public var maxMessages = 512
    /// The most tokens a request may ask for (`max_tokens`), and the default cap when it asks for none.
    public var maxTokens = 4096
    /// The most choices (`n`) a request may ask for.
    public var maxChoices = 8
    /// The most sequences a decoder runs together.
    public var maxBatch = 8
    /// The most requests waiting per model; more are answered 503 with Retry-After.
    public var maxQueue = 64
    /// The KV cache budget per language model (running sequences and kept prompt prefixes).
    public var kvCacheBytes = 1 << 30
    /// A generation still running after this long ends with finish_reason "length".
    public var requestTimeout: Duration = .seconds(600)
    /// Gemma 3 models read images with pan and scan unless a request's `mm_processor_kwargs` says
    /// `do_pan_and_scan: false` (vLLM's `--mm-processor-kwargs '{"do_pan_and_scan": true}'`); other models are not
    /// affected.
    public var panAndScan = false

    public init() {}
}

/// The OpenAI-compatible HTTP server: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`,
/// `/health` and `/metrics`, over the models it was given.
public final class VLMServer: Sendable {
    public let models: [ServedModel]
    public let configuration: ServerConfiguration
    let metrics = PrometheusMetrics()
    let logger: Logger
    /// Image reading and embedding, one piece per core at a time.
    let heavyWork = WorkLimiter(limit: ProcessInfo.processInfo.activeProcessorCount)
    private let running = Mutex<ServiceGroup?>(nil)

    public init(models: [ServedModel], configuration: ServerConfiguration, logger: Logger = Logger(label: "vlm.serve")) throws {
        var names = Set<String>()
        for model in models where !names.insert(model.id).inserted { throw ServerError.duplicateName(model.id) }
        self.models = models
        self.configuration = configuration
        self.logger = logger
    }

    /// Serves until ``shutdown()``, SIGINT or SIGTERM (each a graceful shutdown: open requests finish), or until
    /// the task running it is cancelled. `onListening` gets the port the server listens on, once it does.
    public func run(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) async throws {
        let app = Application(
            router: router(),
            configuration: ApplicationConfiguration(address: .hostname(configuration.host, port: configuration.port),
                                                    serverName: "SwiftVLM"),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? 0) },
            logger: logger)
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(
            services: [app], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        running.withLock { $0 = group }
        defer {
            running.withLock { $0 = nil }
            models.forEach { $0.shutdown() }
        }
        try await group.run()
    }

    /// Stops a running server gracefully.
    public func shutdown() async {
        guard let group = running.withLock({ $0 }) else { return }
        await group.triggerGracefulShutdown()
    }

    func router() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.get("/health") { _, _ in
            Self.json(["status": "ok"])
        }
        router.get("/metrics") { [self] _, _ in
            for model in models {
                switch model.role {
                case .text(_, let batcher), .imageChat(_, let batcher):
                    Meter(label: "vlm_queue_length", dimensions: [("model", model.id)], factory: metrics).set(batcher.queueLength)
                    Meter(label: "vlm_running_sequences", dimensions: [("model", model.id)], factory: metrics).set(batcher.runningCount)
                case .embeddings: break
                }
            }
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
                            body: ResponseBody(byteBuffer: ByteBuffer(string: metrics.exposition())))
        }
        router.get("/v1/models") { [self] request, _ in
            try await answer(request, endpoint: "models") { _ in
                .json(["object": "list", "data": .array(models.map { model in
                    ["id": .string(model.id), "object": "model", "created": .int(model.created), "owned_by": "swiftvlm"]
                })])
            }
        }
        router.get("/v1/models/**") { [self] request, context in
            try await answer(request, endpoint: "models") { _ in
                let name = context.parameters.getCatchAll().joined(separator: "/")
                let model = try model(named: name.removingPercentEncoding ?? name)
                return .json(["id": .string(model.id), "object": "model", "created": .int(model.created), "owned_by": "swiftvlm"])
            }
        }
        for endpoint in Endpoint.allCases {
            router.post(RouterPath(stringLiteral: "/v1/" + endpoint.path)) { [self] request, _ in
                try await answer(request, endpoint: endpoint.rawValue) { try await handle(endpoint, body: $0) }
            }
        }
        return router
    }

    /// Answers one request body for `endpoint` as the HTTP server does once the API key has passed, without HTTP:
    /// what embeds the server in a process of its own needs, and what the fuzzer drives. Every error becomes an
    /// OpenAI error object.
    public func respond(to endpoint: Endpoint, body: Data) async -> APIResponse {
        do {
            return try await handle(endpoint, body: body)
        } catch let error as APIError {
            return .failure(error)
        } catch {
            logger.error("\(endpoint.rawValue): \(error)")
            return .failure(.internalError("\(error)"))
        }
    }

    func handle(_ endpoint: Endpoint, body: Data) async throws -> APIResponse {
        switch endpoint {
        case .chatCompletions: try await chatCompletion(body)
        case .completions: try await completion(body)
        case .embeddings: try await embeddings(body)
        }
    }

    /// Checks the key, reads the body within the limit, runs `handle`, and turns every error into an OpenAI error
    /// object, counting the request by endpoint and status.
    private func answer(_ request: Request, endpoint: String, _ handle: (Data) async throws -> APIResponse) async throws -> Response {
        var response: Response
        do {
            try authorize(request)
            let body = try await readBody(request)
            switch try await handle(body) {
            case .json(let value): response = Self.json(value)
            case .events(let produce): response = serverSentEvents(produce)
            case .failure(let error): response = Self.errorResponse(error)
            }
        } catch let error as APIError {
            response = Self.errorResponse(error)
        } catch {
            logger.error("\(endpoint): \(error)")
            response = Self.errorResponse(.internalError("\(error)"))
        }
        Counter(label: "vlm_requests_total", dimensions: [("endpoint", endpoint), ("status", String(response.status.code))],
                factory: metrics).increment()
        return response
    }

    private func authorize(_ request: Request) throws {
        guard let key = configuration.apiKey else { return }
        let given = request.headers[.authorization].flatMap { value -> String? in
            value.hasPrefix("Bearer ") ? String(value.dropFirst(7)) : nil
        } ?? ""
        guard constantTimeEqual(Array(given.utf8), Array(key.utf8)) else { throw APIError.unauthorized }
    }

    private func readBody(_ request: Request) async throws -> Data {
        if let length = request.headers[.contentLength].flatMap(Int.init), length > configuration.maxBodyBytes {
            throw APIError.tooLarge(configuration.maxBodyBytes)
        }
        do {
            var buffer = try await request.body.collect(upTo: configuration.maxBodyBytes)
            return buffer.readData(length: buffer.readableBytes) ?? Data()
        } catch is NIOTooManyBytesError {
            throw APIError.tooLarge(configuration.maxBodyBytes)
        }
    }

    func model(named name: String) throws -> ServedModel {
        guard let model = models.first(where: { $0.answers(to: name) }) else { throw APIError.modelNotFound(name) }
        return model
    }

    static func json(_ value: JSONValue, status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "application/json"],
                 body: ResponseBody(byteBuffer: ByteBuffer(data: JSONWriter.data(value))))
    }

    static func errorResponse(_ error: APIError) -> Response {
        var headers: HTTPFields = [.contentType: "application/json"]
        if let seconds = error.retryAfter { headers[.retryAfter] = String(seconds) }
        return Response(status: HTTPResponse.Status(code: error.status), headers: headers,
                        body: ResponseBody(byteBuffer: ByteBuffer(data: error.body)))
    }
}

/// Compares without stopping at the first difference, so that response times do not leak how much of a key matched.
func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    var difference = UInt8(a.count == b.count ? 0 : 1)
    for index in 0..<max(a.count, b.count) {
        difference |= (index < a.count ? a[index] : 0) ^ (index < b.count ? b[index] : 0)
    }
    return difference == 0
}

extension ByteBuffer {
    init(data: Data) {
        self.init(bytes: data)
    }
}
