import Foundation
import VLMCheckpoint

/// When beam search may stop before `max_length` (transformers' `early_stopping`).
public enum EarlyStopping: Sendable, Equatable {
    /// `true`: as soon as every batch item has `num_beams` finished hypotheses.
    case always
    /// `false`: when a heuristic says no running beam can beat the finished ones.
    case heuristic
    /// `"never"`: only when no running beam can possibly beat them (the canonical beam search).
    case never
}

/// How text is generated, as transformers' `GenerationConfig`: read from a checkpoint's generation_config.json with
/// transformers' defaults for absent fields, and settable in code.
public struct GenerationConfig: Sendable, Equatable {
    /// The most new tokens per sequence; nil leaves the limit to ``maxLength``.
    public var maxNewTokens: Int?
    /// The longest sequence, prompt included (used when ``maxNewTokens`` is nil).
    public var maxLength: Int = 20
    /// No eos before this many new tokens; nil means none.
    public var minNewTokens: Int?
    /// No eos before the sequence, prompt included, is this long.
    public var minLength: Int = 0
    /// Sample from the processed distribution instead of taking the most likely token.
    public var doSample = false
    public var temperature = 1.0
    /// 0 disables top-k.
    public var topK = 50
    /// 1 disables top-p.
    public var topP = 1.0
    public var minP: Double?
    /// 1 disables the penalty.
    public var repetitionPenalty = 1.0
    public var numBeams = 1
    /// Sequences returned per prompt (at most ``numBeams``).
    public var numReturnSequences = 1
    /// Beam scores are divided by `length ** lengthPenalty`.
    public var lengthPenalty = 1.0
    public var earlyStopping = EarlyStopping.heuristic
    /// A sequence ends after any of these.
    public var eosTokenIds: [Int] = []
    public var padTokenId: Int?
    public var bosTokenId: Int?
    /// Generation stops once the text ends with one of these (it is kept in the output).
    public var stopStrings: [String] = []

    /// transformers' defaults: greedy decoding of up to 20 tokens, prompt included.
    public init() {}

    /// Reads a checkpoint directory's generation_config.json, or without one, the generation fields of its
    /// config.json (ids of the bos, eos and pad tokens above all), as transformers' `from_model_config` does.
    /// Without either file, the defaults.
    public static func load(directory: URL) throws -> GenerationConfig {
        for name in ["generation_config.json", "config.json"] {
            let url = directory.appendingPathComponent(name)
            guard FileManager.default.fileExists(atPath: url.path) else { continue }
            let config: GenerationConfig
            do {
                config = try JSONDecoder().decode(GenerationConfig.self, from: Data(contentsOf: url))
            } catch let error as ModelError {
                throw error.inFile(url.path)
            } catch {
                throw ModelError.invalidConfig("not a valid generation config: \(error)", file: url.path)
            }
            try config.validate(file: url.path)
            return config
        }
        return GenerationConfig()
    }

    /// Checks the settings the way transformers' `GenerationConfig.validate` and the processors' constructors do.
    public func validate(file: String = "generation config") throws {
        func check(_ condition: Bool, _ message: @autoclosure () -> String) throws {
            if !condition { throw ModelError.invalidConfig(message(), file: file) }
        }
        try check(maxNewTokens.map { $0 >= 0 } ?? true, "max_new_tokens is \(maxNewTokens!), expected ≥ 0")
        try check(maxLength >= 0, "max_length is \(maxLength), expected ≥ 0")
        try check(minNewTokens.map { $0 >= 0 } ?? true, "min_new_tokens is \(minNewTokens!), expected ≥ 0")
        try check(minLength >= 0, "min_length is \(minLength), expected ≥ 0")
        try check(numBeams >= 1, "num_beams is \(numBeams), expected ≥ 1")
        // Sampling draws independent sequences; beam search returns its best beams; greedy decoding has one.
        let mostSequences = numBeams > 1 ? numBeams : doSample ? Int.max : 1
        try check(numReturnSequences >= 1 && numReturnSequences <= mostSequences,
                  "num_return_sequences is \(numReturnSequences), expected 1 ... \(mostSequences == Int.max ? "" : String(mostSequences))")
        try check(repetitionPenalty > 0 && repetitionPenalty.isFinite, "repetition_penalty is \(repetitionPenalty), expected > 0")
        try check(lengthPenalty.isFinite, "length_penalty is \(lengthPenalty)")
        try check(eosTokenIds.allSatisfy { $0 >= 0 }, "eos_token_id \(eosTokenIds) has a negative id")
        guard doSample else { return }
        try check(temperature > 0 && temperature.isFinite, "temperature is \(temperature), expected > 0 when sampling")
        try check(topK >= 0, "top_k is \(topK), expected ≥ 0")
        try check(topP >= 0 && topP <= 1, "top_p is \(topP), expected in [0, 1]")
        try check(minP.map { $0 >= 0 && $0 <= 1 } ?? true, "min_p is \(minP!), expected in [0, 1]")
    }

    /// The new-token limit for a prompt of `promptLength` (padding included), as `generate` derives it.
    public func newTokenLimit(promptLength: Int) throws -> Int {
        if let maxNewTokens { return maxNewTokens }
        guard maxLength > promptLength else {
            throw ModelError.invalidInput(
                "the prompt is \(promptLength) tokens long but max_length is \(maxLength); raise max_length or set max_new_tokens")
        }
        return maxLength - promptLength
    }
}

extension GenerationConfig: Decodable {
    enum CodingKeys: String, CodingKey {
        case maxNewTokens = "max_new_tokens", maxLength = "max_length", minNewTokens = "min_new_tokens"
        case minLength = "min_length", doSample = "do_sample", temperature, topK = "top_k", topP = "top_p"
        case minP = "min_p", repetitionPenalty = "repetition_penalty", numBeams = "num_beams"
        case numReturnSequences = "num_return_sequences", lengthPenalty = "length_penalty"
        case earlyStopping = "early_stopping", eosTokenId = "eos_token_id", padTokenId = "pad_token_id"
        case bosTokenId = "bos_token_id", stopStrings = "stop_strings"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = GenerationConfig()
        maxNewTokens = try c.decodeIfPresent(Int.self, forKey: .maxNewTokens)
        maxLength = try c.value(.maxLength, default: defaults.maxLength)
        minNewTokens = try c.decodeIfPresent(Int.self, forKey: .minNewTokens)
        minLength = try c.value(.minLength, default: defaults.minLength)
        doSample = try c.value(.doSample, default: defaults.doSample)
        temperature = try c.value(.temperature, default: defaults.temperature)
        topK = try c.value(.topK, default: defaults.topK)
        topP = try c.value(.topP, default: defaults.topP)
        minP = try c.decodeIfPresent(Double.self, forKey: .minP)
        repetitionPenalty = try c.value(.repetitionPenalty, default: defaults.repetitionPenalty)
        numBeams = try c.value(.numBeams, default: defaults.numBeams)
        numReturnSequences = try c.value(.numReturnSequences, default: defaults.numReturnSequences)
        lengthPenalty = try c.value(.lengthPenalty, default: defaults.lengthPenalty)
        if let flag = try? c.decodeIfPresent(Bool.self, forKey: .earlyStopping) {
            earlyStopping = flag ? .always : .heuristic
        } else if let word = try c.decodeIfPresent(String.self, forKey: .earlyStopping) {
            guard word == "never" else {
                throw ModelError.invalidConfig("early_stopping is \"\(word)\", expected true, false or \"never\"", file: "")
            }
            earlyStopping = .never
        }
        eosTokenIds = try Self.ids(c, .eosTokenId)
        padTokenId = try Self.ids(c, .padTokenId).first
        bosTokenId = try Self.ids(c, .bosTokenId).first
        if let one = try? c.decodeIfPresent(String.self, forKey: .stopStrings) {
            stopStrings = [one]
        } else {
            stopStrings = try c.decodeIfPresent([String].self, forKey: .stopStrings) ?? []
        }
    }

    /// A token id field, which checkpoints give as one id, a list, or null.
    private static func ids(_ c: KeyedDecodingContainer<CodingKeys>, _ key: CodingKeys) throws -> [Int] {
        if let list = try? c.decodeIfPresent([Int].self, forKey: key) { return list }
        return try c.decodeIfPresent(Int.self, forKey: key).map { [$0] } ?? []
    }
}

extension ModelError {
    /// The same error, naming `file` where it was decoded without knowing it.
    func inFile(_ file: String) -> ModelError {
        if case let .invalidConfig(message, "") = self { return .invalidConfig(message, file: file) }
        return self
    }
}
