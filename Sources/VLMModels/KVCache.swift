import VLMTensor

/// Keys and values of every layer for the tokens seen so far, preallocated for `capacity` positions so that
/// decoding appends in place. Made by a decoder's `makeCache(batch:capacity:)` and filled by its forward passes.
public final class KVCache: @unchecked Sendable {
    public let batch: Int
    public let capacity: Int
    /// Positions already stored.
    public private(set) var length = 0
    /// Per layer, `[batch, capacity, kvHeads·headDim]`.
    let keys: [Tensor]
    let values: [Tensor]
    let width: Int

    init(batch: Int, capacity: Int, layers: Int, width: Int) {
        self.batch = batch
        self.capacity = capacity
        self.width = width
        keys = (0..<layers).map { _ in Tensor(uninitialized: [batch, capacity, width]) }
        values = (0..<layers).map { _ in Tensor(uninitialized: [batch, capacity, width]) }
    }

    /// Writes `key` and `value` (`[batch, T, width]`) of `layer` at positions `length..<length + T`.
    func store(layer: Int, key: Tensor, value: Tensor) {
        let count = key.shape[1]
        for (source, destination) in [(key, keys[layer]), (value, values[layer])] {
            for item in 0..<batch {
                (destination.storage.pointer + (item * capacity + length) * width)
                    .update(from: source.storage.pointer + item * count * width, count: count * width)
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

    /// Copies every stored position into `destination`, an empty cache of the same model with room for them
    /// (growing a conversation's cache).
    public func copyStored(into destination: KVCache) throws {
        guard destination.batch == batch, destination.width == width, destination.keys.count == keys.count,
              destination.capacity >= length, destination.length == 0 else {
            throw ModelError.invalidInput(
                "a KV cache of \(destination.batch) rows of \(destination.capacity) positions cannot take this one's \(length) stored positions")
        }
        for (source, target) in zip(keys + values, destination.keys + destination.values) {
            for row in 0..<batch {
                (target.storage.pointer + row * destination.capacity * width)
                    .update(from: source.storage.pointer + row * capacity * width, count: length * width)
            }
        }
        destination.length = length
    }

    /// Makes row `i` a copy of what row `rows[i]` held, for every layer and stored position: beam search moves each
    /// beam's history to where its continuation now lives, in place.
    public func reorder(rows: [Int]) throws {
        guard rows.count == batch, rows.allSatisfy({ $0 >= 0 && $0 < batch }) else {
            throw ModelError.invalidInput("reordering a KV cache of \(batch) rows needs \(batch) row indices in 0..<\(batch), got \(rows)")
        }
        let moved = rows.enumerated().filter { $0.offset != $0.element }
        guard !moved.isEmpty, length > 0 else { return }
        let rowSize = capacity * width, used = length * width
        let scratch = UnsafeMutablePointer<Float>.allocate(capacity: batch * used)
        defer { scratch.deallocate() }
        for tensor in keys + values {
            let base = tensor.storage.pointer
            for row in 0..<batch { (scratch + row * used).update(from: base + row * rowSize, count: used) }
            for (row, source) in moved { (base + row * rowSize).update(from: scratch + source * used, count: used) }
        }
    }
}
