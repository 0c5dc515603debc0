import VLMTensor

/// Keys and values of every layer for the tokens seen so far, preallocated for `capacity` positions so that
/// decoding appends in place. Made by a decoder's `makeCache(batch:capacity:)` and filled by its forward passes.
public final class KVCache: @unchecked Sendable {
    /// What a cache holds its keys and values in.
    public enum ElementType: String, Sendable, CaseIterable {
        /// Floats, as transformers keeps an fp32 model's cache: the same numbers as transformers.
        case float32 = "f32"
        /// IEEE half floats, rounded as they are stored (to nearest, ties to even) and widened to floats as attention
        /// reads them: half the memory, and half the bytes a decoding step reads from its cache, as llama.cpp's
        /// default `--cache-type-k f16 --cache-type-v f16`. Attention's arithmetic stays fp32.
        case float16 = "f16"

        /// The element type of the caches of the decoders built inside `withValue` (``KVCache/ElementType/forNewModels``
        /// set there); fp32 elsewhere. Decoders that hold fp32 caches only (GPT-2, OPT, BLIP's text decoder, T5) ignore
        /// it; ``CausalLanguageModel/cacheElementType`` says what a model's caches hold.
        @TaskLocal public static var forNewModels = ElementType.float32

        /// Bytes of one key or value element.
        public var size: Int { self == .float32 ? 4 : 2 }
    }

    public let batch: Int
    public let capacity: Int
    public let elementType: ElementType
    /// Positions already stored.
    public private(set) var length = 0
    /// Per layer, `[batch, heads·capacity, width/heads]`: each row's positions of a head side by side (head-major,
    /// see `KeyValueLayout`); with one head, `[batch, capacity, width]`. Floats, or half floats in `halfKeys` and
    /// `halfValues` (these empty then).
    let keys: [Tensor]
    let values: [Tensor]
    private let halfKeys: [HalfTensor]
    private let halfValues: [HalfTensor]
    /// Features of a position, all heads.
    let width: Int
    /// Key/value heads, each a run of positions.
    let heads: Int
    private var headDim: Int { width / heads }
    /// How `keys` and `values` hold their positions, for attention that reads them in place.
    var layout: KeyValueLayout { heads == 1 ? .tokenMajor : .headMajor }
    /// Decoder layers the cache has room for.
    var layerCount: Int { Swift.max(keys.count, halfKeys.count) }

    init(batch: Int, capacity: Int, layers: Int, width: Int, heads: Int = 1, elementType: ElementType = .float32) {
        precondition(heads > 0 && width % heads == 0, "a KV cache of \(width) features cannot hold \(heads) heads")
        self.batch = batch
        self.capacity = capacity
        self.width = width
        self.heads = heads
        self.elementType = elementType
        let shape = [batch, heads * capacity, width / heads]
        let floats = elementType == .float32 ? layers : 0, halves = layers - floats
        keys = (0..<floats).map { _ in Tensor(uninitialized: shape) }
        values = (0..<floats).map { _ in Tensor(uninitialized: shape) }
        halfKeys = (0..<halves).map { _ in HalfTensor(uninitialized: shape) }
        halfValues = (0..<halves).map { _ in HalfTensor(uninitialized: shape) }
    }

    /// Whether this cache takes one more position of its one row from a decoder of `layers` layers whose keys and
    /// values are `heads` heads of `width` features in all (positions below 2^24, as every pass checks).
    func takesOneStep(layers: Int, heads: Int, width: Int) -> Bool {
        batch == 1 && length < capacity && length < 1 << 24 && layerCount == layers && self.heads == heads && self.width == width
    }

    /// What a fused decoding step over this cache reuses from step to step (see ``workspace(for:)``).
    private var stepWorkspace: FusedDecoderStep.Workspace?

    /// The workspace of `step`'s decoding steps over this cache, made by the first of them: its buffers are the
    /// cache's for as long as the cache lives.
    private func workspace(for step: FusedDecoderStep) -> FusedDecoderStep.Workspace {
        if let stepWorkspace, stepWorkspace.serves(step) { return stepWorkspace }
        let workspace = step.makeWorkspace(cache: layers, capacity: capacity)
        stepWorkspace = workspace
        return workspace
    }

    /// One fused decoding step over this cache at its next position: `prepare` writes the token's embedding row and
    /// the rotary rows of its position into the cache's workspace; the logits come back through `head` where the
    /// step ends at the final norm.
    func runFusedStep(_ step: FusedDecoderStep, head: (Tensor) -> Tensor,
                      prepare: (FusedDecoderStep.Workspace) -> Void) -> Tensor {
        let workspace = self.workspace(for: step)
        prepare(workspace)
        let output = step(workspace, position: length)
        advance(by: 1)
        return step.vocabularySize == nil ? head(output) : output
    }

    /// Layer `layer`'s keys and values, as attention reads them.
    func keysAndValues(layer: Int) -> KeysAndValues {
        elementType == .float32 ? .floats(key: keys[layer], value: values[layer])
            : .halves(key: halfKeys[layer], value: halfValues[layer])
    }

    /// Every layer's keys and values.
    var layers: [KeysAndValues] { (0..<layerCount).map(keysAndValues(layer:)) }

    /// The start of each layer's keys, then of each layer's values, as bytes: copies move elements of either type.
    private var buffers: [UnsafeMutableRawPointer] { (0..<(2 * layerCount)).map(buffer) }

    /// Buffer `index` of `buffers`.
    private func buffer(_ index: Int) -> UnsafeMutableRawPointer {
        let (isValue, layer) = index.quotientAndRemainder(dividingBy: layerCount)
        switch elementType {
        case .float32: return UnsafeMutableRawPointer((isValue == 0 ? keys : values)[layer].storage.pointer)
        case .float16: return UnsafeMutableRawPointer((isValue == 0 ? halfKeys : halfValues)[layer].pointer)
        }
    }

    /// Where position `position` of head `head` of row `row` starts in a layer's tensor, in elements.
    private func offset(row: Int, head: Int, position: Int) -> Int {
        ((row * heads + head) * capacity + position) * headDim
    }

    /// Copies `count` elements from element `from` of `source` to element `to` of `destination`.
    private func move(_ count: Int, from source: UnsafeMutableRawPointer, _ from: Int, to destination: UnsafeMutableRawPointer,
                      _ to: Int) {
        let size = elementType.size
        (destination + to * size).copyMemory(from: source + from * size, byteCount: count * size)
    }

    /// Writes `key` and `value` (`[batch, T, width]`, token-major) of `layer` at positions `length..<length + T`
    /// (rounded to halves in a half cache).
    func store(layer: Int, key: Tensor, value: Tensor) {
        let count = key.shape[1]
        for (source, target) in [(key, buffer(layer)), (value, buffer(layerCount + layer))] {
            func write(_ from: UnsafeMutablePointer<Float>, at element: Int, count: Int) {
                switch elementType {
                case .float32: (target.assumingMemoryBound(to: Float.self) + element).update(from: from, count: count)
                case .float16: roundToHalves(from, count: count, into: target.assumingMemoryBound(to: UInt16.self) + element)
                }
            }
            for item in 0..<batch {
                let from = source.storage.pointer + item * count * width
                if heads == 1 {
                    write(from, at: offset(row: item, head: 0, position: length), count: count * width)
                    continue
                }
                for head in 0..<heads {
                    let to = offset(row: item, head: head, position: length)
                    for position in 0..<count {
                        write(from + position * width + head * headDim, at: to + position * headDim, count: headDim)
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
              destination.layerCount == layerCount, destination.elementType == elementType, count >= 0, count <= length,
              destination.capacity >= count, destination.length == 0 else {
            throw ModelError.invalidInput(
                "a KV cache of \(destination.batch) rows of \(destination.capacity) positions cannot take \(count) of this one's \(length) stored positions")
        }
        for (source, target) in zip(buffers, destination.buffers) {
            for row in 0..<batch {
                for head in 0..<heads {
                    move(count * headDim, from: source, offset(row: row, head: head, position: 0),
                         to: target, destination.offset(row: row, head: head, position: 0))
                }
            }
        }
        destination.length = count
    }

    /// Bytes one position of one row takes (keys and values of every layer).
    public var bytesPerPosition: Int { 2 * layerCount * width * elementType.size }

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
                  && $0.cache.layerCount == first.layerCount && $0.cache.elementType == first.elementType && $0.row >= 0
                  && $0.row < $0.cache.batch && $0.count > 0 && $0.count <= $0.cache.length }) else {
            throw ModelError.invalidInput("cannot pack these KV cache rows into \(rows.count) rows of \(capacity) positions")
        }
        let packed = KVCache(batch: rows.count, capacity: capacity, layers: first.layerCount, width: first.width,
                             heads: first.heads, elementType: first.elementType)
        let (headDim, size) = (first.headDim, first.elementType.size)
        let targets = packed.buffers
        for (index, source) in rows.enumerated() {
            for (target, origin) in zip(targets, source.cache.buffers) {
                for head in 0..<first.heads {
                    let from = source.cache.offset(row: source.row, head: head,
                                                   position: source.cache.length - source.count)
                    let to = packed.offset(row: index, head: head, position: 0)
                    let padding = (length - source.count) * headDim
                    // Padding is masked, but a masked score times garbage (NaN) would still poison the sum: zero it
                    // (zero bits are a zero float and a zero half).
                    (target + to * size).initializeMemory(as: UInt8.self, repeating: 0, count: padding * size)
                    packed.move(source.count * headDim, from: origin, from, to: target, to + padding)
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
        let scratch = UnsafeMutableRawPointer.allocate(byteCount: batch * rowUsed * elementType.size, alignment: 64)
        defer { scratch.deallocate() }
        for base in buffers {
            for row in 0..<batch {
                for head in 0..<heads {
                    move(used, from: base, offset(row: row, head: head, position: 0), to: scratch, row * rowUsed + head * used)
                }
            }
            for (row, source) in moved {
                for head in 0..<heads {
                    move(used, from: scratch, source * rowUsed + head * used, to: base, offset(row: row, head: head, position: 0))
                }
            }
        }
    }
}
