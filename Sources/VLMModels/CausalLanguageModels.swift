import VLMCheckpoint
import VLMTensor

// What the decoders share: input checks, the KV cache's bounds, learned positions, sliding-window attention.

/// The length of every row of `rows`, which must be non-empty and equal.
func equalRowLength(_ rows: [[Int]], _ what: String) throws -> Int {
    guard let length = rows.first?.count, rows.allSatisfy({ $0.count == length }) else {
        throw ModelError.invalidInput("\(what) must be a non-empty batch of rows of equal length (pad on the left)")
    }
    return length
}

/// Rows of `table [vocabulary, width]` for token ids `[B][T]`: `[B, T, width]`; an id outside the table is an error.
func tokenEmbeddings(_ ids: [[Int]], table: Tensor) throws -> Tensor {
    try tokenEmbeddings(ids, table: .dense(table))
}

/// The same from a table held in fp32 or in blocks (``WeightMatrix/embeddingTable(_:)``).
func tokenEmbeddings(_ ids: [[Int]], table: WeightMatrix) throws -> Tensor {
    let length = try equalRowLength(ids, "input ids")
    let (vocabulary, width) = (table.shape[0], table.shape[1])
    for row in ids {
        if let bad = row.first(where: { $0 < 0 || $0 >= vocabulary }) {
            throw ModelError.invalidInput("token id \(bad) is outside the vocabulary of \(vocabulary)")
        }
    }
    return table.rows(ids.flatMap { $0 }).reshaped([ids.count, length, width])
}

/// An empty cache of `layers` layers of `width` keys and values per position in `heads` heads, refused when it is
/// absurdly large.
func makeBoundedCache(batch: Int, capacity: Int, layers: Int, width: Int, heads: Int = 1,
                      elementType: KVCache.ElementType = .float32) throws -> KVCache {
    let positions = batch.multipliedReportingOverflow(by: capacity)
    let bytes = positions.partialValue.multipliedReportingOverflow(by: 2 * max(layers, 1) * width * elementType.size)
    guard batch > 0, capacity > 0, !positions.overflow, !bytes.overflow,
          bytes.partialValue <= LlamaForCausalLM.maximumCacheBytes else {
        throw ModelError.invalidInput("a KV cache for \(batch) rows of \(capacity) positions is out of range")
    }
    return KVCache(batch: batch, capacity: capacity, layers: layers, width: width, heads: heads, elementType: elementType)
}

/// The checked shape of one forward pass of a decoder: `inputsEmbeds [B, T, width]`, a cache with room for `T`
/// more positions, and the attention mask over cached and new positions as a key padding mask (nil when it
/// masks nothing).
struct DecoderPass {
    let batch: Int, length: Int, past: Int
    let keyPaddingMask: Tensor?

    init(inputsEmbeds: Tensor, width: Int, attentionMask: [[Int]]?, cache: KVCache?, layers: Int, cacheWidth: Int) throws {
        guard inputsEmbeds.rank == 3, inputsEmbeds.shape[2] == width, inputsEmbeds.shape[0] > 0 else {
            throw ModelError.invalidInput("inputs_embeds must be [B, T, \(width)], got \(inputsEmbeds.shape)")
        }
        (batch, length) = (inputsEmbeds.shape[0], inputsEmbeds.shape[1])
        past = cache?.length ?? 0
        if let cache {
            guard cache.batch == batch, past + length <= cache.capacity, cache.layerCount == layers, cache.width == cacheWidth else {
                throw ModelError.invalidInput(
                    "the KV cache holds \(cache.batch) rows of \(cache.capacity) positions (\(past) used); \(batch) rows of \(length) more do not fit")
            }
        }
        var keyPaddingMask: Tensor?
        if let attentionMask {
            guard attentionMask.count == batch, try equalRowLength(attentionMask, "attention mask") == past + length else {
                throw ModelError.invalidInput("the attention mask must be [\(batch)][\(past + length)] (cached and new positions)")
            }
            if attentionMask.contains(where: { $0.contains(0) }) {
                keyPaddingMask = Tensor(shape: [batch, past + length], scalars: attentionMask.flatMap { $0.map { $0 != 0 ? 1 : 0 } })
            }
        }
        self.keyPaddingMask = keyPaddingMask
    }

    /// `positionIds` checked to be `[B][T]` of positions below `limit`, or `past ..< past + T` for every row.
    func positions(_ positionIds: [[Int]]?, below limit: Int) throws -> [[Int]] {
        let positions = positionIds ?? Array(repeating: Array(past..<(past + length)), count: batch)
        guard positions.count == batch, try equalRowLength(positions, "position ids") == length,
              positions.allSatisfy({ $0.allSatisfy { $0 >= 0 && $0 < limit } }) else {
            throw ModelError.invalidInput("position ids must be [\(batch)][\(length)] of positions in 0..<\(limit)")
        }
        return positions
    }

    /// Self-attention of a layer without grouped heads: the new keys and values are appended to `cache` (when
    /// there is one) and the queries attend causally to every cached and new position, read where the cache holds
    /// them.
    func selfAttention(query: Tensor, key: Tensor, value: Tensor, layer: Int, cache: KVCache?, heads: Int,
                       scale: Float) -> Tensor {
        guard let cache else {
            return attention(query: query, key: key, value: value, heads: heads, causal: true,
                             keyPaddingMask: keyPaddingMask, scale: scale)
        }
        cache.store(layer: layer, key: key, value: value)
        return groupedQueryAttention(query: query, keysAndValues: cache.keysAndValues(layer: layer), heads: heads,
                                     keyHeads: heads, keyLength: past + length, layout: cache.layout, causal: true,
                                     keyPaddingMask: keyPaddingMask, scale: scale)
    }
}

/// Rows `positions + offset` of a learned position table `[positions, width]`, as `[B, T, width]`.
func learnedPositions(_ table: Tensor, positions: [[Int]], offset: Int = 0) -> Tensor {
    embedding(table, ids: positions.flatMap { $0.map { $0 + offset } })
        .reshaped([positions.count, positions.first?.count ?? 0, table.shape[1]])
}

/// `weight [features]` when the layer norm has learned parameters, else ones (and zeros for the bias).
func layerNormParameters(_ tensor: (String, [Int]) throws -> Tensor, _ prefix: String, size: Int,
                         affine: Bool) throws -> (weight: Tensor, bias: Tensor) {
    guard affine else {
        return (Tensor(shape: [size], scalars: Array(repeating: 1, count: size)), Tensor(zeros: [size]))
    }
    return try (tensor("\(prefix).weight", [size]), tensor("\(prefix).bias", [size]))
}

/// What a rotary grouped-query decoder's config needs before a model is built from it: positive sizes, a layer count,
/// query heads in whole groups per key head, an even head width (RoPE rotates pairs); an error naming `file` else.
func validateRotaryDecoderShape(vocabSize: Int, hiddenSize: Int, intermediateSize: Int, numHiddenLayers: Int,
                                numAttentionHeads: Int, numKeyValueHeads: Int, headDim: Int, file: String) throws {
    let counts = [("vocab_size", vocabSize), ("hidden_size", hiddenSize), ("intermediate_size", intermediateSize),
                  ("num_attention_heads", numAttentionHeads), ("num_key_value_heads", numKeyValueHeads), ("head_dim", headDim)]
    for (key, value) in counts where value <= 0 {
        throw ModelError.invalidConfig("\(key) is \(value), expected a positive count", file: file)
    }
    guard numHiddenLayers >= 0 else { throw ModelError.invalidConfig("num_hidden_layers is \(numHiddenLayers)", file: file) }
    guard numAttentionHeads % numKeyValueHeads == 0 else {
        throw ModelError.invalidConfig(
            "num_attention_heads \(numAttentionHeads) is not a multiple of num_key_value_heads \(numKeyValueHeads)", file: file)
    }
    guard headDim % 2 == 0 else { throw ModelError.invalidConfig("head_dim \(headDim) is odd; RoPE rotates pairs", file: file) }
}

/// A rotary decoder layer's causal self-attention over grouped key heads: the new keys and values (`[B, T, …]`) stored
/// in `cache` at `layer` when there is one, then the queries attend to every cached and new position (`keyLength` in
/// all), or only to the last `window` of them where the sequence is longer. A query inside one of `blocks` (runs of
/// positions, counted over cached and new ones: one image's tokens) also sees the rest of its block, later positions
/// included, as transformers' `blockwise_overlay` lets Gemma 3's image tokens (`OR(causal, block)`, then the window's
/// `AND`).
func causalSelfAttention(query: Tensor, key: Tensor, value: Tensor, heads: Int, keyHeads: Int, layer: Int, cache: KVCache?,
                         keyLength: Int, window: Int?, keyPaddingMask: Tensor?, scale: Float,
                         blocks: [Range<Int>] = []) -> Tensor {
    var (keysAndValues, layout) = (KeysAndValues.floats(key: key, value: value), KeyValueLayout.tokenMajor)
    if let cache {
        cache.store(layer: layer, key: key, value: value)
        (keysAndValues, layout) = (cache.keysAndValues(layer: layer), cache.layout)
    }
    let past = keyLength - query.shape[1]
    func attend(_ queries: Range<Int>, keyEnd: Int, causal: Bool) -> Tensor {
        let query = queries.count == query.shape[1] ? query : sequenceSlice(query, (queries.lowerBound - past)..<(queries.upperBound - past))
        let mask = keyEnd == keyLength ? keyPaddingMask : keyPaddingMask.map { sequenceSlice($0, 0..<keyEnd) }
        if let window, queries.upperBound > window {
            return slidingWindowAttention(query: query, keysAndValues: keysAndValues, heads: heads, keyHeads: keyHeads,
                                          layout: layout, queries: queries, keyEnd: causal ? nil : keyEnd,
                                          window: window, keyPaddingMask: mask, scale: scale)
        }
        return groupedQueryAttention(query: query, keysAndValues: keysAndValues, heads: heads, keyHeads: keyHeads,
                                     keyLength: keyEnd, layout: layout, causal: causal, keyPaddingMask: mask, scale: scale)
    }
    // Runs of queries alike: outside the blocks causal, inside one the block's keys whole.
    let queries = past..<keyLength
    let crossed = blocks.filter { $0.overlaps(queries) }
    guard !crossed.isEmpty else { return attend(queries, keyEnd: keyLength, causal: true) }
    var parts: [Tensor] = []
    var start = past
    for block in crossed.sorted(by: { $0.lowerBound < $1.lowerBound }) {
        if block.lowerBound > start { parts.append(attend(start..<block.lowerBound, keyEnd: block.lowerBound, causal: true)) }
        let end = min(block.upperBound, keyLength)
        parts.append(attend(max(start, block.lowerBound)..<end, keyEnd: end, causal: false))
        start = end
    }
    if start < keyLength { parts.append(attend(start..<keyLength, keyEnd: keyLength, causal: true)) }
    return parts.count == 1 ? parts[0] : concatenate(parts, axis: 1)
}

/// The runs of positions an attention mask marks as blocks (values of 2 and more, one value per block; see
/// ``CausalLanguageModel/logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``), the same in every
/// row.
///
/// - Throws: `ModelError.invalidInput` when the rows hold their blocks at different positions.
func attentionBlocks(_ attentionMask: [[Int]]?) throws -> [Range<Int>] {
    guard let attentionMask else { return [] }
    func blocks(_ row: [Int]) -> [Range<Int>] {
        var blocks: [Range<Int>] = []
        var start = 0
        for index in row.indices where index == row.count - 1 || row[index + 1] != row[index] {
            if row[index] >= 2 { blocks.append(start..<(index + 1)) }
            start = index + 1
        }
        return blocks
    }
    let first = attentionMask.first.map(blocks) ?? []
    guard attentionMask.dropFirst().allSatisfy({ blocks($0) == first }) else {
        throw ModelError.invalidInput("the rows of a batch must hold their image blocks at the same positions")
    }
    return first
}

/// Attention in which the query at sequence index `i` (one of `queries`, the positions of `query`'s rows) sees only keys
/// `i - window + 1 ... i` (transformers' `sliding_window_overlay` on the causal mask), or up to `keyEnd` where given
/// (a block's queries, which see its later keys). Each query attends to its own run of keys; a decoding step is one
/// query, so this costs a prefill longer than the window only.
private func slidingWindowAttention(query: Tensor, keysAndValues: KeysAndValues, heads: Int, keyHeads: Int, layout: KeyValueLayout,
                                    queries: Range<Int>, keyEnd: Int?, window: Int, keyPaddingMask: Tensor?, scale: Float) -> Tensor {
    let (batch, length, width) = (query.shape[0], query.shape[1], query.shape[2])
    let output = Tensor(uninitialized: query.shape)
    for (step, position) in queries.enumerated() {
        let seen = max(0, position - window + 1)..<(keyEnd ?? (position + 1))
        let attended = groupedQueryAttention(
            query: sequenceSlice(query, step..<(step + 1)), keysAndValues: keysAndValues, heads: heads, keyHeads: keyHeads,
            keyLength: seen.count, firstKey: seen.lowerBound, layout: layout, causal: false,
            keyPaddingMask: keyPaddingMask.map { sequenceSlice($0, seen) }, scale: scale)
        for item in 0..<batch {
            (output.storage.pointer + (item * length + step) * width)
                .initialize(from: attended.storage.pointer + item * width, count: width)
        }
    }
    return output
}
