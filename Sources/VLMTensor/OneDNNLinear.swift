#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL

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
