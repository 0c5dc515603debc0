import Foundation
import VLMTensor

/// One sequence to generate with a ``ContinuousBatcher``: greedy decoding or sampling of one continuation.
public struct BatchRequest: Sendable {
    /// The prompt's token ids (what the logits processors and stopping criteria see).
    public var promptIds: [Int]
    /// The prompt's input embeddings `[1, promptIds.count, hidden]` when they carry image features; nil embeds the ids.
    public var inputsEmbeds: Tensor?
    /// What identifies the prompt's positions for reusing a cached prefix: the ids for text prompts; for prompts
    /// with images, ids in which image tokens stand for the image they carry. Nil: never reused nor kept.
    public var prefixKey: [Int]?
    /// The prompt's attention mask where it marks blocks of image tokens (``ImageChatModel/attentionMask(promptIds:)``);
    /// nil: causal.
    public var attentionMask: [Int]?
    /// Sampling settings and limits; `numBeams` and `numReturnSequences` must be 1.
    public var config: GenerationConfig
    public var stoppingCriteria: [any StoppingCriterion]
    public var seed: UInt64
    /// Report the chosen token's log-probability and this many most likely alternatives; nil reports none.
    public var topLogprobs: Int?
    /// Generation stops, reason ``BatchFinishReason/timeout``, once this time has passed.
    public var deadline: ContinuousClock.Instant?
    /// What the tokens must follow (a grammar); the sequence stops when it allows no token.
    public var constraint: (any GenerationConstraint)?

    public init(promptIds: [Int], inputsEmbeds: Tensor? = nil, prefixKey: [Int]? = nil, attentionMask: [Int]? = nil,
                config: GenerationConfig,
                stoppingCriteria: [any StoppingCriterion] = [], seed: UInt64 = 0, topLogprobs: Int? = nil,
                deadline: ContinuousClock.Instant? = nil, constraint: (any GenerationConstraint)? = nil) {
        self.promptIds = promptIds
        self.inputsEmbeds = inputsEmbeds
        self.prefixKey = prefixKey
        self.attentionMask = attentionMask
        self.config = config
        self.stoppingCriteria = stoppingCriteria
        self.seed = seed
        self.topLogprobs = topLogprobs
        self.deadline = deadline
        self.constraint = constraint
    }
}

/// A generated token with, when asked for, its log-probability under the model (log-softmax of the raw logits, before
/// any sampling setting) and the most likely tokens at that step.
public struct BatchToken: Sendable, Equatable {
    public var id: Int
    public var logprob: Float?
    public var topLogprobs: [TokenLogprob]
}

public struct TokenLogprob: Sendable, Equatable {
    public var id: Int
    public var logprob: Float
}

public enum BatchFinishReason: Sendable, Equatable {
    /// An eos token or a stopping criterion ended the sequence.
    case stop
    /// The new-token limit was reached.
    case length
    /// The request's deadline passed.
    case timeout
}

public enum BatchEvent: Sendable, Equatable {
    /// The prompt has run; `promptTokens` of its tokens came from a cached prefix.
    case started(cachedPromptTokens: Int)
    case token(BatchToken)
    case finished(BatchFinishReason)
}

/// Refusals of ``ContinuousBatcher/submit(_:)``.
public enum BatchError: Error, Equatable, CustomStringConvertible {
    /// `limit` requests already wait.
    case queueFull(limit: Int)
    /// The prompt and its new tokens need more KV cache than the whole budget.
    case exceedsCacheBudget(positions: Int, budgetPositions: Int)
    case unsupported(String)

    public var description: String {
        switch self {
        case .queueFull(let limit): "the queue is full (\(limit) requests waiting); retry later"
        case let .exceedsCacheBudget(positions, budget):
            "the prompt and max_tokens need \(positions) KV cache positions, more than the \(budget) the server's KV cache budget holds"
        case .unsupported(let what): what
        }
    }
}

/// Continuous batching for one decoder: sequences join the running batch and leave it at token boundaries, and each
/// step feeds every running sequence's last token through one forward pass, so that concurrent requests share each
/// read of the weights (what makes a memory-bound decoder serve many clients at little extra cost).
///
/// A new sequence's prompt runs alone (reusing the longest cached prefix it shares with an earlier prompt), then its
/// keys and values join the batch's cache right-aligned with the others', the positions before them masked as
/// padding; each row keeps its own position ids, so a row's tokens are those it would get decoding alone. The batch
/// cache is rebuilt only when sequences join (finished rows ride along until then, or until they are the majority).
/// All model work runs on one thread of its own; callers only submit and read their stream.
public final class ContinuousBatcher: Sendable {
    private let engine: BatchEngine

    public var model: any CausalLanguageModel { engine.model }
    public var maxBatch: Int { engine.maxBatch }
    public var maxQueue: Int { engine.maxQueue }
    /// The KV cache budget in positions (of one row), shared by the running batch and the kept prefixes.
    public var budgetPositions: Int { engine.budgetPositions }

    /// - Parameters:
    ///   - maxBatch: the most sequences decoded together.
    ///   - maxQueue: the most requests waiting to join; more are refused with ``BatchError/queueFull(limit:)``.
    ///   - cacheBytes: the KV cache budget; a quarter of it at most keeps prompt prefixes for reuse.
    public init(model: any CausalLanguageModel, maxBatch: Int = 8, maxQueue: Int = 64, cacheBytes: Int = 512 << 20) throws {
        engine = try BatchEngine(model: model, maxBatch: maxBatch, maxQueue: maxQueue, cacheBytes: cacheBytes)
    }

    /// The loop's thread ends once the running sequences do.
    deinit { engine.shutdown() }

    /// Stops the loop once the running sequences end; later submissions are refused.
    public func shutdown() { engine.shutdown() }

    /// Requests waiting to join the batch.
    public var queueLength: Int { engine.queueLength }

    /// Sequences being decoded.
    public var runningCount: Int { engine.runningCount }

    /// Tokens generated since the batcher started, for every sequence (those whose consumer left included).
    public var generatedTokens: Int { engine.generatedTokens }

    /// Queues `request`; its events arrive on the stream, ending with `.finished` or an error. Cancelling the
    /// consumer (ending the stream) removes the sequence at the next token boundary.
    public func submit(_ request: BatchRequest) throws -> AsyncThrowingStream<BatchEvent, any Error> {
        try engine.submit(request)
    }
}

/// What ``ContinuousBatcher`` runs: the queue, the loop on a thread of its own (which holds the engine until it
/// ends), the kept prefixes.
private final class BatchEngine: @unchecked Sendable {
    let model: any CausalLanguageModel
    let maxBatch: Int
    let maxQueue: Int
    let budgetPositions: Int

    private let condition = NSCondition()
    private var pending: [Submission] = []
    private var running = 0
    private var stopped = false
    private let prefixes: PrefixStore
    private let tally = TokenTally()

    init(model: any CausalLanguageModel, maxBatch: Int = 8, maxQueue: Int = 64, cacheBytes: Int = 512 << 20) throws {
        guard maxBatch > 0, maxQueue >= 0, cacheBytes > 0 else {
            throw ModelError.invalidInput("continuous batching needs maxBatch > 0, maxQueue >= 0 and a positive cache budget")
        }
        self.model = model
        self.maxBatch = maxBatch
        self.maxQueue = maxQueue
        let bytesPerPosition = try model.makeCache(batch: 1, capacity: 1).bytesPerPosition
        budgetPositions = max(cacheBytes / bytesPerPosition, 1)
        prefixes = PrefixStore(budgetPositions: budgetPositions / 4)
        let thread = Thread { [self] in loop() }
        thread.name = "vlm-batcher"
        thread.stackSize = 8 << 20
        thread.start()
    }

    func shutdown() {
        condition.lock()
        stopped = true
        condition.broadcast()
        condition.unlock()
    }

    var queueLength: Int {
        condition.lock()
        defer { condition.unlock() }
        return pending.count
    }

    var generatedTokens: Int { tally.count }

    var runningCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return running
    }

    func submit(_ request: BatchRequest) throws -> AsyncThrowingStream<BatchEvent, any Error> {
        guard request.config.numBeams == 1, request.config.numReturnSequences == 1 else {
            throw BatchError.unsupported("continuous batching generates one sequence per request, without beams")
        }
        try request.config.validate()
        guard !request.promptIds.isEmpty else { throw ModelError.invalidInput("generation needs a non-empty prompt") }
        if let embeds = request.inputsEmbeds, embeds.rank != 3 || embeds.shape[0] != 1 || embeds.shape[1] != request.promptIds.count {
            throw ModelError.invalidInput("inputs_embeds must be [1, \(request.promptIds.count), hidden], got \(embeds.shape)")
        }
        try checkPromptAttentionMask(request.attentionMask, promptLength: request.promptIds.count)
        let newTokens = try request.config.newTokenLimit(promptLength: request.promptIds.count)
        let (positions, overflow) = request.promptIds.count.addingReportingOverflow(newTokens)
        guard !overflow, positions <= budgetPositions else {
            throw BatchError.exceedsCacheBudget(positions: overflow ? .max : positions, budgetPositions: budgetPositions)
        }
        let (stream, continuation) = AsyncThrowingStream<BatchEvent, any Error>.makeStream()
        let submission = Submission(request: request, newTokens: newTokens, continuation: continuation, tally: tally)
        continuation.onTermination = { [weak submission] termination in
            if case .cancelled = termination { submission?.cancel() }
        }
        condition.lock()
        defer { condition.unlock() }
        guard !stopped else { throw BatchError.unsupported("the batcher has shut down") }
        guard pending.count < maxQueue else { throw BatchError.queueFull(limit: maxQueue) }
        pending.append(submission)
        condition.signal()
        return stream
    }

    // MARK: The loop (its own thread)

    private func loop() {
        var batch = RunningBatch()
        while true {
            condition.lock()
            if pending.isEmpty && batch.rows.isEmpty && !stopped {
                // Idle: no OpenMP workers kept spinning or counted against other threads' work meanwhile (see
                // releaseParallelWorkers); the next request starts new ones, a fraction of a millisecond.
                condition.unlock()
                releaseParallelWorkers()
                condition.lock()
            }
            while pending.isEmpty && batch.rows.isEmpty && !stopped { condition.wait() }
            if stopped && pending.isEmpty && batch.rows.isEmpty {
                condition.unlock()
                return
            }
            // Admit what fits: the rebuilt batch must stay within the budget with everyone's remaining tokens.
            var joining: [Submission] = []
            while let next = pending.first, batch.liveCount + joining.count < maxBatch,
                  batch.liveCount == 0 && joining.isEmpty || admits(joining + [next], into: batch) {
                joining.append(pending.removeFirst())
            }
            condition.unlock()

            var joined: [Row] = []
            for submission in joining {
                if submission.isCancelled {
                    submission.continuation.finish()
                    continue
                }
                do {
                    if let row = try prefill(submission) { joined.append(row) }
                } catch {
                    submission.continuation.finish(throwing: error)
                }
            }
            batch.dropFinished(whenAlone: joined.isEmpty)
            do {
                try batch.rebuild(adding: joined)
                publishRunning(batch.liveCount)
                if !batch.rows.isEmpty {
                    try batch.step(model: model)
                    keepConversations(of: batch)
                }
            } catch {
                for row in batch.rows where !row.done { row.submission.continuation.finish(throwing: error) }
                batch = RunningBatch()
            }
            publishRunning(batch.liveCount)
        }
    }

    private func publishRunning(_ count: Int) {
        condition.lock()
        running = count
        condition.unlock()
    }

    /// Whether the batch stays within the cache budget with `joining` added, and within the length up to which the
    /// model's rows do not depend on each other (a longer one runs alone).
    private func admits(_ joining: [Submission], into batch: RunningBatch) -> Bool {
        let (rows, width) = batch.shape(adding: joining)
        if let limit = model.batchInvariantLength, width > limit { return false }
        let prefill = joining.reduce(0) { $0 + $1.request.promptIds.count }
        return rows * width + prefill + prefixes.storedPositions <= budgetPositions
    }

    /// Keeps the cache of each sequence that ended in this step (its prompt and all its tokens but the last, which
    /// never ran) for a next turn of the conversation, whose prompt starts with them.
    private func keepConversations(of batch: RunningBatch) {
        for (index, row) in batch.rows.enumerated() where row.done && !row.kept {
            row.kept = true
            guard let key = row.submission.request.prefixKey, let cache = batch.cache, !row.submission.isCancelled,
                  row.cachedCount <= prefixes.budgetPositions else { continue }
            let positions = key + row.generatedIds.dropLast()
            guard positions.count == row.cachedCount,
                  let copy = try? KVCache.packing([KVCache.PackedRow(cache: cache, row: index, count: row.cachedCount)],
                                                  capacity: row.cachedCount) else { continue }
            prefixes.keep(key: positions, cache: copy)
        }
    }

    /// Runs a new sequence's prompt alone (after its longest cached prefix) and chooses its first token; nil when
    /// that token already ends it.
    private func prefill(_ submission: Submission) throws -> Row? {
        let request = submission.request
        let count = request.promptIds.count
        let cache = try model.makeCache(batch: 1, capacity: count)
        let reused = request.prefixKey.map { prefixes.restore(key: $0, into: cache, limit: count - 1) } ?? 0
        let embeds: Tensor
        if let whole = request.inputsEmbeds {
            embeds = reused == 0 ? whole : positions(of: whole, from: reused)
        } else {
            embeds = try model.embed([Array(request.promptIds[reused...])])
        }
        let logits = try model.logits(inputsEmbeds: embeds, attentionMask: request.attentionMask.map { [$0] }, positionIds: nil,
                                      cache: cache, lastPositionOnly: true)
        if let key = request.prefixKey { prefixes.keep(key: key, cache: cache) }
        submission.continuation.yield(.started(cachedPromptTokens: reused))
        let row = Row(submission: submission, cache: cache)
        row.choose(logits: UnsafeBufferPointer(start: logits.storage.pointer, count: logits.count))
        withExtendedLifetime(logits) {}
        return row.done ? nil : row
    }

    /// `x [1, T, hidden]` from position `start` on.
    private func positions(of x: Tensor, from start: Int) -> Tensor {
        let width = x.shape[2], count = x.shape[1] - start
        let output = Tensor(uninitialized: [1, count, width])
        output.storage.pointer.initialize(from: x.storage.pointer + start * width, count: count * width)
        return output
    }
}

/// A request as the loop holds it.
private final class Submission: @unchecked Sendable {
    let request: BatchRequest
    let newTokens: Int
    let continuation: AsyncThrowingStream<BatchEvent, any Error>.Continuation
    let tally: TokenTally
    private let lock = NSLock()
    private var cancelled = false

    init(request: BatchRequest, newTokens: Int, continuation: AsyncThrowingStream<BatchEvent, any Error>.Continuation,
         tally: TokenTally) {
        self.request = request
        self.newTokens = newTokens
        self.continuation = continuation
        self.tally = tally
    }

    func cancel() {
        lock.lock()
        cancelled = true
        lock.unlock()
    }

    var isCancelled: Bool {
        lock.lock()
        defer { lock.unlock() }
        return cancelled
    }
}

/// A count shared between the loop and readers.
private final class TokenTally: @unchecked Sendable {
    private let lock = NSLock()
    private var value = 0
    func add() { lock.withLock { value += 1 } }
    var count: Int { lock.withLock { value } }
}

/// One sequence of the running batch: its sampling state, and where its keys and values are.
private final class Row {
    let submission: Submission
    private let processors: [any LogitsProcessor]
    private let constraint: (any TokenConstraint)?
    private var generator: SeededGenerator
    private var history: TokenHistory
    private let eos: Set<Int>
    /// The cache its positions are in (its prefill cache until it joins a batch), its row there, and how many
    /// positions it has (the last ones stored).
    var source: KVCache
    var sourceRow = 0
    var cachedCount: Int
    var generated = 0
    var lastToken = 0
    var done = false
    /// Whether its cache was considered for keeping once it ended.
    var kept = false

    init(submission: Submission, cache: KVCache) {
        self.submission = submission
        let config = submission.request.config
        processors = config.logitsProcessors
        constraint = submission.request.constraint?.start()
        generator = SeededGenerator(seed: submission.request.seed)
        history = TokenHistory(tokens: submission.request.promptIds, promptLength: submission.request.promptIds.count)
        eos = Set(config.eosTokenIds)
        source = cache
        cachedCount = cache.length
    }

    /// Picks the next token from this row's logits (copied once, for the logits processors), reports it, and decides
    /// whether the sequence ends.
    func choose(logits: UnsafeBufferPointer<Float>) {
        let request = submission.request
        if submission.isCancelled {
            finish(nil)
            return
        }
        var scores = Array(logits)
        let raw = request.topLogprobs != nil ? logSoftmax(scores) : []
        guard let token = chooseToken(&scores, processors: processors, constraint: constraint, history: history,
                                      sampling: request.config.doSample, generator: &generator) else {
            finish(.stop)
            return
        }
        history.tokens.append(token)
        generated += 1
        submission.tally.add()
        lastToken = token
        var reported = BatchToken(id: token, logprob: nil, topLogprobs: [])
        if let top = request.topLogprobs {
            reported.logprob = raw[token]
            reported.topLogprobs = mostLikely(raw, count: top)
        }
        submission.continuation.yield(.token(reported))
        if eos.contains(token) || request.stoppingCriteria.contains(where: { $0.shouldStop(history) }) {
            finish(.stop)
        } else if generated >= submission.newTokens {
            finish(.length)
        } else if let deadline = request.deadline, ContinuousClock.now >= deadline {
            finish(.timeout)
        }
    }

    /// Ends the sequence; nil ends it silently (the consumer went away).
    func finish(_ reason: BatchFinishReason?) {
        guard !done else { return }
        done = true
        if let reason { submission.continuation.yield(.finished(reason)) }
        submission.continuation.finish()
    }

    var remaining: Int { submission.newTokens - generated }

    var generatedIds: ArraySlice<Int> { history.tokens.suffix(generated) }
}

/// The `count` highest log-probabilities, best first (ties by lower id).
func mostLikely(_ logprobs: [Float], count: Int) -> [TokenLogprob] {
    largestIndices(logprobs, count: count).map { TokenLogprob(id: $0, logprob: logprobs[$0]) }
}

/// The sequences being decoded together and their shared, right-aligned KV cache.
private struct RunningBatch {
    var rows: [Row] = []
    var cache: KVCache?
    var masks: [[Int]] = []

    var liveCount: Int { rows.count { !$0.done } }

    /// The rows and the positions per row the batch needs if `joining` join: every live row padded to the longest,
    /// with room for the most remaining tokens.
    func shape(adding joining: [Submission]) -> (rows: Int, width: Int) {
        let live = rows.filter { !$0.done }
        let lengths = live.map(\.cachedCount) + joining.map(\.request.promptIds.count)
        let remaining = live.map(\.remaining) + joining.map(\.newTokens)
        return (lengths.count, (lengths.max() ?? 0) + (remaining.max() ?? 0))
    }

    /// Forgets finished and cancelled rows: always when nothing joins but they outnumber the live ones, otherwise
    /// at the rebuild.
    mutating func dropFinished(whenAlone: Bool) {
        for row in rows where !row.done && row.submission.isCancelled { row.finish(nil) }
        guard whenAlone else { return }
        let finished = rows.count { $0.done }
        if finished > 0 && (finished * 2 > rows.count || finished == rows.count) {
            try? repack(rows.filter { !$0.done })
        }
    }

    /// Adds the newly prefilled rows, dropping finished ones, when any joined.
    mutating func rebuild(adding joined: [Row]) throws {
        guard !joined.isEmpty else { return }
        try repack(rows.filter { !$0.done } + joined)
    }

    private mutating func repack(_ kept: [Row]) throws {
        rows = kept
        guard !kept.isEmpty else {
            cache = nil
            masks = []
            return
        }
        let length = kept.map(\.cachedCount).max()!
        let capacity = length + kept.map(\.remaining).max()!
        let packed = try KVCache.packing(kept.map { KVCache.PackedRow(cache: $0.source, row: $0.sourceRow, count: $0.cachedCount) },
                                         capacity: capacity)
        for (index, row) in kept.enumerated() {
            row.source = packed
            row.sourceRow = index
        }
        cache = packed
        masks = kept.map { Array(repeating: 0, count: length - $0.cachedCount) + Array(repeating: 1, count: $0.cachedCount) }
    }

    /// Feeds every row's last token (finished rows repeat theirs: rows never attend to each other) and lets each live
    /// row choose its next one.
    mutating func step(model: any CausalLanguageModel) throws {
        guard let cache else { return }
        for index in masks.indices { masks[index].append(1) }
        let logits: Tensor
        if rows.count == 1, cache.batch == 1, rows[0].cachedCount == cache.length, masks[0].allSatisfy({ $0 == 1 }) {
            // One row without padding, at the positions its cache holds: what a step by token alone computes.
            logits = try model.logits(nextToken: rows[0].lastToken, cache: cache)
        } else {
            logits = try model.logits(inputIds: rows.map { [$0.lastToken] }, attentionMask: masks,
                                      positionIds: rows.map { [$0.cachedCount] }, cache: cache, lastPositionOnly: true)
        }
        let size = model.vocabularySize
        for (index, row) in rows.enumerated() {
            row.cachedCount += 1
            if !row.done { row.choose(logits: UnsafeBufferPointer(start: logits.storage.pointer + index * size, count: size)) }
        }
        withExtendedLifetime(logits) {}
    }
}

/// Prompt caches kept after their prefill, for later prompts that start the same way (a shared system prompt, a
/// conversation's earlier turns, an image already seen), least recently used dropped first.
private final class PrefixStore: @unchecked Sendable {
    private struct Entry {
        var key: [Int]
        var cache: KVCache
        var lastUse: Int
    }

    let budgetPositions: Int
    private var entries: [Entry] = []
    private var clock = 0
    private let lock = NSLock()

    init(budgetPositions: Int) { self.budgetPositions = budgetPositions }

    var storedPositions: Int {
        lock.lock()
        defer { lock.unlock() }
        return entries.reduce(0) { $0 + $1.cache.length }
    }

    /// Copies the longest stored prefix of `key` (at most `limit` positions) into the empty `cache`; returns its length.
    func restore(key: [Int], into cache: KVCache, limit: Int) -> Int {
        lock.lock()
        defer { lock.unlock() }
        var best: (index: Int, length: Int)?
        for (index, entry) in entries.enumerated() {
            let common = min(zip(entry.key, key).prefix { $0 == $1 }.count, limit, entry.cache.length)
            if common > (best?.length ?? 0) { best = (index, common) }
        }
        guard let best, (try? entries[best.index].cache.copyStored(into: cache, count: best.length)) != nil else { return 0 }
        clock += 1
        entries[best.index].lastUse = clock
        return best.length
    }

    /// Keeps a prompt's cache (replacing entries it extends), dropping the least recently used past the budget.
    func keep(key: [Int], cache: KVCache) {
        guard cache.length <= budgetPositions else { return }
        lock.lock()
        defer { lock.unlock() }
        entries.removeAll { $0.key.count <= key.count && key.starts(with: $0.key) }
        if entries.contains(where: { $0.key.starts(with: key) }) { return }
        clock += 1
        entries.append(Entry(key: key, cache: cache, lastUse: clock))
        while entries.reduce(0, { $0 + $1.cache.length }) > budgetPositions, entries.count > 1 {
            let oldest = entries.indices.min { entries[$0].lastUse < entries[$1].lastUse }!
            entries.remove(at: oldest)
        }
    }
}
