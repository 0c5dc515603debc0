import CoreMetrics
import Foundation
import Hummingbird
import SwiftVLM

extension VLMServer {
    /// `POST /v1/completions`: continues each prompt (strings tokenized with the tokenizer's special tokens, as
    /// transformers' text-generation pipeline does, or token arrays as given).
    func completion(_ body: Data) async throws -> APIResponse {
        let fields = try RequestFields(body)
        let model = try model(named: try fields.requiredString("model"))
        var requested = try SamplingFields(fields, configuration: configuration, maxTokensKeys: ["max_tokens"],
                                        pipeline: model.generationPipeline)
        requested.logprobs = try fields.int("logprobs", in: 0...20)
        let sampling = requested
        let echo = try fields.bool("echo") ?? false
        let pipeline: TextGenerationPipeline, batcher: ContinuousBatcher
        switch model.role {
        case let .text(text, textBatcher): (pipeline, batcher) = (text, textBatcher)
        case let .imageChat(chat, chatBatcher): (pipeline, batcher) = (chat.text, chatBatcher)
        case .embeddings: throw APIError.invalid("The model `\(model.id)` computes embeddings; it does not complete text", param: "model")
        }
        let prompts = try completionPrompts(fields["prompt"], pipeline: pipeline)
        guard prompts.count * sampling.n <= configuration.maxChoices else {
            throw APIError.invalid("\(prompts.count) prompts with n=\(sampling.n) are more choices than the server answers at once", param: "prompt")
        }
        let runs = try prompts.map { ids in
            try GenerationRun(model: model, pipeline: pipeline, batcher: batcher, prompt: LanguageModelPrompt(ids: ids), fields: sampling,
                              configuration: configuration)
        }
        let echoes = echo ? prompts.map { pipeline.tokenizer.decode($0, skipSpecialTokens: false) } : []
        // With logprobs, the echoed prompt's tokens carry theirs too (the first, with nothing before it, none).
        let promptLogprobs: [[BatchToken?]]
        if echo, let top = sampling.logprobs {
            let languageModel = pipeline.model
            promptLogprobs = try await heavyWork.run(maxImagePixels: configuration.maxImagePixels) {
                try prompts.map { [nil] + (try languageModel.promptLogprobs($0, top: top)) }
            }
        } else {
            promptLogprobs = []
        }
        let id = "cmpl-" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        let created = Int(Date().timeIntervalSince1970)
        let stops = sampling.stop
        let tokenTable = sampling.logprobs != nil ? TokenStrings.shared.bytes(pipeline) : []
        let metrics = metrics
        let start = ContinuousClock.now
        let promptTokens = prompts.reduce(0) { $0 + $1.count }
        let n = sampling.n

        @Sendable func tokenText(_ id: Int) -> String { String(decoding: tokenTable[safe: id] ?? [], as: UTF8.self) }
        /// OpenAI's legacy logprobs object for some tokens of one choice, offsets counted from `offset`; a nil token
        /// (an echoed prompt's first) has null log-probabilities.
        @Sendable func logprobs(_ tokens: [BatchToken?], ids: [Int], offset: Int) -> JSONValue {
            var offsets: [JSONValue] = []
            var position = offset
            for id in ids {
                offsets.append(.int(position))
                position += tokenText(id).utf16.count
            }
            return ["tokens": .array(ids.map { .string(tokenText($0)) }),
                    "token_logprobs": .array(tokens.map { $0.map { .float($0.logprob ?? 0) } ?? .null }),
                    "top_logprobs": .array(tokens.map { token in
                        token.map { .object($0.topLogprobs.map { (tokenText($0.id), .float($0.logprob)) }) } ?? .null
                    }),
                    "text_offset": .array(offsets)]
        }
        @Sendable func echoedLogprobs(_ promptIndex: Int) -> JSONValue {
            promptLogprobs.isEmpty ? .null : logprobs(promptLogprobs[promptIndex], ids: prompts[promptIndex], offset: 0)
        }

        if sampling.stream {
            return .events { send in
                var completion = 0, cached = 0
                for (promptIndex, run) in runs.enumerated() {
                    var progress = RunProgress(run, choices: n, stops: stops, metrics: metrics, start: start)
                    var offsets = Array(repeating: echo ? echoes[promptIndex].utf16.count : 0, count: n)
                    func sendChoice(_ choice: Int, text: String, logprobs: JSONValue = .null, finish: JSONValue = .null) async throws {
                        var object: [(String, JSONValue)] = [
                            ("id", .string(id)), ("object", "text_completion"), ("created", .int(created)), ("model", .string(model.id)),
                            ("choices", [["text": .string(text), "index": .int(promptIndex * n + choice), "logprobs": logprobs,
                                          "finish_reason": finish]])]
                        if sampling.includeUsage { object.append(("usage", .null)) }
                        try await send(.object(object))
                    }
                    if echo {
                        for choice in 0..<n {
                            try await sendChoice(choice, text: echoes[promptIndex], logprobs: echoedLogprobs(promptIndex))
                        }
                    }
                    for try await (choice, event) in run.events() {
                        switch progress.take(choice, event) {
                        case nil: continue
                        case .token(let token, let piece)?:
                            if sampling.logprobs != nil {
                                let entry = logprobs([token], ids: [token.id], offset: offsets[choice])
                                offsets[choice] += tokenText(token.id).utf16.count
                                try await sendChoice(choice, text: piece, logprobs: entry)
                            } else if !piece.isEmpty {
                                try await sendChoice(choice, text: piece)
                            }
                        case .finished(let rest, let reason)?:
                            try await sendChoice(choice, text: rest, finish: .string(reason))
                        }
                    }
                    run.countTokens(metrics, completion: progress.completionTokens)
                    completion += progress.completionTokens
                    cached += progress.cachedTokens
                }
                if sampling.includeUsage {
                    try await send(["id": .string(id), "object": "text_completion", "created": .int(created), "model": .string(model.id),
                                    "choices": [], "usage": usage(prompt: promptTokens, completion: completion, cached: cached)])
                }
            }
        }

        var choices: [JSONValue] = []
        var completion = 0, cached = 0
        for (promptIndex, run) in runs.enumerated() {
            var progress = RunProgress(run, choices: n, stops: stops, metrics: metrics, start: start)
            var contents = Array(repeating: "", count: n)
            var reasons = Array(repeating: "length", count: n)
            var tokens = Array(repeating: [BatchToken](), count: n)
            for try await (choice, event) in run.events() {
                switch progress.take(choice, event) {
                case nil: continue
                case .token(let token, let piece)?:
                    contents[choice] += piece
                    tokens[choice].append(token)
                case .finished(let rest, let reason)?:
                    contents[choice] += rest
                    reasons[choice] = reason
                }
            }
            run.countTokens(metrics, completion: progress.completionTokens)
            completion += progress.completionTokens
            cached += progress.cachedTokens
            for choice in 0..<n {
                let prefix = echo ? echoes[promptIndex] : ""
                choices.append(["text": .string(prefix + contents[choice]), "index": .int(promptIndex * n + choice),
                                "logprobs": sampling.logprobs != nil
                                    ? logprobs((echo ? promptLogprobs[promptIndex] : []) + tokens[choice].map { $0 },
                                               ids: (echo ? prompts[promptIndex] : []) + tokens[choice].map(\.id), offset: 0)
                                    : .null,
                                "finish_reason": .string(reasons[choice])])
            }
        }
        return .json(["id": .string(id), "object": "text_completion", "created": .int(created), "model": .string(model.id),
                      "choices": .array(choices), "usage": usage(prompt: promptTokens, completion: completion, cached: cached)])
    }

    /// `prompt` as token id lists: a string, a list of strings, a list of token ids, or a list of those.
    private func completionPrompts(_ prompt: JSONValue?, pipeline: TextGenerationPipeline) throws -> [[Int]] {
        let vocabulary = pipeline.model.vocabularySize
        func tokens(_ items: [JSONValue]) throws -> [Int] {
            try items.map {
                guard case .int(let id) = $0, id >= 0, id < vocabulary else {
                    throw APIError.invalid("'prompt' token ids must be integers in 0..<\(vocabulary)", param: "prompt")
                }
                return id
            }
        }
        let prompts: [[Int]]
        switch prompt {
        case .string(let text)?: prompts = [pipeline.tokenizer.encode(text).ids]
        case .array(let items)? where !items.isEmpty:
            // Several prompts are answered at once: no more than the choices the server gives one request.
            if !items.allSatisfy({ if case .int = $0 { true } else { false } }), items.count > configuration.maxChoices {
                throw APIError.invalid("'prompt' holds \(items.count) prompts, more than the server's limit of \(configuration.maxChoices)", param: "prompt")
            }
            if items.allSatisfy({ if case .string = $0 { true } else { false } }) {
                prompts = items.map { item in
                    guard case .string(let text) = item else { return [] }
                    return pipeline.tokenizer.encode(text).ids
                }
            } else if items.allSatisfy({ if case .int = $0 { true } else { false } }) {
                prompts = [try tokens(items)]
            } else {
                prompts = try items.map {
                    guard case .array(let inner) = $0 else {
                        throw APIError.invalid("'prompt' must be a string, a list of strings, a list of token ids or a list of those", param: "prompt")
                    }
                    return try tokens(inner)
                }
            }
        default:
            throw APIError.invalid("'prompt' must be a string, a list of strings, a list of token ids or a list of those", param: "prompt")
        }
        guard prompts.allSatisfy({ !$0.isEmpty }) else { throw APIError.invalid("'prompt' must not be empty", param: "prompt") }
        return prompts
    }
}

extension Array {
    subscript(safe index: Int) -> Element? { index >= 0 && index < count ? self[index] : nil }
}
