import Foundation
import Testing
@testable import VLMTensor

/// Each operation's gradient against central differences of the operation itself: for `L = Σ f(x) ⊙ r` with fixed
/// random `r`, the backward function given `r` must return ∂L/∂x. (The CLIP fixtures of VLMTrainingTests compare the
/// whole chain with torch's autograd; these pin down each piece, including the activations CLIP does not use.)
@Suite struct GradientTests {
    /// Deterministic values in [-scale, scale).
    static func values(_ count: Int, seed: UInt64, scale: Float = 1) -> [Float] {
        var state = seed
        return (0..<count).map { _ in
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return (Float(state >> 40) / Float(1 << 24) * 2 - 1) * scale
        }
    }

    static func tensor(_ shape: [Int], seed: UInt64, scale: Float = 1) -> Tensor {
        Tensor(shape: shape, scalars: values(Tensor.elementCount(shape), seed: seed, scale: scale))
    }

    /// ∂/∂x[i] of Σ f(x) ⊙ weights by central differences, in fp32 with step `h`.
    static func numericGradient(_ f: (Tensor) -> Tensor, at x: Tensor, weights: Tensor, h: Float = 1e-2) -> [Float] {
        (0..<x.count).map { i in
            func loss(_ shift: Float) -> Double {
                var shifted = x.scalars
                shifted[i] += shift
                let y = f(Tensor(shape: x.shape, scalars: shifted))
                return zip(y.scalars, weights.scalars).reduce(0.0) { $0 + Double($1.0) * Double($1.1) }
            }
            return Float((loss(h) - loss(-h)) / Double(2 * h))
        }
    }

    static func expectGradient(_ analytic: Tensor, _ numeric: [Float], _ what: String, tolerance: Float = 2e-3) {
        #expect(analytic.count == numeric.count, "\(what)")
        let worst = zip(analytic.scalars, numeric).map { abs($0 - $1) / max(1, abs($1)) }.max() ?? 0
        #expect(worst < tolerance, "\(what): off by \(worst)")
    }

    @Test(arguments: [Activation.identity, .gelu, .geluTanh, .quickGelu, .relu, .silu, .sigmoid, .elu], Backend.allCases)
    func activationDerivatives(kind: Activation, backend: Backend) {
        // Away from relu's kink at 0, where the difference quotient is meaningless.
        let x = Tensor(shape: [64], scalars: (0..<64).map { Float($0) / 8 - 3.95 })
        let r = Self.tensor([64], seed: 1)
        let analytic = activationBackward(r, input: x, kind, backend: backend)
        Self.expectGradient(analytic, Self.numericGradient({ activation($0, kind, backend: .portable) }, at: x, weights: r),
                            "\(kind) \(backend)")
    }

    /// Every backend's derivative is the closed form's (libm's erf, exp and tanh in plain Swift) to fp32 rounding,
    /// far into both tails and over more elements than one parallel unit.
    @Test(arguments: [Activation.gelu, .geluTanh, .quickGelu, .relu, .silu, .sigmoid, .elu])
    func activationDerivativeBackendsAgree(kind: Activation) {
        let count = 40_000
        let x = Tensor(shape: [count], scalars: (0..<count).map { Float($0 - count / 2) / 1000 + 0.0005 })
        let r = Self.tensor([count], seed: 3)
        let reference = activationBackward(r, input: x, kind, backend: .portable).scalars
        for backend in Backend.allCases {
            let gradient = activationBackward(r, input: x, kind, backend: backend).scalars
            let worst = zip(gradient, reference).map { abs($0 - $1) / max(1, abs($1)) }.max() ?? 0
            #expect(worst < 1e-5, "\(kind) \(backend): off the closed form by \(worst)")
        }
    }

    @Test func linearGradients() {
        let x = Self.tensor([2, 3, 4], seed: 2), w = Self.tensor([5, 4], seed: 3), b = Self.tensor([5], seed: 4)
        let r = Self.tensor([2, 3, 5], seed: 5)
        let gradients = linearBackward(r, input: x, weight: w)
        #expect(gradients.input.shape == x.shape && gradients.weight.shape == w.shape && gradients.bias.shape == b.shape)
        Self.expectGradient(gradients.input, Self.numericGradient({ linear($0, weight: w, bias: b) }, at: x, weights: r), "input")
        Self.expectGradient(gradients.weight, Self.numericGradient({ linear(x, weight: $0, bias: b) }, at: w, weights: r), "weight")
        Self.expectGradient(gradients.bias, Self.numericGradient({ linear(x, weight: w, bias: $0) }, at: b, weights: r), "bias")
    }

    /// The antialiased resize's transpose, shrinking (SigLIP 2's 16×16 position grid to a smaller patch grid), growing
    /// and keeping an axis: the resize is linear, so central differences are exact up to rounding.
    @Test(arguments: [(4, 4, 2, 3), (3, 5, 7, 2), (4, 4, 4, 6)])
    func antialiasedResizeGradients(inHeight: Int, inWidth: Int, height: Int, width: Int) {
        let x = Self.tensor([2, inHeight, inWidth], seed: 40), r = Self.tensor([2, height, width], seed: 41)
        let analytic = interpolateAntialiasedBackward(r, height: inHeight, width: inWidth)
        #expect(analytic.shape == x.shape)
        Self.expectGradient(analytic, Self.numericGradient({ interpolateAntialiased($0, height: height, width: width) }, at: x, weights: r),
                            "\(inHeight)×\(inWidth) → \(height)×\(width)")
    }

    /// A row combination (LLaVA-OneVision's packing: rows gathered from a table, a grid of them resized bilinearly)
    /// reads rows as `interpolate` reads the grid's channels, and its backward is its transpose.
    @Test(arguments: [(4, 6, 2, 3), (3, 5, 3, 5), (2, 3, 5, 4)])
    func rowCombinationGradients(height: Int, width: Int, toHeight: Int, toWidth: Int) {
        let channels = 3
        let grid = Self.tensor([height * width, channels], seed: 50)
        let resize = RowCombination.bilinearResize(height: height, width: width, toHeight: toHeight, toWidth: toWidth)
        let planes = channelsFirst(grid.reshaped([1, height * width, channels])).reshaped([1, channels, height, width])
        let expected = channelsFirst(interpolate(planes, height: toHeight, width: toWidth, mode: .bilinear)
            .reshaped([1, channels, toHeight * toWidth])).reshaped([toHeight * toWidth, channels])
        let difference = zip(resize(grid).scalars, expected.scalars).map { abs($0 - $1) }.max() ?? 0
        #expect(difference < 1e-6, "\(height)×\(width) → \(toHeight)×\(toWidth): off interpolate's by \(difference)")

        // Gathered rows (one twice), the resized grid, a row of the table after them.
        let table = Self.tensor([height * width + 1, channels], seed: 51)
        let rows = [[(row: height * width, weight: Float(1))], [(row: 1, weight: 1)], [(row: 1, weight: 1)]]
            + (0..<resize.outputRows).map { resize.terms(ofRow: $0) }
        let combination = RowCombination(inputRows: table.shape[0], rows: rows)
        let r = Self.tensor([combination.outputRows, channels], seed: 52)
        Self.expectGradient(combination.backward(r), Self.numericGradient({ combination($0) }, at: table, weights: r),
                            "\(height)×\(width) → \(toHeight)×\(toWidth)")
    }

    @Test func layerNormGradients() {
        // 70 rows: more than one parallel unit of rows.
        let x = Self.tensor([70, 6], seed: 6, scale: 2), w = Self.tensor([6], seed: 7), b = Self.tensor([6], seed: 8)
        let r = Self.tensor([70, 6], seed: 9)
        let gradients = layerNormBackward(r, input: x, weight: w, eps: 1e-5)
        let rows = Array(0..<6)  // the input's gradient checked on the first row's elements
        let firstRow = Tensor(shape: [1, 6], scalars: Array(x.scalars[0..<6]))
        Self.expectGradient(Tensor(shape: [6], scalars: rows.map { gradients.input.scalars[$0] }),
                            Self.numericGradient({ layerNorm($0, weight: w, bias: b, eps: 1e-5) }, at: firstRow,
                                                 weights: Tensor(shape: [1, 6], scalars: Array(r.scalars[0..<6]))), "input")
        Self.expectGradient(gradients.weight, Self.numericGradient({ layerNorm(x, weight: $0, bias: b, eps: 1e-5) }, at: w, weights: r), "weight")
        Self.expectGradient(gradients.bias, Self.numericGradient({ layerNorm(x, weight: w, bias: $0, eps: 1e-5) }, at: b, weights: r), "bias")
    }

    @Test func rmsNormGradient() {
        let x = Self.tensor([70, 6], seed: 20, scale: 2), w = Self.tensor([6], seed: 21), r = Self.tensor([70, 6], seed: 22)
        let analytic = rmsNormBackward(r, input: x, weight: w, eps: 1e-6)
        let firstRows = Tensor(shape: [2, 6], scalars: Array(x.scalars[0..<12]))
        Self.expectGradient(Tensor(shape: [12], scalars: Array(analytic.scalars[0..<12])),
                            Self.numericGradient({ rmsNorm($0, weight: w, eps: 1e-6) }, at: firstRows,
                                                 weights: Tensor(shape: [2, 6], scalars: Array(r.scalars[0..<12]))), "rmsNorm")
        Self.expectGradient(rmsNormWeightGradient(r, input: x, eps: 1e-6),
                            Self.numericGradient({ rmsNorm(x, weight: $0, eps: 1e-6) }, at: w, weights: r), "rmsNorm weight")
    }

    @Test func rotaryAndRepeatedHeadGradients() {
        let x = Self.tensor([2, 3, 8], seed: 23), r = Self.tensor([2, 3, 8], seed: 24)
        let tables = rotaryTables(positions: [0, 1, 2, 0, 1, 2], inverseFrequencies: [1, 0.1])
        Self.expectGradient(applyRotaryEmbeddingBackward(r, heads: 2, cos: tables.cos, sin: tables.sin),
                            Self.numericGradient({ applyRotaryEmbedding($0, heads: 2, cos: tables.cos, sin: tables.sin) }, at: x, weights: r),
                            "rotary")
        let keys = Self.tensor([2, 3, 4], seed: 25), repeated = Self.tensor([2, 3, 8], seed: 26)
        #expect(repeatingKeyValueHeads(keys, keyHeads: 2, heads: 4).scalars[0..<8].elementsEqual(
            keys.scalars[0..<2] + keys.scalars[0..<2] + keys.scalars[2..<4] + keys.scalars[2..<4]))
        Self.expectGradient(repeatingKeyValueHeadsBackward(repeated, keyHeads: 2, heads: 4),
                            Self.numericGradient({ repeatingKeyValueHeads($0, keyHeads: 2, heads: 4) }, at: keys, weights: repeated),
                            "repeated heads")
    }

    @Test func crossEntropyGradient() {
        let logits = Self.tensor([3, 7], seed: 31, scale: 3)
        let targets: [Int?] = [4, nil, 0]
        let (losses, gradient) = crossEntropyBackward(logits: logits, targets: targets, scale: 0.5)
        #expect(losses[1] == nil && gradient.scalars[7..<14].allSatisfy { $0 == 0 })
        for row in [0, 2] {
            let x = logits.scalars[(row * 7)..<(row * 7 + 7)].map(Double.init)
            let logSum = log(x.map { exp($0) }.reduce(0, +))
            #expect(abs(losses[row]! - (logSum - x[targets[row]!])) < 1e-5)
        }
        // The loss 0.5·Σ nll as a function of the logits, by central differences.
        func loss(_ t: Tensor) -> Tensor {
            let nll = crossEntropyBackward(logits: t, targets: targets, scale: 1).negativeLogLikelihoods
            return Tensor(shape: [1], scalars: [Float(0.5 * nll.compactMap { $0 }.reduce(0, +))])
        }
        Self.expectGradient(gradient, Self.numericGradient(loss, at: logits, weights: Tensor(shape: [1], scalars: [1])), "cross-entropy")
    }

    @Test func l2NormalizedGradient() {
        let x = Self.tensor([3, 5], seed: 10), r = Self.tensor([3, 5], seed: 11)
        Self.expectGradient(l2NormalizedBackward(r, input: x), Self.numericGradient(l2Normalized, at: x, weights: r), "l2Normalized")
    }

    @Test func embeddingGradientSumsRepeatedIds() {
        let r = Self.tensor([4, 3], seed: 12)
        let table = embeddingBackward(r, ids: [2, 0, 2, 3], rows: 5)
        let g = r.scalars
        #expect(table.scalars == [g[3], g[4], g[5], 0, 0, 0, g[0] + g[6], g[1] + g[7], g[2] + g[8], g[9], g[10], g[11], 0, 0, 0])
        let tied = Tensor(shape: [5, 3], scalars: (0..<15).map(Float.init))
        embeddingBackward(r, ids: [2, 0, 2, 3], addingInto: tied)
        #expect(zip(tied.scalars, zip(table.scalars, (0..<15).map(Float.init)).map(+)).allSatisfy { abs($0 - $1) < 1e-6 })
    }

    /// Causal attention with a padded key, against central differences of the forward pass, which must equal the
    /// inference kernel's output.
    @Test(arguments: [false, true])
    func attentionGradients(causal: Bool) {
        let shape = [2, 4, 6]  // two items, four positions, two heads of three
        let q = Self.tensor(shape, seed: 13), k = Self.tensor(shape, seed: 14), v = Self.tensor(shape, seed: 15)
        let mask = Tensor(shape: [2, 4], scalars: [1, 1, 1, 1, 1, 1, 1, 0])
        let r = Self.tensor(shape, seed: 16)
        let forward = attentionForTraining(query: q, key: k, value: v, heads: 2, causal: causal, keyPaddingMask: mask)
        let inference = attention(query: q, key: k, value: v, heads: 2, causal: causal, keyPaddingMask: mask)
        #expect(zip(forward.output.scalars, inference.scalars).allSatisfy { abs($0 - $1) < 1e-6 })
        let gradients = attentionBackward(r, query: q, key: k, value: v, probabilities: forward.probabilities, heads: 2)
        func output(q: Tensor = q, k: Tensor = k, v: Tensor = v) -> Tensor {
            attentionForTraining(query: q, key: k, value: v, heads: 2, causal: causal, keyPaddingMask: mask).output
        }
        Self.expectGradient(gradients.query, Self.numericGradient({ output(q: $0) }, at: q, weights: r), "query")
        Self.expectGradient(gradients.key, Self.numericGradient({ output(k: $0) }, at: k, weights: r), "key")
        Self.expectGradient(gradients.value, Self.numericGradient({ output(v: $0) }, at: v, weights: r), "value")
    }

    /// Long sequences' heads go through oneDNN one at a time, short ones' through vlm_gemm in parallel: both give the
    /// same probabilities, output and gradients (here on 40 positions, both ways).
    @Test func bothAttentionSchedulesAgree() {
        let shape = [2, 40, 12]  // two items, forty positions, three heads of four
        let q = Self.tensor(shape, seed: 27), k = Self.tensor(shape, seed: 28), v = Self.tensor(shape, seed: 29)
        let r = Self.tensor(shape, seed: 30)
        let mask = Tensor(shape: [2, 40], scalars: (0..<80).map { $0 < 40 || $0 % 40 < 33 ? 1 : 0 })
        let short = attentionForTraining(query: q, key: k, value: v, heads: 3, causal: true, keyPaddingMask: mask, longSequence: 41)
        let long = attentionForTraining(query: q, key: k, value: v, heads: 3, causal: true, keyPaddingMask: mask, longSequence: 40)
        func close(_ a: Tensor, _ b: Tensor) -> Bool { a.shape == b.shape && zip(a.scalars, b.scalars).allSatisfy { abs($0 - $1) < 1e-5 } }
        #expect(close(short.output, long.output) && close(short.probabilities, long.probabilities))
        let shortGradients = attentionBackward(r, query: q, key: k, value: v, probabilities: short.probabilities, heads: 3, longSequence: 41)
        let longGradients = attentionBackward(r, query: q, key: k, value: v, probabilities: long.probabilities, heads: 3, longSequence: 40)
        #expect(close(shortGradients.query, longGradients.query))
        #expect(close(shortGradients.key, longGradients.key))
        #expect(close(shortGradients.value, longGradients.value))
    }

    @Test(arguments: Backend.allCases)
    func matmulWithTransposedLeftOperand(backend: Backend) {
        let a = Self.tensor([5, 3], seed: 17), b = Self.tensor([5, 4], seed: 18), c = Self.tensor([4, 5], seed: 19)
        let expected = matmul(transposed(a), b, transposeB: false, backend: .portable)
        let product = matmul(a, b, transposeA: true, transposeB: false, backend: backend)
        #expect(product.shape == [3, 4])
        #expect(zip(product.scalars, expected.scalars).allSatisfy { abs($0 - $1) < 1e-5 })
        let both = matmul(a, c, transposeA: true, transposeB: true, backend: backend)
        let bothExpected = matmul(transposed(a), transposed(c), transposeB: false, backend: .portable)
        #expect(zip(both.scalars, bothExpected.scalars).allSatisfy { abs($0 - $1) < 1e-5 })
    }
}
