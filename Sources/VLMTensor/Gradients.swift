internal import CVLMKernels
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// The forward operations training needs beyond inference's (a linear layer whose weight changes every step, attention
// that keeps its probabilities) and the gradients of each operation a transformer is built from, as PyTorch's
// autograd computes them: given the gradient of the loss with respect to an operation's output, the gradients with
// respect to its inputs and parameters.

/// `x·Wᵀ + b` over the last dimension for a weight `[out, in]` read as it is, unpacked: a weight that changes every
/// training step. (Inference packs each weight once: `Linear`.)
public func linear(_ x: Tensor, weight: Tensor, bias: Tensor?) -> Tensor {
    let (outFeatures, inFeatures) = (weight.shape[0], weight.shape[1])
    precondition(weight.rank == 2 && x.shape.last == inFeatures && (bias.map { $0.shape == [outFeatures] } ?? true),
                 "linear of \(x.shape) with weight \(weight.shape) and bias \(bias?.shape ?? [])")
    let product = matmul(x.reshaped([x.count / inFeatures, inFeatures]), weight, transposeB: true)
    return (bias.map { add(product, $0) } ?? product).reshaped(Array(x.shape.dropLast()) + [outFeatures])
}

/// The gradients of ``linear(_:weight:bias:)``.
public struct LinearGradients: Sendable {
    /// `dY·W`, shaped like the input.
    public let input: Tensor
    /// `dYᵀ·X`, `[out, in]`.
    public let weight: Tensor
    /// `dY` summed over rows, `[out]`.
    public let bias: Tensor
}

/// The gradients of `y = x·Wᵀ + b` given `outputGradient` (shaped like `y`).
public func linearBackward(_ outputGradient: Tensor, input: Tensor, weight: Tensor) -> LinearGradients {
    let (outFeatures, inFeatures) = (weight.shape[0], weight.shape[1])
    let rows = input.count / inFeatures
    precondition(outputGradient.count == rows * outFeatures, "linear gradient \(outputGradient.shape) for input \(input.shape), weight \(weight.shape)")
    let dy = outputGradient.reshaped([rows, outFeatures])
    let x = input.reshaped([rows, inFeatures])
    return LinearGradients(input: matmul(dy, weight).reshaped(input.shape), weight: matmul(dy, x, transposeA: true),
                           bias: columnSums(dy))
}

/// The sum over rows of a `[rows, columns]` tensor (any rank: all but the last dimension are rows), `[columns]`.
public func columnSums(_ x: Tensor) -> Tensor {
    let columns = x.shape.last ?? 0
    let sums = Tensor(zeros: [columns])
    guard columns > 0 else { return sums }
    let source = x.storage.pointer, destination = sums.storage.pointer
    for row in 0..<(x.count / columns) {
        for column in 0..<columns { destination[column] += source[row * columns + column] }
    }
    return sums
}

/// The gradients of ``layerNorm(_:weight:bias:eps:)``.
public struct LayerNormGradients: Sendable {
    public let input: Tensor
    public let weight: Tensor
    public let bias: Tensor
}

/// The gradients of layer normalization over the last dimension, from its input (the mean and variance are
/// recomputed) and the gradient of its output.
public func layerNormBackward(_ outputGradient: Tensor, input: Tensor, weight: Tensor, eps: Float) -> LayerNormGradients {
    let features = weight.count
    precondition(input.shape == outputGradient.shape && input.shape.last == features,
                 "layerNorm gradient \(outputGradient.shape) for input \(input.shape), weight \(weight.shape)")
    let inputGradient = Tensor(uninitialized: input.shape)
    let rows = features == 0 ? 0 : input.count / features
    let units = (rows + backwardRowsPerUnit - 1) / backwardRowsPerUnit
    // Each unit's sums for the weight and bias, added up after.
    let partialWeight = Tensor(zeros: [units, features]), partialBias = Tensor(zeros: [units, features])
    let run: @Sendable (Int) -> Void = { unit in
        let x = input.storage.pointer, dy = outputGradient.storage.pointer, gamma = weight.storage.pointer
        let dx = inputGradient.storage.pointer
        let dGamma = partialWeight.storage.pointer + unit * features, dBeta = partialBias.storage.pointer + unit * features
        var normalized = [Float](repeating: 0, count: features)
        for row in (unit * backwardRowsPerUnit)..<min(rows, (unit + 1) * backwardRowsPerUnit) {
            let offset = row * features
            var sum = 0.0
            for i in 0..<features { sum += Double(x[offset + i]) }
            let mean = sum / Double(features)
            var squares = 0.0
            for i in 0..<features { squares += (Double(x[offset + i]) - mean) * (Double(x[offset + i]) - mean) }
            let inverseDeviation = 1 / (squares / Double(features) + Double(eps)).squareRoot()
            // dx = (dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)) / σ, with dx̂ = dy·γ.
            var meanGradient = 0.0, meanProjection = 0.0
            for i in 0..<features {
                normalized[i] = Float((Double(x[offset + i]) - mean) * inverseDeviation)
                let g = Double(dy[offset + i]) * Double(gamma[i])
                meanGradient += g
                meanProjection += g * Double(normalized[i])
                dGamma[i] += dy[offset + i] * normalized[i]
                dBeta[i] += dy[offset + i]
            }
            meanGradient /= Double(features)
            meanProjection /= Double(features)
            for i in 0..<features {
                let g = Double(dy[offset + i]) * Double(gamma[i])
                dx[offset + i] = Float((g - meanGradient - Double(normalized[i]) * meanProjection) * inverseDeviation)
            }
        }
    }
    if units <= 1 { (0..<units).forEach(run) } else { parallelFor(units, run) }
    return LayerNormGradients(input: inputGradient, weight: columnSums(partialWeight), bias: columnSums(partialBias))
}

/// Rows per parallel unit of a row-wise gradient.
private let backwardRowsPerUnit = 64

/// Elements per parallel unit of an elementwise gradient.
private let backwardElementsPerUnit = 1 << 14

/// The gradient of ``activation(_:_:)`` with respect to its input `x`, given the gradient of its output.
public func activationBackward(_ outputGradient: Tensor, input: Tensor, _ kind: Activation) -> Tensor {
    activationBackward(outputGradient, input: input, kind, backend: .best)
}

func activationBackward(_ outputGradient: Tensor, input: Tensor, _ kind: Activation, backend: Backend) -> Tensor {
    precondition(input.shape == outputGradient.shape, "activation gradient \(outputGradient.shape) for input \(input.shape)")
    let inputGradient = Tensor(uninitialized: input.shape)
    let count = input.count
    if count == 0 { return inputGradient }
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    if backend == .oneDNN && kind != .identity {
        oneDNNActivationBackward(outputGradient, input: input, kind, into: inputGradient)
        return inputGradient
    }
    #endif
    let units = (count + backwardElementsPerUnit - 1) / backwardElementsPerUnit
    let run: @Sendable (Int) -> Void = { unit in
        let x = input.storage.pointer, dy = outputGradient.storage.pointer, dx = inputGradient.storage.pointer
        for i in (unit * backwardElementsPerUnit)..<min(count, (unit + 1) * backwardElementsPerUnit) {
            dx[i] = dy[i] * kind.derivative(x[i])
        }
    }
    if units <= 1 { (0..<units).forEach(run) } else { parallelFor(units, run) }
    return inputGradient
}

extension Activation {
    /// d/dx of the function at `x`.
    func derivative(_ x: Float) -> Float {
        switch self {
        case .identity: return 1
        case .gelu:
            // Φ(x) + x·φ(x)
            return 0.5 * (1 + erf(x * 0.70710678118654752)) + x * 0.39894228040143268 * exp(-0.5 * x * x)
        case .geluTanh:
            let inner = 0.79788456080286536 * (x + 0.044715 * x * x * x)
            let t = tanh(inner)
            return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.79788456080286536 * (1 + 3 * 0.044715 * x * x)
        case .quickGelu:
            let s = 1 / (1 + exp(-1.702 * x))
            return s + 1.702 * x * s * (1 - s)
        case .relu: return x > 0 ? 1 : 0
        case .silu:
            let s = 1 / (1 + exp(-x))
            return s * (1 + x * (1 - s))
        case .sigmoid:
            let s = 1 / (1 + exp(-x))
            return s * (1 - s)
        case .elu: return x > 0 ? 1 : exp(x)
        }
    }
}

/// The gradient of ``l2Normalized(_:)`` with respect to its input `x`: `(dy − y·(y·dy)) / ‖x‖` per row, `y` the
/// normalized row.
public func l2NormalizedBackward(_ outputGradient: Tensor, input: Tensor) -> Tensor {
    precondition(input.shape == outputGradient.shape, "l2Normalized gradient \(outputGradient.shape) for input \(input.shape)")
    let inputGradient = Tensor(uninitialized: input.shape)
    let columns = input.shape.last ?? 0
    let x = input.storage.pointer, dy = outputGradient.storage.pointer, dx = inputGradient.storage.pointer
    for row in 0..<(columns == 0 ? 0 : input.count / columns) {
        let offset = row * columns
        var squares = 0.0
        for i in 0..<columns { squares += Double(x[offset + i]) * Double(x[offset + i]) }
        let norm = squares.squareRoot()
        var projection = 0.0
        for i in 0..<columns { projection += Double(x[offset + i]) / norm * Double(dy[offset + i]) }
        for i in 0..<columns {
            dx[offset + i] = Float((Double(dy[offset + i]) - Double(x[offset + i]) / norm * projection) / norm)
        }
    }
    return inputGradient
}

/// The gradient of ``embedding(_:ids:)`` with respect to its table `[rows, dim]`: each id's row gets the sum of the
/// output gradients of the positions that looked it up.
public func embeddingBackward(_ outputGradient: Tensor, ids: [Int], rows: Int) -> Tensor {
    let tableGradient = Tensor(uninitialized: [rows, outputGradient.shape.last ?? 0])
    embeddingBackward(outputGradient, ids: ids, into: tableGradient)
    return tableGradient
}

/// ``embeddingBackward(_:ids:rows:)`` written over `tableGradient`: a large table's gradient buffer kept from step
/// to step instead of fresh pages every step.
public func embeddingBackward(_ outputGradient: Tensor, ids: [Int], into tableGradient: Tensor) {
    tableGradient.storage.pointer.update(repeating: 0, count: tableGradient.count)
    embeddingBackward(outputGradient, ids: ids, addingInto: tableGradient)
}

/// ``embeddingBackward(_:ids:rows:)`` added to `tableGradient`: a table that is also a tied output head, whose
/// gradient holds the head's already.
public func embeddingBackward(_ outputGradient: Tensor, ids: [Int], addingInto tableGradient: Tensor) {
    let (rows, dim) = (tableGradient.shape[0], tableGradient.shape[1])
    precondition(tableGradient.rank == 2 && outputGradient.count == ids.count * dim,
                 "embedding gradient \(outputGradient.shape) for \(ids.count) ids into \(tableGradient.shape)")
    let dy = outputGradient.storage.pointer, dTable = tableGradient.storage.pointer
    for (position, id) in ids.enumerated() {
        precondition(id >= 0 && id < rows, "embedding id \(id) outside a table of \(rows) rows")
        for i in 0..<dim { dTable[id * dim + i] += dy[position * dim + i] }
    }
}

/// Self-attention's output with the probabilities its gradient needs.
public struct AttentionForTraining: Sendable {
    /// `[B, T, heads·headDim]`.
    public let output: Tensor
    /// `[B, heads, T, T]`: softmax(q·kᵀ·scale + mask) per item and head.
    public let probabilities: Tensor
}

/// Multi-head self-attention as ``attention(query:key:value:heads:causal:keyPaddingMask:scale:precision:)`` computes
/// it with `Tq = Tk = T` and the default scale, keeping the probabilities for ``attentionBackward(_:query:key:value:probabilities:heads:)``.
/// Each item's heads run in parallel, their products through `vlm_gemm` on the heads' strided columns.
public func attentionForTraining(query: Tensor, key: Tensor, value: Tensor, heads: Int, causal: Bool,
                                 keyPaddingMask: Tensor?) -> AttentionForTraining {
    attentionForTraining(query: query, key: key, value: value, heads: heads, causal: causal, keyPaddingMask: keyPaddingMask,
                         longSequence: longSequence)
}

/// - Parameter longSequence: the length from which each head's products go through oneDNN one head at a time.
func attentionForTraining(query: Tensor, key: Tensor, value: Tensor, heads: Int, causal: Bool, keyPaddingMask: Tensor?,
                          longSequence: Int) -> AttentionForTraining {
    precondition(query.rank == 3 && query.shape == key.shape && key.shape == value.shape && query.shape[2] % heads == 0,
                 "attention needs query, key and value [B, T, heads·headDim]; got \(query.shape), \(key.shape), \(value.shape)")
    let (batch, length, width) = (query.shape[0], query.shape[1], query.shape[2])
    precondition(keyPaddingMask.map { $0.shape == [batch, length] } ?? true, "key padding mask \(keyPaddingMask?.shape ?? []) for [\(batch), \(length)]")
    let headDim = width / heads
    let scale = 1 / Float(headDim).squareRoot()
    let output = Tensor(uninitialized: query.shape)
    let probabilities = Tensor(uninitialized: [batch, heads, length, length])
    if length >= longSequence {
        for unit in 0..<(batch * heads) {
            let (item, head) = (unit / heads, unit % heads)
            let scores = matmul(headSlice(query, item: item, head: head, heads: heads), headSlice(key, item: item, head: head, heads: heads),
                                transposeB: true)
            maskScores(scores.storage.pointer, length: length, item: item, scale: scale, causal: causal, keyPaddingMask: keyPaddingMask)
            let weights = softmax(scores)
            uniformWhereNothingIsVisible(weights.storage.pointer, scores: scores.storage.pointer, length: length)
            (probabilities.storage.pointer + unit * length * length).update(from: weights.storage.pointer, count: length * length)
            storeHeadSlice(matmul(weights, headSlice(value, item: item, head: head, heads: heads)), into: output, item: item,
                           head: head, heads: heads)
        }
        return AttentionForTraining(output: output, probabilities: probabilities)
    }
    parallelFor(batch * heads) { unit in
        let (item, head) = (unit / heads, unit % heads)
        let base = item * length * width + head * headDim
        let weights = probabilities.storage.pointer + unit * length * length
        // Scores q·kᵀ, then per row the scale, the masks and the softmax, in place.
        precondition(vlm_gemm(length, length, headDim, query.storage.pointer + base, width, key.storage.pointer + base, width, 1,
                              weights, length) == 0, "out of memory for GEMM scratch")
        maskScores(weights, length: length, item: item, scale: scale, causal: causal, keyPaddingMask: keyPaddingMask)
        for row in 0..<length {
            let scores = weights + row * length
            var largest = -Float.infinity
            for column in 0..<length { largest = max(largest, scores[column]) }
            if largest == -.infinity {
                // No key to attend to: every value alike, as transformers' eager attention's additive mask gives.
                for column in 0..<length { scores[column] = 1 / Float(length) }
                continue
            }
            var sum: Float = 0
            for column in 0..<length {
                scores[column] = scores[column] == -.infinity ? 0 : exp(scores[column] - largest)
                sum += scores[column]
            }
            for column in 0..<length { scores[column] /= sum }
        }
        precondition(vlm_gemm(length, headDim, length, weights, length, value.storage.pointer + base, width, 0,
                              output.storage.pointer + base, width) == 0, "out of memory for GEMM scratch")
    }
    return AttentionForTraining(output: output, probabilities: probabilities)
}

/// The gradients of self-attention with respect to its query, key and value.
public struct AttentionGradients: Sendable {
    public let query: Tensor
    public let key: Tensor
    public let value: Tensor
}

/// The gradients of ``attentionForTraining(query:key:value:heads:causal:keyPaddingMask:)`` from its inputs, its
/// probabilities and the gradient of its output: per item and head, `dV = Pᵀ·dO`, `dP = dO·Vᵀ`,
/// `dS = P ⊙ (dP − rowsum(dP ⊙ P))`, `dQ = dS·K·scale`, `dK = dSᵀ·Q·scale`; the heads in parallel, their products
/// through `vlm_gemm`.
public func attentionBackward(_ outputGradient: Tensor, query: Tensor, key: Tensor, value: Tensor,
                              probabilities: Tensor, heads: Int) -> AttentionGradients {
    attentionBackward(outputGradient, query: query, key: key, value: value, probabilities: probabilities, heads: heads,
                      longSequence: longSequence)
}

/// - Parameter longSequence: the length from which each head's products go through oneDNN one head at a time.
func attentionBackward(_ outputGradient: Tensor, query: Tensor, key: Tensor, value: Tensor, probabilities: Tensor, heads: Int,
                       longSequence: Int) -> AttentionGradients {
    let (batch, length, width) = (query.shape[0], query.shape[1], query.shape[2])
    precondition(outputGradient.shape == query.shape && probabilities.shape == [batch, heads, length, length],
                 "attention gradient \(outputGradient.shape), probabilities \(probabilities.shape) for query \(query.shape)")
    let headDim = width / heads
    let scale = 1 / Float(headDim).squareRoot()
    let dQuery = Tensor(uninitialized: query.shape), dKey = Tensor(uninitialized: key.shape)
    let dValue = Tensor(uninitialized: value.shape)
    if length >= longSequence {
        for unit in 0..<(batch * heads) {
            let (item, head) = (unit / heads, unit % heads)
            let weights = Tensor(shape: [length, length], scalars: Array(UnsafeBufferPointer(
                start: probabilities.storage.pointer + unit * length * length, count: length * length)))
            let outputGradient = headSlice(outputGradient, item: item, head: head, heads: heads)
            let (q, k) = (headSlice(query, item: item, head: head, heads: heads), headSlice(key, item: item, head: head, heads: heads))
            storeHeadSlice(matmul(weights, outputGradient, transposeA: true), into: dValue, item: item, head: head, heads: heads)
            let scoreGradient = matmul(outputGradient, headSlice(value, item: item, head: head, heads: heads), transposeB: true)
            softmaxBackward(scoreGradient.storage.pointer, probabilities: weights.storage.pointer, length: length, scale: scale)
            storeHeadSlice(matmul(scoreGradient, k), into: dQuery, item: item, head: head, heads: heads)
            storeHeadSlice(matmul(scoreGradient, q, transposeA: true), into: dKey, item: item, head: head, heads: heads)
        }
        return AttentionGradients(query: dQuery, key: dKey, value: dValue)
    }
    // Each unit writes only its own head's columns of its own item.
    parallelFor(batch * heads) { unit in
        let base = (unit / heads) * length * width + (unit % heads) * headDim
        let weights = probabilities.storage.pointer + unit * length * length
        let scratch = UnsafeMutablePointer<Float>.allocate(capacity: 2 * length * length)
        defer { scratch.deallocate() }
        let (scoreGradient, transposed) = (scratch, scratch + length * length)
        func gemm(_ m: Int, _ n: Int, _ k: Int, _ a: UnsafePointer<Float>, _ lda: Int, _ b: UnsafePointer<Float>, _ ldb: Int,
                  transposeB: Bool, _ c: UnsafeMutablePointer<Float>, _ ldc: Int) {
            precondition(vlm_gemm(m, n, k, a, lda, b, ldb, transposeB ? 1 : 0, c, ldc) == 0, "out of memory for GEMM scratch")
        }
        func transpose(_ source: UnsafePointer<Float>) {
            for row in 0..<length {
                for column in 0..<length { transposed[column * length + row] = source[row * length + column] }
            }
        }
        let dOut = outputGradient.storage.pointer + base
        // dV = Pᵀ·dO.
        transpose(weights)
        gemm(length, headDim, length, transposed, length, dOut, width, transposeB: false, dValue.storage.pointer + base, width)
        // dP = dO·Vᵀ, then dS = P ⊙ (dP − rowsum(dP ⊙ P)), scaled.
        gemm(length, length, headDim, dOut, width, value.storage.pointer + base, width, transposeB: true, scoreGradient, length)
        softmaxBackward(scoreGradient, probabilities: weights, length: length, scale: scale)
        // dQ = dS·K, dK = dSᵀ·Q.
        gemm(length, headDim, length, scoreGradient, length, key.storage.pointer + base, width, transposeB: false,
             dQuery.storage.pointer + base, width)
        transpose(scoreGradient)
        gemm(length, headDim, length, transposed, length, query.storage.pointer + base, width, transposeB: false,
             dKey.storage.pointer + base, width)
    }
    return AttentionGradients(query: dQuery, key: dKey, value: dValue)
}

/// From this many positions on, training attention takes each head's products through oneDNN one head after another
/// (its own threads splitting each product); shorter sequences' products are too small for that to pay, and their
/// heads run in parallel through `vlm_gemm` instead.
private let longSequence = 128

/// Scores `[T, T]` scaled, with the positions a query may not see (later ones when `causal`, padded keys) at −∞.
private func maskScores(_ scores: UnsafeMutablePointer<Float>, length: Int, item: Int, scale: Float, causal: Bool,
                        keyPaddingMask: Tensor?) {
    let mask = keyPaddingMask?.storage.pointer
    for row in 0..<length {
        for column in 0..<length {
            let visible = (!causal || column <= row) && (mask.map { $0[item * length + column] != 0 } ?? true)
            scores[row * length + column] = visible ? scores[row * length + column] * scale : -.infinity
        }
    }
}

/// Rows of `weights` (a softmax of `scores`) whose scores were all −∞ made uniform, as transformers' eager
/// attention's additive mask leaves them.
private func uniformWhereNothingIsVisible(_ weights: UnsafeMutablePointer<Float>, scores: UnsafePointer<Float>, length: Int) {
    for row in 0..<length where (0..<length).allSatisfy({ scores[row * length + $0] == -.infinity }) {
        for column in 0..<length { weights[row * length + column] = 1 / Float(length) }
    }
}

/// `dP` `[T, T]` turned in place into the scores' gradient `P ⊙ (dP − rowsum(dP ⊙ P))`, scaled.
private func softmaxBackward(_ gradient: UnsafeMutablePointer<Float>, probabilities: UnsafePointer<Float>, length: Int, scale: Float) {
    for row in 0..<length {
        let p = probabilities + row * length, d = gradient + row * length
        var weighted: Float = 0
        for column in 0..<length { weighted += d[column] * p[column] }
        for column in 0..<length { d[column] = p[column] * (d[column] - weighted) * scale }
    }
}

/// Head `head`'s columns of item `item` of `x [B, T, heads·headDim]`, copied: `[T, headDim]`.
private func headSlice(_ x: Tensor, item: Int, head: Int, heads: Int) -> Tensor {
    let (length, width) = (x.shape[1], x.shape[2])
    let headDim = width / heads
    let slice = Tensor(uninitialized: [length, headDim])
    for row in 0..<length {
        (slice.storage.pointer + row * headDim).update(from: x.storage.pointer + (item * length + row) * width + head * headDim,
                                                        count: headDim)
    }
    return slice
}

/// `slice [T, headDim]` written into head `head`'s columns of item `item` of `x`.
private func storeHeadSlice(_ slice: Tensor, into x: Tensor, item: Int, head: Int, heads: Int) {
    let (length, width) = (x.shape[1], x.shape[2])
    let headDim = width / heads
    for row in 0..<length {
        (x.storage.pointer + (item * length + row) * width + head * headDim).update(from: slice.storage.pointer + row * headDim,
                                                                                     count: headDim)
    }
}

/// The gradient of ``rmsNorm(_:weight:eps:)`` with respect to its input: with `r = 1/√(mean(x²) + eps)` and
/// `g = dy·w`, `dx = r·g − x·r³·mean(g·x)`. (The weight's is ``rmsNormWeightGradient(_:input:eps:)``, needed only
/// where the norm trains.)
public func rmsNormBackward(_ outputGradient: Tensor, input: Tensor, weight: Tensor, eps: Float) -> Tensor {
    let features = weight.count
    precondition(input.shape == outputGradient.shape && input.shape.last == features,
                 "rmsNorm gradient \(outputGradient.shape) for input \(input.shape), weight \(weight.shape)")
    let inputGradient = Tensor(uninitialized: input.shape)
    let rows = features == 0 ? 0 : input.count / features
    let units = (rows + backwardRowsPerUnit - 1) / backwardRowsPerUnit
    let run: @Sendable (Int) -> Void = { unit in
        let x = input.storage.pointer, dy = outputGradient.storage.pointer, w = weight.storage.pointer
        let dx = inputGradient.storage.pointer
        for row in (unit * backwardRowsPerUnit)..<min(rows, (unit + 1) * backwardRowsPerUnit) {
            let offset = row * features
            var squares = 0.0, projection = 0.0
            for i in 0..<features {
                squares += Double(x[offset + i]) * Double(x[offset + i])
                projection += Double(dy[offset + i]) * Double(w[i]) * Double(x[offset + i])
            }
            let r = 1 / (squares / Double(features) + Double(eps)).squareRoot()
            let correction = r * r * r * projection / Double(features)
            for i in 0..<features {
                dx[offset + i] = Float(r * Double(dy[offset + i]) * Double(w[i]) - Double(x[offset + i]) * correction)
            }
        }
    }
    if units <= 1 { (0..<units).forEach(run) } else { parallelFor(units, run) }
    return inputGradient
}

/// The gradient of ``rmsNorm(_:weight:eps:)`` with respect to its weight: `dw = Σ_rows dy·x·r`, with
/// `r = 1/√(mean(x²) + eps)` per row.
public func rmsNormWeightGradient(_ outputGradient: Tensor, input: Tensor, eps: Float) -> Tensor {
    precondition(input.shape == outputGradient.shape && input.rank > 0, "rmsNorm weight gradient \(outputGradient.shape) for input \(input.shape)")
    let features = input.shape.last!
    let rows = features == 0 ? 0 : input.count / features
    let x = input.storage.pointer, dy = outputGradient.storage.pointer
    var sums = [Double](repeating: 0, count: features)
    for row in 0..<rows {
        let offset = row * features
        var squares = 0.0
        for i in 0..<features { squares += Double(x[offset + i]) * Double(x[offset + i]) }
        let r = 1 / (squares / Double(features) + Double(eps)).squareRoot()
        for i in 0..<features { sums[i] += Double(dy[offset + i]) * Double(x[offset + i]) * r }
    }
    return Tensor(shape: [features], scalars: sums.map(Float.init))
}

/// Grouped-query attention's keys or values for every query head: `x [B, T, keyHeads·headDim]` with each key head
/// repeated for the `heads / keyHeads` query heads that read it, consecutively (transformers' `repeat_kv`).
public func repeatingKeyValueHeads(_ x: Tensor, keyHeads: Int, heads: Int) -> Tensor {
    precondition(x.rank == 3 && keyHeads > 0 && heads % keyHeads == 0 && x.shape[2] % keyHeads == 0,
                 "repeatingKeyValueHeads of \(x.shape) from \(keyHeads) to \(heads) heads")
    let headDim = x.shape[2] / keyHeads, group = heads / keyHeads
    let tokens = x.shape[0] * x.shape[1]
    let output = Tensor(uninitialized: [x.shape[0], x.shape[1], heads * headDim])
    for token in 0..<tokens {
        for head in 0..<heads {
            (output.storage.pointer + (token * heads + head) * headDim)
                .update(from: x.storage.pointer + (token * keyHeads + head / group) * headDim, count: headDim)
        }
    }
    return output
}

/// The gradient of ``repeatingKeyValueHeads(_:keyHeads:heads:)``: each key head's gradient is the sum over the query
/// heads that read it.
public func repeatingKeyValueHeadsBackward(_ outputGradient: Tensor, keyHeads: Int, heads: Int) -> Tensor {
    let headDim = outputGradient.shape[2] / heads, group = heads / keyHeads
    let tokens = outputGradient.shape[0] * outputGradient.shape[1]
    let inputGradient = Tensor(zeros: [outputGradient.shape[0], outputGradient.shape[1], keyHeads * headDim])
    let dy = outputGradient.storage.pointer, dx = inputGradient.storage.pointer
    for token in 0..<tokens {
        for head in 0..<heads {
            let source = dy + (token * heads + head) * headDim
            let destination = dx + (token * keyHeads + head / group) * headDim
            for i in 0..<headDim { destination[i] += source[i] }
        }
    }
    return inputGradient
}

/// The gradient of ``applyRotaryEmbedding(_:heads:cos:sin:)`` with respect to its input: the rotation is orthogonal,
/// so its gradient is the gradient rotated back (by `−sin`).
public func applyRotaryEmbeddingBackward(_ outputGradient: Tensor, heads: Int, cos: Tensor, sin: Tensor) -> Tensor {
    applyRotaryEmbedding(outputGradient, heads: heads, cos: cos, sin: scaled(sin, by: -1))
}

/// The cross-entropy of rows of `logits` `[N, V]` against their targets (nil: the row does not count) and its gradient
/// with respect to the logits, `(softmax − one-hot) · scale` on the counted rows and 0 elsewhere: each row's
/// exponentials computed once, the rows split over the cores. Returns each counted row's negative log-likelihood
/// (log Σ e^x − x[target], in Double from fp32 exponentials), nil for the others.
public func crossEntropyBackward(logits: Tensor, targets: [Int?], scale: Float) -> (negativeLogLikelihoods: [Double?], gradient: Tensor) {
    let vocabulary = logits.shape.last ?? 0
    precondition(logits.count == targets.count * vocabulary && targets.allSatisfy { ($0 ?? 0) >= 0 && ($0 ?? 0) < vocabulary },
                 "cross-entropy of logits \(logits.shape) against \(targets.count) targets")
    let gradient = Tensor(uninitialized: logits.shape)
    let losses = Tensor(uninitialized: [targets.count])
    parallelFor(targets.count) { row in
        let x = logits.storage.pointer + row * vocabulary, g = gradient.storage.pointer + row * vocabulary
        guard let target = targets[row] else {
            g.update(repeating: 0, count: vocabulary)
            return
        }
        var largest = -Float.infinity
        for i in 0..<vocabulary { largest = max(largest, x[i]) }
        var sum = 0.0
        for i in 0..<vocabulary {
            g[i] = exp(x[i] - largest)
            sum += Double(g[i])
        }
        let factor = Float(1 / sum) * scale
        for i in 0..<vocabulary { g[i] *= factor }
        g[target] -= scale
        losses.storage.pointer[row] = Float(log(sum) + Double(largest) - Double(x[target]))
    }
    return (targets.enumerated().map { $0.element == nil ? nil : Double(losses.storage.pointer[$0.offset]) }, gradient)
}
