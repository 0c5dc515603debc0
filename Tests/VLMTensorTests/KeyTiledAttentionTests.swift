import CVLMKernels
import Foundation
import Testing

/// The key-tiled (flash attention) schedule against the whole-row kernel that AttentionTests checks against PyTorch,
/// on random inputs: lengths that are not multiples of the tiles, head sizes that are not multiples of 16, padding
/// masks, causal masks and queries that see no key at all. On CPUs without AVX-512 both schedules run the portable
/// kernel, and the comparison is trivially exact.
@Suite struct KeyTiledAttentionTests {
    struct Shape: CustomTestStringConvertible, Sendable {
        let queryLength, keyLength, heads, headDim: Int
        let causal: Bool
        /// Key `j` of item 1 is masked where `j % maskPeriod == 3`; 0: no mask. Item 0 is masked whole.
        let maskPeriod: Int
        let queryBlock, keyTile: Int
        var testDescription: String {
            "q\(queryLength) k\(keyLength) h\(heads)×\(headDim)\(causal ? " causal" : "")"
                + "\(maskPeriod > 0 ? " mask/\(maskPeriod)" : "") tiles \(queryBlock)×\(keyTile)"
        }
    }

    static let shapes: [Shape] = [
        // 333 keys: five tiles of 64 and one of 13; 150 queries: blocks of 12 and register blocks of 6.
        Shape(queryLength: 150, keyLength: 333, heads: 2, headDim: 64, causal: false, maskPeriod: 0, queryBlock: 12, keyTile: 64),
        // A head of 72 features ends in a partial vector; causal rows see a different part of each tile.
        Shape(queryLength: 100, keyLength: 100, heads: 3, headDim: 72, causal: true, maskPeriod: 5, queryBlock: 18, keyTile: 64),
        // Tiles of 128 keys, a query block that is not a multiple of 6 (rounded down to 30).
        Shape(queryLength: 70, keyLength: 200, heads: 2, headDim: 40, causal: false, maskPeriod: 4, queryBlock: 32, keyTile: 128),
        // More queries than keys under a causal mask: the first ten see no key and average every value.
        Shape(queryLength: 90, keyLength: 80, heads: 1, headDim: 64, causal: true, maskPeriod: 0, queryBlock: 24, keyTile: 64),
        // A causal continuation (queries are the last 130 of 400 positions): rows end mid-tile, at different tiles.
        Shape(queryLength: 130, keyLength: 400, heads: 2, headDim: 64, causal: true, maskPeriod: 11, queryBlock: 36, keyTile: 64),
        // Fewer queries than one register block.
        Shape(queryLength: 3, keyLength: 500, heads: 2, headDim: 32, causal: false, maskPeriod: 6, queryBlock: 6, keyTile: 64),
        // The tile sizes this CPU's L2 gives, over more keys than one tile of them holds on any current CPU.
        Shape(queryLength: 700, keyLength: 5000, heads: 1, headDim: 64, causal: false, maskPeriod: 7, queryBlock: 0, keyTile: 0),
    ]

    /// Random inputs for `shape`, two batch items: queries, keys and values packed side by side as a fused
    /// projection writes them, and the mask (item 0 masked whole).
    struct Inputs {
        let query, keyValue: [Float]
        let mask: [Float]?
        init(_ shape: Shape) {
            let batch = 2, width = shape.heads * shape.headDim
            var generator = SplitMixGenerator(seed: UInt64(shape.queryLength * 1_000 + shape.keyLength))
            // Scores of a few units, as in trained models, so that the softmax is neither flat nor one-hot.
            query = (0..<(batch * shape.queryLength * width)).map { _ in 2 * generator.nextFloat() }
            keyValue = (0..<(batch * shape.keyLength * 2 * width)).map { _ in 2 * generator.nextFloat() }
            mask = shape.maskPeriod == 0 ? nil : (0..<(batch * shape.keyLength)).map { index in
                index < shape.keyLength || (index - shape.keyLength) % shape.maskPeriod == 3 ? 0 : 1
            }
        }
    }

    static func run(_ shape: Shape, _ inputs: Inputs, _ schedule: vlm_attention_schedule, bf16: Bool = false) -> [Float] {
        let batch = 2, width = shape.heads * shape.headDim
        var output = [Float](repeating: .nan, count: batch * shape.queryLength * width)
        inputs.query.withUnsafeBufferPointer { query in
            inputs.keyValue.withUnsafeBufferPointer { keyValue in
                output.withUnsafeMutableBufferPointer { output in
                    for item in 0..<batch {
                        var problem = vlm_attention_problem(
                            query: query.baseAddress! + item * shape.queryLength * width,
                            key: keyValue.baseAddress! + item * shape.keyLength * 2 * width,
                            value: keyValue.baseAddress! + item * shape.keyLength * 2 * width + width,
                            output: output.baseAddress! + item * shape.queryLength * width,
                            query_stride: width, key_stride: 2 * width, value_stride: 2 * width, output_stride: width,
                            query_length: shape.queryLength, key_length: shape.keyLength, head_dim: shape.headDim,
                            head_count: shape.heads, scale: 1 / Float(shape.headDim).squareRoot(),
                            causal: shape.causal ? 1 : 0, key_mask: nil, bf16_products: bf16 ? 1 : 0,
                            half_key: nil, half_value: nil, streams: 0)
                        let status = inputs.mask.map { mask in
                            mask.withUnsafeBufferPointer { mask in
                                problem.key_mask = mask.baseAddress! + item * shape.keyLength
                                return vlm_attention_scheduled(&problem, schedule, shape.queryBlock, shape.keyTile,
                                                               vlm_best_isa())
                            }
                        } ?? vlm_attention_scheduled(&problem, schedule, shape.queryBlock, shape.keyTile, vlm_best_isa())
                        #expect(status == 0)
                    }
                }
            }
        }
        return output
    }

    @Test(arguments: shapes)
    func keyTilesMatchWholeRows(shape: Shape) {
        let inputs = Inputs(shape)
        let expected = Self.run(shape, inputs, VLM_ATTENTION_WHOLE_ROWS)
        let actual = Self.run(shape, inputs, VLM_ATTENTION_KEY_TILES)
        let largest = expected.map { abs($0) }.max() ?? 0
        let worst = zip(actual, expected).map { abs($0 - $1) }.max() ?? .infinity
        #expect(largest > 0.01)
        #expect(worst <= 1e-4 * largest, "\(shape.testDescription): off by \(worst), outputs up to \(largest)")
    }

    /// bf16 products against attention in double precision over the same bf16-rounded queries, keys and values.
    /// What remains is the probabilities' rounding to bf16 before their product with v (at most 2⁻⁹ of each, so of
    /// the largest value) and fp32 sums; a row that sees no key averages the unrounded values, as in fp32.
    @Test(.enabled(if: vlm_has_avx512_bf16() != 0), arguments: shapes.filter { $0.queryLength > 4 })
    func bf16ProductsMatchRoundedOperands(shape: Shape) {
        let inputs = Inputs(shape)
        let actual = Self.run(shape, inputs, VLM_ATTENTION_AUTOMATIC, bf16: true)
        let (width, d) = (shape.heads * shape.headDim, shape.headDim)
        let rounded = { (x: Float) -> Double in Double(Float(bitPattern: bf16Bits(x) << 16)) }
        // A spread of about 50 rows of each item (the reference is slow in a debug build), the first ten included:
        // under a causal mask they see the fewest keys, or none.
        let rows = Array(0..<min(10, shape.queryLength))
            + Array(stride(from: 10, to: shape.queryLength, by: max(1, shape.queryLength / 40)))
        var expected = actual
        for item in 0..<2 {
            for head in 0..<shape.heads {
                for i in rows {
                    let query = (0..<d).map { rounded(inputs.query[(item * shape.queryLength + i) * width + head * d + $0]) }
                    func keyValue(_ j: Int, _ c: Int, value: Bool) -> Float {
                        inputs.keyValue[(item * shape.keyLength + j) * 2 * width + (value ? width : 0) + head * d + c]
                    }
                    let visible = (0..<shape.keyLength).filter { j in
                        (!shape.causal || j <= i + shape.keyLength - shape.queryLength)
                            && (inputs.mask.map { $0[item * shape.keyLength + j] != 0 } ?? true)
                    }
                    var out = [Double](repeating: 0, count: d)
                    if visible.isEmpty {
                        for j in 0..<shape.keyLength {
                            for c in 0..<d { out[c] += Double(keyValue(j, c, value: true)) / Double(shape.keyLength) }
                        }
                    } else {
                        let scores = visible.map { j in
                            (0..<d).reduce(0.0) { $0 + query[$1] * rounded(keyValue(j, $1, value: false)) }
                                / Double(d).squareRoot()
                        }
                        let top = scores.max()!
                        let weights = scores.map { exp($0 - top) }
                        let total = weights.reduce(0, +)
                        for (j, weight) in zip(visible, weights) {
                            for c in 0..<d { out[c] += weight / total * rounded(keyValue(j, c, value: true)) }
                        }
                    }
                    for c in 0..<d { expected[(item * shape.queryLength + i) * width + head * d + c] = Float(out[c]) }
                }
            }
        }
        let fp32 = Self.run(shape, inputs, VLM_ATTENTION_AUTOMATIC)
        let largestValue = inputs.keyValue.map { abs($0) }.max()!
        let worst = zip(actual, expected).map { abs($0 - $1) }.max() ?? .infinity
        let fromFP32 = zip(actual, fp32).map { abs($0 - $1) }.max() ?? 0
        #expect(worst <= largestValue / 512 + 1e-5, "\(shape.testDescription): off by \(worst)")
        // The rounded operands move the scores: were this fp32, it would sit within a few ulp of the fp32 kernel.
        #expect(fromFP32 > 1e-4, "\(shape.testDescription): \(fromFP32) from fp32")
    }

    /// Masked keys contribute exactly nothing to the key-tiled schedule either, even when their scores would dominate.
    @Test func maskedKeysAreIgnored() {
        let (length, width) = (300, 64)
        var generator = SplitMixGenerator(seed: 5)
        let query = (0..<(length * width)).map { _ in generator.nextFloat() }
        var key = (0..<(length * width)).map { _ in generator.nextFloat() }
        var value = (0..<(length * width)).map { _ in generator.nextFloat() }
        let mask: [Float] = (0..<length).map { $0 % 9 == 2 ? 0 : 1 }
        func run() -> [Float] {
            var output = [Float](repeating: .nan, count: length * width)
            query.withUnsafeBufferPointer { query in
                key.withUnsafeBufferPointer { key in
                    value.withUnsafeBufferPointer { value in
                        mask.withUnsafeBufferPointer { mask in
                            output.withUnsafeMutableBufferPointer { output in
                                var problem = vlm_attention_problem(
                                    query: query.baseAddress, key: key.baseAddress, value: value.baseAddress,
                                    output: output.baseAddress, query_stride: width, key_stride: width,
                                    value_stride: width, output_stride: width, query_length: length, key_length: length,
                                    head_dim: width, head_count: 1, scale: 0.125, causal: 0, key_mask: mask.baseAddress,
                                    bf16_products: 0, half_key: nil, half_value: nil, streams: 0)
                                #expect(vlm_attention_scheduled(&problem, VLM_ATTENTION_KEY_TILES, 12, 64, vlm_best_isa()) == 0)
                            }
                        }
                    }
                }
            }
            return output
        }
        let original = run()
        for token in 0..<length where mask[token] == 0 {
            for feature in 0..<width {
                key[token * width + feature] = 1e4
                value[token * width + feature] = -7
            }
        }
        #expect(run() == original)
    }
}

/// `x` rounded to bf16, ties to even (the bits of the float's upper half).
private func bf16Bits(_ x: Float) -> UInt32 {
    let bits = x.bitPattern
    return (bits &+ 0x7FFF &+ ((bits >> 16) & 1)) >> 16
}

/// SplitMix64's floats in [-1, 1).
private struct SplitMixGenerator {
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
