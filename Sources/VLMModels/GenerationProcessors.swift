import Foundation

/// One row's tokens as transformers' logits processors see them (`input_ids`).
public struct TokenHistory: Sendable {
    /// The prompt (left padding included; empty when the prompt was given as embeddings only), then the tokens
    /// generated so far.
    public var tokens: [Int]
    /// Leading positions of `tokens` that are padding.
    public var paddingLength: Int
    /// Positions of `tokens` that came before generation, padding included.
    public var promptLength: Int

    public init(tokens: [Int], paddingLength: Int = 0, promptLength: Int) {
        self.tokens = tokens
        self.paddingLength = paddingLength
        self.promptLength = promptLength
    }

    /// The tokens generated so far.
    public var generated: ArraySlice<Int> { tokens[min(promptLength, tokens.count)...] }
}

/// Changes one row's next-token scores before a token is chosen, as one of transformers' `LogitsProcessor`s.
public protocol LogitsProcessor: Sendable {
    /// `scores` holds one score per vocabulary entry; removed tokens become -infinity.
    func process(_ scores: inout [Float], history: TokenHistory)
}

/// transformers' `RepetitionPenaltyLogitsProcessor`: the score of every token already in the sequence (prompt
/// included, padding not) is divided by the penalty if positive, multiplied if negative.
public struct RepetitionPenaltyProcessor: LogitsProcessor {
    public let penalty: Float
    public init(penalty: Float) { self.penalty = penalty }

    public func process(_ scores: inout [Float], history: TokenHistory) {
        var seen = Set<Int>()
        for token in history.tokens[min(history.paddingLength, history.tokens.count)...]
        where token >= 0 && token < scores.count && seen.insert(token).inserted {
            let score = scores[token]
            scores[token] = score < 0 ? score * penalty : score / penalty
        }
    }
}

/// transformers' `MinLengthLogitsProcessor`: no eos while the sequence, prompt included, is shorter than `minLength`.
public struct MinLengthProcessor: LogitsProcessor {
    public let minLength: Int
    public let eosTokenIds: [Int]
    public init(minLength: Int, eosTokenIds: [Int]) {
        self.minLength = minLength
        self.eosTokenIds = eosTokenIds
    }

    public func process(_ scores: inout [Float], history: TokenHistory) {
        if history.tokens.count < minLength { suppress(eosTokenIds, in: &scores) }
    }
}

/// transformers' `MinNewTokensLengthLogitsProcessor`: no eos before `minNewTokens` new tokens.
public struct MinNewTokensProcessor: LogitsProcessor {
    public let minNewTokens: Int
    public let eosTokenIds: [Int]
    public init(minNewTokens: Int, eosTokenIds: [Int]) {
        self.minNewTokens = minNewTokens
        self.eosTokenIds = eosTokenIds
    }

    public func process(_ scores: inout [Float], history: TokenHistory) {
        if history.tokens.count - history.promptLength < minNewTokens { suppress(eosTokenIds, in: &scores) }
    }
}

private func suppress(_ ids: [Int], in scores: inout [Float]) {
    for id in ids where id >= 0 && id < scores.count { scores[id] = -.infinity }
}

/// transformers' `TemperatureLogitsWarper`: scores divided by the temperature.
public struct TemperatureWarper: LogitsProcessor {
    public let temperature: Float
    public init(temperature: Float) { self.temperature = temperature }

    public func process(_ scores: inout [Float], history: TokenHistory) {
        for index in scores.indices { scores[index] /= temperature }
    }
}

/// transformers' `TopKLogitsWarper`: tokens scoring below the k-th best are removed (ties with it kept).
public struct TopKWarper: LogitsProcessor {
    public let topK: Int
    public init(topK: Int, minTokensToKeep: Int = 1) { self.topK = max(topK, minTokensToKeep) }

    public func process(_ scores: inout [Float], history: TokenHistory) {
        let k = min(topK, scores.count)
        guard k > 0, k < scores.count else { return }
        let threshold = scores[largestIndices(scores, count: k)[k - 1]]
        for index in scores.indices where scores[index] < threshold { scores[index] = -.infinity }
    }
}

/// transformers' `TopPLogitsWarper` (nucleus): in ascending order of score, tokens whose cumulative probability is
/// at most `1 - topP` are removed, keeping at least `minTokensToKeep` of the best.
public struct TopPWarper: LogitsProcessor {
    public let topP: Double
    public let minTokensToKeep: Int
    public init(topP: Double, minTokensToKeep: Int = 1) {
        self.topP = topP
        self.minTokensToKeep = minTokensToKeep
    }

    public func process(_ scores: inout [Float], history: TokenHistory) {
        // Tokens already removed (a top-k before this leaves all but a few at -infinity) come first in ascending
        // order and add nothing to the sums, so only the others are sorted: the same results as sorting all of them.
        let removed = scores.count(where: { $0 == -.infinity })
        let order = scores.indices.filter { scores[$0] != -.infinity }.sorted { scores[$0] < scores[$1] }
        let probabilities = softmaxProbabilities(order.map { scores[$0] })
        // torch's cumsum accumulates float32 inputs in double and stores float32; the bound is cast to float32.
        let bound = Float(1 - topP)
        var cumulative = 0.0
        let protected = scores.count - minTokensToKeep
        for (rank, index) in order.enumerated() {
            cumulative += Double(probabilities[rank])
            if removed + rank < protected && Float(cumulative) <= bound { scores[index] = -.infinity }
        }
    }
}

/// transformers' `MinPLogitsWarper`: tokens less probable than `minP` times the best token's probability are removed,
/// keeping at least `minTokensToKeep` of the most probable.
public struct MinPWarper: LogitsProcessor {
    public let minP: Float
    public let minTokensToKeep: Int
    public init(minP: Float, minTokensToKeep: Int = 1) {
        self.minP = minP
        self.minTokensToKeep = minTokensToKeep
    }

    public func process(_ scores: inout [Float], history: TokenHistory) {
        let probabilities = softmaxProbabilities(scores)
        let threshold = minP * (probabilities.max() ?? 0)
        let kept = Set(largestIndices(probabilities, count: minTokensToKeep))
        for index in scores.indices where probabilities[index] < threshold && !kept.contains(index) {
            scores[index] = -.infinity
        }
    }
}

/// Indices of the `count` largest values, best first, ties to the lower index (what a stable descending sort puts
/// first; NaN ranks below every number): one pass keeping the best few in order, where sorting a whole vocabulary
/// at every step would cost V·log V.
func largestIndices(_ values: [Float], count: Int) -> [Int] {
    guard count > 0 else { return [] }
    func isBetter(_ value: Float, than other: Float) -> Bool { value > other || (other.isNaN && !value.isNaN) }
    var best: [Int] = []
    best.reserveCapacity(count + 1)
    for index in values.indices {
        let value = values[index]
        if best.count == count && !isBetter(value, than: values[best[count - 1]]) { continue }
        // After every kept value that is not worse: equal values keep their index order.
        var low = 0, high = best.count
        while low < high {
            let middle = (low + high) / 2
            if isBetter(value, than: values[best[middle]]) { high = middle } else { low = middle + 1 }
        }
        best.insert(index, at: low)
        if best.count > count { best.removeLast() }
    }
    return best
}

/// Softmax in float32 as torch computes it: shifted by the maximum, normalized by the sum of exponentials.
func softmaxProbabilities(_ scores: [Float]) -> [Float] {
    guard let maximum = scores.max(), maximum > -.infinity else { return scores.map { _ in 0 } }
    let exponentials = scores.map { expf($0 - maximum) }
    let sum = exponentials.reduce(0, +)
    return exponentials.map { $0 / sum }
}

/// Log-softmax in float32 (`x - max - log(sum(exp(x - max)))`), as beam search scores tokens.
func logSoftmax(_ scores: [Float]) -> [Float] {
    guard let maximum = scores.max(), maximum > -.infinity else { return scores }
    let logSum = logf(scores.reduce(Float(0)) { $0 + expf($1 - maximum) })
    return scores.map { $0 - maximum - logSum }
}

extension GenerationConfig {
    /// The processors transformers' `_get_logits_processor` builds for these settings, in its order: repetition
    /// penalty, minimum lengths, then (when sampling) temperature, top-k, top-p and min-p.
    public var logitsProcessors: [any LogitsProcessor] {
        var processors: [any LogitsProcessor] = []
        if repetitionPenalty != 1 { processors.append(RepetitionPenaltyProcessor(penalty: Float(repetitionPenalty))) }
        if !eosTokenIds.isEmpty && minLength > 0 {
            processors.append(MinLengthProcessor(minLength: minLength, eosTokenIds: eosTokenIds))
        }
        if !eosTokenIds.isEmpty, let minNewTokens, minNewTokens > 0 {
            processors.append(MinNewTokensProcessor(minNewTokens: minNewTokens, eosTokenIds: eosTokenIds))
        }
        guard doSample else { return processors }
        // Beam sampling keeps one token more than there are eos tokens, so that a beam can always continue.
        let keep = numBeams > 1 ? max(eosTokenIds.count + 1, 2) : 1
        if temperature != 1 { processors.append(TemperatureWarper(temperature: Float(temperature))) }
        if topK != 0 { processors.append(TopKWarper(topK: topK, minTokensToKeep: keep)) }
        if topP < 1 { processors.append(TopPWarper(topP: topP, minTokensToKeep: keep)) }
        if let minP { processors.append(MinPWarper(minP: Float(minP), minTokensToKeep: keep)) }
        return processors
    }
}
