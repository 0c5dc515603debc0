import Testing
@testable import VLMTensor

@Suite struct GroupedQueryAttentionTests {
    /// The shared-head attention over part of a larger cache equals the plain attention (checked against PyTorch
    /// in AttentionTests) on keys and values whose heads were copied out for each query head.
    @Test(arguments: [KernelPath.best, .scalar])
    func matchesAttentionOnRepeatedHeads(path: KernelPath) {
        let (batch, queryLength, heads, keyHeads, headDim, capacity, keyLength) = (2, 3, 6, 2, 8, 9, 7)
        var generator = SplitMix(seed: 11)
        func random(_ shape: [Int]) -> Tensor {
            Tensor(shape: shape, scalars: (0..<Tensor.elementCount(shape)).map { _ in generator.nextFloat() })
        }
        let query = random([batch, queryLength, heads * headDim])
        let key = random([batch, capacity, keyHeads * headDim]), value = random([batch, capacity, keyHeads * headDim])
        let mask = Tensor(shape: [batch, keyLength], scalars: (0..<(batch * keyLength)).map { $0 == 1 ? 0 : 1 })
        func repeated(_ x: Tensor) -> Tensor {
            var scalars: [Float] = []
            for item in 0..<batch {
                for position in 0..<keyLength {
                    for head in 0..<heads {
                        let start = (item * capacity + position) * keyHeads * headDim + head / (heads / keyHeads) * headDim
                        scalars += x.scalars[start..<(start + headDim)]
                    }
                }
            }
            return Tensor(shape: [batch, keyLength, heads * headDim], scalars: scalars)
        }
        let expected = attention(query: query, key: repeated(key), value: repeated(value), heads: heads, causal: true,
                                 keyPaddingMask: mask, scale: 0.3, path: path)
        let actual = groupedQueryAttention(query: query, key: key, value: value, heads: heads, keyHeads: keyHeads,
                                           keyLength: keyLength, causal: true, keyPaddingMask: mask, scale: 0.3, path: path)
        #expect(actual.shape == expected.shape)
        let worst = zip(actual.scalars, expected.scalars).map { abs($0 - $1) }.max() ?? .infinity
        #expect(worst < 1e-6, "\(worst)")
    }

    /// A decoding step without padding runs in parts split along the keys (300 keys over one key head: more than
    /// one part on any machine; five query heads on it: more than the four rows a part computes at once); the merged
    /// result equals the unsplit attention that a padding mask of ones selects.
    @Test(arguments: [KernelPath.best, .scalar])
    func decodingStepSplitAlongTheKeysMatchesTheWholeAttention(path: KernelPath) {
        let (batch, heads, keyHeads, headDim, capacity, keyLength) = (1, 5, 1, 24, 320, 300)
        var generator = SplitMix(seed: 5)
        func random(_ shape: [Int], spread: Float = 1) -> Tensor {
            Tensor(shape: shape, scalars: (0..<Tensor.elementCount(shape)).map { _ in spread * generator.nextFloat() })
        }
        let query = random([batch, 1, heads * headDim], spread: 3)
        let key = random([batch, capacity, keyHeads * headDim]), value = random([batch, capacity, keyHeads * headDim])
        let ones = Tensor(shape: [batch, keyLength], scalars: Array(repeating: 1, count: batch * keyLength))
        let expected = groupedQueryAttention(query: query, key: key, value: value, heads: heads, keyHeads: keyHeads,
                                             keyLength: keyLength, causal: true, keyPaddingMask: ones, scale: 0.4, path: path)
        let actual = groupedQueryAttention(query: query, key: key, value: value, heads: heads, keyHeads: keyHeads,
                                           keyLength: keyLength, causal: true, keyPaddingMask: nil, scale: 0.4, path: path)
        let worst = zip(actual.scalars, expected.scalars).map { abs($0 - $1) }.max() ?? .infinity
        #expect(worst < 1e-6, "\(worst)")
    }
}

extension GroupedQueryAttentionTests {
    /// Keys and values read from an offset, token-major or head-major (a KV cache: each head's positions side by
    /// side), give exactly what the token-major copy of those positions gives, for a decoding step (split into parts
    /// along the keys) and for a prompt with a padding mask.
    @Test(arguments: [KernelPath.best, .scalar])
    func headMajorKeysFromAnOffsetMatchTokenMajorOnes(path: KernelPath) {
        let (batch, heads, keyHeads, headDim, capacity, firstKey, keyLength) = (2, 6, 3, 16, 400, 37, 290)
        var generator = SplitMix(seed: 23)
        func random(_ shape: [Int], spread: Float = 1) -> Tensor {
            Tensor(shape: shape, scalars: (0..<Tensor.elementCount(shape)).map { _ in spread * generator.nextFloat() })
        }
        let width = keyHeads * headDim
        let key = random([batch, capacity, width]), value = random([batch, capacity, width])
        func headMajor(_ x: Tensor) -> Tensor {
            var scalars: [Float] = []
            for item in 0..<batch {
                for head in 0..<keyHeads {
                    for position in 0..<capacity {
                        let start = (item * capacity + position) * width + head * headDim
                        scalars += x.scalars[start..<(start + headDim)]
                    }
                }
            }
            return Tensor(shape: [batch, keyHeads * capacity, headDim], scalars: scalars)
        }
        let mask = Tensor(shape: [batch, keyLength], scalars: (0..<(batch * keyLength)).map { $0 % 7 == 3 ? 0 : 1 })
        for (queryLength, keyPaddingMask) in [(1, nil), (3, mask)] {
            let query = random([batch, queryLength, heads * headDim], spread: 3)
            let expected = groupedQueryAttention(
                query: query, key: sequenceSlice(key, firstKey..<(firstKey + keyLength)),
                value: sequenceSlice(value, firstKey..<(firstKey + keyLength)), heads: heads, keyHeads: keyHeads,
                keyLength: keyLength, causal: true, keyPaddingMask: keyPaddingMask, scale: 0.3, path: path)
            let tokenMajor = groupedQueryAttention(
                query: query, key: key, value: value, heads: heads, keyHeads: keyHeads, keyLength: keyLength,
                firstKey: firstKey, layout: .tokenMajor, causal: true, keyPaddingMask: keyPaddingMask, scale: 0.3, path: path)
            let headMajorResult = groupedQueryAttention(
                query: query, key: headMajor(key), value: headMajor(value), heads: heads, keyHeads: keyHeads,
                keyLength: keyLength, firstKey: firstKey, layout: .headMajor, causal: true,
                keyPaddingMask: keyPaddingMask, scale: 0.3, path: path)
            #expect(tokenMajor.scalars == expected.scalars, "query length \(queryLength)")
            #expect(headMajorResult.scalars == expected.scalars, "query length \(queryLength)")
        }
    }
}

/// A small deterministic generator, so the test inputs are the same on every run.
private struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func nextFloat() -> Float {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        return Float(z >> 40) / Float(1 << 24) * 2 - 1
    }
}
