import VLMTensor

/// A decoder-only language model that ``generate(inputIds:attentionMask:options:processors:selector:)`` can drive:
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
    ///   - attentionMask: `[B][cached + T]`, 1 for tokens and 0 for padding; nil means all tokens.
    ///   - positionIds: `[B][T]`; nil means `cached ..< cached + T` for every row, as transformers' forward.
    ///   - cache: extended in place by the `T` new positions.
    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool) throws -> Tensor
}

extension CausalLanguageModel {
    /// Logits for token ids; see ``logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``.
    public func logits(inputIds: [[Int]], attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        try logits(inputsEmbeds: embed(inputIds), attentionMask: attentionMask, positionIds: positionIds, cache: cache,
                   lastPositionOnly: lastPositionOnly)
    }
}

/// Changes next-token logits before a token is chosen (repetition penalties, temperature, …).
public protocol LogitsProcessor: Sendable {
    /// `logits` is `[B, vocabSize]`; `generated[b]` holds row `b`'s new tokens so far.
    func process(_ logits: Tensor, generated: [[Int]]) -> Tensor
}

/// Chooses each row's next token from its (processed) logits.
public protocol TokenSelector {
    /// `logits` is `[B, vocabSize]`; returns one token per row.
    mutating func selectTokens(_ logits: Tensor) -> [Int]
}

/// Greedy decoding: the most likely token, the first on ties (transformers' `do_sample=False`, one beam).
public struct GreedySelector: TokenSelector {
    public init() {}
    public mutating func selectTokens(_ logits: Tensor) -> [Int] { argmaxLastDimension(logits) }
}

/// When generation stops.
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
    /// Continues a left-padded batch of prompts: the prompt is prefilled in one pass, then each step feeds one
    /// token per row through a preallocated KV cache.
    ///
    /// Positions follow transformers' `generate`: each row counts its own tokens from 0, padding ignored.
    /// - Returns: each row's new tokens, ending with the eos token that stopped it, if one did.
    public func generate(inputIds: [[Int]], attentionMask: [[Int]]? = nil, options: GenerationOptions,
                         processors: [any LogitsProcessor] = [], selector: some TokenSelector = GreedySelector()) throws -> [[Int]] {
        try generate(inputsEmbeds: embed(inputIds), attentionMask: attentionMask, options: options, processors: processors,
                     selector: selector)
    }

    /// ``generate(inputIds:attentionMask:options:processors:selector:)`` from input embeddings `[B, T, hiddenSize]`,
    /// for prompts whose embeddings carry image features.
    public func generate(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, options: GenerationOptions,
                         processors: [any LogitsProcessor] = [], selector: some TokenSelector = GreedySelector()) throws -> [[Int]] {
        guard inputsEmbeds.rank == 3, inputsEmbeds.shape[0] > 0, inputsEmbeds.shape[1] > 0 else {
            throw ModelError.invalidInput("generation needs a non-empty prompt, got inputs_embeds \(inputsEmbeds.shape)")
        }
        guard options.maxNewTokens >= 0 else { throw ModelError.invalidInput("maxNewTokens is \(options.maxNewTokens)") }
        let (batch, promptLength) = (inputsEmbeds.shape[0], inputsEmbeds.shape[1])
        var mask = attentionMask ?? Array(repeating: Array(repeating: 1, count: promptLength), count: batch)
        guard mask.count == batch, mask.allSatisfy({ $0.count == promptLength }) else {
            throw ModelError.invalidInput("the attention mask must be [\(batch)][\(promptLength)]")
        }
        guard mask.allSatisfy({ $0.contains { $0 != 0 } }) else {
            throw ModelError.invalidInput("every row of the attention mask needs at least one token")
        }
        if options.maxNewTokens == 0 { return Array(repeating: [], count: batch) }

        // generate()'s position_ids: cumsum(mask) - 1, padding at 0.
        var positions = mask.map { row in
            var count = -1
            return row.map { flag in
                if flag != 0 { count += 1 }
                return flag != 0 ? count : 0
            }
        }
        let (capacity, overflow) = promptLength.addingReportingOverflow(options.maxNewTokens)
        guard !overflow else { throw ModelError.invalidInput("maxNewTokens \(options.maxNewTokens) is out of range") }
        let cache = try makeCache(batch: batch, capacity: capacity)
        var logits = try self.logits(inputsEmbeds: inputsEmbeds, attentionMask: mask, positionIds: positions, cache: cache,
                                     lastPositionOnly: true)
        var selector = selector
        var generated = Array(repeating: [Int](), count: batch)
        var finished = Array(repeating: false, count: batch)
        for step in 0..<options.maxNewTokens {
            var scores = logits.reshaped([batch, vocabularySize])
            for processor in processors { scores = processor.process(scores, generated: generated) }
            let tokens = selector.selectTokens(scores)
            for row in 0..<batch where !finished[row] {
                generated[row].append(tokens[row])
                finished[row] = options.eosTokenIds.contains(tokens[row])
            }
            if step == options.maxNewTokens - 1 || finished.allSatisfy({ $0 }) { break }
            // Finished rows keep being fed (their last token); rows never attend to each other, so it changes nothing.
            for row in 0..<batch {
                mask[row].append(1)
                positions[row] = [(positions[row].last ?? -1) + 1]
            }
            logits = try self.logits(inputIds: generated.map { [$0.last!] }, attentionMask: mask, positionIds: positions,
                                     cache: cache)
        }
        return generated
    }
}
