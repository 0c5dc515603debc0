internal import CVLMKernels

/// Multi-head scaled-dot-product attention, `softmax(q·kᵀ·scale + mask)·v`, per head.
///
/// - Parameters:
///   - query: `[B, Tq, heads·headDim]`, straight out of the query projection.
///   - key: `[B, Tk, heads·headDim]`.
///   - value: `[B, Tk, heads·headDim]`.
///   - causal: query `i` sees keys up to `i + Tk - Tq` (the last query sees every key).
///   - keyPaddingMask: `[B, Tk]`, nonzero where the key may be attended to (transformers' `attention_mask`).
///     A query left with no key at all averages every value, as transformers' eager attention does.
///   - scale: defaults to `1/√headDim`.
///   - precision: `.bfloat16` multiplies q·kᵀ and the probabilities by v on bf16-rounded operands with fp32 sums, as
///     a bf16 layer's products do (the softmax stays fp32), where the CPU has AVX512-BF16 and there are more than 4
///     queries; anything else runs fp32.
/// - Returns: `[B, Tq, heads·headDim]`.
public func attention(query: Tensor, key: Tensor, value: Tensor, heads: Int, causal: Bool = false,
                      keyPaddingMask: Tensor? = nil, scale: Float? = nil, precision: MatrixPrecision = .float32) -> Tensor {
    attention(query: query, key: key, value: value, heads: heads, causal: causal, keyPaddingMask: keyPaddingMask,
              scale: scale, path: .best, precision: precision)
}

/// Self-attention over the fused output of one query-key-value projection.
///
/// - Parameters:
///   - packedQKV: `[B, T, 3·heads·headDim]`: queries, keys and values side by side along the last dimension, as a
///     `Linear` whose weight stacks the three projections' weights produces them.
///   - heads, causal, keyPaddingMask, scale, precision: as in
///     ``attention(query:key:value:heads:causal:keyPaddingMask:scale:precision:)``, with `Tq = Tk = T`.
/// - Returns: `[B, T, heads·headDim]`.
public func attention(packedQKV: Tensor, heads: Int, causal: Bool = false, keyPaddingMask: Tensor? = nil,
                      scale: Float? = nil, precision: MatrixPrecision = .float32) -> Tensor {
    attention(packedQKV: packedQKV, heads: heads, causal: causal, keyPaddingMask: keyPaddingMask, scale: scale, path: .best,
              precision: precision)
}

/// Self-attention for one query token per batch item, over the fused output of one query-key-value projection: the
/// rows of ``attention(packedQKV:heads:causal:keyPaddingMask:scale:)``'s output that a model reads when it pools one
/// token (a class token, an end-of-text token), without the work for the others.
///
/// - Parameters:
///   - packedQKV: `[B, T, 3·heads·headDim]`, as for the full self-attention.
///   - queryPositions: `B` positions in `0..<T`: item `b`'s query is its token `queryPositions[b]`, which attends to
///     every key (`causal`: keys `0...queryPositions[b]`) as it would in the full self-attention.
///   - heads, causal, keyPaddingMask, scale: as in ``attention(packedQKV:heads:causal:keyPaddingMask:scale:)``.
/// - Returns: `[B, heads·headDim]`: row `b` is row `queryPositions[b]` of item `b` of the full self-attention.
public func attention(packedQKV: Tensor, heads: Int, queryPositions: [Int], causal: Bool = false,
                      keyPaddingMask: Tensor? = nil, scale: Float? = nil) -> Tensor {
    attention(packedQKV: packedQKV, heads: heads, queryPositions: queryPositions, causal: causal,
              keyPaddingMask: keyPaddingMask, scale: scale, path: .best)
}

func attention(query: Tensor, key: Tensor, value: Tensor, heads: Int, causal: Bool, keyPaddingMask: Tensor?,
               scale: Float?, path: KernelPath, precision: MatrixPrecision = .float32) -> Tensor {
    precondition(query.rank == 3 && key.rank == 3 && key.shape == value.shape && query.shape[0] == key.shape[0]
                 && query.shape[2] == key.shape[2],
                 "attention needs query [B, Tq, E], key and value [B, Tk, E]; got \(query.shape), \(key.shape), \(value.shape)")
    let (batch, queryLength, width) = (query.shape[0], query.shape[1], query.shape[2])
    let output = Tensor(uninitialized: query.shape)
    let layout = AttentionLayout(batch: batch, queryLength: queryLength, keyLength: key.shape[1], width: width,
                                 heads: heads, queryStride: width, keyStride: width, valueStride: width)
    runAttention(layout, query: query, queryOffset: 0, key: key, keyOffset: 0, value: value, valueOffset: 0,
                 output: output, causal: causal, keyPaddingMask: keyPaddingMask, scale: scale, path: path,
                 precision: precision)
    return output
}

func attention(packedQKV: Tensor, heads: Int, causal: Bool, keyPaddingMask: Tensor?, scale: Float?,
               path: KernelPath, precision: MatrixPrecision = .float32) -> Tensor {
    precondition(packedQKV.rank == 3 && packedQKV.shape[2] % 3 == 0,
                 "attention needs packed queries, keys and values [B, T, 3·E]; got \(packedQKV.shape)")
    let (batch, length, width) = (packedQKV.shape[0], packedQKV.shape[1], packedQKV.shape[2] / 3)
    let output = Tensor(uninitialized: [batch, length, width])
    let layout = AttentionLayout(batch: batch, queryLength: length, keyLength: length, width: width, heads: heads,
                                 queryStride: 3 * width, keyStride: 3 * width, valueStride: 3 * width)
    runAttention(layout, query: packedQKV, queryOffset: 0, key: packedQKV, keyOffset: width, value: packedQKV,
                 valueOffset: 2 * width, output: output, causal: causal, keyPaddingMask: keyPaddingMask, scale: scale,
                 path: path, precision: precision)
    return output
}

func attention(packedQKV: Tensor, heads: Int, queryPositions: [Int], causal: Bool, keyPaddingMask: Tensor?,
               scale: Float?, path: KernelPath) -> Tensor {
    precondition(packedQKV.rank == 3 && packedQKV.shape[2] % 3 == 0 && queryPositions.count == packedQKV.shape[0],
                 "attention needs packed queries, keys and values [B, T, 3·E] and B query positions; got \(packedQKV.shape) and \(queryPositions.count)")
    let (batch, length, width) = (packedQKV.shape[0], packedQKV.shape[1], packedQKV.shape[2] / 3)
    if let keyPaddingMask {
        precondition(keyPaddingMask.shape == [batch, length],
                     "attention: keyPaddingMask \(keyPaddingMask.shape), expected [\(batch), \(length)]")
    }
    let queries = Tensor(uninitialized: [batch, 1, width])
    for (item, position) in queryPositions.enumerated() {
        precondition(position >= 0 && position < length, "attention: query position \(position) outside \(length) tokens")
        (queries.storage.pointer + item * width)
            .initialize(from: packedQKV.storage.pointer + (item * length + position) * 3 * width, count: width)
    }
    // A lone query at position p sees the keys a causal query p sees when the mask also hides the keys after p. The
    // kernel's causal rule would give it all of them, and a shorter key range would change what a query with no
    // visible key averages (every key, as in the full attention).
    var mask = keyPaddingMask
    if causal {
        let combined = Tensor(uninitialized: [batch, length])
        for (item, position) in queryPositions.enumerated() {
            for token in 0..<length {
                let padding = keyPaddingMask.map { $0.storage.pointer[item * length + token] != 0 } ?? true
                combined.storage.pointer[item * length + token] = token <= position && padding ? 1 : 0
            }
        }
        mask = combined
    }
    let output = Tensor(uninitialized: [batch, 1, width])
    let layout = AttentionLayout(batch: batch, queryLength: 1, keyLength: length, width: width, heads: heads,
                                 queryStride: width, keyStride: 3 * width, valueStride: 3 * width)
    runAttention(layout, query: queries, queryOffset: 0, key: packedQKV, keyOffset: width, value: packedQKV,
                 valueOffset: 2 * width, output: output, causal: false, keyPaddingMask: mask, scale: scale, path: path)
    return output.reshaped([batch, width])
}

/// Where attention's operands lie: every token's `heads·headDim` features start `*Stride` floats after the
/// previous token's, and batch items follow one another.
private struct AttentionLayout {
    let batch, queryLength, keyLength, width, heads: Int
    let queryStride, keyStride, valueStride: Int
}

/// Below this many multiply-adds (about 50 µs of work) attention runs on the calling thread: waking the other
/// cores would cost more than it saves.
private let parallelAttentionWork = 1 << 20

private func runAttention(_ layout: AttentionLayout, query: Tensor, queryOffset: Int, key: Tensor, keyOffset: Int,
                          value: Tensor, valueOffset: Int, output: Tensor, causal: Bool, keyPaddingMask: Tensor?,
                          scale: Float?, path: KernelPath, precision: MatrixPrecision = .float32) {
    let (batch, queryLength, keyLength, width, heads) =
        (layout.batch, layout.queryLength, layout.keyLength, layout.width, layout.heads)
    precondition(heads > 0 && width % heads == 0, "attention: width \(width) does not split into \(heads) heads")
    if let keyPaddingMask {
        precondition(keyPaddingMask.shape == [batch, keyLength],
                     "attention: keyPaddingMask \(keyPaddingMask.shape), expected [\(batch), \(keyLength)]")
    }
    if output.count == 0 { return }
    precondition(keyLength > 0, "attention over zero keys")
    let headDim = width / heads
    let scale = scale ?? 1 / Float(headDim).squareRoot()

    // A work unit is a run of consecutive heads of one batch item: the kernel fetches the next head's data while it
    // works on the current one, so runs should be long, but there should be a few units per core to balance.
    let groupsPerItem = min(heads, max(1, (2 * processorCount + batch - 1) / batch))
    let units = batch * groupsPerItem
    let run: @Sendable (Int) -> Void = { unit in
        let (item, group) = unit.quotientAndRemainder(dividingBy: groupsPerItem)
        let firstHead = group * heads / groupsPerItem
        let headCount = (group + 1) * heads / groupsPerItem - firstHead
        let headOffset = firstHead * headDim
        var problem = vlm_attention_problem(
            query: query.storage.pointer + queryOffset + item * queryLength * layout.queryStride + headOffset,
            key: key.storage.pointer + keyOffset + item * keyLength * layout.keyStride + headOffset,
            value: value.storage.pointer + valueOffset + item * keyLength * layout.valueStride + headOffset,
            output: output.storage.pointer + item * queryLength * width + headOffset,
            query_stride: layout.queryStride, key_stride: layout.keyStride, value_stride: layout.valueStride,
            output_stride: width, query_length: queryLength, key_length: keyLength, head_dim: headDim,
            head_count: headCount, scale: scale, causal: causal ? 1 : 0,
            key_mask: keyPaddingMask.map { UnsafePointer($0.storage.pointer + item * keyLength) },
            bf16_products: precision == .bfloat16 ? 1 : 0, half_key: nil, half_value: nil, streams: 0)
        precondition(vlm_attention(&problem, path.isa) == 0, "out of memory for attention scratch over \(keyLength) keys")
    }
    if batch * heads * queryLength * keyLength * headDim < parallelAttentionWork {
        for unit in 0..<units { run(unit) }
    } else {
        parallelFor(units, run)
    }
}
