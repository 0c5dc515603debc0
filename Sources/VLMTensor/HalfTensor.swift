internal import CVLMKernels
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// IEEE half floats (their bit patterns) in a shape, 64-byte aligned: the keys and values of a KV cache kept in fp16,
/// half an fp32 cache's size, as llama.cpp keeps its caches by default.
public final class HalfTensor: @unchecked Sendable {
    public let shape: [Int]
    public let pointer: UnsafeMutablePointer<UInt16>
    public var count: Int { Tensor.elementCount(shape) }

    /// A tensor whose contents the caller writes before reading.
    public init(uninitialized shape: [Int]) {
        let count = Tensor.elementCount(shape)
        var raw: UnsafeMutableRawPointer?
        let status = posix_memalign(&raw, 64, max(count, 1) * MemoryLayout<UInt16>.stride)
        precondition(status == 0 && raw != nil, "out of memory allocating \(count) half floats")
        pointer = raw!.bindMemory(to: UInt16.self, capacity: max(count, 1))
        self.shape = shape
    }

    deinit { free(pointer) }

    /// The values widened to floats.
    public var floats: Tensor {
        let floats = Tensor(uninitialized: shape)
        vlm_halves_to_floats(pointer, count, floats.storage.pointer, KernelPath.best.isa)
        return floats
    }
}

/// `count` floats rounded to half floats into `halves`: to nearest, ties to even, as PyTorch's `.half()` rounds.
public func roundToHalves(_ floats: UnsafePointer<Float>, count: Int, into halves: UnsafeMutablePointer<UInt16>) {
    roundToHalves(floats, count: count, into: halves, path: .best)
}

func roundToHalves(_ floats: UnsafePointer<Float>, count: Int, into halves: UnsafeMutablePointer<UInt16>, path: KernelPath) {
    vlm_floats_to_halves(floats, count, halves, path.isa)
}

/// The keys and values attention reads where they lie: floats, or half floats (a KV cache kept in fp16) that it
/// widens to floats as it reads them, so that it computes what it computes over floats holding the same values.
public enum KeysAndValues: @unchecked Sendable {
    case floats(key: Tensor, value: Tensor)
    case halves(key: HalfTensor, value: HalfTensor)

    var keyShape: [Int] {
        switch self {
        case let .floats(key, _): key.shape
        case let .halves(key, _): key.shape
        }
    }

    var shapesMatch: Bool {
        switch self {
        case let .floats(key, value): key.shape == value.shape
        case let .halves(key, value): key.shape == value.shape
        }
    }

    /// `problem`'s keys and values (floats or halves) from element `offset` of both.
    func address(_ problem: inout vlm_attention_problem, offset: Int) {
        switch self {
        case let .floats(key, value):
            problem.key = UnsafePointer(key.storage.pointer + offset)
            problem.value = UnsafePointer(value.storage.pointer + offset)
        case let .halves(key, value):
            problem.half_key = UnsafePointer(key.pointer + offset)
            problem.half_value = UnsafePointer(value.pointer + offset)
        }
    }

    func keepAlive() {
        switch self {
        case let .floats(key, value): withExtendedLifetime((key, value)) {}
        case let .halves(key, value): withExtendedLifetime((key, value)) {}
        }
    }
}
