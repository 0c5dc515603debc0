import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// Runs `requests` through `batcher` concurrently; each request's tokens and finish reason.
private func runConcurrently(_ batcher: ContinuousBatcher, _ requests: [BatchRequest]) async throws
    -> [(tokens: [BatchToken], finish: BatchFinishReason?, cached: Int)] {
    let streams = try requests.map { try batcher.submit($0) }
    return try await withThrowingTaskGroup(of: (Int, [BatchToken], BatchFinishReason?, Int).self) { group in
        for (index, stream) in streams.enumerated() {
            group.addTask {
                var tokens: [BatchToken] = []
                var finish: BatchFinishReason?
                var cached = 0
                for try await event in stream {
                    switch event {
                    case .started(let count): cached = count
                    case .token(let token): tokens.append(token)
                    case .finished(let reason): finish = reason
                    }
                }
                return (index, tokens, finish, cached)
            }
        }
        var results = Array(repeating: (tokens: [BatchToken](), finish: BatchFinishReason?.none, cached: 0), count: streams.count)
        for try await (index, tokens, finish, cached) in group { results[index] = (tokens, finish, cached) }
        return results
    }
}

private final class TokenCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var value = 0
    func add() { lock.withLock { value += 1 } }
    var count: Int { lock.withLock { value } }
}

/// Records the most sequences `batcher` ran at once, read as its rows check whether to stop; stops none.
private final class BatchWidthProbe: StoppingCriterion, @unchecked Sendable {
    private let batcher: ContinuousBatcher
    private let lock = NSLock()
    private var most = 0

    init(_ batcher: ContinuousBatcher) { self.batcher = batcher }

    func shouldStop(_ history: TokenHistory) -> Bool {
        let running = batcher.runningCount
        lock.withLock { most = max(most, running) }
        return false
    }

    var widest: Int { lock.withLock { most } }
}

private func greedy(maxNewTokens: Int, eos: [Int] = []) -> GenerationConfig {
    var config = GenerationConfig()
    config.maxNewTokens = maxNewTokens
    config.eosTokenIds = eos
    return config
}

@Suite struct ContinuousBatchingTests {
    /// Every prompt of the oracle's greedy generations, submitted together: each row decoded in a shared batch
    /// (padded, joining and leaving at different steps) gives transformers' tokens.
    /// llama-dynamic's rows depend on each other past 6 positions (dynamic RoPE), so only transformers' one-prompt
    /// generations apply to it.
    @Test(arguments: ["opt-pre", "gpt2", "qwen2", "qwen3", "smollm3", "gemma3", "mistral-sliding", "llama-dynamic", "gqa-untied",
                      "llama3-tied", "linear-bias-mqa"])
    func batchedGreedyMatchesTransformers(name: String) async throws {
        let (model, generations, maxNewTokens): (any CausalLanguageModel, [LlamaFixture.Expected.Generation], Int)
        if LlamaFixture.names.contains(name) {
            let fixture = try LlamaFixture(name)
            (model, generations, maxNewTokens) = (fixture.model, fixture.expected.generations, fixture.expected.max_new_tokens)
        } else {
            let fixture = try DecoderFixture(name)
            (model, generations, maxNewTokens) = (fixture.model, fixture.expected.generations, fixture.expected.max_new_tokens)
        }
        let batcher = try ContinuousBatcher(model: model, maxBatch: 4)
        defer { batcher.shutdown() }
        var requests: [BatchRequest] = []
        var expected: [(tokens: [Int], eos: [Int])] = []
        for generation in generations where name != "llama-dynamic" || generation.prompts.count == 1 {
            for (prompt, tokens) in zip(generation.prompts, generation.new_tokens) {
                requests.append(BatchRequest(promptIds: prompt, config: greedy(maxNewTokens: maxNewTokens, eos: generation.eos)))
                // transformers pads finished rows after their eos; the sequence ends at it.
                let end = tokens.firstIndex { generation.eos.contains($0) }.map { $0 + 1 } ?? tokens.count
                expected.append((Array(tokens[..<end]), generation.eos))
            }
        }
        let results = try await runConcurrently(batcher, requests)
        for (index, (result, expect)) in zip(results, expected).enumerated() {
            #expect(result.tokens.map(\.id) == expect.tokens, "\(name) request \(index)")
            let stoppedByEos = expect.tokens.last.map(expect.eos.contains) ?? false
            #expect(result.finish == (stoppedByEos ? .stop : .length), "\(name) request \(index)")
        }
    }

    /// Sampling in a batch draws what sampling alone draws with the same seed, and logprobs are the model's.
    @Test func batchedSamplingMatchesAlone() async throws {
        let fixture = try LlamaFixture("gqa-untied")
        let model = fixture.model
        var config = greedy(maxNewTokens: 12)
        config.doSample = true
        config.temperature = 0.8
        config.topP = 0.9
        let prompts = [[1, 17, 45, 99, 3], [1, 8], [1, 60, 61, 62, 5, 9, 10, 11], [2, 3]]
        let batcher = try ContinuousBatcher(model: model, maxBatch: 3)
        defer { batcher.shutdown() }
        let requests = prompts.enumerated().map { BatchRequest(promptIds: $1, config: config, seed: UInt64(40 + $0), topLogprobs: 2) }
        let results = try await runConcurrently(batcher, requests)
        for (index, prompt) in prompts.enumerated() {
            let alone = try model.generate(inputIds: [prompt], config: config, seed: UInt64(40 + index)).sequences[0]
            #expect(results[index].tokens.map(\.id) == alone, "prompt \(index)")
            // The first token's log-probability from the model's logits for the prompt.
            let logits = try model.logits(inputIds: [prompt], lastPositionOnly: true).scalars
            let maximum = logits.max()!
            let logSum = log(logits.reduce(0) { $0 + exp(Double($1 - maximum)) })
            let first = try #require(results[index].tokens.first)
            #expect(abs(Double(first.logprob!) - (Double(logits[first.id] - maximum) - logSum)) < 1e-4)
            #expect(first.topLogprobs.count == 2)
            #expect(first.topLogprobs[0].logprob >= first.topLogprobs[1].logprob)
        }
    }

    /// A sequence's tokens and log-probabilities do not depend on what else is decoded beside it: rows decoded
    /// together (left-padded, joining and leaving at different steps) give the same floats as each decoded alone, in
    /// fp32 and in int8 (whose rounding of activations would turn the smallest difference into a visible one). The
    /// real SmolLM2 Q4_1 file, prompts of 60 to 180 tokens of the perplexity passage, so that each sequence's
    /// attention splits its keys in parts; and with the caches in fp16, packed and grown as halves.
    @Test(.enabled(if: SmolLM2.url != nil, Comment(rawValue: SmolLM2.skipMessage)),
          arguments: zip([MatrixPrecision.float32, .int8, .float32], [KVCache.ElementType.float32, .float32, .float16]))
    func batchedDecodingMatchesAlone(precision: MatrixPrecision, cacheType: KVCache.ElementType) async throws {
        let url = try #require(SmolLM2.url)
        let model = try KVCache.ElementType.$forNewModels.withValue(cacheType) {
            try MatrixPrecision.$forNewLayers.withValue(precision) { try LlamaForCausalLM(gguf: url) }
        }
        #expect(model.cacheElementType == cacheType)
        let passage = try JSONDecoder().decode(SmolLM2GGUFTests.PerplexityExpected.self, from: Data(contentsOf: SmolLM2
            .packageRoot.appendingPathComponent("Tests/Fixtures/llama/smollm2-perplexity.json"))).input_ids
        let requests = [(0, 140, 10), (60, 180, 6), (200, 60, 14)].map { start, count, newTokens in
            BatchRequest(promptIds: Array(passage[start..<(start + count)]), config: greedy(maxNewTokens: newTokens),
                         topLogprobs: 2)
        }
        let together = try ContinuousBatcher(model: model, maxBatch: 3)
        defer { together.shutdown() }
        let alone = try ContinuousBatcher(model: model, maxBatch: 1)
        defer { alone.shutdown() }
        let (batched, single) = try await (runConcurrently(together, requests), runConcurrently(alone, requests))
        for index in requests.indices {
            #expect(batched[index].tokens == single[index].tokens, "\(precision) \(cacheType) request \(index)")
        }
    }

    /// Sliding-window models batch past their window (4 and 5 positions here): rows padded on the left keep in their
    /// last `window` positions the keys they keep alone, and attention skips the padding, so rows decoded together
    /// give each one's tokens and log-probabilities alone.
    @Test(arguments: ["gemma3", "mistral-sliding"])
    func slidingWindowModelsBatchPastTheirWindow(name: String) async throws {
        let model = try DecoderFixture(name).model
        let prompts = [[1, 17, 45, 99, 3, 8, 21], [1, 8], [1, 60, 61, 62, 5, 9, 10, 11, 30, 31, 32], [2, 3, 4]]
        let together = try ContinuousBatcher(model: model, maxBatch: 4)
        defer { together.shutdown() }
        let alone = try ContinuousBatcher(model: model, maxBatch: 1)
        defer { alone.shutdown() }
        let probe = BatchWidthProbe(together)
        func requests(_ criteria: [any StoppingCriterion]) -> [BatchRequest] {
            prompts.enumerated().map { index, prompt in
                BatchRequest(promptIds: prompt, config: greedy(maxNewTokens: 16 + 4 * index), stoppingCriteria: criteria,
                             topLogprobs: 2)
            }
        }
        let batched = try await runConcurrently(together, requests([probe]))
        let single = try await runConcurrently(alone, requests([]))
        #expect(probe.widest >= 2, "\(name): the batch never held two sequences")
        for index in prompts.indices {
            #expect(batched[index].tokens == single[index].tokens, "\(name) request \(index)")
        }
    }

    /// A prompt that starts like an earlier one runs only its new part, with the same tokens as from scratch.
    @Test func promptPrefixIsReused() async throws {
        let fixture = try LlamaFixture("gqa-untied")
        let batcher = try ContinuousBatcher(model: fixture.model, maxBatch: 2)
        defer { batcher.shutdown() }
        let system = [1, 17, 45, 99, 3, 150, 12, 60, 61, 62]
        let first = system + [5, 9]
        let second = system + [10, 11, 12]
        let config = greedy(maxNewTokens: 8)
        let a = try await runConcurrently(batcher, [BatchRequest(promptIds: first, prefixKey: first, config: config)])
        let b = try await runConcurrently(batcher, [BatchRequest(promptIds: second, prefixKey: second, config: config)])
        #expect(a[0].cached == 0)
        #expect(b[0].cached == system.count)
        let alone = try fixture.model.generate(inputIds: [second], config: config).sequences[0]
        #expect(b[0].tokens.map(\.id) == alone)

        // The next turn of the second conversation: its prompt holds the answer, all but whose last token ran.
        let answer = b[0].tokens.map(\.id)
        let third = second + answer + [7, 8]
        let c = try await runConcurrently(batcher, [BatchRequest(promptIds: third, prefixKey: third, config: config)])
        #expect(c[0].cached == second.count + answer.count - 1)
        let thirdAlone = try fixture.model.generate(inputIds: [third], config: config).sequences[0]
        #expect(c[0].tokens.map(\.id) == thirdAlone)
    }

    @Test func fullQueueAndOversizedRequestsAreRefused() async throws {
        let fixture = try LlamaFixture("gqa-untied")
        let bytes = try fixture.model.makeCache(batch: 1, capacity: 1).bytesPerPosition
        let batcher = try ContinuousBatcher(model: fixture.model, maxBatch: 1, maxQueue: 0, cacheBytes: 64 * bytes)
        defer { batcher.shutdown() }
        #expect(throws: BatchError.exceedsCacheBudget(positions: 102, budgetPositions: 64)) {
            try batcher.submit(BatchRequest(promptIds: [1, 2], config: greedy(maxNewTokens: 100)))
        }
        #expect(throws: BatchError.queueFull(limit: 0)) {
            try batcher.submit(BatchRequest(promptIds: [1, 2], config: greedy(maxNewTokens: 4)))
        }
    }

    /// A consumer that stops reading ends its sequence; the others go on.
    @Test func cancelledRequestLeavesTheBatch() async throws {
        let fixture = try LlamaFixture("gqa-untied")
        let batcher = try ContinuousBatcher(model: fixture.model, maxBatch: 2)
        defer { batcher.shutdown() }
        let long = try batcher.submit(BatchRequest(promptIds: [1, 8], config: greedy(maxNewTokens: 10_000)))
        let received = TokenCounter()
        // A client that disconnects: its task is cancelled while it waits for the next token.
        let reader = Task {
            for try await event in long { if case .token = event { received.add() } }
        }
        while received.count < 3 { try await Task.sleep(for: .milliseconds(5)) }
        reader.cancel()
        _ = await reader.result
        let other = try await runConcurrently(batcher, [BatchRequest(promptIds: [1, 17, 45], config: greedy(maxNewTokens: 5))])
        #expect(other[0].tokens.count == 5)
        var waited = 0
        while batcher.runningCount > 0 && waited < 200 {
            try await Task.sleep(for: .milliseconds(10))
            waited += 1
        }
        #expect(batcher.runningCount == 0)
    }
}
