import VLMTensor

/// Keys and values of every layer for the tokens seen so far, preallocated for `capacity` positions so that
/// decoding appends in place. Made by a decoder's `makeCache(batch:capacity:)` and filled by its forward passes.
public final class KVCache: @unchecked Sendable {
    public let batch: Int
    public let capacity: Int
    /// Positions already stored.
    public private(set) var length = 0
    /// Per layer, `[batch, heads·capacity, width/heads]`: each row's positions of a head side by side (head-major,
    /// see `KeyValueLayout`); with one head, `[batch, capacity, width]`.
    let keys: [Tensor]
    let values: [Tensor]
    /// Features of a position, all heads.
    let width: Int
    /// Key/value heads, each a run of positions.
    let heads: Int
    private var headDim: Int { width / heads }
    /// How `keys` and `values` hold their positions, for attention that reads them in place.
    var layout: KeyValueLayout { heads == 1 ? .tokenMajor : .headMajor }

    init(batch: Int, capacity: Int, layers: Int, width: Int, heads: Int = 1) {
        precondition(heads > 0 && width % heads == 0, "a KV cache of \(width) features cannot hold \(heads) heads")
        self.batch = batch
        self.capacity = capacity
        self.width = width
        self.heads = heads
        keys = (0..<layers).map { _ in Tensor(uninitialized: [batch, heads * capacity, width / heads]) }
        values = (0..<layers).map { _ in Tensor(uninitialized: [batch, heads * capacity, width / heads]) }
    }

    /// Where position `position` of head `head` of row `row` starts in a layer's tensor.
    private func offset(row: Int, head: Int, position: Int) -> Int {
        ((row * heads + head) * capacity + position) * headDim
    }

    /// Writes `key` and `value` (`[batch, T, width]`, token-major) of `layer` at positions `length..<length + T`.
    func store(layer: Int, key: Tensor, value: Tensor) {
        let count = key.shape[1]
        for (source, destination) in [(key, keys[layer]), (value, values[layer])] {
            for item in 0..<batch {
                let from = source.storage.pointer + item * count * width
                if heads == 1 {
                    (destination.storage.pointer + offset(row: item, head: 0, position: length))
                        .update(from: from, count: count * width)
                    continue
                }
                for head in 0..<heads {
                    let to = destination.storage.pointer + offset(row: item, head: head, position: length)
                    for position in 0..<count {
                        (to + position * headDim).update(from: from + position * width + head * headDim, count: headDim)
                    }
                }
            }
        }
    }

    func advance(by count: Int) { length += count }

    /// Forgets every position from `length` on, so that the next forward pass writes there: a conversation that
    /// goes on from an earlier point than the cache has reached.
    public func truncate(to length: Int) throws {
        guard length >= 0, length <= self.length else {
            throw ModelError.invalidInput("cannot truncate a KV cache holding \(self.length) positions to \(length)")
        }
        self.length = length
    }

    /// Copies the first `count` stored positions (all of them by default) into `destination`, an empty cache of the
    /// same model with room for them (growing a conversation's cache, reusing a prompt's prefix).
    public func copyStored(into destination: KVCache, count: Int? = nil) throws {
        let count = count ?? length
        guard destination.batch == batch, destination.width == width, destination.heads == heads,
              destination.keys.count == keys.count, count >= 0, count <= length, destination.capacity >= count,
              destination.length == 0 else {
            throw ModelError.invalidInput(
                "a KV cache of \(destination.batch) rows of \(destination.capacity) positions cannot take \(count) of this one's \(length) stored positions")
        }
        for (source, target) in zip(keys + values, destination.keys + destination.values) {
            for row in 0..<batch {
                for head in 0..<heads {
                    let from = source.storage.pointer + offset(row: row, head: head, position: 0)
                    (target.storage.pointer + destination.offset(row: row, head: head, position: 0))
                        .update(from: from, count: count * headDim)
                }
            }
        }
        destination.length = count
    }

    /// Bytes one position of one row takes (keys and values of every layer, float32).
    public var bytesPerPosition: Int { 2 * keys.count * width * MemoryLayout<Float>.size }

    /// Where a row of a packed cache comes from: the last `count` stored positions of `cache`'s row `row`.
    public struct PackedRow {
        public var cache: KVCache
        public var row: Int
        public var count: Int

        public init(cache: KVCache, row: Int, count: Int) {
            self.cache = cache
            self.row = row
            self.count = count
        }
    }

    /// A cache of one model holding `rows.count` rows right-aligned: its length is the longest row's count, row `i`
    /// holds its source's positions at the end and the positions before them are zeros, to be masked as padding.
    /// Continuous batching composes a new batch from running sequences and newly prefilled ones this way.
    public static func packing(_ rows: [PackedRow], capacity: Int) throws -> KVCache {
        guard let first = rows.first?.cache else { throw ModelError.invalidInput("packing a KV cache needs at least one row") }
        let length = rows.map(\.count).max() ?? 0
        guard capacity >= length,
              rows.allSatisfy({ $0.cache.width == first.width && $0.cache.heads == first.heads
                  && $0.cache.keys.count == first.keys.count && $0.row >= 0 && $0.row < $0.cache.batch && $0.count > 0
                  && $0.count <= $0.cache.length }) else {
            throw ModelError.invalidInput("cannot pack these KV cache rows into \(rows.count) rows of \(capacity) positions")
        }
        let packed = KVCache(batch: rows.count, capacity: capacity, layers: first.keys.count, width: first.width,
                             heads: first.heads)
        let headDim = first.headDim
        for layer in 0..<first.keys.count {
            for (index, source) in rows.enumerated() {
                for head in 0..<first.heads {
                    let from = source.cache.offset(row: source.row, head: head,
                                                   position: source.cache.length - source.count)
                    let to = packed.offset(row: index, head: head, position: 0)
                    let padding = (length - source.count) * headDim
                    // Padding is masked, but a masked score times garbage (NaN) would still poison the sum: zero it.
                    for (target, origin) in [(packed.keys[layer], source.cache.keys[layer]),
                                             (packed.values[layer], source.cache.values[layer])] {
                        (target.storage.pointer + to).update(repeating: 0, count: padding)
                        (target.storage.pointer + to + padding)
                            .update(from: origin.storage.pointer + from, count: source.count * headDim)
                    }
                }
            }
        }
        packed.length = length
        return packed
    }

    /// Makes row `i` a copy of what row `rows[i]` held, for every layer and stored position: beam search moves each
    /// beam's history to where its continuation now lives, in place.
    public func reorder(rows: [Int]) throws {
        guard rows.count == batch, rows.allSatisfy({ $0 >= 0 && $0 < batch }) else {
            throw ModelError.invalidInput("reordering a KV cache of \(batch) rows needs \(batch) row indices in 0..<\(batch), got \(rows)")
        }
        let moved = rows.enumerated().filter { $0.offset != $0.element }
        guard !moved.isEmpty, length > 0 else { return }
        // Each row's stored positions, head after head.
        let used = length * headDim, rowUsed = heads * used
        let scratch = UnsafeMutablePointer<Float>.allocate(capacity: batch * rowUsed)
        defer { scratch.deallocate() }
        for tensor in keys + values {
            let base = tensor.storage.pointer
            for row in 0..<batch {
                for head in 0..<heads {
                    (scratch + row * rowUsed + head * used)
                        .update(from: base + offset(row: row, head: head, position: 0), count: used)
                }
            }
            for (row, source) in moved {
                for head in 0..<heads {
                    (base + offset(row: row, head: head, position: 0))
                        .update(from: scratch + source * rowUsed + head * used, count: used)
                }
            }
        }
    }
}
