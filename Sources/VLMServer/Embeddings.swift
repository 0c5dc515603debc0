import Foundation
import Hummingbird
import SwiftVLM

extension VLMServer {
    /// `POST /v1/embeddings` for CLIP-style models: the projected embeddings `vlm embed` prints (not normalized), of
    /// texts, token arrays and, beyond OpenAI, images given as `data:image/…;base64,` URLs.
    func embeddings(_ body: Data) async throws -> APIResponse {
        let fields = try RequestFields(body)
        let model = try model(named: try fields.requiredString("model"))
        guard case .embeddings(let pipeline) = model.role else {
            throw APIError.invalid("The model `\(model.id)` does not compute embeddings (CLIP and SigLIP models do)", param: "model")
        }
        let format = try fields.string("encoding_format") ?? "float"
        guard format == "float" || format == "base64" else {
            throw APIError.invalid("'encoding_format' must be \"float\" or \"base64\"", param: "encoding_format")
        }
        if let dimensions = try fields.int("dimensions", in: 1...Int.max), dimensions != pipeline.model.embeddingSize {
            throw APIError.invalid("This model's embeddings have \(pipeline.model.embeddingSize) dimensions and cannot be shortened", param: "dimensions")
        }
        let inputs = try embeddingInputs(fields["input"])
        let result = try await heavyWork.run(maxImagePixels: configuration.maxImagePixels) { () throws -> EmbeddingResult in
            try preparing(param: "input") { try Self.embed(inputs, pipeline: pipeline) }
        }
        let data: [JSONValue] = result.rows.enumerated().map { index, row in
            let embedding: JSONValue = format == "float"
                ? .array(row.map(JSONValue.float))
                : .string(row.withUnsafeBytes { Data($0) }.base64EncodedString())
            return ["object": "embedding", "embedding": embedding, "index": .int(index)]
        }
        return .json(["object": "list", "data": .array(data), "model": .string(model.id),
                          "usage": ["prompt_tokens": .int(result.tokens), "total_tokens": .int(result.tokens)]])
    }

    private struct EmbeddingResult: Sendable {
        var rows: [[Float]]
        var tokens: Int
    }

    private enum EmbeddingInput: Sendable {
        case text(String)
        case tokens([Int])
        case image(String)
    }

    private func embeddingInputs(_ input: JSONValue?) throws -> [EmbeddingInput] {
        func item(_ value: JSONValue) throws -> EmbeddingInput {
            switch value {
            case .string(let text): return text.hasPrefix("data:image/") ? .image(text) : .text(text)
            case .array(let ids):
                return .tokens(try ids.map {
                    guard case .int(let id) = $0, id >= 0 else { throw APIError.invalid("token ids must be non-negative integers", param: "input") }
                    return id
                })
            default: throw APIError.invalid("'input' must be a string, a list of strings, a list of token ids or a list of those", param: "input")
            }
        }
        let items: [EmbeddingInput]
        switch input {
        case .string?: items = [try item(input!)]
        case .array(let values)? where !values.isEmpty:
            items = values.allSatisfy({ if case .int = $0 { true } else { false } }) ? [try item(input!)] : try values.map(item)
        default: throw APIError.invalid("'input' must be a string, a list of strings, a list of token ids or a list of those", param: "input")
        }
        guard items.count <= 2048 else { throw APIError.invalid("'input' holds more than 2048 items", param: "input") }
        return items
    }

    /// Each input's embedding, in order, computed in one batch per kind, and the number of text tokens.
    private static func embed(_ inputs: [EmbeddingInput], pipeline: DualEncoderPipeline) throws -> EmbeddingResult {
        var rows = Array(repeating: [Float](), count: inputs.count)
        let width = pipeline.model.embeddingSize
        func place(_ indices: [Int], _ embeddings: Tensor) {
            let values = embeddings.scalars
            for (row, index) in indices.enumerated() { rows[index] = Array(values[(row * width)..<((row + 1) * width)]) }
        }
        var texts: [(Int, String)] = [], images: [(Int, String)] = [], tokenLists: [(Int, [Int])] = []
        for (index, input) in inputs.enumerated() {
            switch input {
            case .text(let text): texts.append((index, text))
            case .image(let url): images.append((index, url))
            case .tokens(let ids): tokenLists.append((index, ids))
            }
        }
        var tokens = 0
        if !texts.isEmpty {
            place(texts.map(\.0), try pipeline.textEmbeddings(texts.map(\.1)))
            tokens += texts.reduce(0) { $0 + pipeline.tokenizer.encode($1.1).ids.count }
        }
        if !images.isEmpty {
            let decoded = try images.enumerated().map { number, item in
                try ChatImages.load(ChatImageReference(message: number, key: "url", value: item.1))
            }
            place(images.map(\.0), try pipeline.imageEmbeddings(decoded))
        }
        for (index, ids) in tokenLists {
            place([index], try pipeline.textEmbeddings(tokenIds: ids))
            tokens += ids.count
        }
        return EmbeddingResult(rows: rows, tokens: tokens)
    }
}

/// ``preparing(_:)`` for another field.
func preparing<T>(param: String, _ work: () throws -> T) throws -> T {
    do { return try work() } catch let error as APIError { throw error } catch {
        throw APIError.invalid("\(error)", param: param)
    }
}
