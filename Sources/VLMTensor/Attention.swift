internal import CDNNL

private enum AttentionMask: Hashable {
    case none
    /// `[B, 1, 1, Tk]`: key padding only.
    case perKey
    /// `[B, 1, Tq, Tk]`: causal, possibly with key padding folded in.
    case perQueryAndKey
}

private enum AttentionStage: Hashable { case scores, softmax, weightedValues }

private struct AttentionKey: Hashable {
    let stage: AttentionStage
    let batch, heads, queryLength, keyLength, headDim: Int
    let mask: AttentionMask
    let scale: Float
}

private let attentionPrimitives = PrimitiveCache<AttentionKey>(capacity: 384)

/// Attention scores of this many floats (64 MiB) at most are materialized at once; larger batches run in slices.
let defaultScoreBudget = 1 << 24

/// Multi-head scaled-dot-product attention, `softmax(q·kᵀ·scale + mask)·v`, per head.
///
/// - Parameters:
///   - query: `[B, Tq, heads·headDim]`, straight out of the query projection.
///   - key: `[B, Tk, heads·headDim]`.
///   - value: `[B, Tk, heads·headDim]`.
///   - causal: query `i` sees keys up to `i + Tk - Tq` (the last query sees every key).
///   - keyPaddingMask: `[B, Tk]`, nonzero where the key may be attended to (transformers' `attention_mask`).
///     Every query must keep at least one key.
///   - scale: defaults to `1/√headDim`.
/// - Returns: `[B, Tq, heads·headDim]`.
public func attention(query: Tensor, key: Tensor, value: Tensor, heads: Int, causal: Bool = false,
                      keyPaddingMask: Tensor? = nil, scale: Float? = nil) -> Tensor {
    attention(query: query, key: key, value: value, heads: heads, causal: causal, keyPaddingMask: keyPaddingMask,
              scale: scale, scoreBudget: defaultScoreBudget)
}

func attention(query: Tensor, key: Tensor, value: Tensor, heads: Int, causal: Bool, keyPaddingMask: Tensor?,
               scale: Float?, scoreBudget: Int) -> Tensor {
    precondition(query.rank == 3 && key.rank == 3 && key.shape == value.shape && query.shape[0] == key.shape[0]
                 && query.shape[2] == key.shape[2],
                 "attention needs query [B, Tq, E], key and value [B, Tk, E]; got \(query.shape), \(key.shape), \(value.shape)")
    let (batch, queryLength, width) = (query.shape[0], query.shape[1], query.shape[2])
    let keyLength = key.shape[1]
    precondition(heads > 0 && width % heads == 0, "attention: width \(width) does not split into \(heads) heads")
    if let keyPaddingMask {
        precondition(keyPaddingMask.shape == [batch, keyLength], "attention: keyPaddingMask \(keyPaddingMask.shape), expected [\(batch), \(keyLength)]")
    }
    let headDim = width / heads
    let scale = scale ?? 1 / Float(headDim).squareRoot()
    let output = Tensor(uninitialized: query.shape)
    if output.count == 0 { return output }
    precondition(keyLength > 0, "attention over zero keys")

    let mask = additiveMask(batch: batch, queryLength: queryLength, keyLength: keyLength, causal: causal, keyPaddingMask: keyPaddingMask)
    let maskKind: AttentionMask = causal ? .perQueryAndKey : (keyPaddingMask == nil ? .none : .perKey)
    let maskRowLength = maskKind == .perQueryAndKey ? queryLength * keyLength : keyLength

    let scoresPerItem = heads * queryLength * keyLength
    let slice = max(1, min(batch, scoreBudget / max(scoresPerItem, 1)))
    let scores = Tensor(uninitialized: [slice * scoresPerItem])
    let floatSize = MemoryLayout<Float>.stride
    var start = 0
    while start < batch {
        let count = min(slice, batch - start)
        func primitive(_ stage: AttentionStage) -> Primitive {
            let cacheKey = AttentionKey(stage: stage, batch: count, heads: heads, queryLength: queryLength, keyLength: keyLength,
                                        headDim: headDim, mask: maskKind, scale: scale)
            return attentionPrimitives.primitive(for: cacheKey) { makeAttentionPrimitive(cacheKey) }
        }
        var scoreArguments: [(Int32, UnsafeMutableRawPointer)] = [
            (DNNL_ARG_SRC, query.rawPointer + start * queryLength * width * floatSize),
            (DNNL_ARG_WEIGHTS, key.rawPointer + start * keyLength * width * floatSize),
            (DNNL_ARG_DST, scores.rawPointer),
        ]
        if let mask { scoreArguments.append((postOpSource(0), mask.rawPointer + start * maskRowLength * floatSize)) }
        primitive(.scores).execute(scoreArguments)
        primitive(.softmax).execute([(DNNL_ARG_SRC, scores.rawPointer), (DNNL_ARG_DST, scores.rawPointer)])
        primitive(.weightedValues).execute([
            (DNNL_ARG_SRC, scores.rawPointer),
            (DNNL_ARG_WEIGHTS, value.rawPointer + start * keyLength * width * floatSize),
            (DNNL_ARG_DST, output.rawPointer + start * queryLength * width * floatSize),
        ])
        start += count
    }
    return output
}

/// The additive mask transformers builds: 0 where attending, the most negative float where not. A causal mask
/// is materialized per batch item because oneDNN's fast matmul cannot broadcast a binary post-op over the batch.
private func additiveMask(batch: Int, queryLength: Int, keyLength: Int, causal: Bool, keyPaddingMask: Tensor?) -> Tensor? {
    let blocked = -Float.greatestFiniteMagnitude
    if !causal {
        guard let keyPaddingMask else { return nil }
        let mask = Tensor(uninitialized: [batch, 1, 1, keyLength])
        for index in 0..<mask.count { mask.storage.pointer[index] = keyPaddingMask.storage.pointer[index] != 0 ? 0 : blocked }
        return mask
    }
    let mask = Tensor(uninitialized: [batch, 1, queryLength, keyLength])
    let offset = keyLength - queryLength
    for item in 0..<batch {
        let padding = keyPaddingMask.map { $0.storage.pointer + item * keyLength }
        for row in 0..<queryLength {
            let destination = mask.storage.pointer + (item * queryLength + row) * keyLength
            for column in 0..<keyLength {
                let visible = column <= row + offset && (padding?[column] ?? 1) != 0
                destination[column] = visible ? 0 : blocked
            }
        }
    }
    return mask
}

private func makeAttentionPrimitive(_ key: AttentionKey) -> Primitive {
    let (b, h, tq, tk, d) = (key.batch, key.heads, key.queryLength, key.keyLength, key.headDim)
    let width = h * d
    // Views of [B, T, heads·headDim] as [B, heads, T, headDim] without moving data.
    let queries = memoryDescriptor([b, h, tq, d], strides: [tq * width, d, width, 1])
    let scores = memoryDescriptor([b, h, tq, tk])
    let name: String
    let primitive: Primitive?
    switch key.stage {
    case .scores:
        name = "attention scores"
        var source = queries
        var keysTransposed = memoryDescriptor([b, h, d, tk], strides: [tk * width, d, 1, width])
        var destination = scores
        var operation = dnnl_matmul_desc_t()
        checkDNNL(dnnl_matmul_desc_init(&operation, &source, &keysTransposed, nil, &destination), "attention scores descriptor")
        var attributes = PrimitiveAttributes(outputScale: key.scale)
        switch key.mask {
        case .none: break
        case .perKey: attributes.postOps = [.add(memoryDescriptor([b, 1, 1, tk]))]
        case .perQueryAndKey: attributes.postOps = [.add(memoryDescriptor([b, 1, tq, tk]))]
        }
        primitive = Primitive(name, operation: operation, attributes: attributes)
    case .softmax:
        name = "attention softmax"
        primitive = Primitive(name, operation: softmaxOperation(scores, axis: 3))
    case .weightedValues:
        name = "attention values"
        var source = scores
        var values = memoryDescriptor([b, h, tk, d], strides: [tk * width, d, width, 1])
        var destination = queries
        var operation = dnnl_matmul_desc_t()
        checkDNNL(dnnl_matmul_desc_init(&operation, &source, &values, nil, &destination), "attention values descriptor")
        primitive = Primitive(name, operation: operation)
    }
    guard let primitive else { fatalError("oneDNN has no implementation of \(name) for \(key)") }
    return primitive
}
