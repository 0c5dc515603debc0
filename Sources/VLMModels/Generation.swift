import Foundation
import VLMTensor

/// A decoder-only language model that ``generate(inputIds:attentionMask:config:stoppingCriteria:seed:onStep:)`` can drive:
/// Llama-family, OPT and GPT-2 decoders conform.
public protocol CausalLanguageModel: AnyObject, Sendable {
    /// Size of the logits' last dimension.
    var vocabularySize: Int { get }
    /// Rows of the embedding table for `ids` (`[B][T]`, equal lengths): `[B, T, hidden]`.
    func embed(_ ids: [[Int]]) throws -> Tensor
    /// An empty cache for `batch` rows and up to `capacity` positions (prompt plus new tokens).
    func makeCache(batch: Int, capacity: Int) throws -> KVCache
    /// Logits `[B, T, vocabularySize]` for input embeddings `[B, T, hidden]`, or `[B, 1, vocabularySize]` with
    /// `lastPositionOnly`.
    ///
    /// - Parameters:
    ///   - attentionMask: `[B][cached + T]`, 1 for tokens and 0 for padding; nil means all tokens. A run of one value
    ///     of 2 or more marks a block whose positions also see each other's later ones (Gemma 3's images, as its
    ///     `token_type_ids` make them); decoders without such blocks read it as 1.
    ///   - positionIds: `[B][T]`; nil means `cached ..< cached + T` for every row, as transformers' forward.
    ///   - cache: extended in place by the `T` new positions.
    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool) throws -> Tensor
    /// The longest row (cached positions, padding included, plus new ones) up to which each row of a batch computes
    /// exactly what it would alone; nil: any length. Dynamic RoPE takes its frequencies from the batch's largest
    /// position, so past it rows depend on each other.
    var batchInvariantLength: Int? { get }
    /// The most positions the model was made for (`max_position_embeddings`), nil where it sets none.
    var contextLength: Int? { get }
    /// What the caches of `makeCache(batch:capacity:)` hold keys and values in.
    var cacheElementType: KVCache.ElementType { get }
    /// The logits `[1, 1, vocabularySize]` of `token` after the positions a one-row `cache` holds, the cache extended
    /// by it: `logits(inputIds: [[token]], cache: cache)`. A decoder whose steps run fused allocates nothing here
    /// from the cache's second step on; its logits are then one of two rows the cache keeps, the one no caller holds.
    func logits(nextToken token: Int, cache: KVCache) throws -> Tensor
}

extension CausalLanguageModel {
    public var batchInvariantLength: Int? { nil }
    public var contextLength: Int? { nil }
    public var cacheElementType: KVCache.ElementType { .float32 }
}

extension CausalLanguageModel {
    public func logits(nextToken token: Int, cache: KVCache) throws -> Tensor {
        try logits(inputIds: [[token]], cache: cache)
    }

    /// Logits for token ids; see ``logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``.
    public func logits(inputIds: [[Int]], attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        try logits(inputsEmbeds: embed(inputIds), attentionMask: attentionMask, positionIds: positionIds, cache: cache,
                   lastPositionOnly: lastPositionOnly)
    }
}

/// What generation shows of its work beyond the tokens: each row's logits for its first new token as the model gives
/// them, before any logits processor (transformers' `generate(output_logits=True).logits[0]`), in the order rows are
/// generated; greedy decoding and sampling only. Generation records into ``current``, set around a task's calls:
/// what observes a generation is the caller's business, not that of every model and pipeline between them.
public final class GenerationRecorder: @unchecked Sendable {
    /// The recorder generation writes to in this task, if any.
    @TaskLocal public static var current: GenerationRecorder?

    private let lock = NSLock()
    private var firstSteps: [[Float]] = []

    public init() {}

    /// Every first-step logits row recorded so far.
    public var firstStepLogits: [[Float]] { lock.withLock { firstSteps } }

    func recordFirstStep(_ logits: [Float]) { lock.withLock { firstSteps.append(logits) } }
}

/// What ``CausalLanguageModel/generate(inputIds:attentionMask:config:stoppingCriteria:seed:onStep:)`` returns.
public struct GenerationOutput: Sendable, Equatable {
    /// The new tokens of each returned sequence (`numReturnSequences` per prompt, prompt by prompt), each ending
    /// with the eos token that stopped it, if one did.
    public var sequences: [[Int]]
    /// Beam search only: each sequence's length-penalized log-probability (transformers' `sequences_scores`).
    public var scores: [Float]
}

/// When generation stops, for ``CausalLanguageModel/generate(inputIds:attentionMask:options:)``.
public struct GenerationOptions: Sendable {
    /// At most this many new tokens per row.
    public var maxNewTokens: Int
    /// A row stops after producing any of these; empty means it runs to `maxNewTokens`.
    public var eosTokenIds: Set<Int>

    public init(maxNewTokens: Int = 20, eosTokenIds: [Int] = []) {
        self.maxNewTokens = maxNewTokens
        self.eosTokenIds = Set(eosTokenIds)
    }
}

extension CausalLanguageModel {
    /// Greedy continuation of a left-padded batch: each row's new tokens.
    public func generate(inputIds: [[Int]], attentionMask: [[Int]]? = nil, options: GenerationOptions) throws -> [[Int]] {
        var config = GenerationConfig()
        config.maxNewTokens = options.maxNewTokens
        config.eosTokenIds = options.eosTokenIds.sorted()
        return try generate(inputIds: inputIds, attentionMask: attentionMask, config: config).sequences
    }

    /// Continues a left-padded batch of prompts as transformers' `generate` does with `config`: greedy decoding,
    /// sampling or beam search, its logits processors, and its stopping rules (max length, eos ids, stop criteria).
    ///
    /// The prompt is prefilled in one pass, then each step feeds one token per row through a KV cache allocated
    /// once for the whole generation. Positions follow transformers: each row counts its own tokens from 0,
    /// padding ignored.
    /// - Parameters:
    ///   - stoppingCriteria: more reasons to end a row (``StopStringCriterion`` for `config.stopStrings`).
    ///   - seed: seeds the ``SeededGenerator`` that sampling draws from.
    ///   - onStep: called after each step of greedy decoding or sampling with every row's new token (nil for rows
    ///     already finished); throwing from it ends generation with that error. Beam search does not call it.
    ///   - constraint: what each row's tokens must follow (a grammar); a row stops where it allows no token. Not
    ///     with beam search.
    public func generate(inputIds: [[Int]], attentionMask: [[Int]]? = nil, config: GenerationConfig,
                         stoppingCriteria: [any StoppingCriterion] = [], seed: UInt64 = 0,
                         constraint: (any GenerationConstraint)? = nil,
                         onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        try generate(inputsEmbeds: embed(inputIds), promptIds: inputIds, attentionMask: attentionMask, config: config,
                     stoppingCriteria: stoppingCriteria, seed: seed, constraint: constraint, onStep: onStep)
    }

    /// ``generate(inputIds:attentionMask:config:stoppingCriteria:seed:onStep:)`` from input embeddings
    /// `[B, T, hiddenSize]`, for prompts whose embeddings carry image features.
    ///
    /// - Parameter promptIds: the prompt's token ids where known (`[B][T]`), which the repetition penalty and stop
    ///   strings see as transformers does; nil means they see only new tokens.
    public func generate(inputsEmbeds: Tensor, promptIds: [[Int]]? = nil, attentionMask: [[Int]]? = nil,
                         config: GenerationConfig, stoppingCriteria: [any StoppingCriterion] = [], seed: UInt64 = 0,
                         constraint: (any GenerationConstraint)? = nil,
                         onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        guard inputsEmbeds.rank == 3, inputsEmbeds.shape[0] > 0, inputsEmbeds.shape[1] > 0 else {
            throw ModelError.invalidInput("generation needs a non-empty prompt, got inputs_embeds \(inputsEmbeds.shape)")
        }
        try config.validate()
        let (batch, promptLength) = (inputsEmbeds.shape[0], inputsEmbeds.shape[1])
        let mask = attentionMask ?? Array(repeating: Array(repeating: 1, count: promptLength), count: batch)
        guard mask.count == batch, mask.allSatisfy({ $0.count == promptLength }) else {
            throw ModelError.invalidInput("the attention mask must be [\(batch)][\(promptLength)]")
        }
        guard mask.allSatisfy({ $0.contains { $0 != 0 } }) else {
            throw ModelError.invalidInput("every row of the attention mask needs at least one token")
        }
        if let promptIds, promptIds.count != batch || promptIds.contains(where: { $0.count != promptLength }) {
            throw ModelError.invalidInput("the prompt ids must be [\(batch)][\(promptLength)]")
        }
        let newTokens = try config.newTokenLimit(promptLength: promptLength)
        guard promptLength.addingReportingOverflow(newTokens).overflow == false else {
            throw ModelError.invalidInput("max_new_tokens \(newTokens) is out of range")
        }
        // Beam search and several samples per prompt run the prompt once per row they need, as transformers expands it.
        let copies = config.numBeams > 1 ? config.numBeams : config.numReturnSequences
        let prompt = GenerationPrompt(embeds: repeatRows(inputsEmbeds, copies), mask: mask.repeatingRows(copies),
                                      ids: promptIds?.repeatingRows(copies), length: promptLength)
        if newTokens == 0 {
            return GenerationOutput(sequences: Array(repeating: [], count: batch * config.numReturnSequences), scores: [])
        }
        if config.numBeams > 1 {
            guard !config.doSample else {
                throw ModelError.invalidInput("beam sampling (do_sample with num_beams > 1) is not supported")
            }
            guard constraint == nil else {
                throw ModelError.invalidInput("beam search under a grammar (num_beams > 1 with a grammar) is not supported")
            }
            return try beamSearch(prompt: prompt, batch: batch, newTokens: newTokens, config: config, criteria: stoppingCriteria)
        }
        return try sample(prompt: prompt, newTokens: newTokens, config: config, criteria: stoppingCriteria, seed: seed,
                          constraint: constraint, onStep: onStep)
    }

    /// Continues one prompt of which `cache` already holds the first `cache.length` tokens (a conversation's
    /// earlier turns): only the rest of the prompt runs before generation proceeds as in
    /// ``generate(inputIds:attentionMask:config:stoppingCriteria:seed:onStep:)``. Greedy decoding or sampling of one
    /// sequence; the cache needs room for the prompt and `config`'s new tokens, and ends up holding every token
    /// that was run (the prompt and all new tokens but the last).
    ///
    /// - Parameters:
    ///   - inputsEmbeds: the embeddings of the prompt's positions after the cached ones
    ///     (`[1, inputIds.count - cache.length, hidden]`), for prompts whose embeddings carry image features; nil
    ///     embeds `inputIds`.
    ///   - attentionMask: the whole prompt's (`[inputIds.count]`), for prompts with blocks (see
    ///     ``logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``); nil means all tokens.
    public func generate(continuing cache: KVCache, inputIds: [Int], inputsEmbeds: Tensor? = nil, attentionMask: [Int]? = nil,
                         config: GenerationConfig,
                         stoppingCriteria: [any StoppingCriterion] = [], seed: UInt64 = 0,
                         constraint: (any GenerationConstraint)? = nil,
                         onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        try config.validate()
        guard config.numBeams == 1, config.numReturnSequences == 1 else {
            throw ModelError.invalidInput("continuing a KV cache generates one sequence without beams")
        }
        guard cache.batch == 1, cache.length < inputIds.count else {
            throw ModelError.invalidInput(
                "continuing a KV cache of \(cache.batch) rows holding \(cache.length) positions needs one row and a longer prompt than that (got \(inputIds.count) tokens)")
        }
        let newTokens = try config.newTokenLimit(promptLength: inputIds.count)
        guard inputIds.count.addingReportingOverflow(newTokens).overflow == false,
              inputIds.count + newTokens <= cache.capacity else {
            throw ModelError.invalidInput(
                "a prompt of \(inputIds.count) tokens and \(newTokens) new ones do not fit a KV cache of \(cache.capacity) positions")
        }
        let uncached = inputIds.count - cache.length
        if let inputsEmbeds, inputsEmbeds.rank != 3 || inputsEmbeds.shape[0] != 1 || inputsEmbeds.shape[1] != uncached {
            throw ModelError.invalidInput("inputs_embeds must be [1, \(uncached), hidden] for the \(uncached) uncached prompt tokens, got \(inputsEmbeds.shape)")
        }
        try checkPromptAttentionMask(attentionMask, promptLength: inputIds.count)
        if newTokens == 0 { return GenerationOutput(sequences: [[]], scores: []) }
        let prompt = GenerationPrompt(embeds: try inputsEmbeds ?? embed([Array(inputIds[cache.length...])]),
                                      mask: [attentionMask ?? Array(repeating: 1, count: inputIds.count)], ids: [inputIds],
                                      length: inputIds.count)
        return try sample(prompt: prompt, newTokens: newTokens, config: config, criteria: stoppingCriteria, seed: seed,
                          constraint: constraint, cache: cache, onStep: onStep)
    }

    /// Greedy decoding, or sampling with `config.doSample` (transformers' `_sample`). With `cache`, the prompt's
    /// embeddings are those of its positions after the ones the cache holds.
    private func sample(prompt: GenerationPrompt, newTokens: Int, config: GenerationConfig, criteria: [any StoppingCriterion],
                        seed: UInt64, constraint: (any GenerationConstraint)?, cache: KVCache? = nil,
                        onStep: (([Int?]) throws -> Void)?) throws -> GenerationOutput {
        let rows = prompt.mask.count
        let processors = config.logitsProcessors
        let constraints = (0..<rows).map { _ in constraint?.start() }
        var generator = SeededGenerator(seed: seed)
        var step = try DecodingState(model: self, prompt: prompt, rows: rows, capacity: prompt.length + newTokens, cache: cache)
        var histories = prompt.histories
        var generated = Array(repeating: [Int](), count: rows)
        var finished = Array(repeating: false, count: rows)
        let eos = Set(config.eosTokenIds)
        for index in 0..<newTokens {
            var tokens = [Int?](repeating: nil, count: rows)
            for row in 0..<rows where !finished[row] {
                var scores = step.scores(row: row)
                if index == 0 { GenerationRecorder.current?.recordFirstStep(scores) }
                guard let token = chooseToken(&scores, processors: processors, constraint: constraints[row],
                                              history: histories[row], sampling: config.doSample, generator: &generator) else {
                    finished[row] = true
                    continue
                }
                tokens[row] = token
                generated[row].append(token)
                histories[row].tokens.append(token)
                finished[row] = eos.contains(token) || criteria.contains { $0.shouldStop(histories[row]) }
            }
            try onStep?(tokens)
            if index == newTokens - 1 || !finished.contains(false) { break }
            // Finished rows keep being fed their last token; rows never attend to each other, so it changes nothing.
            // (A row the constraint ended before its first token is fed token 0, as unused.)
            try step.advance(tokens: generated.map { $0.last ?? 0 })
        }
        return GenerationOutput(sequences: generated, scores: [])
    }
}

/// A prompt as generation runs it: embeddings `[rows, length, hidden]`, the attention mask and, where known, ids.
struct GenerationPrompt {
    var embeds: Tensor
    var mask: [[Int]]
    var ids: [[Int]]?
    var length: Int

    /// Each row's tokens for the logits processors: the ids with their padding, or nothing for embeddings alone.
    var histories: [TokenHistory] {
        mask.enumerated().map { row, flags in
            let padding = flags.firstIndex { $0 != 0 } ?? 0
            return ids.map { TokenHistory(tokens: $0[row], paddingLength: padding, promptLength: length) }
                ?? TokenHistory(tokens: [], promptLength: 0)
        }
    }
}

/// The model, its KV cache and the next-token scores of every row, one step at a time.
struct DecodingState<Model: CausalLanguageModel> {
    let model: Model
    let cache: KVCache
    var mask: [[Int]]
    var positions: [[Int]]
    /// `[rows, 1, vocabulary]`, as the model returned them: copied out once, a row at a time, by `scores(row:)`.
    private var logits: Tensor
    /// One row without padding or blocks (a mask of ones), so its positions are those its cache holds.
    private let unpadded: Bool

    /// Runs the prompt: all of it into a new cache of `capacity` positions, or, given `cache`, the positions after
    /// those it holds (the prompt's embeddings are then just those).
    init(model: Model, prompt: GenerationPrompt, rows: Int, capacity: Int, cache: KVCache? = nil) throws {
        self.model = model
        mask = prompt.mask
        // generate()'s position_ids: cumsum(mask) - 1, padding at 0.
        positions = prompt.mask.map { row in
            var count = -1
            return Array(row.map { flag in
                if flag != 0 { count += 1 }
                return flag != 0 ? count : 0
            }.dropFirst(cache?.length ?? 0))
        }
        self.cache = try cache ?? model.makeCache(batch: rows, capacity: capacity)
        unpadded = rows == 1 && mask[0].allSatisfy { $0 == 1 }
        logits = try model.logits(inputsEmbeds: prompt.embeds, attentionMask: mask, positionIds: positions, cache: self.cache,
                                  lastPositionOnly: true)
    }

    /// Row `row`'s next-token logits.
    func scores(row: Int) -> [Float] {
        let size = model.vocabularySize
        precondition(row >= 0 && (row + 1) * size <= logits.count, "no logits for row \(row)")
        return Array(UnsafeBufferPointer(start: logits.storage.pointer + row * size, count: size))
    }

    /// Feeds one token per row.
    mutating func advance(tokens: [Int]) throws {
        for row in mask.indices {
            mask[row].append(1)
            positions[row] = [(positions[row].last ?? -1) + 1]
        }
        // One row that is all tokens, at the positions the cache holds: what a step by token alone computes.
        if unpadded, tokens.count == 1 {
            logits = try model.logits(nextToken: tokens[0], cache: cache)
            return
        }
        logits = try model.logits(inputIds: tokens.map { [$0] }, attentionMask: mask, positionIds: positions, cache: cache)
    }
}

/// The first index of the largest score (torch's `argmax`).
func argmax(_ scores: [Float]) -> Int { scores.withUnsafeBufferPointer { VLMTensor.argmax($0) } }

/// Each row of `x [B, …]` repeated `count` times in place (torch's `repeat_interleave(count, dim=0)`).
func repeatRows(_ x: Tensor, _ count: Int) -> Tensor {
    guard count > 1 else { return x }
    let rowSize = x.count / x.shape[0]
    let output = Tensor(uninitialized: [x.shape[0] * count] + x.shape.dropFirst())
    for row in 0..<x.shape[0] {
        for copy in 0..<count {
            (output.storage.pointer + (row * count + copy) * rowSize).initialize(from: x.storage.pointer + row * rowSize, count: rowSize)
        }
    }
    return output
}

extension Array {
    func repeatingRows(_ count: Int) -> [Element] { flatMap { Array(repeating: $0, count: count) } }
}

/// A single prompt's attention mask, where one is given: one nonzero entry per prompt token (a prompt of one sequence
/// has no padding; its blocks are values of 2 and more).
func checkPromptAttentionMask(_ mask: [Int]?, promptLength: Int) throws {
    if let mask, mask.count != promptLength || mask.contains(0) {
        throw ModelError.invalidInput("the attention mask must hold \(promptLength) nonzero entries, one per prompt token")
    }
}
