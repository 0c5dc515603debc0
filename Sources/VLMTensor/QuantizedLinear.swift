internal import CVLMKernels
internal import Foundation
#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL
#endif

/// `Linear` on a ``QuantizedMatrix`` weight. Few input rows (decoding) go through CVLMKernels' int8 dot products
/// on a packed copy of the weight where the CPU has them (see vlm_kernels.h), otherwise through its fused product,
/// which dequantizes each weight block once into registers or L1 and accumulates in fp32; more rows (a prompt)
/// dequantize the weight to fp32 in bounded panels, each multiplied at GEMM speed, so the fp32 copy never
/// outlives the call. A layer built in bf16 multiplies those panels in bf16 (the input and each panel rounded, the
/// products accumulated in fp32), at about twice the speed where the CPU has bf16 dot products; one built in int8
/// multiplies the packed blocks themselves by the input quantized to int8 per 32-element block (llama.cpp's q8_0
/// activations), two to three times faster than fp32 for a prompt, its decoding rows as llama.cpp's CPU kernels
/// compute them.
final class QuantizedLinear: @unchecked Sendable {
    let weight: QuantizedMatrix
    /// The precision of the products: fp32, or bf16 or int8 where the layer was built in it and the CPU has it. bf16
    /// rounds a prompt's panels; decoding rows keep the fixed point. int8 runs every row count, decoding included,
    /// on the packed products with one 8-bit digit per activation (vlm_quant_int8_matmul), each row's outputs the
    /// same whichever rows it is multiplied with.
    let precision: MatrixPrecision
    /// The weight in 16-row groups for the int8 products, made at init where the CPU and the format allow.
    private let packed: OwnedBytes?
    private let bias: Tensor?
    private let backend: Backend
    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    private let primitives = PrimitiveCache<Key>(capacity: 64)
    /// bf16: the reorders rounding an input of each row count, and a dequantized panel of each width, to bf16.
    private let inputRoundings = PrimitiveCache<Int>(capacity: 64)
    private let panelRoundings = PrimitiveCache<Int>(capacity: 8)

    private struct Key: Hashable {
        let rows: Int, panel: Int, activation: Activation, residual: Bool
    }
    #endif

    /// Input rows up to which the fused product runs; from there on dequantizing once and running a GEMM is faster.
    static let fusedRows = 4
    /// Input rows up to which the fixed-point packed products run (a batch of decoding sequences): each thread takes
    /// its weight groups through every 8-row chunk while they are in cache, so the weight is read once per call, far
    /// cheaper than dequantizing it all to fp32 for a GEMM until the rows make the products compute-bound.
    static let packedRows = 16
    /// Floats of dequantized weight per GEMM panel (16 MiB).
    static let panelFloats = 1 << 22

    /// `packing` false keeps to the fp32 decoding kernels even where the int8 ones run (tests use it to check them).
    init(weight: QuantizedMatrix, bias: Tensor?, backend: Backend, packing: Bool = true) {
        self.weight = weight
        self.bias = bias
        self.backend = backend
        let size = vlm_quant_packed_size(weight.format.kernelFormat, weight.rows, weight.columns)
        if packing && vlm_quant_packed_supported() != 0 && size > 0 {
            let buffer = OwnedBytes(count: size, weight: true)
            // Packing is most of loading a GGUF model: each range of 16-row groups packs on a core of its own, into
            // its own part of the buffer.
            let groups = (weight.rows + 15) / 16, groupBytes = size / groups
            let destination = UnsafeSendablePointer(pointer: buffer.pointer.assumingMemoryBound(to: UInt8.self))
            parallelRanges(groups, grain: 16) { range in
                var matrix = weight.kernelMatrix
                matrix.data = matrix.data + 16 * range.lowerBound * matrix.row_bytes
                matrix.rows = min(weight.rows, 16 * range.upperBound) - 16 * range.lowerBound
                vlm_quant_pack(&matrix, destination.pointer + range.lowerBound * groupBytes)
            }
            withExtendedLifetime(weight) {}
            packed = buffer
        } else {
            packed = nil
        }
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        switch MatrixPrecision.forNewLayers.available {
        case .bfloat16 where backend == .oneDNN: precision = .bfloat16
        case .int8 where packed != nil && vlm_quant_int8_supported() != 0: precision = .int8
        default: precision = .float32
        }
        #else
        precision = .float32
        #endif
    }

    /// The layer as one product of a fused decoding step, where its decoding products run packed.
    var decoderProduct: vlm_decoder_product? {
        guard let packed, KernelPath.best == .vector else { return nil }
        return vlm_decoder_product(packed: UnsafeRawPointer(packed.pointer), format: weight.format.kernelFormat,
                                   rows: weight.rows, columns: weight.columns,
                                   bias: bias.map { UnsafePointer($0.storage.pointer) }, offset: 0)
    }

    /// Writes the layer's output for `rows > 0` rows of `x` to `output`.
    func apply(_ x: Tensor, rows: Int, activation: Activation, residual: Tensor?, into output: Tensor,
               path: KernelPath = .best) {
        if path == .vector, packed != nil, rows == 1 {
            Self.decode([self], x, into: [output], activation: activation, residuals: [residual])
        } else if path == .vector, let packed, precision == .int8 {
            applyInt8(packed, x, rows: rows, activation: activation, residual: residual, into: output)
        } else if path == .vector, let packed, rows <= Self.packedRows {
            applyPacked(packed, x, rows: rows, activation: activation, residual: residual, into: output)
        } else if rows <= Self.fusedRows {
            applyFused(x, rows: rows, activation: activation, residual: residual, into: output, path: path)
        } else {
            applyPanels(x, rows: rows, activation: activation, residual: residual, into: output, path: path)
        }
    }

    private func applyFused(_ x: Tensor, rows: Int, activation: Activation, residual: Tensor?, into output: Tensor,
                            path: KernelPath) {
        let (n, k) = (weight.rows, weight.columns)
        // A few chunks per core keep the cores evenly busy; multiples of 4 rows match the kernel's row groups.
        let cores = processorCount
        let chunk = max(16, (n + 4 * cores - 1) / (4 * cores) + 3) & ~3
        let chunks = (n + chunk - 1) / chunk
        let input = UnsafeSendablePointer(pointer: x.storage.pointer)
        let destination = UnsafeSendablePointer(pointer: output.storage.pointer)
        let bias = self.bias, residualPointer = residual.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        let weight = self.weight
        parallelFor(chunks) { index in
            var matrix = weight.kernelMatrix
            let first = index * chunk, count = min(chunk, n - first)
            vlm_quant_matmul_rows(&matrix, input.pointer, rows, k, destination.pointer, n, first, count, path.isa)
            finishLinearOutput(destination.pointer, rows: rows, columns: first..<(first + count), stride: n, bias: bias,
                        activation: activation, residual: residualPointer?.pointer)
        }
    }

    /// A decoding thread reads its range as vlm_quant_streams() streams (quant_packed_avx512.c), so ranges are claimed
    /// in whole sets of that many groups: what does not divide among the streams runs one group at a time, more
    /// slowly. At least two sets a range (smaller ranges fell back to one stream: Qwen2-0.5B Q4_K_M decoding 5%
    /// faster than with ranges of 2 groups).
    private func applyPacked(_ packed: OwnedBytes, _ x: Tensor, rows: Int, activation: Activation, residual: Tensor?,
                             into output: Tensor) {
        let (n, k) = (weight.rows, weight.columns)
        let format = weight.format.kernelFormat
        let groups = (n + 15) / 16
        let destination = UnsafeSendablePointer(pointer: output.storage.pointer)
        let bias = self.bias, residualPointer = residual.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        let activationBytes = vlm_quant_activation_size(k)
        let activations = OwnedBytes(count: rows * activationBytes)
        for row in 0..<rows {
            vlm_quant_activation(x.storage.pointer + row * k, k, activations.pointer + row * activationBytes)
        }
        let chunk = Int(VLM_QUANT_MAX_ROWS), streams = Int(vlm_quant_streams())
        parallelRanges((groups + streams - 1) / streams, grain: 2) { sets in
            let range = (sets.lowerBound * streams)..<min(groups, sets.upperBound * streams)
            for first in stride(from: 0, to: rows, by: chunk) {
                vlm_quant_packed_matmul(packed.pointer, format, n, k, activations.pointer + first * activationBytes,
                                        min(chunk, rows - first), destination.pointer + first * n, n,
                                        range.lowerBound, range.count, KernelPath.vectorISA)
            }
            finishLinearOutput(destination.pointer, rows: rows, columns: (16 * range.lowerBound)..<min(n, 16 * range.upperBound),
                        stride: n, bias: bias, activation: activation, residual: residualPointer?.pointer)
        }
        withExtendedLifetime((packed, x, activations)) {}
    }

    /// One decoding row `x` through several layers that read it (q, k and v in different block formats), their
    /// products in one parallel region over all their groups: a separate region for each would leave a small
    /// matrix's few ranges to one core while the other waits. False, with nothing written, unless every layer runs
    /// packed products on inputs of one width.
    static func applyPacked(together layers: [QuantizedLinear], _ x: Tensor, into outputs: [Tensor]) -> Bool {
        let k = x.shape.last ?? 0
        guard layers.allSatisfy({ $0.packed != nil && $0.weight.columns == k }), layers.count == outputs.count,
              x.count == k, KernelPath.best == .vector else { return false }
        decode(layers, x, into: outputs, activation: .identity, residuals: outputs.map { _ in nil })
        return true
    }

    /// The packed products of one row `x` through `layers` (all packed, all reading x's width) in one parallel
    /// region, each thread writing the row in fixed point (int8 for the int8 layers) itself as it joins rather than
    /// all of them waiting while one does; then each output's bias, `activation` and residual.
    private static func decode(_ layers: [QuantizedLinear], _ x: Tensor, into outputs: [Tensor], activation: Activation,
                               residuals: [Tensor?]) {
        let packed = layers.map { $0.packed! }
        let k = x.shape.last ?? 0
        let streams = Int(vlm_quant_streams())
        // Each layer's groups in whole sets of vlm_quant_streams(), the layers' sets one after another.
        let firstSets = layers.reduce(into: [0]) { starts, layer in
            starts.append(starts.last! + ((layer.weight.rows + 15) / 16 + streams - 1) / streams)
        }
        let input = UnsafeSendablePointer(pointer: x.storage.pointer), call = vlm_quant_call_token()
        let destinations = outputs.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        let residualPointers = residuals.map { $0.map { UnsafeSendablePointer(pointer: $0.storage.pointer) } }
        let formats = layers.map(\.weight.format.kernelFormat), int8 = layers.map { $0.precision == .int8 }
        parallelRanges(firstSets.last!, grain: 2) { sets in
            for (index, layer) in layers.enumerated() {
                let (from, to) = (max(sets.lowerBound, firstSets[index]), min(sets.upperBound, firstSets[index + 1]))
                if from >= to { continue }
                let n = layer.weight.rows, groups = (n + 15) / 16
                let range = ((from - firstSets[index]) * streams)..<min(groups, (to - firstSets[index]) * streams)
                let matvec = int8[index] ? vlm_quant_int8_matvec : vlm_quant_packed_matvec
                precondition(matvec(packed[index].pointer, formats[index], n, k, input.pointer, call,
                                    destinations[index].pointer, range.lowerBound, range.count) == 0,
                             "out of memory for a decoding product's activations")
                finishLinearOutput(destinations[index].pointer, rows: 1, columns: (16 * range.lowerBound)..<min(n, 16 * range.upperBound),
                            stride: n, bias: layer.bias, activation: activation, residual: residualPointers[index]?.pointer)
            }
        }
        withExtendedLifetime((packed, x, outputs, residuals)) {}
    }

    /// A prompt's product in int8: its rows quantized in parallel, then each thread takes pairs of weight groups (the
    /// kernel's tile width) through every row while they are in cache.
    private func applyInt8(_ packed: OwnedBytes, _ x: Tensor, rows: Int, activation: Activation, residual: Tensor?,
                           into output: Tensor) {
        let (n, k) = (weight.rows, weight.columns)
        let format = weight.format.kernelFormat
        let groups = (n + 15) / 16
        let activationBytes = vlm_quant_int8_activation_size(k)
        let scratch = DequantizationScratch.shared.take(count: (rows * activationBytes + 3) / 4)
        defer { DequantizationScratch.shared.give(scratch) }
        let input = UnsafeSendablePointer(pointer: x.storage.pointer)
        let activations = UnsafeSendablePointer(pointer: scratch.pointer)
        parallelRanges(rows, grain: 16) { range in
            for row in range {
                vlm_quant_int8_activation(input.pointer + row * k, k,
                                            UnsafeMutableRawPointer(activations.pointer) + row * activationBytes)
            }
        }
        let destination = UnsafeSendablePointer(pointer: output.storage.pointer)
        let bias = self.bias, residualPointer = residual.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        parallelRanges((groups + 1) / 2, grain: 1) { pairs in
            let range = (2 * pairs.lowerBound)..<min(groups, 2 * pairs.upperBound)
            precondition(vlm_quant_int8_matmul(packed.pointer, format, n, k, activations.pointer, rows, destination.pointer,
                                                 n, range.lowerBound, range.count) == 0,
                         "out of memory for an int8 prompt product's unpacked weights")
            finishLinearOutput(destination.pointer, rows: rows, columns: (16 * range.lowerBound)..<min(n, 16 * range.upperBound),
                               stride: n, bias: bias, activation: activation, residual: residualPointer?.pointer)
        }
        withExtendedLifetime((packed, x, scratch)) {}
    }

    private func applyPanels(_ x: Tensor, rows: Int, activation: Activation, residual: Tensor?, into output: Tensor,
                             path: KernelPath) {
        let (n, k) = (weight.rows, weight.columns)
        let panel = max(1, min(n, Self.panelFloats / max(k, 1)))
        let bf16 = precision == .bfloat16
        // bf16: the rounded panel after the fp32 one, in half its bytes.
        let scratch = DequantizationScratch.shared.take(count: bf16 ? panel * k + (panel * k + 1) / 2 : panel * k)
        defer { DequantizationScratch.shared.give(scratch) }
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        let roundedInput = bf16 ? roundedToBFloat16(x.storage.pointer, rows: rows, columns: k, roundings: inputRoundings) : nil
        #else
        let roundedInput: TensorStorage? = nil
        #endif
        let source = UnsafeMutableRawPointer(roundedInput?.pointer ?? x.storage.pointer)
        let multiplied = UnsafeMutableRawPointer(bf16 ? scratch.pointer + panel * k : scratch.pointer)
        for first in stride(from: 0, to: n, by: panel) {
            let width = min(panel, n - first)
            weight.dequantizeRows(first..<(first + width), into: scratch.pointer, path: path)
            #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
            if bf16 {
                roundedToBFloat16(scratch.pointer, rows: width, columns: k, roundings: panelRoundings, into: multiplied)
            }
            #endif
            multiplyPanel(source, rows: rows, panel: multiplied, columns: first..<(first + width), activation: activation,
                          residual: residual, into: output)
        }
        withExtendedLifetime(roundedInput) {}
    }

    /// `output[:, columns] = epilogue(x · panelᵀ + bias[columns])` for a dequantized panel `[columns.count, k]`, both
    /// operands in the layer's precision.
    private func multiplyPanel(_ x: UnsafeMutableRawPointer, rows: Int, panel: UnsafeMutableRawPointer,
                               columns: Range<Int>, activation: Activation, residual: Tensor?, into output: Tensor) {
        let (n, k, width) = (weight.rows, weight.columns, columns.count)
        switch backend {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case .oneDNN:
            let key = Key(rows: rows, panel: width, activation: activation, residual: residual != nil)
            let primitive = primitives.primitive(for: key) {
                Self.makePrimitive(rows: rows, k: k, n: n, width: width, type: precision.dnnlType, hasBias: bias != nil,
                                   activation: activation, residual: residual != nil)
            }
            var arguments: [(Int32, UnsafeMutableRawPointer)] = [
                (DNNL_ARG_SRC, x), (DNNL_ARG_WEIGHTS, panel),
                (DNNL_ARG_DST, UnsafeMutableRawPointer(output.storage.pointer + columns.lowerBound)),
            ]
            if let bias { arguments.append((DNNL_ARG_BIAS, UnsafeMutableRawPointer(bias.storage.pointer + columns.lowerBound))) }
            if let residual {
                arguments.append((postOpSource(activation == .identity ? 0 : 1),
                                  UnsafeMutableRawPointer(residual.storage.pointer + columns.lowerBound)))
            }
            primitive.execute(arguments)
        #endif
        case .portable:
            let status = vlm_gemm(rows, width, k, x.assumingMemoryBound(to: Float.self), k,
                                  panel.assumingMemoryBound(to: Float.self), k, 1,
                                  output.storage.pointer + columns.lowerBound, n)
            precondition(status == 0, "out of memory for GEMM scratch")
            finishLinearOutput(output.storage.pointer, rows: rows, columns: columns, stride: n, bias: bias,
                        activation: activation, residual: residual?.storage.pointer)
        }
    }

    #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
    /// A matmul of `x [rows, k]` with a row-major `[width, k]` panel (the `[k, width]` operand with strides (1, k)),
    /// both of `type`, writing fp32 columns of the `[rows, n]` output in place; bias, activation and residual are
    /// post-ops.
    private static func makePrimitive(rows: Int, k: Int, n: Int, width: Int, type: dnnl_data_type_t, hasBias: Bool,
                                      activation: Activation, residual: Bool) -> Primitive {
        guard let primitive = linearMatmulPrimitive(
            "quantized Linear matmul [\(rows), \(k)] -> \(width) of \(n)", source: memoryDescriptor([rows, k], type: type),
            weights: memoryDescriptor([k, width], strides: [1, k], type: type), bias: hasBias ? memoryDescriptor([1, width]) : nil,
            destination: memoryDescriptor([rows, width], strides: [n, 1]), activation: activation, residual: residual) else {
            fatalError("oneDNN has no matmul for a dequantized panel [\(rows), \(k)] -> \(width)")
        }
        return primitive
    }
    #endif
}

/// One reusable buffer for dequantized panels: a fresh multi-megabyte allocation on every prompt matmul would
/// cost a page fault per 4 KiB. A caller that finds it taken (another thread) gets a buffer of its own.
final class DequantizationScratch: @unchecked Sendable {
    static let shared = DequantizationScratch()
    private let lock = NSLock()
    private var spare: TensorStorage?

    func take(count: Int) -> TensorStorage {
        lock.lock()
        defer { lock.unlock() }
        if let buffer = spare, buffer.count >= count {
            spare = nil
            return buffer
        }
        spare = nil
        return TensorStorage(count: count)
    }

    func give(_ buffer: TensorStorage) {
        lock.lock()
        defer { lock.unlock() }
        if (spare?.count ?? 0) < buffer.count { spare = buffer }
    }
}
