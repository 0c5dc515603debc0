import Dispatch

// Bit manipulation rather than Swift's Float16, which is unavailable on some x86 targets and would tie exactness to
// whatever the compiler lowers it to. Both conversions are exact: every f16 and bf16 value is an fp32 value.

/// The fp32 bit pattern of an IEEE half-precision value.
func float32Bits(fromFloat16 half: UInt16) -> UInt32 {
    let sign = UInt32(half & 0x8000) << 16
    let magnitude = UInt32(half & 0x7FFF)
    let exponent = magnitude >> 10
    // Normal: exponent and mantissa move up together, the exponent rebiased from 15 to 127.
    let normal = (magnitude << 13) &+ (112 << 23)
    // Zero and subnormals: mantissa × 2^-24, exact in fp32 since the mantissa has at most 10 bits.
    let subnormal = (Float(magnitude) * 0x1p-24).bitPattern
    // Infinity, or NaN with its payload moved up and the quiet bit set, as F16C's vcvtph2ps and torch's
    // vectorised `.float()` do.
    let quiet: UInt32 = magnitude > 0x7C00 ? 0x0040_0000 : 0
    let special = 0x7F80_0000 | quiet | ((magnitude & 0x03FF) << 13)
    return sign | (exponent == 0 ? subnormal : exponent == 0x1F ? special : normal)
}

/// The fp32 bit pattern of every f16 value, indexed by the f16 bits: 256 KB that stay in L2, and a lookup per element
/// is several times faster than computing the conversion.
private let float16Table: [UInt32] = (0...UInt16.max).map(float32Bits(fromFloat16:))

/// The fp32 bit pattern of a bfloat16 value: bf16 is the top half of an fp32.
@inline(__always)
func float32Bits(fromBFloat16 value: UInt16) -> UInt32 {
    UInt32(value) << 16
}

/// The two 16-bit float formats of checkpoints.
enum HalfFormat: Sendable {
    case float16, bfloat16
}

/// Elements below which a conversion stays on the calling thread: splitting costs more than it saves.
private let parallelThreshold = 1 << 16

/// Widens `count` little-endian 16-bit values at `source` (any alignment) into `destination`, over all cores for
/// large tensors.
func widen16(_ source: UnsafeRawPointer, count: Int, format: HalfFormat, into destination: UnsafeMutablePointer<Float>) {
    guard count >= parallelThreshold else {
        widen16(source, range: 0..<count, format: format, into: destination)
        return
    }
    // Each chunk writes a disjoint range of `destination`, so sharing the pointers is safe.
    struct Pointers: @unchecked Sendable {
        let source: UnsafeRawPointer
        let destination: UnsafeMutablePointer<Float>
    }
    let pointers = Pointers(source: source, destination: destination)
    let chunks = 8
    let chunkSize = (count + chunks - 1) / chunks
    DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
        let start = chunk * chunkSize
        widen16(pointers.source, range: start..<min(start + chunkSize, count), format: format, into: pointers.destination)
    }
}

private func widen16(
    _ source: UnsafeRawPointer, range: Range<Int>, format: HalfFormat, into destination: UnsafeMutablePointer<Float>
) {
    // One loop per format keeps the per-element work free of a branch on the format.
    switch format {
    case .float16:
        float16Table.withUnsafeBufferPointer { table in
            for index in range {
                let bits = UInt16(littleEndian: source.loadUnaligned(fromByteOffset: 2 * index, as: UInt16.self))
                destination[index] = Float(bitPattern: table[Int(bits)])
            }
        }
    case .bfloat16:
        for index in range {
            let bits = UInt16(littleEndian: source.loadUnaligned(fromByteOffset: 2 * index, as: UInt16.self))
            destination[index] = Float(bitPattern: float32Bits(fromBFloat16: bits))
        }
    }
}
