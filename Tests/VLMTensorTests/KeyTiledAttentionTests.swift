import Testing
import CVLMKernels

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

    @Test(arguments: shapes)
    func keyTilesMatchWholeRows(shape: Shape) {
        let batch = 2
        let width = shape.heads * shape.headDim
        var generator = SplitMixGenerator(seed: UInt64(shape.queryLength * 1_000 + shape.keyLength))
        // Scores of a few units, as in trained models, so that the softmax is neither flat nor one-hot.
        let query = (0..<(batch * shape.queryLength * width)).map { _ in 2 * generator.nextFloat() }
        // Keys and values packed side by side, as a fused projection writes them.
        let keyValue = (0..<(batch * shape.keyLength * 2 * width)).map { _ in 2 * generator.nextFloat() }
        let mask: [Float]? = shape.maskPeriod == 0 ? nil : (0..<(batch * shape.keyLength)).map { index in
            index < shape.keyLength || (index - shape.keyLength) % shape.maskPeriod == 3 ? 0 : 1
        }

        func run(_ schedule: vlm_attention_schedule) -> [Float] {
            var output = [Float](repeating: .nan, count: batch * shape.queryLength * width)
            query.withUnsafeBufferPointer { query in
                keyValue.withUnsafeBufferPointer { keyValue in
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
                                causal: shape.causal ? 1 : 0, key_mask: nil)
                            let status = mask.map { mask in
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

        let expected = run(VLM_ATTENTION_WHOLE_ROWS), actual = run(VLM_ATTENTION_KEY_TILES)
        let largest = expected.map { abs($0) }.max() ?? 0
        let worst = zip(actual, expected).map { abs($0 - $1) }.max() ?? .infinity
        #expect(largest > 0.01)
        #expect(worst <= 1e-4 * largest, "\(shape.testDescription): off by \(worst), outputs up to \(largest)")
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
                                    head_dim: width, head_count: 1, scale: 0.125, causal: 0, key_mask: mask.baseAddress)
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
