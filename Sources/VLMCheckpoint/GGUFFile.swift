#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import VLMTensor

/// One metadata value of a GGUF file, with the type the file gives it.
public enum GGUFValue: Sendable, Equatable {
    case uint8(UInt8), int8(Int8), uint16(UInt16), int16(Int16), uint32(UInt32), int32(Int32)
    case uint64(UInt64), int64(Int64), float32(Float), float64(Double), bool(Bool), string(String)
    /// An array; GGUF arrays hold elements of one type (arrays of arrays included).
    case array([GGUFValue])

    /// The value as an `Int` when it is an integer of any width that fits, else nil.
    public var integer: Int? {
        switch self {
        case let .uint8(value): Int(value)
        case let .int8(value): Int(value)
        case let .uint16(value): Int(value)
        case let .int16(value): Int(value)
        case let .uint32(value): Int(value)
        case let .int32(value): Int(value)
        case let .uint64(value): Int(exactly: value)
        case let .int64(value): Int(value)
        default: nil
        }
    }

    /// The value as a `Double` when it is a number (integer or floating point), else nil.
    public var number: Double? {
        switch self {
        case let .float32(value): Double(value)
        case let .float64(value): value
        default: integer.map(Double.init)
        }
    }

    /// The string, or nil for any other type.
    public var string: String? {
        if case let .string(value) = self { return value }
        return nil
    }

    /// The elements, or nil for a scalar.
    public var array: [GGUFValue]? {
        if case let .array(value) = self { return value }
        return nil
    }
}

/// A ggml tensor type: how a GGUF tensor's elements are stored (plain floats, or quantized blocks).
public struct GGMLType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    public static let f32 = GGMLType(rawValue: 0)
    public static let f16 = GGMLType(rawValue: 1)
    public static let q4_0 = GGMLType(rawValue: 2)
    public static let q4_1 = GGMLType(rawValue: 3)
    public static let q5_0 = GGMLType(rawValue: 6)
    public static let q5_1 = GGMLType(rawValue: 7)
    public static let q8_0 = GGMLType(rawValue: 8)
    public static let q4_K = GGMLType(rawValue: 12)
    public static let q5_K = GGMLType(rawValue: 13)
    public static let q6_K = GGMLType(rawValue: 14)
    public static let bf16 = GGMLType(rawValue: 30)

    /// The types ``GGUFFile/tensor(_:)`` dequantizes to fp32: the float types and every ``QuantizationFormat``.
    public static let dequantizable: [GGMLType] = [.f32, .f16, .bf16]
        + QuantizationFormat.allCases.filter { !$0.isHalfPrecisionFloat }.map(\.ggmlType)

    /// The block format ``QuantizedMatrix`` reads this type as (F16 and BF16 included), or nil for F32 and
    /// unsupported types.
    public var quantizationFormat: QuantizationFormat? { QuantizationFormat(rawValue: rawValue) }

    /// ggml's name (`Q4_0`, `BF16`, …), or `type N` for a number ggml does not define.
    public var description: String { Self.layouts[rawValue]?.name ?? "type \(rawValue)" }

    /// Elements per block and bytes per block, from ggml's type traits; nil for a number ggml does not define.
    var layout: (blockSize: Int, blockBytes: Int)? {
        Self.layouts[rawValue].map { ($0.blockSize, $0.blockBytes) }
    }

    // Every type ggml defines, dequantizable or not, so that a whole file's layout can be validated.
    private static let layouts: [UInt32: (name: String, blockSize: Int, blockBytes: Int)] = [
        0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
        6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
        10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
        14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
        18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
        22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
        27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
        34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    ]
}

extension QuantizationFormat {
    /// The ggml tensor type with this block format.
    public var ggmlType: GGMLType { GGMLType(rawValue: rawValue) }
}

/// Where one tensor of a GGUF file lives (already validated against the file).
public struct GGUFTensorInfo: Sendable, Equatable {
    public let name: String
    /// ggml's dimensions, fastest-varying first (`ne[0]`, `ne[1]`, …).
    public let dimensions: [Int]
    public let type: GGMLType
    /// The tensor's bytes as offsets from the start of the file.
    public let byteRange: Range<Int>

    /// The PyTorch shape: ggml's dimensions reversed, so a `[out, in]` weight is `[out, in]` here too.
    public var shape: [Int] { dimensions.reversed() }
    public var elementCount: Int { dimensions.reduce(1, *) }
}

/// A GGUF (v2 or v3) file, memory-mapped read-only: metadata, tensor directory, tensors dequantized to fp32, and
/// quantized weight matrices read in place.
///
/// Opening reads the header, the metadata and the tensor directory, and validates every count, size and offset
/// against the file, so a truncated or corrupt file is a ``CheckpointError/invalidGGUF(file:tensor:reason:)`` naming
/// the file (and the tensor), never a crash or a huge allocation. Tensor data is read only by ``tensor(_:)`` and
/// ``matrix(_:shape:)``.
public final class GGUFFile: @unchecked Sendable {
    /// Arrays nest at most this deep; real files nest none.
    static let maximumArrayDepth = 8
    /// ggml tensors have at most four dimensions.
    static let maximumDimensions = 4

    public let url: URL
    /// The format version, 2 or 3.
    public let version: Int
    /// Tensor data alignment in bytes (`general.alignment`, 32 when absent).
    public let alignment: Int
    /// Offset of the tensor data section from the start of the file.
    public let dataOffset: Int
    /// Metadata by key.
    public let metadata: [String: GGUFValue]
    /// Metadata keys in file order.
    public let metadataKeys: [String]
    /// Tensors in file order.
    public let tensorInfos: [GGUFTensorInfo]
    private let infosByName: [String: GGUFTensorInfo]
    private let file: MappedFile

    /// Maps `url` and validates its header, metadata and tensor directory.
    public init(url: URL) throws {
        self.url = url
        let path = url.path
        file = try MappedFile(path: path, minimumSize: GGUFReader.headerSize) { size in
            CheckpointError.invalidGGUF(file: path, tensor: nil, reason: "\(size) bytes, shorter than the \(GGUFReader.headerSize)-byte GGUF header")
        }
        var reader = GGUFReader(bytes: file.bytes, file: path)
        let header = try reader.readHeader()
        version = header.version
        metadataKeys = header.keys
        metadata = header.metadata
        alignment = header.alignment
        let layout = try reader.readTensorInfos(count: header.tensorCount, alignment: header.alignment)
        dataOffset = layout.dataOffset
        tensorInfos = layout.infos
        infosByName = Dictionary(uniqueKeysWithValues: tensorInfos.map { ($0.name, $0) })
    }

    /// The tensor `name`'s type, shape and location, or nil when the file has no such tensor.
    public func info(_ name: String) -> GGUFTensorInfo? { infosByName[name] }

    /// A fresh fp32 copy of `name` in its PyTorch shape, dequantized as ggml (and gguf-py) do. Types outside
    /// ``GGMLType/dequantizable`` throw, naming the tensor and its type.
    public func tensor(_ name: String) throws -> Tensor {
        let info = try self.info(name, file: url.path)
        let source = file.bytes.baseAddress! + info.byteRange.lowerBound
        switch info.type {
        case .f32:
            let result = Tensor(uninitialized: info.shape)
            UnsafeMutableRawPointer(result.storage.pointer).copyMemory(from: source, byteCount: info.byteRange.count)
            return result
        case .f16, .bf16:
            let result = Tensor(uninitialized: info.shape)
            widen16(source, count: result.count, format: info.type == .f16 ? .float16 : .bfloat16, into: result.storage.pointer)
            return result
        default:
            // A tensor of any rank is a matrix of rows along its first ggml dimension.
            let rowLength = info.dimensions.first ?? 1
            let rows = rowLength == 0 ? 0 : info.elementCount / rowLength
            return try quantizedMatrix(info, rows: rows, columns: rowLength).dequantized().reshaped(info.shape)
        }
    }

    /// `name` as fp32, which must have the PyTorch shape `shape`; the shape is checked before any data is read.
    public func tensor(_ name: String, shape: [Int]) throws -> Tensor {
        if let actual = infosByName[name]?.shape, actual != shape {
            throw CheckpointError.shapeMismatch(file: url.path, tensor: name, expected: shape, actual: actual)
        }
        return try tensor(name)
    }

    /// The 2-D tensor `name` of PyTorch shape `shape` (`[rows, columns]`) as a weight matrix: quantized types, and
    /// F16/BF16 rows of a multiple of 32, stay as stored, read in place from the mapping (which the matrix keeps
    /// alive); other float tensors are widened to fp32.
    public func matrix(_ name: String, shape: [Int]) throws -> WeightMatrix {
        let info = try self.info(name, file: url.path)
        guard shape.count == 2, info.shape == shape else {
            throw CheckpointError.shapeMismatch(file: url.path, tensor: name, expected: shape, actual: info.shape)
        }
        guard let format = info.type.quantizationFormat,
              !format.isHalfPrecisionFloat || shape[1] % format.blockElements == 0 else { return .dense(try tensor(name)) }
        return .quantized(try quantizedMatrix(info, rows: shape[0], columns: shape[1]))
    }

    private func info(_ name: String, file path: String) throws -> GGUFTensorInfo {
        guard let info = infosByName[name] else { throw CheckpointError.missingTensor(file: path, tensor: name) }
        return info
    }

    private func quantizedMatrix(_ info: GGUFTensorInfo, rows: Int, columns: Int) throws -> QuantizedMatrix {
        guard let format = info.type.quantizationFormat else {
            throw CheckpointError.invalidGGUF(
                file: url.path, tensor: info.name,
                reason: "type \(info.type) cannot be dequantized (supported: \(GGMLType.dequantizable.map(\.description).joined(separator: ", ")))")
        }
        let bytes = UnsafeRawBufferPointer(rebasing: file.bytes[info.byteRange])
        do {
            return try QuantizedMatrix(format: format, rows: rows, columns: columns, bytes: bytes, owner: file)
        } catch {
            throw CheckpointError.invalidGGUF(file: url.path, tensor: info.name, reason: "\(error)")
        }
    }
}

// MARK: - Parsing

/// A bounds-checked little-endian cursor over the mapped file.
struct GGUFReader {
    static let headerSize = 24
    let bytes: UnsafeRawBufferPointer
    let file: String
    var position = 0

    init(bytes: UnsafeRawBufferPointer, file: String) {
        self.bytes = bytes
        self.file = file
    }

    var remaining: Int { bytes.count - position }

    func corrupt(_ reason: String, tensor: String? = nil) -> CheckpointError {
        CheckpointError.invalidGGUF(file: file, tensor: tensor, reason: reason)
    }

    mutating func read<T: FixedWidthInteger>(_: T.Type, _ what: @autoclosure () -> String) throws -> T {
        let size = MemoryLayout<T>.size
        guard remaining >= size else { throw corrupt("truncated at byte \(position) while reading \(what())") }
        defer { position += size }
        return T(littleEndian: bytes.loadUnaligned(fromByteOffset: position, as: T.self))
    }

    /// A count that must fit in what is left of the file at `minimumBytes` per item: this is what keeps a corrupt
    /// count from allocating or looping for ever.
    mutating func readCount(_ what: @autoclosure () -> String, minimumBytes: Int) throws -> Int {
        let count = try read(UInt64.self, what())
        guard count <= UInt64(remaining / max(minimumBytes, 1)) else {
            throw corrupt("\(what()) is \(count), more than the \(remaining) bytes left can hold")
        }
        return Int(count)
    }

    mutating func readString(_ what: @autoclosure () -> String) throws -> String {
        let length = try readCount("the length of \(what())", minimumBytes: 1)
        defer { position += length }
        return String(decoding: UnsafeRawBufferPointer(rebasing: bytes[position..<(position + length)]), as: UTF8.self)
    }

    struct Header {
        let version: Int
        let tensorCount: Int
        let keys: [String]
        let metadata: [String: GGUFValue]
        let alignment: Int
    }

    mutating func readHeader() throws -> Header {
        let magic = try read(UInt32.self, "the magic number")
        guard magic == 0x4655_4747 else {
            throw corrupt(String(format: "bad magic 0x%08x, expected the bytes 'GGUF'", UInt32(bigEndian: magic)))
        }
        let version = try read(UInt32.self, "the version")
        guard version == 2 || version == 3 else {
            let hint = version == 1 ? " (version 1 is not supported)" : (version > 0xFFFF ? " (a big-endian file?)" : "")
            throw corrupt("version \(version); only versions 2 and 3 are read\(hint)")
        }
        // Each tensor entry is at least a name length, a dimension count, a type and an offset.
        let tensorCount = try readCount("the tensor count", minimumBytes: 24)
        // Each key/value pair is at least a key length, a value type and a one-byte value.
        let keyCount = try readCount("the metadata key count", minimumBytes: 13)
        var keys: [String] = []
        var metadata: [String: GGUFValue] = [:]
        for index in 0..<keyCount {
            let key = try readString("metadata key \(index)")
            let type = try read(UInt32.self, "the type of '\(key)'")
            let value = try readValue(type: type, key: key, depth: 0)
            guard metadata.updateValue(value, forKey: key) == nil else { throw corrupt("metadata key '\(key)' appears twice") }
            keys.append(key)
        }
        var alignment = 32
        if let value = metadata["general.alignment"] {
            guard case let .uint32(declared) = value, declared > 0, declared.nonzeroBitCount == 1 else {
                throw corrupt("general.alignment must be a power of two stored as uint32, got \(value)")
            }
            alignment = Int(declared)
        }
        return Header(version: Int(version), tensorCount: tensorCount, keys: keys, metadata: metadata, alignment: alignment)
    }

    /// The smallest encoding of one value of `type`, to bound array counts.
    private static func minimumBytes(of type: UInt32) -> Int? {
        switch type {
        case 0, 1, 7: 1
        case 2, 3: 2
        case 4, 5, 6: 4
        case 10, 11, 12: 8
        case 8: 8
        case 9: 12
        default: nil
        }
    }

    mutating func readValue(type: UInt32, key: String, depth: Int) throws -> GGUFValue {
        switch type {
        case 0: return .uint8(try read(UInt8.self, "'\(key)'"))
        case 1: return .int8(try read(Int8.self, "'\(key)'"))
        case 2: return .uint16(try read(UInt16.self, "'\(key)'"))
        case 3: return .int16(try read(Int16.self, "'\(key)'"))
        case 4: return .uint32(try read(UInt32.self, "'\(key)'"))
        case 5: return .int32(try read(Int32.self, "'\(key)'"))
        case 6: return .float32(Float(bitPattern: try read(UInt32.self, "'\(key)'")))
        case 7:
            let byte = try read(UInt8.self, "'\(key)'")
            guard byte <= 1 else { throw corrupt("'\(key)' is a bool stored as \(byte)") }
            return .bool(byte == 1)
        case 8: return .string(try readString("'\(key)'"))
        case 9:
            guard depth < GGUFFile.maximumArrayDepth else {
                throw corrupt("'\(key)' nests arrays more than \(GGUFFile.maximumArrayDepth) deep")
            }
            let elementType = try read(UInt32.self, "the element type of '\(key)'")
            guard let minimum = Self.minimumBytes(of: elementType) else {
                throw corrupt("'\(key)' is an array of unknown value type \(elementType)")
            }
            let count = try readCount("the length of '\(key)'", minimumBytes: minimum)
            var elements: [GGUFValue] = []
            elements.reserveCapacity(count)
            for _ in 0..<count { elements.append(try readValue(type: elementType, key: key, depth: depth + 1)) }
            return .array(elements)
        case 10: return .uint64(try read(UInt64.self, "'\(key)'"))
        case 11: return .int64(try read(Int64.self, "'\(key)'"))
        case 12: return .float64(Double(bitPattern: try read(UInt64.self, "'\(key)'")))
        default: throw corrupt("'\(key)' has unknown value type \(type)")
        }
    }

    mutating func readTensorInfos(count: Int, alignment: Int) throws -> (infos: [GGUFTensorInfo], dataOffset: Int) {
        var entries: [(name: String, dimensions: [Int], type: GGMLType, offset: Int, byteCount: Int)] = []
        var seen = Set<String>()
        for index in 0..<count {
            let name = try readString("the name of tensor \(index)")
            guard seen.insert(name).inserted else { throw corrupt("the name appears twice", tensor: name) }
            let rank = try read(UInt32.self, "the dimension count of '\(name)'")
            guard rank <= GGUFFile.maximumDimensions else {
                throw corrupt("\(rank) dimensions; ggml tensors have at most \(GGUFFile.maximumDimensions)", tensor: name)
            }
            var dimensions: [Int] = []
            for _ in 0..<rank {
                let dimension = try read(UInt64.self, "the dimensions of '\(name)'")
                guard dimension <= UInt64(Int32.max) else { throw corrupt("dimension \(dimension) is out of range", tensor: name) }
                dimensions.append(Int(dimension))
            }
            let type = GGMLType(rawValue: try read(UInt32.self, "the type of '\(name)'"))
            let offset = try read(UInt64.self, "the data offset of '\(name)'")
            guard let layout = type.layout else { throw corrupt("unknown tensor type \(type.rawValue)", tensor: name) }
            let rowLength = dimensions.first ?? 1
            guard rowLength % layout.blockSize == 0 else {
                throw corrupt("its first dimension \(rowLength) is not a multiple of \(type)'s block of \(layout.blockSize)", tensor: name)
            }
            var byteCount = layout.blockBytes
            var overflow = false
            for (axis, dimension) in dimensions.enumerated() {
                let factor = axis == 0 ? dimension / layout.blockSize : dimension
                let product = byteCount.multipliedReportingOverflow(by: factor)
                byteCount = product.partialValue
                overflow = overflow || product.overflow
            }
            guard !overflow, offset <= UInt64(bytes.count) else {
                throw corrupt("dimensions \(dimensions) at offset \(offset) reach past the end of the file", tensor: name)
            }
            guard Int(offset) % alignment == 0 else {
                throw corrupt("data offset \(offset) is not a multiple of the alignment \(alignment)", tensor: name)
            }
            entries.append((name, dimensions, type, Int(offset), byteCount))
        }
        let dataOffset = (position + alignment - 1) / alignment * alignment
        let dataSize = bytes.count - dataOffset
        var infos: [GGUFTensorInfo] = []
        for entry in entries {
            guard dataSize >= 0, entry.offset <= dataSize, entry.byteCount <= dataSize - entry.offset else {
                throw corrupt("its \(entry.byteCount) bytes at data offset \(entry.offset) reach past the end of the \(max(dataSize, 0))-byte data section (truncated file?)",
                              tensor: entry.name)
            }
            let start = dataOffset + entry.offset
            infos.append(GGUFTensorInfo(name: entry.name, dimensions: entry.dimensions, type: entry.type,
                                        byteRange: start..<(start + entry.byteCount)))
        }
        let occupied = infos.filter { !$0.byteRange.isEmpty }.sorted { $0.byteRange.lowerBound < $1.byteRange.lowerBound }
        for (previous, next) in zip(occupied, occupied.dropFirst()) where next.byteRange.lowerBound < previous.byteRange.upperBound {
            throw corrupt("its data overlaps tensor '\(previous.name)'", tensor: next.name)
        }
        return (infos, dataOffset)
    }
}
