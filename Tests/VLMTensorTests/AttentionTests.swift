import Foundation
import Testing
@testable import VLMTensor
import CVLMKernels

/// Attention against transformers' eager attention, through both kernel paths: `.vector` falls back to `.scalar`
/// on CPUs without AVX-512, where both cases check the same code.
@Suite struct AttentionTests {
    let fixtures = OpFixtures.shared
    static let paths: [KernelPath] = [.vector, .scalar]

    @Test(arguments: OpFixtures.names(op: "attention"), paths)
    func separateProjectionsMatchTorch(name: String, path: KernelPath) throws {
        let c = try #require(fixtures.cases[name])
        let y = attention(query: c.input("query"), key: c.input("key"), value: c.input("value"), heads: try #require(c.params.heads),
                          causal: try #require(c.params.causal as Bool?), keyPaddingMask: c.optionalInput("keyPaddingMask"),
                          scale: c.params.scale, path: path)
        expectClose(y, c.output(), "\(name) \(path)", tolerance: 1e-6)
    }

    @Test(arguments: OpFixtures.names(op: "attentionPacked"), paths)
    func packedProjectionMatchesTorch(name: String, path: KernelPath) throws {
        let c = try #require(fixtures.cases[name])
        let (heads, causal) = (try #require(c.params.heads), try #require(c.params.causal as Bool?))
        let packed = c.input("qkv")
        let mask = c.optionalInput("keyPaddingMask")
        let y = attention(packedQKV: packed, heads: heads, causal: causal, keyPaddingMask: mask, scale: nil, path: path)
        expectClose(y, c.output(), "\(name) \(path)", tolerance: 1e-6)

        // The packed layout only changes strides: the same numbers as from three separate tensors, bit for bit.
        let width = packed.shape[2] / 3
        let (query, key, value) = (slice(packed, part: 0, width: width), slice(packed, part: 1, width: width),
                                   slice(packed, part: 2, width: width))
        let separate = attention(query: query, key: key, value: value, heads: heads, causal: causal, keyPaddingMask: mask,
                                 scale: nil, path: path)
        #expect(y.scalars == separate.scalars, "\(name) \(path): packed and separate projections differ")
    }

    /// One query per item: the rows of torch's full output at those positions, for the first, the last and a middle
    /// token (under a causal mask the first sees one key, the last all of them). The vector path sums a lone query's
    /// dot products across 16 lanes rather than in feature order, which moves results by a few 1e-6.
    @Test(arguments: OpFixtures.names(op: "attentionPacked"), paths)
    func singleQueryPerItemMatchesTorch(name: String, path: KernelPath) throws {
        let c = try #require(fixtures.cases[name])
        let packed = c.input("qkv"), expected = c.output()
        let (batch, length, width) = (packed.shape[0], packed.shape[1], packed.shape[2] / 3)
        for choice in 0..<3 {
            let positions = (0..<batch).map { item in [0, length - 1, (length + item) / 2][(choice + item) % 3] }
            let y = attention(packedQKV: packed, heads: try #require(c.params.heads), queryPositions: positions,
                              causal: try #require(c.params.causal as Bool?), keyPaddingMask: c.optionalInput("keyPaddingMask"),
                              scale: nil, path: path)
            let rows = positions.enumerated().flatMap { item, position in
                expected.scalars[((item * length + position) * width)..<((item * length + position + 1) * width)]
            }
            expectClose(y, Tensor(shape: [batch, width], scalars: rows), "\(name) \(path) at \(positions)", tolerance: 1e-5)
        }
    }

    /// On a Linux machine whose CPU lists the AVX-512 features, or else AVX2's, the vector path is the one that runs,
    /// on the widest of them.
    @Test func bestPathUsesAVX512OrAVX2WhereTheCPUHasThem() throws {
        guard let cpuinfo = try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8),
              let flags = cpuinfo.split(separator: "\n").first(where: { $0.hasPrefix("flags") }) else { return }
        let features = Set(flags.split(separator: " ").map(String.init))
        let avx512: Set = ["avx512f", "avx512dq", "avx512bw", "avx512vl", "fma"], avx2: Set = ["avx2", "fma", "f16c"]
        let expected = avx512.isSubset(of: features) ? VLM_ISA_AVX512 : avx2.isSubset(of: features) ? VLM_ISA_AVX2 : VLM_ISA_SCALAR
        #expect(KernelPath.vectorISA == expected)
        #expect(KernelPath.best == (expected == VLM_ISA_SCALAR ? .scalar : .vector))
    }

    /// The public entry points run the best path.
    @Test func publicEntryPointsMatchTorch() throws {
        let c = try #require(fixtures.cases["attention_packed_causal_padding"])
        let y = attention(packedQKV: c.input("qkv"), heads: try #require(c.params.heads), causal: true,
                          keyPaddingMask: c.input("keyPaddingMask"))
        expectClose(y, c.output(), "packed, best path", tolerance: 1e-6)
        let s = try #require(fixtures.cases["attention_causal_padding"])
        let z = attention(query: s.input("query"), key: s.input("key"), value: s.input("value"), heads: try #require(s.params.heads),
                          causal: true, keyPaddingMask: s.input("keyPaddingMask"))
        expectClose(z, s.output(), "separate, best path", tolerance: 1e-6)
    }

    /// Masked keys contribute exactly nothing: changing their values must not change any output bit.
    @Test(arguments: paths)
    func maskedKeysAreIgnored(path: KernelPath) throws {
        let c = try #require(fixtures.cases["attention_head_dim_80"])
        let mask = c.input("keyPaddingMask")
        let (key, value) = (c.input("key"), c.input("value"))
        let (batch, length, width) = (key.shape[0], key.shape[1], key.shape[2])
        var changedKeys = key.scalars, changedValues = value.scalars
        for item in 0..<batch {
            for token in 0..<length where mask.scalars[item * length + token] == 0 {
                for feature in 0..<width {
                    changedKeys[(item * length + token) * width + feature] = 1e4
                    changedValues[(item * length + token) * width + feature] = -7
                }
            }
        }
        #expect(mask.scalars.contains(0))
        let heads = try #require(c.params.heads)
        let original = attention(query: c.input("query"), key: key, value: value, heads: heads, causal: false,
                                 keyPaddingMask: mask, scale: nil, path: path)
        let changed = attention(query: c.input("query"), key: Tensor(shape: key.shape, scalars: changedKeys),
                                value: Tensor(shape: value.shape, scalars: changedValues), heads: heads, causal: false,
                                keyPaddingMask: mask, scale: nil, path: path)
        #expect(original.scalars == changed.scalars)
    }

    /// `[B, T, 3E]` → the `part`-th `[B, T, E]` block.
    private func slice(_ packed: Tensor, part: Int, width: Int) -> Tensor {
        let tokens = packed.shape[0] * packed.shape[1]
        let all = packed.scalars
        var scalars: [Float] = []
        scalars.reserveCapacity(tokens * width)
        for token in 0..<tokens {
            scalars += all[(token * 3 + part) * width ..< (token * 3 + part + 1) * width]
        }
        return Tensor(shape: [packed.shape[0], packed.shape[1], width], scalars: scalars)
    }

    /// `precision: .bfloat16` reaches the bf16 kernel (KeyTiledAttentionTests checks its numbers) for the packed
    /// self-attention an encoder layer runs; int8 and fp32 run the fp32 kernel.
    @Test(.enabled(if: vlm_has_avx512_bf16() != 0), arguments: OpFixtures.names(op: "attentionPacked"))
    func bf16PrecisionTakesBf16Products(name: String) throws {
        let c = try #require(fixtures.cases[name])
        let (heads, causal) = (try #require(c.params.heads), try #require(c.params.causal as Bool?))
        let packed = c.input("qkv"), mask = c.optionalInput("keyPaddingMask")
        func run(_ precision: MatrixPrecision) -> [Float] {
            attention(packedQKV: packed, heads: heads, causal: causal, keyPaddingMask: mask, precision: precision).scalars
        }
        let fp32 = run(.float32)
        #expect(run(.int8) == fp32)
        let bf16 = run(.bfloat16)
        let difference = zip(bf16, fp32).map { abs($0 - $1) }.max() ?? 0
        // Four or fewer query rows stay fp32 (a decoding step's case); more take rounded operands, which move these
        // fixtures' outputs (scores of several units) by about 1% of the largest.
        if packed.shape[1] > 4, (packed.shape[2] / 3 / heads) % 2 == 0 {
            let largest = fp32.map { abs($0) }.max() ?? 0
            #expect(difference > 1e-6 && difference < 0.03 * largest, "\(name): \(difference) from fp32")
        } else {
            #expect(difference == 0, "\(name)")
        }
    }
}
