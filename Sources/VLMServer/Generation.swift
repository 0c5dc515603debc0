import CoreMetrics
import Foundation
import Hummingbird
import NIOCore
import SwiftVLM

/// The sampling fields chat and text completions share, read and checked.
struct SamplingFields {
    var maxTokens: Int?
    var temperature: Double?
    var topP: Double?
    var seed: UInt64?
    var stop: [String]
    var n: Int
    var stream: Bool
    var includeUsage: Bool
    /// Alternatives reported per token; nil: no logprobs.
    var logprobs: Int?
    /// vLLM's and llama.cpp's `ignore_eos`: generate max_tokens whatever the model says (benchmarks).
    var ignoreEos: Bool
    /// What the output must follow: `response_format`'s JSON schema, or llama-server's `json_schema` or `grammar`.
    var grammar: Grammar?

    /// `pipeline` resolves a GBNF grammar's tokens by text (nil for a model that does not generate).
    init(_ fields: RequestFields, configuration: ServerConfiguration, maxTokensKeys: [String], pipeline: TextGenerationPipeline?) throws {
        maxTokens = try maxTokensKeys.lazy.compactMap { try fields.int($0, in: 1...configuration.maxTokens) }.first
        temperature = try fields.double("temperature", in: 0...2)
        topP = try fields.double("top_p", in: 0...1)
        seed = try fields.int("seed", in: Int.min...Int.max).map { UInt64(bitPattern: Int64($0)) }
        stop = try fields.stopStrings()
        n = try fields.int("n", in: 1...configuration.maxChoices) ?? 1
        stream = try fields.bool("stream") ?? false
        ignoreEos = try fields.bool("ignore_eos") ?? false
        grammar = try fields.outputGrammar(pipeline: pipeline)
        includeUsage = false
        if let options = fields["stream_options"] {
            guard case .object = options else { throw APIError.invalid("'stream_options' must be an object", param: "stream_options") }
            guard stream else { throw APIError.invalid("'stream_options' is only allowed when 'stream' is true", param: "stream_options") }
            if let flag = options["include_usage"] {
                guard case .bool(let include) = flag else {
                    throw APIError.invalid("'stream_options.include_usage' must be a boolean", param: "stream_options")
                }
                includeUsage = include
            }
        }
    }

    /// The model's generation settings with the request's applied; without max_tokens, the `room` the prompt leaves
    /// (in the KV cache budget and the model's context) within the server's cap.
    func settings(base: GenerationConfig, room: Int, configuration: ServerConfiguration) throws -> GenerationConfig {
        var config = base
        config.maxNewTokens = maxTokens ?? max(1, min(configuration.maxTokens, room))
        config.maxLength = Int.max
        if let temperature {
            config.doSample = temperature > 0
            if temperature > 0 { config.temperature = temperature }
        }
        if let topP { config.topP = topP }
        config.numBeams = 1
        config.numReturnSequences = 1
        config.stopStrings += stop
        if ignoreEos { config.eosTokenIds = [] }
        do { try config.validate(file: "request") } catch { throw APIError.invalid("\(error)") }
        return config
    }
}

extension RequestFields {
    /// The grammar the output must follow, as llama-server reads a request: OpenAI's `response_format`
    /// (`{"type": "json_object"}` for any JSON object, or with a `schema`; `{"type": "json_schema", "json_schema":
    /// {"schema": …}}`), or llama-server's own `json_schema` (a schema) or `grammar` (GBNF text, its tokens by text
    /// resolved in `pipeline`'s vocabulary), not both. An empty schema means any object. Schemas become grammars as
    /// llama.cpp converts them (``JSONSchemaGrammar``).
    func outputGrammar(pipeline: TextGenerationPipeline?) throws -> Grammar? {
        var schema = self["json_schema"]
        let gbnf = try string("grammar")
        if schema != nil && gbnf != nil {
            throw APIError.invalid("Cannot use both json_schema and grammar", param: "grammar")
        }
        if let format = self["response_format"] {
            guard case .object = format else { throw APIError.invalid("'response_format' must be an object", param: "response_format") }
            switch format["type"] {
            case .string("json_object")?:
                if format["schema"] != nil || schema == nil { schema = format["schema"] ?? .object([]) }
            case .string("json_schema")?:
                guard case .object? = format["json_schema"] else {
                    throw APIError.invalid("'response_format.json_schema' must be an object", param: "response_format")
                }
                schema = format["json_schema"]?["schema"] ?? .object([])
            case .string("text")?, nil:
                break
            case let other?:
                throw APIError.invalid("'response_format.type' must be one of \"text\", \"json_object\" or \"json_schema\", got \(other)",
                                       param: "response_format")
            }
        }
        if var schema {
            if case .object(let pairs) = schema, pairs.isEmpty { schema = ["type": "object"] }
            do {
                return try Grammar(gbnf: JSONSchemaGrammar.convert(schema).grammar)
            } catch {
                throw APIError.invalid("\(error)", param: self["response_format"] != nil ? "response_format" : "json_schema")
            }
        }
        guard let gbnf, !gbnf.isEmpty else { return nil }
        do {
            return try pipeline?.grammar(gbnf: gbnf) ?? Grammar(gbnf: gbnf)
        } catch {
            throw APIError.invalid("\(error)", param: "grammar")
        }
    }
}

/// One choice's text as it is released to the client: the tokens' text with the request's stop strings cut off
/// (OpenAI returns the text before a stop string), held back while its end could still begin one.
struct ChoiceText {
    private var detokenizer: StreamingDetokenizer
    private let stops: [String]
    private var held = ""
    private(set) var stopped = false

    /// - Parameter keepSpecialTokens: the text holds special tokens' text too (a response template's delimiters).
    init(tokenizer: Tokenizer, stops: [String], keepSpecialTokens: Bool = false) {
        detokenizer = StreamingDetokenizer(tokenizer: tokenizer, skipSpecialTokens: !keepSpecialTokens)
        self.stops = stops.filter { !$0.isEmpty }
    }

    /// The text `token` releases.
    mutating func append(_ token: Int) -> String {
        guard !stopped else { return "" }
        held += detokenizer.append(token)
        return release(final: false)
    }

    /// Whatever is still held once generation ends.
    mutating func finish() -> String {
        guard !stopped else { return "" }
        held += detokenizer.finish()
        return release(final: true)
    }

    private mutating func release(final: Bool) -> String {
        let earliest = stops.compactMap { held.range(of: $0)?.lowerBound }.min()
        if let earliest {
            stopped = true
            let text = String(held[..<earliest])
            held = ""
            return text
        }
        var keep = 0
        if !final {
            // The longest end of the held text that a stop string starts with.
            for stop in stops {
                for length in stride(from: min(stop.count - 1, held.count), to: 0, by: -1)
                where length > keep && held.hasSuffix(stop.prefix(length)) {
                    keep = length
                    break
                }
            }
        }
        let text = String(held.dropLast(keep))
        held = String(held.suffix(keep))
        return text
    }
}

/// What one event of a run means for the text a client receives.
enum ChoiceUpdate {
    /// A token and the text it releases (often empty).
    case token(BatchToken, text: String)
    /// The choice ended: the text still held back, and OpenAI's finish_reason.
    case finished(text: String, reason: String)
}

/// A run's choices as their events arrive: each choice's text (stop strings cut), the tokens generated, the prompt
/// tokens a kept prefix gave, and the latency metrics.
struct RunProgress {
    let run: GenerationRun
    private let metrics: PrometheusMetrics
    private let start: ContinuousClock.Instant
    private var texts: [ChoiceText]
    private var previous: ContinuousClock.Instant?
    private(set) var completionTokens = 0
    private(set) var cachedTokens = 0

    init(_ run: GenerationRun, choices: Int, stops: [String], metrics: PrometheusMetrics, start: ContinuousClock.Instant,
         keepSpecialTokens: Bool = false) {
        self.run = run
        self.metrics = metrics
        self.start = start
        texts = Array(repeating: ChoiceText(tokenizer: run.pipeline.tokenizer, stops: stops, keepSpecialTokens: keepSpecialTokens),
                      count: choices)
    }

    /// What `event` of `choice` changes for the client; nil for a choice's start.
    mutating func take(_ choice: Int, _ event: BatchEvent) -> ChoiceUpdate? {
        switch event {
        case .started(let count):
            cachedTokens = max(cachedTokens, count)
            return nil
        case .token(let token):
            completionTokens += 1
            run.observe(metrics, start: start, previous: &previous)
            return .token(token, text: texts[choice].append(token.id))
        case .finished(let reason):
            let rest = texts[choice].finish()
            return .finished(text: rest, reason: finishReason(reason, stoppedByText: texts[choice].stopped))
        }
    }
}

/// A running generation of one or more choices for a request, as one stream of events tagged with the choice.
struct GenerationRun {
    let model: ServedModel
    let pipeline: TextGenerationPipeline
    let batcher: ContinuousBatcher
    let promptLength: Int
    let streams: [AsyncThrowingStream<BatchEvent, any Error>]

    /// Submits `n` sequences (seeds seed, seed + 1, …), all at once or none.
    ///
    /// - Parameter otherConstraint: what constrains the reply when the request sets no grammar (a chat's tool calls),
    ///   given the settings the request runs with.
    init(model: ServedModel, pipeline: TextGenerationPipeline, batcher: ContinuousBatcher, prompt: LanguageModelPrompt,
         fields: SamplingFields, configuration: ServerConfiguration,
         otherConstraint: ((GenerationConfig) throws -> (any GenerationConstraint)?)? = nil) throws {
        self.model = model
        self.pipeline = pipeline
        self.batcher = batcher
        promptLength = prompt.ids.count
        if let context = pipeline.model.contextLength {
            let asked = prompt.ids.count + (fields.maxTokens ?? 0)
            guard asked <= context else {
                throw APIError.invalid(
                    "This model's maximum context length is \(context) tokens. However, you requested \(asked) tokens (\(prompt.ids.count) in the messages, \(fields.maxTokens ?? 0) in the completion). Please reduce the length of the messages or completion.",
                    param: "messages", code: "context_length_exceeded")
            }
        }
        let room = min(batcher.budgetPositions, pipeline.model.contextLength ?? .max) - prompt.ids.count
        let settings = try fields.settings(base: pipeline.config, room: room, configuration: configuration)
        let criteria = pipeline.stoppingCriteria(settings)
        let constraint = try fields.grammar.map { pipeline.constraint($0, settings: settings) } ?? otherConstraint?(settings)
        let seed = fields.seed ?? UInt64.random(in: .min ... .max)
        let deadline = ContinuousClock.now + configuration.requestTimeout
        var streams: [AsyncThrowingStream<BatchEvent, any Error>] = []
        do {
            for choice in 0..<fields.n {
                streams.append(try batcher.submit(BatchRequest(
                    promptIds: prompt.ids, inputsEmbeds: prompt.inputsEmbeds, prefixKey: prompt.prefixKey,
                    attentionMask: prompt.attentionMask, config: settings,
                    stoppingCriteria: criteria, seed: seed &+ UInt64(choice), topLogprobs: fields.logprobs,
                    deadline: deadline, constraint: constraint)))
            }
        } catch let error as BatchError {
            // Streams already made end when dropped, which removes their sequences.
            switch error {
            case .queueFull: throw APIError.overloaded("The server is busy: \(error)")
            case .exceedsCacheBudget: throw APIError.invalid("\(error)", param: "max_tokens", code: "context_length_exceeded")
            case .unsupported: throw APIError.invalid("\(error)")
            }
        }
        self.streams = streams
    }

    /// Every choice's events in the order they happen, `(choice, event)`; ending the consumer cancels them all.
    func events() -> AsyncThrowingStream<(Int, BatchEvent), any Error> {
        let streams = streams
        return AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        for (index, stream) in streams.enumerated() {
                            group.addTask { for try await event in stream { continuation.yield((index, event)) } }
                        }
                        try await group.waitForAll()
                    }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Records time to first token and the time between tokens.
    func observe(_ metrics: PrometheusMetrics, start: ContinuousClock.Instant, previous: inout ContinuousClock.Instant?) {
        let now = ContinuousClock.now
        if let last = previous {
            Timer(label: "vlm_time_per_output_token_seconds", dimensions: [("model", model.id)], factory: metrics)
                .recordNanoseconds((now - last).nanoseconds)
        } else {
            Timer(label: "vlm_time_to_first_token_seconds", dimensions: [("model", model.id)], factory: metrics)
                .recordNanoseconds((now - start).nanoseconds)
        }
        previous = now
    }

    func countTokens(_ metrics: PrometheusMetrics, completion: Int) {
        Counter(label: "vlm_prompt_tokens_total", dimensions: [("model", model.id)], factory: metrics).increment(by: promptLength * streams.count)
        Counter(label: "vlm_generation_tokens_total", dimensions: [("model", model.id)], factory: metrics).increment(by: completion)
    }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

/// OpenAI's finish_reason for how a sequence ended (a timeout ends it as a length limit would).
func finishReason(_ reason: BatchFinishReason, stoppedByText: Bool) -> String {
    switch reason {
    case .stop: "stop"
    case .length, .timeout: stoppedByText ? "stop" : "length"
    }
}

/// Server-sent events: each `data:` line a JSON object, then `data: [DONE]`.
func serverSentEvents(_ produce: @escaping APIResponse.Producer) -> Response {
    Response(status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-cache"],
             body: ResponseBody { writer in
                 try await produce { value in
                     var bytes = Array("data: ".utf8)
                     JSONWriter.write(value, to: &bytes)
                     bytes += Array("\n\n".utf8)
                     try await writer.write(ByteBuffer(bytes: bytes))
                 }
                 try await writer.write(ByteBuffer(string: "data: [DONE]\n\n"))
                 try await writer.finish(nil)
             })
}

/// Each token's text and bytes, for logprobs (computed once per model, on first use).
final class TokenStrings: @unchecked Sendable {
    private let lock = NSLock()
    private var table: [ObjectIdentifier: [[UInt8]]] = [:]

    static let shared = TokenStrings()

    func bytes(_ pipeline: TextGenerationPipeline) -> [[UInt8]] {
        lock.withLock {
            if let known = table[ObjectIdentifier(pipeline)] { return known }
            let bytes = pipeline.tokenizer.tokenBytes(count: pipeline.model.vocabularySize)
            table[ObjectIdentifier(pipeline)] = bytes
            return bytes
        }
    }
}

/// A logprob entry as chat completions give it: `{"token", "logprob", "bytes"}`.
func logprobEntry(_ id: Int, _ logprob: Float, _ table: [[UInt8]]) -> JSONValue {
    let bytes = id >= 0 && id < table.count ? table[id] : []
    return ["token": .string(String(decoding: bytes, as: UTF8.self)), "logprob": .float(logprob),
            "bytes": .array(bytes.map { .int(Int($0)) })]
}
