internal import CVLMKernels

/// Grouped-query attention that reads each key/value head where it lies, for decoders whose query heads share
/// key/value heads (transformers' `repeat_kv` without the copy), over the first `keyLength` positions of keys and
/// values that may have room for more (a preallocated KV cache).
///
/// - Parameters:
///   - query: `[B, Tq, heads·headDim]`.
///   - key: `[B, capacity, keyHeads·headDim]` with `capacity ≥ keyLength`; query head `h` uses key head
///     `h / (heads / keyHeads)`.
///   - value: the same shape as `key`.
///   - causal: query `i` sees keys up to `i + keyLength - Tq`.
///   - keyPaddingMask: `[B, keyLength]`, nonzero where the key may be attended to.
///   - scale: defaults to `1/√headDim`.
/// - Returns: `[B, Tq, heads·headDim]`.
public func groupedQueryAttention(query: Tensor, key: Tensor, value: Tensor, heads: Int, keyHeads: Int, keyLength: Int,
                                  causal: Bool, keyPaddingMask: Tensor? = nil, scale: Float? = nil) -> Tensor {
    groupedQueryAttention(query: query, key: key, value: value, heads: heads, keyHeads: keyHeads, keyLength: keyLength,
                          causal: causal, keyPaddingMask: keyPaddingMask, scale: scale, path: .best)
}

/// Below this many multiply-adds the heads run on the calling thread; waking the other cores costs more. Decoding
/// reads every cached key and value once, so it gains from the cores' combined memory bandwidth early (measured).
private let parallelWork = 1 << 16

func groupedQueryAttention(query: Tensor, key: Tensor, value: Tensor, heads: Int, keyHeads: Int, keyLength: Int,
                           causal: Bool, keyPaddingMask: Tensor?, scale: Float?, path: KernelPath) -> Tensor {
    precondition(query.rank == 3 && key.rank == 3 && key.shape == value.shape && query.shape[0] == key.shape[0],
                 "groupedQueryAttention needs query [B, Tq, E] and key, value [B, capacity, kvE]; got \(query.shape), \(key.shape), \(value.shape)")
    let (batch, queryLength, width) = (query.shape[0], query.shape[1], query.shape[2])
    let (capacity, keyWidth) = (key.shape[1], key.shape[2])
    precondition(heads > 0 && keyHeads > 0 && heads % keyHeads == 0 && width % heads == 0
                 && keyWidth == width / heads * keyHeads,
                 "groupedQueryAttention: \(heads) query heads of \(width) features do not fit \(keyHeads) key heads of \(keyWidth)")
    precondition(keyLength > 0 && keyLength <= capacity, "groupedQueryAttention over \(keyLength) of \(capacity) keys")
    if let keyPaddingMask {
        precondition(keyPaddingMask.shape == [batch, keyLength],
                     "groupedQueryAttention: keyPaddingMask \(keyPaddingMask.shape), expected [\(batch), \(keyLength)]")
    }
    let output = Tensor(uninitialized: query.shape)
    if output.count == 0 { return output }
    let headDim = width / heads, group = heads / keyHeads
    let scale = scale ?? 1 / Float(headDim).squareRoot()
    let run: @Sendable (Int) -> Void = { unit in
        let (item, head) = unit.quotientAndRemainder(dividingBy: heads)
        let keyOffset = item * capacity * keyWidth + head / group * headDim
        var problem = vlm_attention_problem(
            query: query.storage.pointer + item * queryLength * width + head * headDim,
            key: key.storage.pointer + keyOffset, value: value.storage.pointer + keyOffset,
            output: output.storage.pointer + item * queryLength * width + head * headDim,
            query_stride: width, key_stride: keyWidth, value_stride: keyWidth, output_stride: width,
            query_length: queryLength, key_length: keyLength, head_dim: headDim, head_count: 1, scale: scale,
            causal: causal ? 1 : 0, key_mask: keyPaddingMask.map { UnsafePointer($0.storage.pointer + item * keyLength) })
        precondition(vlm_attention(&problem, path.isa) == 0, "out of memory for attention scratch over \(keyLength) keys")
    }
    if batch * heads * queryLength * keyLength * headDim < parallelWork {
        for unit in 0..<(batch * heads) { run(unit) }
    } else {
        parallelFor(batch * heads, run)
    }
    return output
}

