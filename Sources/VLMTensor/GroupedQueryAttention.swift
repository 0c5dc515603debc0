internal import CVLMKernels
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How a key or value tensor holds its positions: one row of every head per position (`[B, capacity,
/// keyHeads·headDim]`, what a projection writes), or one run of positions per head (`[B, keyHeads·capacity, headDim]`:
/// a KV cache, so that a decoding step reads each head's keys and values as one stream, which the hardware
/// prefetchers follow, instead of a few lines of every row).
public enum KeyValueLayout: Sendable {
    case tokenMajor
    case headMajor
}

/// Grouped-query attention that reads each key/value head where it lies, for decoders whose query heads share
/// key/value heads (transformers' `repeat_kv` without the copy), over `keyLength` positions from `firstKey` of keys and
/// values that may have room for more (a preallocated KV cache).
///
/// - Parameters:
///   - query: `[B, Tq, heads·headDim]`.
///   - key: `[B, capacity, keyHeads·headDim]` (token-major) or `[B, keyHeads·capacity, headDim]` (head-major), with
///     `capacity ≥ firstKey + keyLength`; query head `h` uses key head `h / (heads / keyHeads)`.
///   - value: the same shape and layout as `key`.
///   - causal: query `i` sees keys up to `i + keyLength - Tq`.
///   - keyPaddingMask: `[B, keyLength]`, nonzero where the key may be attended to.
///   - scale: defaults to `1/√headDim`.
/// - Returns: `[B, Tq, heads·headDim]`.
public func groupedQueryAttention(query: Tensor, key: Tensor, value: Tensor, heads: Int, keyHeads: Int, keyLength: Int,
                                  firstKey: Int = 0, layout: KeyValueLayout = .tokenMajor, causal: Bool,
                                  keyPaddingMask: Tensor? = nil, scale: Float? = nil) -> Tensor {
    groupedQueryAttention(query: query, keysAndValues: .floats(key: key, value: value), heads: heads, keyHeads: keyHeads,
                          keyLength: keyLength, firstKey: firstKey, layout: layout, causal: causal,
                          keyPaddingMask: keyPaddingMask, scale: scale, path: .best)
}

/// ``groupedQueryAttention(query:key:value:heads:keyHeads:keyLength:firstKey:layout:causal:keyPaddingMask:scale:)``
/// over keys and values that may be half floats (a KV cache kept in fp16).
public func groupedQueryAttention(query: Tensor, keysAndValues: KeysAndValues, heads: Int, keyHeads: Int, keyLength: Int,
                                  firstKey: Int = 0, layout: KeyValueLayout = .tokenMajor, causal: Bool,
                                  keyPaddingMask: Tensor? = nil, scale: Float? = nil) -> Tensor {
    groupedQueryAttention(query: query, keysAndValues: keysAndValues, heads: heads, keyHeads: keyHeads,
                          keyLength: keyLength, firstKey: firstKey, layout: layout, causal: causal,
                          keyPaddingMask: keyPaddingMask, scale: scale, path: .best)
}

/// Where the keys (or values) of one head of one batch item start, and how far apart its positions are.
private struct KeyValueAddressing {
    let capacity: Int, stride: Int
    private let itemSize: Int, headSize: Int, start: Int

    init(shape: [Int], layout: KeyValueLayout, keyHeads: Int, headDim: Int, firstKey: Int) {
        switch layout {
        case .tokenMajor:
            (capacity, stride, headSize) = (shape[1], shape[2], headDim)
        case .headMajor:
            (capacity, stride) = (shape[1] / keyHeads, headDim)
            headSize = capacity * headDim
        }
        itemSize = shape[1] * shape[2]
        start = firstKey * stride
    }

    func offset(item: Int, keyHead: Int) -> Int { item * itemSize + keyHead * headSize + start }
}

/// Below this many multiply-adds the heads run on the calling thread; waking the other cores costs more. Decoding
/// reads every cached key and value once, so it gains from the cores' combined memory bandwidth early (measured).
private let parallelWork = 1 << 16

func groupedQueryAttention(query: Tensor, key: Tensor, value: Tensor, heads: Int, keyHeads: Int, keyLength: Int,
                           firstKey: Int = 0, layout: KeyValueLayout = .tokenMajor, causal: Bool, keyPaddingMask: Tensor?,
                           scale: Float?, path: KernelPath) -> Tensor {
    groupedQueryAttention(query: query, keysAndValues: .floats(key: key, value: value), heads: heads, keyHeads: keyHeads,
                          keyLength: keyLength, firstKey: firstKey, layout: layout, causal: causal,
                          keyPaddingMask: keyPaddingMask, scale: scale, path: path)
}

func groupedQueryAttention(query: Tensor, keysAndValues: KeysAndValues, heads: Int, keyHeads: Int, keyLength: Int,
                           firstKey: Int = 0, layout: KeyValueLayout = .tokenMajor, causal: Bool, keyPaddingMask: Tensor?,
                           scale: Float?, path: KernelPath) -> Tensor {
    let keyShape = keysAndValues.keyShape
    precondition(query.rank == 3 && keyShape.count == 3 && keysAndValues.shapesMatch && query.shape[0] == keyShape[0],
                 "groupedQueryAttention needs query [B, Tq, E] and key, value [B, capacity, kvE]; got \(query.shape), \(keyShape)")
    let (batch, queryLength, width) = (query.shape[0], query.shape[1], query.shape[2])
    precondition(heads > 0 && keyHeads > 0 && heads % keyHeads == 0 && width % heads == 0,
                 "groupedQueryAttention: \(heads) query heads of \(width) features do not share \(keyHeads) key heads")
    let headDim = width / heads, group = heads / keyHeads
    switch layout {
    case .tokenMajor:
        precondition(keyShape[2] == headDim * keyHeads,
                     "groupedQueryAttention: \(heads) query heads of \(width) features do not fit \(keyHeads) key heads of \(keyShape[2])")
    case .headMajor:
        precondition(keyShape[2] == headDim && keyShape[1] % keyHeads == 0,
                     "groupedQueryAttention: head-major keys \(keyShape) do not hold \(keyHeads) heads of \(headDim) features")
    }
    let keys = KeyValueAddressing(shape: keyShape, layout: layout, keyHeads: keyHeads, headDim: headDim, firstKey: firstKey)
    precondition(keyLength > 0 && firstKey >= 0 && firstKey + keyLength <= keys.capacity,
                 "groupedQueryAttention over keys \(firstKey)..<\(firstKey + keyLength) of \(keys.capacity)")
    if let keyPaddingMask {
        precondition(keyPaddingMask.shape == [batch, keyLength],
                     "groupedQueryAttention: keyPaddingMask \(keyPaddingMask.shape), expected [\(batch), \(keyLength)]")
    }
    let output = Tensor(uninitialized: query.shape)
    if output.count == 0 { return output }
    let scale = scale ?? 1 / Float(headDim).squareRoot()
    if queryLength == 1, let firstKeys = leftPaddingEnds(keyPaddingMask, batch: batch, keyLength: keyLength) {
        return decodingAttention(query: query, keysAndValues: keysAndValues, heads: heads, keyHeads: keyHeads,
                                 keyLength: keyLength, firstKeys: firstKeys, keys: keys, scale: scale, path: path)
    }
    if case let .halves(key, value) = keysAndValues {
        // A prompt reads each key head once per query head of its group: its attended halves widened once, head-major.
        let widened = [key, value].map { halves in
            let floats = Tensor(uninitialized: [batch, keyHeads * keyLength, headDim])
            for item in 0..<batch {
                for head in 0..<keyHeads {
                    let from = halves.pointer + keys.offset(item: item, keyHead: head)
                    let to = floats.storage.pointer + (item * keyHeads + head) * keyLength * headDim
                    if keys.stride == headDim {
                        vlm_halves_to_floats(from, keyLength * headDim, to, path.isa)
                        continue
                    }
                    for position in 0..<keyLength {
                        vlm_halves_to_floats(from + position * keys.stride, headDim, to + position * headDim, path.isa)
                    }
                }
            }
            return floats
        }
        return groupedQueryAttention(query: query, keysAndValues: .floats(key: widened[0], value: widened[1]), heads: heads,
                                     keyHeads: keyHeads, keyLength: keyLength, layout: .headMajor, causal: causal,
                                     keyPaddingMask: keyPaddingMask, scale: scale, path: path)
    }
    let run: @Sendable (Int) -> Void = { unit in
        let (item, head) = unit.quotientAndRemainder(dividingBy: heads)
        let keyOffset = keys.offset(item: item, keyHead: head / group)
        var problem = vlm_attention_problem(
            query: query.storage.pointer + item * queryLength * width + head * headDim, key: nil, value: nil,
            output: output.storage.pointer + item * queryLength * width + head * headDim,
            query_stride: width, key_stride: keys.stride, value_stride: keys.stride, output_stride: width,
            query_length: queryLength, key_length: keyLength, head_dim: headDim, head_count: 1, scale: scale,
            causal: causal ? 1 : 0, key_mask: keyPaddingMask.map { UnsafePointer($0.storage.pointer + item * keyLength) },
            bf16_products: 0, half_key: nil, half_value: nil, streams: 0)
        keysAndValues.address(&problem, offset: keyOffset)
        precondition(vlm_attention(&problem, path.isa) == 0, "out of memory for attention scratch over \(keyLength) keys")
    }
    if batch * heads * queryLength * keyLength * headDim < parallelWork {
        for unit in 0..<(batch * heads) { run(unit) }
    } else {
        parallelFor(batch * heads, run)
    }
    keysAndValues.keepAlive()
    return output
}

/// Keys per part below which a decoding step's attention is not split further.
private let minimumKeysPerPart = 64

/// How many ranges of keys a decoding step's attention splits each of one sequence's `units` (its key/value heads)
/// into: enough parts to keep the cores evenly busy, none shorter than `minimumKeysPerPart`.
func decodingAttentionParts(keyLength: Int, units: Int) -> Int {
    max(1, min(keyLength / minimumKeysPerPart, (2 * processorCount + units - 1) / units))
}

/// Where each item's keys start when `mask` (`[batch, keyLength]`) only pads items on the left, as batches of
/// decoding sequences are padded: zeros for no mask; nil for any other mask, or an item with no key.
private func leftPaddingEnds(_ mask: Tensor?, batch: Int, keyLength: Int) -> [Int]? {
    guard let mask else { return Array(repeating: 0, count: batch) }
    var ends: [Int] = []
    for item in 0..<batch {
        let row = UnsafeBufferPointer(start: mask.storage.pointer + item * keyLength, count: keyLength)
        let first = row.firstIndex { $0 != 0 } ?? keyLength
        guard first < keyLength, row[first...].allSatisfy({ $0 != 0 }) else { return nil }
        ends.append(first)
    }
    return ends
}

/// One decoding step (a single query position) of grouped-query attention, item `i` attending to keys
/// `firstKeys[i] ..< keyLength`, split into parts that each run a key/value head's group of query heads over a range
/// of keys: every cached key and value is read once, and there are enough parts to keep the cores evenly busy. The
/// parts' unnormalized softmax sums merge as in flash-decoding: rescaled to the largest maximum, added, divided by
/// the total weight. An item's parts depend on its own keys alone, so a sequence decoded in a batch (its padding
/// skipped) gets the floats it gets decoded alone.
private func decodingAttention(query: Tensor, keysAndValues: KeysAndValues, heads: Int, keyHeads: Int, keyLength: Int,
                               firstKeys: [Int], keys: KeyValueAddressing, scale: Float, path: KernelPath) -> Tensor {
    let (batch, width) = (query.shape[0], query.shape[2])
    let headDim = width / heads, group = heads / keyHeads
    let parts = firstKeys.map { decodingAttentionParts(keyLength: keyLength - $0, units: keyHeads) }
    // Item i's parts fill slots firstSlots[i] ..< firstSlots[i + 1], key head by key head.
    let firstSlots = parts.reduce(into: [0]) { $0.append($0.last! + keyHeads * $1) }
    let slots = firstSlots.last!
    let maxima = Tensor(uninitialized: [slots, group]), sums = Tensor(uninitialized: [slots, group])
    let partials = Tensor(uninitialized: [slots, group, headDim])
    let run: @Sendable (Int) -> Void = { slot in
        var item = 0
        while firstSlots[item + 1] <= slot { item += 1 }
        let (keyHead, part) = (slot - firstSlots[item]).quotientAndRemainder(dividingBy: parts[item])
        let length = keyLength - firstKeys[item], partLength = (length + parts[item] - 1) / parts[item]
        let keyOffset = keys.offset(item: item, keyHead: keyHead)
        var problem = vlm_attention_problem(
            query: query.storage.pointer + item * width + keyHead * group * headDim, key: nil, value: nil, output: nil,
            query_stride: headDim, key_stride: keys.stride, value_stride: keys.stride, output_stride: headDim,
            query_length: group, key_length: keyLength, head_dim: headDim, head_count: 1, scale: scale, causal: 0,
            key_mask: nil, bf16_products: 0, half_key: nil, half_value: nil, streams: 0)
        keysAndValues.address(&problem, offset: keyOffset)
        let first = part * partLength
        precondition(vlm_attention_partial(&problem, firstKeys[item] + first, min(partLength, length - first),
                                           maxima.storage.pointer + slot * group, sums.storage.pointer + slot * group,
                                           partials.storage.pointer + slot * group * headDim, path.isa) == 0,
                     "out of memory for attention scratch over \(keyLength) keys")
    }
    if batch * heads * keyLength * headDim < parallelWork {
        for slot in 0..<slots { run(slot) }
    } else {
        parallelFor(slots, run)
    }
    keysAndValues.keepAlive()
    // Item i's query rows are the output's rows of its key heads' groups, headDim features each.
    let output = Tensor(uninitialized: query.shape)
    for item in 0..<batch {
        let slot = firstSlots[item]
        vlm_attention_merge(maxima.storage.pointer + slot * group, sums.storage.pointer + slot * group,
                            partials.storage.pointer + slot * group * headDim, keyHeads, parts[item], group, headDim,
                            output.storage.pointer + item * width)
    }
    return output
}
