#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL
internal import CVLMKernels

/// `Linear` on oneDNN's matmul. The weight is reordered once, at init, into the blocked layout oneDNN's matmul
/// prefers (in bf16 for `.bfloat16`); the primitive for each row count is created on first use and cached.
final class OneDNNLinear: @unchecked Sendable {
    private let inFeatures: Int
    private let outFeatures: Int
    /// The precision the products run in: fp32, or bf16 where it was asked for and the CPU has bf16 instructions.
    let precision: MatrixPrecision
    private let weights: PackedBuffer
    private let bias: Tensor?
    private let primitives = PrimitiveCache<LinearCall>(capacity: 64)
    /// bf16: the reorders rounding an fp32 input of each row count to bf16.
    private let sourceRoundings = PrimitiveCache<Int>(capacity: 64)
    /// Values from one 64-column panel of the packed weight to the next, where the layout is the one
    /// `vlm_panel_matvec` (fp32 `BA16a64b`) or `vlm_panel_matvec_bf16` (bf16 `BA16a64b2a`) reads and this CPU runs
    /// it; nil where one row goes through oneDNN too.
    private let panelStride: Int?

    /// `weight [out, in]` and `bias [out]`, already checked by `Linear`; `precision` fp32 or bf16 (available here).
    init(weight: Tensor, bias: Tensor?, precision: MatrixPrecision) {
        precondition(precision != .int8, "int8 layers are OneDNNInt8Linear's")
        outFeatures = weight.shape[0]
        inFeatures = weight.shape[1]
        self.bias = bias
        self.precision = precision
        // PyTorch's [out, in] row-major weight is the matmul's [in, out] operand with strides (1, in). The
        // blocked layout brgemm picks does not depend on the row count, so any row count serves to ask for it.
        let plain = memoryDescriptor([inFeatures, outFeatures], strides: [1, inFeatures])
        let type = precision.dnnlType
        guard let probe = OneDNNLinear.makePrimitive(
            rows: 128, inFeatures: inFeatures, outFeatures: outFeatures,
            weights: memoryDescriptor([inFeatures, outFeatures], tag: dnnl_format_tag_any, type: type),
            sourceType: type, hasBias: bias != nil, activation: .identity, residual: false) else {
            fatalError("oneDNN has no \(precision.rawValue) matmul for Linear \(inFeatures) -> \(outFeatures)")
        }
        weights = PackedBuffer(descriptor: probe.descriptor(for: DNNL_ARG_WEIGHTS), from: weight.rawPointer, sourceDescriptor: plain)
        panelStride = Self.panelStride(of: weights.descriptor)
    }

    /// The panel stride of an `[in, out]` weight laid out in 64-column panels, each of 16-row blocks of 16 × 64 fp32
    /// values (`BA16a64b`: row r of a panel starts 64·r values in) or 32-row blocks of 16 row pairs × 64 × 2 bf16
    /// values (`BA16a64b2a`: row pair j starts 128·j values in), where this CPU runs the kernel that reads it; nil
    /// otherwise.
    private static func panelStride(of descriptor: dnnl_memory_desc_t) -> Int? {
        let blocking = descriptor.format_desc.blocking
        guard descriptor.ndims == 2, descriptor.format_kind == dnnl_blocked, descriptor.offset0 == 0,
              blocking.inner_blks.0 == 16, blocking.inner_blks.1 == 64, blocking.inner_idxs.0 == 0,
              blocking.inner_idxs.1 == 1, blocking.strides.1 == descriptor.padded_dims.0 * 64 else { return nil }
        switch descriptor.data_type {
        case dnnl_f32:
            guard blocking.inner_nblks == 2, blocking.strides.0 == 16 * 64,
                  vlm_panel_matvec(nil, 0, 0, 0, nil, nil, nil, 0, 0) == 0 else { return nil }
        case dnnl_bf16:
            guard blocking.inner_nblks == 3, blocking.inner_blks.2 == 2, blocking.inner_idxs.2 == 0,
                  blocking.strides.0 == 16 * 64 * 2,
                  vlm_panel_matvec_bf16(nil, 0, 0, 0, nil, nil, nil, 0, 0) == 0 else { return nil }
        default:
            return nil
        }
        return Int(blocking.strides.1)
    }

    /// Whether oneDNN multiplies bf16 natively here, rather than not at all or by emulating the instructions.
    static let hasNativeBFloat16: Bool = {
        let bf16 = dnnl_bf16
        guard let probe = makePrimitive(rows: 64, inFeatures: 64, outFeatures: 64,
                                        weights: memoryDescriptor([64, 64], tag: dnnl_format_tag_any, type: bf16),
                                        sourceType: bf16, hasBias: false, activation: .identity, residual: false) else {
            return false
        }
        let implementation = probe.implementation
        return implementation.contains("bf16") || implementation.contains("amx")
    }()

    /// Writes the layer's output for `rows > 0` rows of `x` to `output`.
    func apply(_ x: Tensor, rows: Int, activation: Activation, residual: Tensor?, into output: Tensor) {
        if rows == 1, let panelStride {
            return decode(x, panelStride: panelStride, activation: activation, residual: residual, into: output)
        }
        let key = LinearCall(rows: rows, activation: activation, residual: residual != nil)
        let type = precision.dnnlType
        let primitive = primitives.primitive(
            for: key, "matmul for Linear [\(rows), \(inFeatures)] -> \(outFeatures) with the packed weight layout") {
            OneDNNLinear.makePrimitive(rows: rows, inFeatures: inFeatures, outFeatures: outFeatures, weights: weights.descriptor,
                                sourceType: type, hasBias: bias != nil, activation: activation, residual: residual != nil)
        }
        let rounded = precision == .bfloat16
            ? roundedToBFloat16(x.storage.pointer, rows: rows, columns: inFeatures, roundings: sourceRoundings) : nil
        var arguments: [(Int32, UnsafeMutableRawPointer)] = [
            (DNNL_ARG_SRC, rounded.map { UnsafeMutableRawPointer($0.pointer) } ?? x.rawPointer),
            (DNNL_ARG_WEIGHTS, weights.pointer), (DNNL_ARG_DST, output.rawPointer),
        ]
        if let bias { arguments.append((DNNL_ARG_BIAS, bias.rawPointer)) }
        if let residual { arguments.append((postOpSource(activation == .identity ? 0 : 1), residual.rawPointer)) }
        primitive.execute(arguments)
    }

    /// One row through `vlm_panel_matvec` (or its bf16 form): a decoding step reads every weight once, and oneDNN's
    /// matmul for one row read them at 74–80% of the speed of plain loads (a harness over OPT-2.7B's fp32 shapes on a
    /// Zen 4 VM; these kernels at 95%).
    private func decode(_ x: Tensor, panelStride: Int, activation: Activation, residual: Tensor?, into output: Tensor) {
        let (k, n) = (inFeatures, outFeatures)
        let bf16 = precision == .bfloat16
        let rounded = bf16 ? roundedToBFloat16(x.storage.pointer, rows: 1, columns: k, roundings: sourceRoundings) : nil
        // Addresses, Sendable, typed where each kernel reads them.
        let weight = UInt(bitPattern: weights.pointer)
        let input = UInt(bitPattern: rounded?.pointer ?? x.storage.pointer)
        let destination = UnsafeSendablePointer(pointer: output.storage.pointer)
        let bias = self.bias.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        let residualPointer = residual.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        parallelRanges((n + 63) / 64, grain: 2) { panels in
            let written = bf16
                ? vlm_panel_matvec_bf16(UnsafePointer(bitPattern: weight), k, n, panelStride, UnsafePointer(bitPattern: input),
                                        bias?.pointer, destination.pointer, panels.lowerBound, panels.count)
                : vlm_panel_matvec(UnsafePointer(bitPattern: weight), k, n, panelStride, UnsafePointer(bitPattern: input),
                                   bias?.pointer, destination.pointer, panels.lowerBound, panels.count)
            precondition(written == 0, "the panel product ran on a CPU that lacks its instructions")
            finishLinearOutput(destination.pointer, rows: 1, columns: (64 * panels.lowerBound)..<min(n, 64 * panels.upperBound),
                               stride: n, bias: nil, activation: activation, residual: residualPointer?.pointer)
        }
        withExtendedLifetime((weights, x, rounded, output, self.bias, residual)) {}
    }

    private static func makePrimitive(rows: Int, inFeatures: Int, outFeatures: Int, weights: dnnl_memory_desc_t,
                                      sourceType: dnnl_data_type_t, hasBias: Bool, activation: Activation,
                                      residual: Bool) -> Primitive? {
        linearMatmulPrimitive(
            "Linear matmul [\(rows), \(inFeatures)] -> \(outFeatures)", source: memoryDescriptor([rows, inFeatures], type: sourceType),
            weights: weights, bias: hasBias ? memoryDescriptor([1, outFeatures]) : nil,
            destination: memoryDescriptor([rows, outFeatures]), activation: activation, residual: residual)
    }
}

/// `rows × columns` fp32 values rounded to bf16 by a reorder from `roundings` (cached per row count). bf16 halves the
/// bytes, so an fp32 storage of half the elements holds them.
func roundedToBFloat16(_ values: UnsafeMutablePointer<Float>, rows: Int, columns: Int,
                       roundings: PrimitiveCache<Int>) -> TensorStorage {
    let rounded = TensorStorage(count: (rows * columns + 1) / 2)
    roundedToBFloat16(values, rows: rows, columns: columns, roundings: roundings, into: UnsafeMutableRawPointer(rounded.pointer))
    return rounded
}

/// The same into `destination`, which holds `rows × columns` bf16 values.
func roundedToBFloat16(_ values: UnsafeMutablePointer<Float>, rows: Int, columns: Int, roundings: PrimitiveCache<Int>,
                       into destination: UnsafeMutableRawPointer) {
    let rounding = roundings.primitive(for: rows) {
        Primitive(reorderFrom: memoryDescriptor([rows, columns]), to: memoryDescriptor([rows, columns], type: dnnl_bf16))
    }
    rounding.execute([(DNNL_ARG_FROM, UnsafeMutableRawPointer(values)), (DNNL_ARG_TO, destination)])
}

/// The matmul of a Linear layer: `source · weights (+ bias)`, then `activation` and, with `residual`, the addition
/// of a tensor shaped like `destination`, as post-ops. Nil when oneDNN has no implementation for these layouts.
func linearMatmulPrimitive(_ name: String, source: dnnl_memory_desc_t, weights: dnnl_memory_desc_t,
                           bias: dnnl_memory_desc_t?, destination: dnnl_memory_desc_t, activation: Activation,
                           residual: Bool) -> Primitive? {
    var (source, weights, destination) = (source, weights, destination)
    var operation = dnnl_matmul_desc_t()
    let status: dnnl_status_t
    if var bias {
        status = dnnl_matmul_desc_init(&operation, &source, &weights, &bias, &destination)
    } else {
        status = dnnl_matmul_desc_init(&operation, &source, &weights, nil, &destination)
    }
    checkDNNL(status, "\(name) descriptor")
    var attributes = PrimitiveAttributes(postOps: activation.postOps)
    if residual { attributes.postOps.append(.add(destination)) }
    return Primitive(name, operation: operation, attributes: attributes)
}

extension MatrixPrecision {
    var dnnlType: dnnl_data_type_t {
        switch self {
        case .float32: dnnl_f32
        case .bfloat16: dnnl_bf16
        case .int8: dnnl_s8
        }
    }
}

#endif
