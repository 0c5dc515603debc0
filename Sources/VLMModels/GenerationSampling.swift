import Foundation

/// A small, fully specified random number generator (xoshiro256**, seeded through SplitMix64), so that the same
/// seed draws the same tokens on every platform and Swift version.
///
/// It cannot reproduce PyTorch: torch's `multinomial` uses its own generator stream and algorithm, so sampled
/// continuations match transformers in distribution, not token for token.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: (UInt64, UInt64, UInt64, UInt64)

    public init(seed: UInt64) {
        var splitMix = seed
        func next() -> UInt64 {
            splitMix &+= 0x9E37_79B9_7F4A_7C15
            var z = splitMix
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        state = (next(), next(), next(), next())
    }

    public mutating func next() -> UInt64 {
        let result = rotate(state.1 &* 5, 7) &* 9
        let shifted = state.1 << 17
        state.2 ^= state.0
        state.3 ^= state.1
        state.1 ^= state.2
        state.0 ^= state.3
        state.2 ^= shifted
        state.3 = rotate(state.3, 45)
        return result
    }

    private func rotate(_ x: UInt64, _ k: UInt64) -> UInt64 { (x << k) | (x >> (64 - k)) }

    /// A uniform double in [0, 1) from the top 53 bits of one draw.
    mutating func unit() -> Double { Double(next() >> 11) * 0x1p-53 }

    /// A token drawn with probability proportional to `exp(score)`; tokens at -infinity are never drawn. Only the
    /// others are looked at (after top-k, a few of the vocabulary): the removed ones add exact zeros to every sum, so
    /// the draw is the one all of them would give.
    mutating func sample(scores: [Float]) -> Int {
        let candidates = scores.indices.filter { scores[$0] != -.infinity }
        let probabilities = softmaxProbabilities(candidates.map { scores[$0] })
        let total = probabilities.reduce(0.0) { $0 + Double($1) }
        let target = unit() * total
        var cumulative = 0.0
        var last = 0
        for (index, probability) in zip(candidates, probabilities) where probability > 0 {
            cumulative += Double(probability)
            last = index
            if target < cumulative { return index }
        }
        // Rounding can leave the target just past the sum: the last possible token.
        return last
    }
}

/// Decides after each new token whether a row is done, as transformers' `StoppingCriteria`.
public protocol StoppingCriterion: Sendable {
    func shouldStop(_ history: TokenHistory) -> Bool
}

/// transformers' `StopStringCriteria`: a row stops when its text contains a stop string that ends within the last
/// token's text (the token may run past the end of the stop string, which is kept in the output).
///
/// Works on bytes: `tokenBytes[id]` is the text each token contributes (UTF-8 bytes, raw bytes for byte tokens),
/// supplied by the caller from its tokenizer.
public struct StopStringCriterion: StoppingCriterion {
    let stopStrings: [[UInt8]]
    let tokenBytes: [[UInt8]]
    let longest: Int

    public init(stopStrings: [String], tokenBytes: [[UInt8]]) {
        self.stopStrings = stopStrings.map { Array($0.utf8) }.filter { !$0.isEmpty }
        self.tokenBytes = tokenBytes
        longest = self.stopStrings.map(\.count).max() ?? 0
    }

    public func shouldStop(_ history: TokenHistory) -> Bool {
        guard longest > 0, let last = history.tokens.last, last >= 0, last < tokenBytes.count else { return false }
        let lastBytes = tokenBytes[last]
        guard !lastBytes.isEmpty else { return false }
        // Enough text before the last token for the longest stop string to start there.
        var tail = lastBytes
        var index = history.tokens.count - 2
        while tail.count < lastBytes.count + longest - 1, index >= 0 {
            let token = history.tokens[index]
            if token >= 0 && token < tokenBytes.count { tail.insert(contentsOf: tokenBytes[token], at: 0) }
            index -= 1
        }
        let lastStart = tail.count - lastBytes.count
        for stop in stopStrings where stop.count <= tail.count {
            // The match must end inside the last token: at tail positions lastStart + 1 ... tail.count.
            for end in max(lastStart + 1, stop.count)...tail.count where tail[(end - stop.count)..<end].elementsEqual(stop) {
                return true
            }
        }
        return false
    }
}
