import Foundation
import SwiftVLM

/// The endpoints that take a request body.
public enum Endpoint: String, CaseIterable, Sendable {
    case chatCompletions = "chat.completions"
    case completions
    case embeddings

    /// The path after `/v1/`.
    public var path: String {
        switch self {
        case .chatCompletions: "chat/completions"
        case .completions: "completions"
        case .embeddings: "embeddings"
        }
    }
}

/// What an endpoint answers, before HTTP: a JSON body, server-sent events produced as they come (each a JSON
/// object; the HTTP layer adds `data: [DONE]`), or an OpenAI error.
public enum APIResponse: Sendable {
    /// Produces the events through `send`; throwing from `send` (the client went away) stops the producer.
    public typealias Producer = @Sendable (_ send: (JSONValue) async throws -> Void) async throws -> Void

    case json(JSONValue)
    case events(Producer)
    case failure(APIError)
}
