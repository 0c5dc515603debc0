#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
internal import Foundation

/// Owns a 64-byte aligned block of `Float`s. Tensors share storage when reshaped; ops write fresh storage.
public final class TensorStorage: @unchecked Sendable {
    public let pointer: UnsafeMutablePointer<Float>
    public let count: Int

    public init(count: Int) {
        precondition(count >= 0, "negative element count")
        if let reused = smallBlocks.take(count: count) ?? largeBlocks.take(count: count) {
            pointer = reused
        } else {
            var raw: UnsafeMutableRawPointer?
            // posix_memalign wants a non-zero size; oneDNN and AVX-512 loads like 64-byte alignment.
            let status = posix_memalign(&raw, 64, max(count, 1) * MemoryLayout<Float>.stride)
            precondition(status == 0 && raw != nil, "out of memory allocating \(count) floats")
            pointer = raw!.bindMemory(to: Float.self, capacity: max(count, 1))
        }
        self.count = count
    }

    deinit {
        if !smallBlocks.keep(pointer, count: count) { largeBlocks.keepOrFree(pointer, count: count) }
    }

    /// Runs `body` keeping up to `bytes` of freed large blocks for reuse instead of the usual 256 MiB, then goes back
    /// to that. A training step allocates gigabytes of activations and gradients of the same sizes as the step
    /// before; served by the C allocator, each is fresh pages the kernel zeroes (a tenth of a 0.5B language model's
    /// step). Not reentrant: the outermost call's capacity holds.
    public static func reusingFreedBlocks<T>(upTo bytes: Int, _ body: () throws -> T) rethrows -> T {
        let previous = largeBlocks.setCapacity(bytes: bytes)
        defer { largeBlocks.setCapacity(bytes: previous) }
        return try body()
    }
}

/// Blocks of 1 KiB up to the large ones, kept by element count for the next tensor of that size. A decoding step
/// allocates a dozen activation rows of this size per layer between many small frees, and glibc serves each such
/// request by first sweeping every freed small block into its bins (malloc_consolidate): with the frees and
/// allocations, 4% of a small model's decoding step.
private let smallBlocks = SizedBlockPool(minimumBytes: 1 << 10, maximumBytes: 64 << 10, capacityBytes: 16 << 20)

/// Large blocks freed recently, handed out again for the same element count. A forward pass allocates the same
/// activation sizes layer after layer, and a decoding step the same logits row. The C allocator serves the largest
/// blocks with fresh pages from the kernel (mmap), whose faulting in and zeroing cost about 5% of a batched CLIP
/// forward pass; and glibc's free of any block from 64 KiB up sweeps all its small-block bins first
/// (malloc_consolidate, ~2% of a decoding step on the logits alone).
private let largeBlocks = BlockCache(minimumBytes: 64 << 10, capacityBytes: 256 << 20)

private final class BlockCache: @unchecked Sendable {
    private let minimumCount: Int
    private var capacityCount: Int
    private let lock = NSLock()
    /// Oldest first; the oldest go back to the allocator when the cache is over capacity.
    private var blocks: [(count: Int, pointer: UnsafeMutablePointer<Float>)] = []
    private var cachedCount = 0

    init(minimumBytes: Int, capacityBytes: Int) {
        minimumCount = minimumBytes / MemoryLayout<Float>.stride
        capacityCount = capacityBytes / MemoryLayout<Float>.stride
    }

    func take(count: Int) -> UnsafeMutablePointer<Float>? {
        guard count >= minimumCount else { return nil }
        lock.lock()
        defer { lock.unlock() }
        guard let index = blocks.lastIndex(where: { $0.count == count }) else { return nil }
        cachedCount -= count
        return blocks.remove(at: index).pointer
    }

    func keepOrFree(_ pointer: UnsafeMutablePointer<Float>, count: Int) {
        guard count >= minimumCount else { return free(pointer) }
        lock.lock()
        guard count <= capacityCount else {
            lock.unlock()
            return free(pointer)
        }
        blocks.append((count, pointer))
        cachedCount += count
        let evicted = evictingOverCapacity()
        lock.unlock()
        evicted.forEach { free($0) }
    }

    /// Sets the capacity, freeing the oldest blocks over it; returns the capacity it had, in bytes.
    @discardableResult
    func setCapacity(bytes: Int) -> Int {
        lock.lock()
        let previous = capacityCount * MemoryLayout<Float>.stride
        capacityCount = bytes / MemoryLayout<Float>.stride
        let evicted = evictingOverCapacity()
        lock.unlock()
        evicted.forEach { free($0) }
        return previous
    }

    /// The oldest blocks while the cache holds more than its capacity, taken out of it. Called with the lock held.
    private func evictingOverCapacity() -> [UnsafeMutablePointer<Float>] {
        var evicted: [UnsafeMutablePointer<Float>] = []
        var oldest = 0
        while cachedCount > capacityCount {
            cachedCount -= blocks[oldest].count
            evicted.append(blocks[oldest].pointer)
            oldest += 1
        }
        blocks.removeFirst(oldest)
        return evicted
    }
}

private final class SizedBlockPool: @unchecked Sendable {
    private let counts: Range<Int>
    private let capacityCount: Int
    private let lock = NSLock()
    private var blocks: [Int: [UnsafeMutablePointer<Float>]] = [:]
    private var keptCount = 0

    init(minimumBytes: Int, maximumBytes: Int, capacityBytes: Int) {
        let stride = MemoryLayout<Float>.stride
        counts = (minimumBytes / stride)..<(maximumBytes / stride)
        capacityCount = capacityBytes / stride
    }

    func take(count: Int) -> UnsafeMutablePointer<Float>? {
        guard counts.contains(count) else { return nil }
        lock.lock()
        defer { lock.unlock() }
        guard let pointer = blocks[count]?.popLast() else { return nil }
        keptCount -= count
        return pointer
    }

    /// False, keeping nothing, for a block outside the pool's sizes or one that would take it over capacity.
    func keep(_ pointer: UnsafeMutablePointer<Float>, count: Int) -> Bool {
        guard counts.contains(count) else { return false }
        lock.lock()
        defer { lock.unlock() }
        guard keptCount + count <= capacityCount else { return false }
        blocks[count, default: []].append(pointer)
        keptCount += count
        return true
    }
}

/// A dense, contiguous, row-major fp32 tensor.
///
/// All compute in SwiftVLM is fp32; f16/bf16 checkpoints are widened when loaded.
public struct Tensor: @unchecked Sendable {
    public let shape: [Int]
    public let storage: TensorStorage

    /// A tensor of zeros.
    public init(zeros shape: [Int]) {
        let count = Tensor.elementCount(shape)
        storage = TensorStorage(count: count)
        storage.pointer.initialize(repeating: 0, count: count)
        self.shape = shape
    }

    /// A tensor whose contents the caller writes before reading (ops that fill every element use this).
    public init(uninitialized shape: [Int]) {
        storage = TensorStorage(count: Tensor.elementCount(shape))
        self.shape = shape
    }

    public init(shape: [Int], scalars: [Float]) {
        precondition(Tensor.elementCount(shape) == scalars.count, "shape \(shape) does not hold \(scalars.count) values")
        let storage = TensorStorage(count: scalars.count)
        scalars.withUnsafeBufferPointer { storage.pointer.initialize(from: $0.baseAddress!, count: $0.count) }
        self.storage = storage
        self.shape = shape
    }

    public init(shape: [Int], storage: TensorStorage) {
        precondition(Tensor.elementCount(shape) == storage.count, "shape \(shape) does not match storage of \(storage.count)")
        self.shape = shape
        self.storage = storage
    }

    public var count: Int { storage.count }
    public var rank: Int { shape.count }
    public var scalars: [Float] { Array(UnsafeBufferPointer(start: storage.pointer, count: count)) }

    /// Same storage, new shape; one dimension may be -1.
    public func reshaped(_ newShape: [Int]) -> Tensor {
        var dims = newShape
        if let unknown = dims.firstIndex(of: -1) {
            let known = dims.enumerated().filter { $0.offset != unknown }.reduce(1) { $0 * $1.element }
            precondition(known > 0 && count % known == 0, "cannot reshape \(shape) to \(newShape)")
            dims[unknown] = count / known
        }
        return Tensor(shape: dims, storage: storage)
    }

    public func withUnsafeBufferPointer<R>(_ body: (UnsafeBufferPointer<Float>) throws -> R) rethrows -> R {
        try body(UnsafeBufferPointer(start: storage.pointer, count: count))
    }

    /// Writes in place; only for tensors the caller has just created and not shared.
    public func withUnsafeMutableBufferPointer<R>(_ body: (UnsafeMutableBufferPointer<Float>) throws -> R) rethrows -> R {
        try body(UnsafeMutableBufferPointer(start: storage.pointer, count: count))
    }

    public static func elementCount(_ shape: [Int]) -> Int {
        shape.reduce(1) { product, dim in
            precondition(dim >= 0, "negative dimension in \(shape)")
            return product * dim
        }
    }
}
