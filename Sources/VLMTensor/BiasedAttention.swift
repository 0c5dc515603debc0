internal import CVLMKernels
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Multi-head attention with an additive bias on every head's scores, `softmax(q·kᵀ·scale + bias + mask)·v`: T5's
/// relative position bias, which transformers adds to the scores before the mask.
///
/// The fused kernels behind ``attention(query:key:value:heads:causal:keyPaddingMask:scale:)`` take no bias; this runs
/// each head as two matrix products around a softmax over the biased scores.
///
/// - Parameters:
///   - query: `[B, Tq, heads·headDim]`.
///   - key: `[B, capacity, heads·headDim]` with `capacity ≥ keyLength`: the first `keyLength` positions are the keys
///     (a preallocated KV cache may hold room for more).
///   - value: the same shape as `key`.
///   - scoreBias: `[heads, Tq, keyLength]`, added to every batch item's scores.
///   - keyLength: keys attended to; nil means all of `key`.
///   - causal: query `i` sees keys up to `i + keyLength - Tq`.
///   - keyPaddingMask: `[B, keyLength]`, nonzero where the key may be attended to. A query left with no key at all
///     averages every value, as with transformers' additive mask of the dtype's minimum.
///   - scale: multiplies `q·kᵀ` before the bias is added.
/// - Returns: `[B, Tq, heads·headDim]`.
public func attention(query: Tensor, key: Tensor, value: Tensor, heads: Int, scoreBias: Tensor, keyLength: Int? = nil,
                      causal: Bool = false, keyPaddingMask: Tensor? = nil, scale: Float = 1) -> Tensor {
    precondition(query.rank == 3 && key.rank == 3 && key.shape == value.shape && query.shape[0] == key.shape[0]
                 && query.shape[2] == key.shape[2],
                 "attention needs query [B, Tq, E], key and value [B, capacity, E]; got \(query.shape), \(key.shape), \(value.shape)")
    let (batch, queryLength, width, capacity) = (query.shape[0], query.shape[1], query.shape[2], key.shape[1])
    let keyLength = keyLength ?? capacity
    precondition(heads > 0 && width % heads == 0, "attention: width \(width) does not split into \(heads) heads")
    precondition(keyLength > 0 && keyLength <= capacity, "attention over \(keyLength) of \(capacity) keys")
    precondition(scoreBias.shape == [heads, queryLength, keyLength],
                 "attention: scoreBias \(scoreBias.shape), expected [\(heads), \(queryLength), \(keyLength)]")
    if let keyPaddingMask {
        precondition(keyPaddingMask.shape == [batch, keyLength],
                     "attention: keyPaddingMask \(keyPaddingMask.shape), expected [\(batch), \(keyLength)]")
    }
    let output = Tensor(uninitialized: query.shape)
    if output.count == 0 { return output }
    let headDim = width / heads
    let run: @Sendable (Int) -> Void = { unit in
        let (item, head) = unit.quotientAndRemainder(dividingBy: heads)
        let scores = UnsafeMutablePointer<Float>.allocate(capacity: queryLength * keyLength)
        defer { scores.deallocate() }
        let queries = query.storage.pointer + item * queryLength * width + head * headDim
        let keys = key.storage.pointer + item * capacity * width + head * headDim
        let values = value.storage.pointer + item * capacity * width + head * headDim
        precondition(vlm_gemm(queryLength, keyLength, headDim, queries, width, keys, width, 1, scores, keyLength) == 0,
                     "out of memory for GEMM scratch")
        let bias = scoreBias.storage.pointer + head * queryLength * keyLength
        let mask = keyPaddingMask.map { $0.storage.pointer + item * keyLength }
        for row in 0..<queryLength {
            let visible = causal ? row + keyLength - queryLength + 1 : keyLength
            biasedSoftmax(scores + row * keyLength, bias: bias + row * keyLength, count: keyLength,
                          visible: visible, mask: mask, scale: scale)
        }
        precondition(vlm_gemm(queryLength, headDim, keyLength, scores, keyLength, values, width, 0,
                              output.storage.pointer + item * queryLength * width + head * headDim, width) == 0,
                     "out of memory for GEMM scratch")
    }
    // Below this many multiply-adds the heads run on the calling thread; waking the other cores costs more.
    if batch * heads * queryLength * keyLength * headDim < 1 << 18 {
        for unit in 0..<(batch * heads) { run(unit) }
    } else {
        parallelFor(batch * heads, run)
    }
    return output
}

/// One row of attention weights in place: `softmax(scores·scale + bias)` over the first `visible` keys that `mask`
/// allows, zero elsewhere; uniform over all `count` keys when none is allowed.
private func biasedSoftmax(_ scores: UnsafeMutablePointer<Float>, bias: UnsafePointer<Float>, count: Int, visible: Int,
                           mask: UnsafePointer<Float>?, scale: Float) {
    var largest = -Float.infinity
    for key in 0..<count {
        let allowed = key < visible && (mask.map { $0[key] != 0 } ?? true)
        scores[key] = allowed ? scores[key] * scale + bias[key] : -.infinity
        largest = max(largest, scores[key])
    }
    guard largest > -.infinity else {
        scores.update(repeating: 1 / Float(count), count: count)
        return
    }
    var sum: Float = 0
    for key in 0..<count {
        scores[key] = exp(scores[key] - largest)
        sum += scores[key]
    }
    for key in 0..<count { scores[key] /= sum }
}
