#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Owns a 64-byte aligned block of `Float`s. Tensors share storage when reshaped; ops write fresh storage.
public final class TensorStorage: @unchecked Sendable {
    public let pointer: UnsafeMutablePointer<Float>
    public let count: Int

    public init(count: Int) {
        precondition(count >= 0, "negative element count")
        var raw: UnsafeMutableRawPointer?
        // posix_memalign wants a non-zero size; oneDNN and AVX-512 loads like 64-byte alignment.
        let status = posix_memalign(&raw, 64, max(count, 1) * MemoryLayout<Float>.stride)
        precondition(status == 0 && raw != nil, "out of memory allocating \(count) floats")
        pointer = raw!.bindMemory(to: Float.self, capacity: max(count, 1))
        self.count = count
    }

    deinit { free(pointer) }
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
