import Foundation
import Testing
@testable import VLMTensor

/// Attention with a score bias against its definition computed in Double, and, with a zero bias, against the fused
/// kernels (themselves checked against transformers' eager attention in AttentionTests).
@Suite struct BiasedAttentionTests {
    /// Reproducible values in [-2, 2).
    static func values(_ count: Int, seed: UInt64) -> [Float] {
        var state = seed
        return (0..<count).map { _ in
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return Float(state >> 40) / Float(1 << 24) * 4 - 2
        }
    }

    /// `softmax(q·kᵀ·scale + bias + mask)·v` straight from its definition; masked keys get a weight of zero, and a
    /// query with no key left averages them all.
    static func reference(query: Tensor, key: Tensor, value: Tensor, heads: Int, bias: Tensor, causal: Bool,
                          mask: Tensor?, scale: Float) -> Tensor {
        let (batch, queryLength, width, keyLength) = (query.shape[0], query.shape[1], query.shape[2], key.shape[1])
        let headDim = width / heads
        let (q, k, v, b) = (query.scalars, key.scalars, value.scalars, bias.scalars)
        var output = [Float](repeating: 0, count: query.count)
        for item in 0..<batch {
            for head in 0..<heads {
                for row in 0..<queryLength {
                    let allowed = (0..<keyLength).map { column in
                        (!causal || column <= row + keyLength - queryLength) && (mask.map { $0.scalars[item * keyLength + column] != 0 } ?? true)
                    }
                    let scores = (0..<keyLength).map { column -> Double in
                        var dot = 0.0
                        for feature in 0..<headDim {
                            dot += Double(q[(item * queryLength + row) * width + head * headDim + feature])
                                * Double(k[(item * keyLength + column) * width + head * headDim + feature])
                        }
                        return dot * Double(scale) + Double(b[(head * queryLength + row) * keyLength + column])
                    }
                    let largest = zip(scores, allowed).filter(\.1).map(\.0).max()
                    let weights = zip(scores, allowed).map { score, visible in
                        largest.map { visible ? exp(score - $0) : 0 } ?? 1
                    }
                    let total = weights.reduce(0, +)
                    for feature in 0..<headDim {
                        var sum = 0.0
                        for column in 0..<keyLength {
                            sum += weights[column] / total * Double(v[(item * keyLength + column) * width + head * headDim + feature])
                        }
                        output[(item * queryLength + row) * width + head * headDim + feature] = Float(sum)
                    }
                }
            }
        }
        return Tensor(shape: query.shape, scalars: output)
    }

    @Test(arguments: [false, true], [false, true])
    func matchesItsDefinition(causal: Bool, masked: Bool) {
        let (batch, heads, headDim, queryLength, keyLength) = (2, 3, 5, 4, 7)
        let width = heads * headDim
        let query = Tensor(shape: [batch, queryLength, width], scalars: Self.values(batch * queryLength * width, seed: 1))
        let key = Tensor(shape: [batch, keyLength, width], scalars: Self.values(batch * keyLength * width, seed: 2))
        let value = Tensor(shape: [batch, keyLength, width], scalars: Self.values(batch * keyLength * width, seed: 3))
        let bias = Tensor(shape: [heads, queryLength, keyLength], scalars: Self.values(heads * queryLength * keyLength, seed: 4))
        // The second item's last two keys are padding; with the causal rule its first query sees no key at all.
        let mask = masked ? Tensor(shape: [batch, keyLength], scalars: [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1]) : nil
        let actual = attention(query: query, key: key, value: value, heads: heads, scoreBias: bias, causal: causal,
                               keyPaddingMask: mask, scale: 0.7)
        let expected = Self.reference(query: query, key: key, value: value, heads: heads, bias: bias, causal: causal,
                                      mask: mask, scale: 0.7)
        expectClose(actual, expected, "causal \(causal) masked \(masked)", tolerance: 1e-5)
    }

    /// A zero bias gives the fused kernel's result; keys read from the front of a longer buffer give the same as
    /// keys of exactly that length.
    @Test func zeroBiasEqualsTheFusedKernel() {
        let (batch, heads, headDim, queryLength, keyLength, capacity) = (2, 4, 8, 3, 6, 9)
        let width = heads * headDim
        let query = Tensor(shape: [batch, queryLength, width], scalars: Self.values(batch * queryLength * width, seed: 5))
        let keyBuffer = Tensor(shape: [batch, capacity, width], scalars: Self.values(batch * capacity * width, seed: 6))
        let valueBuffer = Tensor(shape: [batch, capacity, width], scalars: Self.values(batch * capacity * width, seed: 7))
        let front = { (x: Tensor) in
            Tensor(shape: [batch, keyLength, width], scalars: (0..<batch).flatMap { item in
                x.scalars[(item * capacity * width)..<((item * capacity + keyLength) * width)]
            })
        }
        let mask = Tensor(shape: [batch, keyLength], scalars: [1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1])
        let fused = attention(query: query, key: front(keyBuffer), value: front(valueBuffer), heads: heads, causal: true,
                              keyPaddingMask: mask, scale: 1)
        let biased = attention(query: query, key: keyBuffer, value: valueBuffer, heads: heads,
                               scoreBias: Tensor(zeros: [heads, queryLength, keyLength]), keyLength: keyLength,
                               causal: true, keyPaddingMask: mask)
        expectClose(biased, fused, "zero bias", tolerance: 1e-5)
    }

    @Test func embeddingColumnsTransposeTheRows() {
        let table = Tensor(shape: [3, 2], scalars: [0, 1, 10, 11, 20, 21])
        let columns = embeddingColumns(table, ids: [2, 0, 2, 1])
        #expect(columns.shape == [2, 4])
        #expect(columns.scalars == [20, 0, 20, 10, 21, 1, 21, 11])
    }
}
