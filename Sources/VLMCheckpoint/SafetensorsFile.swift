#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import VLMTensor

/// Where one tensor of a safetensors file lives, as its header declares it (already validated).
public struct TensorInfo: Sendable, Equatable {
    /// The safetensors dtype name: `F32`, `F16`, `BF16`, `I64`, ….
    public let dtype: String
    public let shape: [Int]
    /// The tensor's bytes as offsets from the start of the file.
    public let byteRange: Range<Int>

    public var elementCount: Int { shape.reduce(1, *) }
}

/// The element types safetensors defines, with their sizes in bytes.
enum SafetensorsDType: String {
    case f64 = "F64", f32 = "F32", f16 = "F16", bf16 = "BF16"
    case i64 = "I64", i32 = "I32", i16 = "I16", i8 = "I8"
    case u64 = "U64", u32 = "U32", u16 = "U16", u8 = "U8"
    case bool = "BOOL", f8e4m3 = "F8_E4M3", f8e5m2 = "F8_E5M2"

    var byteSize: Int {
        switch self {
        case .f64, .i64, .u64: return 8
        case .f32, .i32, .u32: return 4
        case .f16, .bf16, .i16, .u16: return 2
        case .i8, .u8, .bool, .f8e4m3, .f8e5m2: return 1
        }
    }
}

/// One .safetensors file, memory-mapped (mmap, read-only); header validated up front.
///
/// Opening reads only the header: a tensor's bytes are touched when ``tensor(_:)`` copies them out, so opening
/// every shard of a large checkpoint is cheap.
public final class SafetensorsFile: @unchecked Sendable {
    /// The largest header accepted. Real headers are kilobytes; this bounds what a corrupt length can make us read.
    public static let maximumHeaderLength = 100 << 20

    public let url: URL
    /// Sorted tensor names.
    public let tensorNames: [String]
    private let infos: [String: TensorInfo]
    private let file: MappedFile

    /// Maps `url` and validates its header: JSON, dtypes, shapes against byte counts, offsets against the file size,
    /// and that no two tensors overlap.
    public init(url: URL) throws {
        self.url = url
        let path = url.path
        // Anything under 8 bytes cannot hold the header length.
        file = try MappedFile(path: path, minimumSize: 8) { CheckpointError.fileTooShort(file: path, size: $0) }
        infos = try Self.parseHeader(of: file.bytes, file: path)
        tensorNames = infos.keys.sorted()
    }

    /// The dtype, shape and byte range of `name`, or nil when the file has no such tensor.
    public func info(_ name: String) -> TensorInfo? { infos[name] }

    /// A fresh fp32 copy of `name`. F32 is copied; F16 and BF16 are widened exactly. Other dtypes throw
    /// ``CheckpointError/unsupportedDType(file:tensor:dtype:)``. The tensor's pages of the map are given back once
    /// copied, so a process holds each weight once, in the form its layer keeps.
    public func tensor(_ name: String) throws -> Tensor {
        guard let info = infos[name] else { throw CheckpointError.missingTensor(file: url.path, tensor: name) }
        let source = file.bytes.baseAddress! + info.byteRange.lowerBound
        let result = Tensor(uninitialized: info.shape)
        switch SafetensorsDType(rawValue: info.dtype) {
        case .f32:
            // Little-endian on every platform Swift on Linux and macOS runs on, so the bytes are the floats.
            UnsafeMutableRawPointer(result.storage.pointer).copyMemory(from: source, byteCount: info.byteRange.count)
        case .f16:
            widen16(source, count: result.count, format: .float16, into: result.storage.pointer)
        case .bf16:
            widen16(source, count: result.count, format: .bfloat16, into: result.storage.pointer)
        default:
            throw CheckpointError.unsupportedDType(file: url.path, tensor: name, dtype: info.dtype)
        }
        file.releasePages(info.byteRange)
        return result
    }

    // MARK: - Opening and validation


    private static func parseHeader(of bytes: UnsafeRawBufferPointer, file: String) throws -> [String: TensorInfo] {
        let headerLength = UInt64(littleEndian: bytes.loadUnaligned(as: UInt64.self))
        let available = bytes.count - 8
        guard headerLength <= UInt64(available), headerLength <= UInt64(maximumHeaderLength) else {
            throw CheckpointError.headerLengthOutOfRange(file: file, length: headerLength, available: available)
        }
        let dataStart = 8 + Int(headerLength)
        let dataSize = bytes.count - dataStart

        // The header is at most 100 MB and the mapping outlives this call, so no copy is needed.
        let headerData = Data(bytesNoCopy: UnsafeMutableRawPointer(mutating: bytes.baseAddress! + 8),
                              count: Int(headerLength), deallocator: .none)
        let header = try decodeJSON(
            RawHeader.self, from: headerData,
            syntaxError: { CheckpointError.invalidHeader(file: file, reason: "not valid JSON: \($0)") },
            contentError: { keyPath, reason in
                CheckpointError.invalidHeader(file: file, reason: keyPath.isEmpty ? reason : "'\(keyPath)': \(reason)")
            })

        var infos: [String: TensorInfo] = [:]
        for (name, entry) in header.entries.sorted(by: { $0.key < $1.key }) {
            guard let dtype = SafetensorsDType(rawValue: entry.dtype) else {
                throw CheckpointError.unknownDType(file: file, tensor: name, dtype: entry.dtype)
            }
            guard entry.dataOffsets.count == 2 else {
                throw CheckpointError.invalidHeader(
                    file: file, reason: "tensor '\(name)' has \(entry.dataOffsets.count) data_offsets, expected 2")
            }
            let begin = entry.dataOffsets[0], end = entry.dataOffsets[1]
            guard begin >= 0, begin <= end, end <= dataSize else {
                throw CheckpointError.dataOutOfBounds(file: file, tensor: name, begin: begin, end: end, dataSize: dataSize)
            }
            let byteCount = try checkedByteCount(shape: entry.shape, dtype: dtype, file: file, tensor: name)
            guard byteCount == end - begin else {
                throw CheckpointError.byteCountMismatch(
                    file: file, tensor: name,
                    reason: "shape \(entry.shape) of \(dtype.rawValue) is \(byteCount) bytes but data_offsets [\(begin), \(end)] hold \(end - begin)")
            }
            infos[name] = TensorInfo(dtype: dtype.rawValue, shape: entry.shape,
                                     byteRange: (dataStart + begin)..<(dataStart + end))
        }

        // Overlapping tensors mean a corrupt header; empty tensors occupy no bytes and cannot overlap.
        let occupied = infos.filter { !$0.value.byteRange.isEmpty }
            .sorted { ($0.value.byteRange.lowerBound, $0.key) < ($1.value.byteRange.lowerBound, $1.key) }
        for (previous, next) in zip(occupied, occupied.dropFirst())
        where next.value.byteRange.lowerBound < previous.value.byteRange.upperBound {
            throw CheckpointError.overlappingTensors(file: file, first: previous.key, second: next.key)
        }
        return infos
    }

    private static func checkedByteCount(shape: [Int], dtype: SafetensorsDType, file: String, tensor: String) throws -> Int {
        var product = dtype.byteSize
        for dimension in shape {
            guard dimension >= 0 else {
                throw CheckpointError.byteCountMismatch(file: file, tensor: tensor, reason: "negative dimension in shape \(shape)")
            }
            let (next, overflow) = product.multipliedReportingOverflow(by: dimension)
            guard !overflow else {
                throw CheckpointError.byteCountMismatch(
                    file: file, tensor: tensor, reason: "shape \(shape) of \(dtype.rawValue) overflows a byte count")
            }
            product = next
        }
        return product
    }
}

/// The safetensors header: `{"__metadata__": {...}, name: {"dtype", "shape", "data_offsets"}, ...}`.
private struct RawHeader: Decodable {
    struct Entry: Decodable {
        let dtype: String
        let shape: [Int]
        let dataOffsets: [Int]

        enum CodingKeys: String, CodingKey {
            case dtype, shape, dataOffsets = "data_offsets"
        }
    }

    let entries: [String: Entry]

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: AnyKey.self)
        var entries: [String: Entry] = [:]
        // Metadata is free-form string pairs that SwiftVLM has no use for.
        for key in container.allKeys where key.stringValue != "__metadata__" {
            entries[key.stringValue] = try container.decode(Entry.self, forKey: key)
        }
        self.entries = entries
    }
}

/// A coding key for any string: a header's keys are tensor names.
private struct AnyKey: CodingKey {
    let stringValue: String
    let intValue: Int?

    init(stringValue: String) {
        self.stringValue = stringValue
        intValue = nil
    }

    init(intValue: Int) {
        stringValue = String(intValue)
        self.intValue = intValue
    }
}
