internal import CVLMKernels

/// A ggml block format (ggml-common.h) that ``QuantizedMatrix`` reads; raw values are ggml's type numbers.
///
/// F16 and BF16 are here too, read in blocks of 32 values, so that a half-precision matrix is multiplied as stored
/// (half the bytes of fp32) instead of widened; their rows must then be a multiple of 32 long.
public enum QuantizationFormat: UInt32, Sendable, CaseIterable, CustomStringConvertible {
    case f16 = 1, bf16 = 30
    case q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8
    case q4_K = 12, q5_K = 13, q6_K = 14

    /// Whether the values are plain 16-bit floats rather than quantized blocks.
    public var isHalfPrecisionFloat: Bool { self == .f16 || self == .bf16 }

    /// Elements per block: 32 (F16 and BF16 as well), or 256 for the K-quants.
    public var blockElements: Int { layout.elements }
    /// Bytes per block.
    public var blockBytes: Int { layout.bytes }

    /// ggml's name (`Q4_1`, `Q6_K`, …).
    public var description: String {
        switch self {
        case .f16: "F16"
        case .bf16: "BF16"
        case .q4_0: "Q4_0"
        case .q4_1: "Q4_1"
        case .q5_0: "Q5_0"
        case .q5_1: "Q5_1"
        case .q8_0: "Q8_0"
        case .q4_K: "Q4_K"
        case .q5_K: "Q5_K"
        case .q6_K: "Q6_K"
        }
    }

    private var layout: (elements: Int, bytes: Int) {
        var elements = 0, bytes = 0
        precondition(vlm_quant_block_layout(Int32(rawValue), &elements, &bytes) == 0, "CVLMKernels does not know \(self)")
        return (elements, bytes)
    }

    var kernelFormat: vlm_quant_format { vlm_quant_format(rawValue: rawValue) }
}

/// Why a ``QuantizedMatrix`` could not be made.
public enum QuantizedMatrixError: Error, CustomStringConvertible {
    /// The row length is not a whole number of blocks.
    case partialBlock(format: QuantizationFormat, columns: Int)
    /// The bytes given are not `rows · columns / blockElements · blockBytes`.
    case byteCount(format: QuantizationFormat, rows: Int, columns: Int, expected: Int, actual: Int)

    public var description: String {
        switch self {
        case let .partialBlock(format, columns):
            "a \(format) row of \(columns) elements is not a whole number of \(format.blockElements)-element blocks"
        case let .byteCount(format, rows, columns, expected, actual):
            "a \(rows)x\(columns) \(format) matrix takes \(expected) bytes, got \(actual)"
        }
    }
}

/// A `[rows, columns]` matrix stored as ggml quantized blocks (blocks run along each row), read where it lies:
/// typically inside a memory-mapped GGUF file. ``Linear`` multiplies by it without expanding it to fp32.
public final class QuantizedMatrix: @unchecked Sendable {
    public let format: QuantizationFormat
    public let rows: Int
    public let columns: Int
    /// Bytes from one row to the next.
    public let rowBytes: Int
    let data: UnsafeRawPointer
    /// Whatever keeps `data` alive: the mapped file, or the buffer this matrix copied its rows into.
    private let owner: AnyObject

    /// A matrix over `bytes`, which must stay valid and unchanged as long as `owner` lives; the matrix keeps
    /// `owner` alive.
    public init(format: QuantizationFormat, rows: Int, columns: Int, bytes: UnsafeRawBufferPointer, owner: AnyObject) throws {
        guard rows >= 0, columns >= 0, columns % format.blockElements == 0 else {
            throw QuantizedMatrixError.partialBlock(format: format, columns: columns)
        }
        rowBytes = columns / format.blockElements * format.blockBytes
        let (expected, overflow) = rows.multipliedReportingOverflow(by: rowBytes)
        guard !overflow, expected == bytes.count else {
            throw QuantizedMatrixError.byteCount(format: format, rows: rows, columns: columns,
                                                 expected: overflow ? Int.max : expected, actual: bytes.count)
        }
        self.format = format
        self.rows = rows
        self.columns = columns
        // An empty buffer may have no base address; nothing is read from it then.
        data = bytes.baseAddress ?? UnsafeRawPointer(bitPattern: 64)!
        self.owner = owner
    }

    private init(copying order: [Int], of source: QuantizedMatrix) {
        format = source.format
        rows = order.count
        columns = source.columns
        rowBytes = source.rowBytes
        let buffer = OwnedBytes(count: rows * rowBytes, weight: true)
        for (row, sourceRow) in order.enumerated() {
            precondition(sourceRow >= 0 && sourceRow < source.rows, "row \(sourceRow) outside \(source.rows) rows")
            (buffer.pointer + row * rowBytes).copyMemory(from: source.data + sourceRow * rowBytes, byteCount: rowBytes)
        }
        data = UnsafeRawPointer(buffer.pointer)
        owner = buffer
    }

    private init(stacking parts: [QuantizedMatrix]) {
        format = parts[0].format
        rows = parts.reduce(0) { $0 + $1.rows }
        columns = parts[0].columns
        rowBytes = parts[0].rowBytes
        let buffer = OwnedBytes(count: rows * rowBytes, weight: true)
        var offset = 0
        for part in parts {
            (buffer.pointer + offset).copyMemory(from: part.data, byteCount: part.rows * rowBytes)
            offset += part.rows * rowBytes
        }
        data = UnsafeRawPointer(buffer.pointer)
        owner = buffer
    }

    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    /// `table` `[rows, columns]` rounded to bf16, in a buffer of its own.
    convenience init(bfloat16Rounding table: Tensor) throws {
        let (rows, columns) = (table.shape[0], table.shape[1])
        let rounded = roundedToBFloat16(table.storage.pointer, rows: rows, columns: columns, roundings: PrimitiveCache<Int>(capacity: 1))
        try self.init(format: .bf16, rows: rows, columns: columns,
                      bytes: UnsafeRawBufferPointer(start: rounded.pointer, count: rows * columns * 2), owner: rounded)
    }
    #endif

    /// The rows of `parts` one after another, still quantized; nil unless all have this format and row length.
    public static func stacking(_ parts: [QuantizedMatrix]) -> QuantizedMatrix? {
        guard let first = parts.first, parts.allSatisfy({ $0.format == first.format && $0.columns == first.columns }) else {
            return nil
        }
        return QuantizedMatrix(stacking: parts)
    }

    /// A copy whose row `i` is this matrix's row `order[i]`, still quantized.
    public func permutingRows(_ order: [Int]) -> QuantizedMatrix { QuantizedMatrix(copying: order, of: self) }

    /// The matrix dequantized to fp32, `[rows, columns]`, with ggml's arithmetic (bit for bit what gguf-py gives).
    public func dequantized() -> Tensor { dequantized(path: .best) }

    /// Rows `ids` dequantized to fp32, `[ids.count, columns]`: an embedding lookup that reads only those rows.
    public func rows(_ ids: [Int]) -> Tensor {
        let output = Tensor(uninitialized: [ids.count, columns])
        for (index, id) in ids.enumerated() { copyRow(id, into: output.storage.pointer + index * columns) }
        return output
    }

    /// Row `id` dequantized into `destination` (`columns` floats): one row of ``rows(_:)``.
    public func copyRow(_ id: Int, into destination: UnsafeMutablePointer<Float>) {
        precondition(id >= 0 && id < rows, "embedding id \(id) outside vocabulary of \(rows)")
        var matrix = kernelMatrix
        vlm_quant_dequantize_rows(&matrix, id, 1, destination, columns, KernelPath.best.isa)
        withExtendedLifetime(self) {}
    }

    func dequantized(path: KernelPath) -> Tensor {
        let output = Tensor(uninitialized: [rows, columns])
        dequantizeRows(0..<rows, into: output.storage.pointer, path: path)
        return output
    }

    /// Rows `range` as fp32, written `columns` floats apart from `destination`, spread over the cores.
    func dequantizeRows(_ range: Range<Int>, into destination: UnsafeMutablePointer<Float>, path: KernelPath) {
        let chunk = 64
        let chunks = (range.count + chunk - 1) / chunk
        let destination = UnsafeSendablePointer(pointer: destination)
        parallelFor(chunks) { index in
            var matrix = self.kernelMatrix
            let first = range.lowerBound + index * chunk
            let count = min(chunk, range.upperBound - first)
            vlm_quant_dequantize_rows(&matrix, first, count, destination.pointer + (first - range.lowerBound) * matrix.columns,
                                      matrix.columns, path.isa)
        }
    }

    /// The C view of this matrix; valid while `self` lives.
    var kernelMatrix: vlm_quant_matrix {
        vlm_quant_matrix(data: data, format: format.kernelFormat, rows: rows, columns: columns, row_bytes: rowBytes)
    }
}

/// A 64-byte aligned heap buffer (from 2 MiB on, on huge pages; a weight's, with `weight`, also below: see
/// `allocateWeightMemory`), freed with its owner.
final class OwnedBytes: @unchecked Sendable {
    let pointer: UnsafeMutableRawPointer
    init(count: Int, weight: Bool = false) { pointer = allocateWeightMemory(byteCount: count, sideBySide: weight) }
    deinit { releaseWeightMemory(pointer) }
}

/// A raw pointer handed to parallel work items, each of which writes its own disjoint part.
struct UnsafeSendablePointer<T>: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<T>
}

/// The weight of a ``Linear`` layer or the table of an embedding: plain fp32, or quantized blocks.
public enum WeightMatrix: Sendable {
    case dense(Tensor)
    case quantized(QuantizedMatrix)

    /// `[rows, columns]` (a dense tensor's own shape, whatever its rank).
    public var shape: [Int] {
        switch self {
        case let .dense(tensor): tensor.shape
        case let .quantized(matrix): [matrix.rows, matrix.columns]
        }
    }

    /// The rows of `parts` one after another: dense if all are 2-D dense tensors, quantized if all are quantized
    /// in one format; nil for a mixture or for differing row lengths.
    public static func stackingRows(_ parts: [WeightMatrix]) -> WeightMatrix? {
        let dense = parts.compactMap { if case let .dense(tensor) = $0, tensor.rank == 2 { tensor } else { nil } }
        if dense.count == parts.count, let columns = dense.first?.shape[1], dense.allSatisfy({ $0.shape[1] == columns }) {
            return .dense(concatenate(dense, axis: 0))
        }
        let quantized = parts.compactMap { if case let .quantized(matrix) = $0 { matrix } else { nil } }
        guard quantized.count == parts.count else { return nil }
        return QuantizedMatrix.stacking(quantized).map(WeightMatrix.quantized)
    }

    /// An embedding table `[rows, columns]` held as the layers built now hold their weights: in bf16 where
    /// ``MatrixPrecision/forNewLayers`` runs bf16 here and the rows are whole 32-value blocks (rounded to nearest
    /// even, as bf16 layers round their weights), otherwise the fp32 tensor itself. A language model's table is as
    /// large as its head; kept in fp32 beside bf16 layers it would be the largest thing in memory after them.
    public static func embeddingTable(_ table: Tensor) -> WeightMatrix {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        guard MatrixPrecision.forNewLayers.available == .bfloat16, table.rank == 2, table.shape[1] % 32 == 0,
              let matrix = try? QuantizedMatrix(bfloat16Rounding: table) else { return .dense(table) }
        return .quantized(matrix)
        #else
        return .dense(table)
        #endif
    }

    /// Rows `ids` of the matrix as fp32, `[ids.count, columns]` (an embedding lookup).
    public func rows(_ ids: [Int]) -> Tensor {
        switch self {
        case let .dense(tensor): embedding(tensor, ids: ids)
        case let .quantized(matrix): matrix.rows(ids)
        }
    }

    /// Row `id` as fp32 into `destination` (`shape[1]` floats): one row of ``rows(_:)``.
    public func copyRow(_ id: Int, into destination: UnsafeMutablePointer<Float>) {
        switch self {
        case let .dense(tensor):
            precondition(tensor.rank == 2 && id >= 0 && id < tensor.shape[0], "embedding id \(id) outside vocabulary of \(shape[0])")
            destination.initialize(from: tensor.storage.pointer + id * tensor.shape[1], count: tensor.shape[1])
        case let .quantized(matrix): matrix.copyRow(id, into: destination)
        }
    }
}
