import Testing
@testable import VLMTensor

@Suite struct GroupedQueryAttentionTests {
    /// The shared-head attention over part of a larger cache equals the plain attention (checked against PyTorch
    /// in AttentionTests) on keys and values whose heads were copied out for each query head.
    @Test(arguments: [KernelPath.best, .scalar])
    func matchesAttentionOnRepeatedHeads(path: KernelPath) {
        let (batch, queryLength, heads, keyHeads, headDim, capacity, keyLength) = (2, 3, 6, 2, 8, 9, 7)
        var generator = SplitMix(seed: 11)
        let query = generator.tensor([batch, queryLength, heads * headDim])
        let key = generator.tensor([batch, capacity, keyHeads * headDim]), value = generator.tensor([batch, capacity, keyHeads * headDim])
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
        let query = generator.tensor([batch, 1, heads * headDim], spread: 3)
        let key = generator.tensor([batch, capacity, keyHeads * headDim]), value = generator.tensor([batch, capacity, keyHeads * headDim])
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
        let width = keyHeads * headDim
        let key = generator.tensor([batch, capacity, width]), value = generator.tensor([batch, capacity, width])
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
            let query = generator.tensor([batch, queryLength, heads * headDim], spread: 3)
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

extension GroupedQueryAttentionTests {
    // Swift's Float16 is unavailable on macOS on Intel.
#if !(os(macOS) && arch(x86_64))
    /// Rounding to halves gives the bits Swift's own `Float16(_:)` gives (to nearest, ties to even), on every path:
    /// halfway cases in the normal and subnormal ranges, the edges of both, overflow, signed zeros and infinities,
    /// and random bit patterns of every exponent.
    @Test(arguments: [KernelPath.best, .scalar])
    func roundingToHalvesMatchesSwiftsFloat16(path: KernelPath) {
        let ulp = Float(Float16.ulpOfOne)
        var floats: [Float] = [0, -0, 1, -1, 1 + ulp / 2, 1 + ulp * 1.5, 1 + ulp / 2 + ulp / 1024, 65504, 65519.996, 65520,
                               -65520, 1e10, .infinity, -.infinity, Float(Float16.leastNormalMagnitude),
                               Float(Float16.leastNonzeroMagnitude), Float(Float16.leastNonzeroMagnitude) / 2,
                               Float(Float16.leastNonzeroMagnitude) * 0.5000001, Float(Float16.leastNonzeroMagnitude) * 1.5,
                               Float(Float16.leastNonzeroMagnitude) * 2.5, Float(Float16.leastNormalMagnitude) * (1 - ulp / 2),
                               .leastNonzeroMagnitude, .greatestFiniteMagnitude, 3.0e-8, -2.9802322e-8]
        var generator = SplitMix(seed: 31)
        for _ in 0..<100_000 { floats.append(Float(bitPattern: UInt32(truncatingIfNeeded: generator.nextBits()))) }
        floats.append(.nan)
        var halves = [UInt16](repeating: 0, count: floats.count)
        roundToHalves(floats, count: floats.count, into: &halves, path: path)
        for (float, half) in zip(floats, halves) {
            if float.isNaN {
                #expect(Float16(bitPattern: half).isNaN)
            } else if half != Float16(float).bitPattern {
                Issue.record("\(float) (\(String(float.bitPattern, radix: 16))): \(String(half, radix: 16)), Swift \(String(Float16(float).bitPattern, radix: 16))")
                return
            }
        }
    }
#endif

    /// Keys and values kept as halves give exactly what floats holding the same (rounded) values give: a decoding
    /// step split along the keys, and a prompt with a padding mask, over a head-major cache read from an offset.
    @Test(arguments: [KernelPath.best, .scalar])
    func halfKeysAndValuesGiveWhatTheirFloatsGive(path: KernelPath) {
        let (batch, heads, keyHeads, headDim, capacity, firstKey, keyLength) = (2, 6, 3, 16, 400, 37, 290)
        var generator = SplitMix(seed: 41)
        func halves(_ x: Tensor) -> HalfTensor {
            let half = HalfTensor(uninitialized: x.shape)
            roundToHalves(x.storage.pointer, count: x.count, into: half.pointer, path: path)
            return half
        }
        let shape = [batch, keyHeads * capacity, headDim]
        let (halfKey, halfValue) = (halves(generator.tensor(shape)), halves(generator.tensor(shape)))
        let widened = KeysAndValues.floats(key: halfKey.floats, value: halfValue.floats)
        let half = KeysAndValues.halves(key: halfKey, value: halfValue)
        for queryLength in [1, 5] {
            let query = generator.tensor([batch, queryLength, heads * headDim], spread: 3)
            let mask = queryLength == 1 ? nil
                : Tensor(shape: [batch, keyLength], scalars: (0..<(batch * keyLength)).map { $0 % 7 == 3 ? 0 : 1 })
            func attend(_ keysAndValues: KeysAndValues) -> [Float] {
                groupedQueryAttention(query: query, keysAndValues: keysAndValues, heads: heads, keyHeads: keyHeads,
                                      keyLength: keyLength, firstKey: firstKey, layout: .headMajor, causal: true,
                                      keyPaddingMask: mask, scale: 0.3, path: path).scalars
            }
            let (actual, expected) = (attend(half), attend(widened))
            #expect(actual == expected, "\(queryLength) query rows: differences up to \(zip(actual, expected).map { abs($0 - $1) }.max() ?? 0)")
        }
    }
}

/// A small deterministic generator, so the test inputs are the same on every run.
private struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func nextBits() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    /// A tensor of `shape` drawn uniformly from `-spread ..< spread`.
    mutating func tensor(_ shape: [Int], spread: Float = 1) -> Tensor {
        Tensor(shape: shape, scalars: (0..<Tensor.elementCount(shape)).map { _ in spread * nextFloat() })
    }

    mutating func nextFloat() -> Float {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        return Float(z >> 40) / Float(1 << 24) * 2 - 1
    }
}
