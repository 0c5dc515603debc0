#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL
internal import CVLMKernels

/// `Linear` with dynamic int8 quantization, as PyTorch's `quantize_dynamic` and ONNX Runtime's dynamic
/// quantization do: the weight quantized once per output channel, each input row (token) quantized as it comes, on
/// a scale of its own, and their int8 product accumulated exactly in int32 by oneDNN's VNNI kernels.
///
/// `y[m, n] = act(s_x[m] · s_w[n] · Σ_k q_x[m, k] · q_w[n, k] + b[n]) + residual[m, n]`: the weight scales are the
/// matmul's output scales, the row scales a multiplying post-op, and bias, activation and residual the post-ops
/// after it. The product is posed as a batch of one, [1, M, K]·[1, K, N]: oneDNN's brgemm kernels broadcast a
/// per-row [1, M, 1] operand in that shape but fall back to a reference loop for [M, 1] in two dimensions.
final class OneDNNInt8Linear: @unchecked Sendable {
    private let inFeatures: Int
    private let outFeatures: Int
    private let weights: PackedBuffer
    private let weightScales: [Float]
    private let bias: Tensor?
    private let primitives = PrimitiveCache<LinearCall>(capacity: 64)
    /// Each column's sum of the packed weight, where one row goes through `vlm_int8_matvec` (the weight kept plain,
    /// as oneDNN keeps it, and a CPU with VNNI); nil where one row goes through oneDNN too, whose one-row matmul
    /// copies the plain weight into its blocks on every call: Gemma 3 4B's int8 decoding steps read their weights at
    /// 11.5 GB/s that way, a third of the memory's speed.
    private let columnSums: [Int32]?

    /// `weight [out, in]` and `bias [out]`, already checked by `Linear`.
    init(weight: Tensor, bias: Tensor?) {
        let (outFeatures, inFeatures) = (weight.shape[0], weight.shape[1])
        (self.outFeatures, self.inFeatures) = (outFeatures, inFeatures)
        self.bias = bias
        // Each output channel is a row of PyTorch's [out, in] weight: quantized like a token.
        let quantized = UnsafeMutableRawPointer.allocate(byteCount: max(weight.count, 1), alignment: 64)
        defer { quantized.deallocate() }
        var scales = [Float](repeating: 1, count: outFeatures)
        scales.withUnsafeMutableBufferPointer { scales in
            vlm_quantize_rows_int8(weight.storage.pointer, outFeatures, inFeatures,
                                   quantized.assumingMemoryBound(to: CChar.self), scales.baseAddress, KernelPath.best.isa)
        }
        weightScales = scales
        let plain = memoryDescriptor([1, inFeatures, outFeatures], strides: [inFeatures * outFeatures, 1, inFeatures], type: dnnl_s8)
        guard let probe = OneDNNInt8Linear.makePrimitive(
            rows: 128, inFeatures: inFeatures, outFeatures: outFeatures,
            weights: memoryDescriptor([1, inFeatures, outFeatures], tag: dnnl_format_tag_any, type: dnnl_s8),
            weightScales: scales, hasBias: bias != nil, activation: .identity, residual: false) else {
            fatalError("oneDNN has no int8 matmul for Linear \(inFeatures) -> \(outFeatures)")
        }
        let weights = PackedBuffer(descriptor: probe.descriptor(for: DNNL_ARG_WEIGHTS), from: quantized, sourceDescriptor: plain)
        self.weights = weights
        let packed = weights.descriptor
        let strides = packed.format_desc.blocking.strides
        if packed.ndims == 3, packed.format_kind == dnnl_blocked, packed.offset0 == 0,
           packed.format_desc.blocking.inner_nblks == 0, strides.1 == outFeatures, strides.2 == 1,
           vlm_int8_matvec(nil, inFeatures, 0, nil, nil, nil, 1, nil, nil, 0, 0) == 0 {
            var sums = [Int32](repeating: 0, count: outFeatures)
            sums.withUnsafeMutableBufferPointer {
                vlm_int8_column_sums(weights.pointer.assumingMemoryBound(to: Int8.self), inFeatures, outFeatures, $0.baseAddress)
            }
            columnSums = sums
        } else {
            columnSums = nil
        }
    }

    /// Whether oneDNN multiplies int8 with VNNI dot products here. Without them its int8 kernels add pairs of
    /// products in saturating 16-bit arithmetic, which clips large activations: no precision a caller asked for.
    static let hasVNNI: Bool = {
        guard let probe = makePrimitive(rows: 64, inFeatures: 64, outFeatures: 64,
                                        weights: memoryDescriptor([1, 64, 64], tag: dnnl_format_tag_any, type: dnnl_s8),
                                        weightScales: [Float](repeating: 1, count: 64), hasBias: false,
                                        activation: .identity, residual: false) else {
            return false
        }
        let implementation = probe.implementation
        return implementation.contains("vnni") || implementation.contains("amx")
    }()

    /// Writes the layer's output for `rows > 0` rows of `x` to `output`.
    func apply(_ x: Tensor, rows: Int, activation: Activation, residual: Tensor?, into output: Tensor) {
        if rows == 1, let columnSums {
            return decode(x, columnSums: columnSums, activation: activation, residual: residual, into: output)
        }
        let key = LinearCall(rows: rows, activation: activation, residual: residual != nil)
        let primitive = primitives.primitive(
            for: key, "int8 matmul for Linear [\(rows), \(inFeatures)] -> \(outFeatures) with the packed weight layout") {
            OneDNNInt8Linear.makePrimitive(rows: rows, inFeatures: inFeatures, outFeatures: outFeatures, weights: weights.descriptor,
                                weightScales: weightScales, hasBias: bias != nil, activation: activation, residual: residual != nil)
        }
        // The int8 rows in an fp32 storage of a quarter the elements, then the rows' scales.
        let quantizedCount = (rows * inFeatures + 3) / 4
        let scratch = TensorStorage(count: quantizedCount + rows)
        let quantized = UnsafeMutableRawPointer(scratch.pointer)
        let rowScales = scratch.pointer + quantizedCount
        let features = inFeatures, path = KernelPath.best
        parallelRanges(rows, grain: 16) { range in
            let first = range.lowerBound
            vlm_quantize_rows_int8(x.storage.pointer + first * features, range.count, features,
                                   UnsafeMutableRawPointer(scratch.pointer).assumingMemoryBound(to: CChar.self) + first * features,
                                   scratch.pointer + quantizedCount + first, path.isa)
        }
        var arguments: [(Int32, UnsafeMutableRawPointer)] = [
            (DNNL_ARG_SRC, quantized), (DNNL_ARG_WEIGHTS, weights.pointer), (DNNL_ARG_DST, output.rawPointer),
            (postOpSource(0), UnsafeMutableRawPointer(rowScales)),
        ]
        if let bias { arguments.append((postOpSource(1), bias.rawPointer)) }
        if let residual {
            let index = 1 + (bias == nil ? 0 : 1) + activation.postOps.count
            arguments.append((postOpSource(index), residual.rawPointer))
        }
        primitive.execute(arguments)
    }

    /// One row through `vlm_int8_matvec`: the same int32 sums and the same floats after them as oneDNN's matmul, from
    /// one pass over the plain weight.
    private func decode(_ x: Tensor, columnSums: [Int32], activation: Activation, residual: Tensor?, into output: Tensor) {
        let (k, n) = (inFeatures, outFeatures)
        let quantized = TensorStorage(count: (k + 3) / 4 + 1)
        let rowScale = quantized.pointer + (k + 3) / 4
        vlm_quantize_rows_int8(x.storage.pointer, 1, k, UnsafeMutableRawPointer(quantized.pointer).assumingMemoryBound(to: CChar.self),
                               rowScale, KernelPath.best.isa)
        let scale = rowScale.pointee
        // Addresses, Sendable, typed where the kernel reads them.
        let weight = UInt(bitPattern: weights.pointer), input = UInt(bitPattern: quantized.pointer)
        let destination = UnsafeSendablePointer(pointer: output.storage.pointer)
        let bias = self.bias.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        let residualPointer = residual.map { UnsafeSendablePointer(pointer: $0.storage.pointer) }
        columnSums.withUnsafeBufferPointer { sums in
            weightScales.withUnsafeBufferPointer { scales in
                let (sums, scales) = (UInt(bitPattern: sums.baseAddress), UInt(bitPattern: scales.baseAddress))
                parallelRanges((n + 63) / 64, grain: 4) { panels in
                    let written = vlm_int8_matvec(UnsafePointer(bitPattern: weight), k, n, UnsafePointer(bitPattern: input),
                                                  UnsafePointer(bitPattern: sums), UnsafePointer(bitPattern: scales), scale,
                                                  bias?.pointer, destination.pointer, panels.lowerBound, panels.count)
                    precondition(written == 0, "the int8 row product ran on a CPU that lacks its instructions")
                    finishLinearOutput(destination.pointer, rows: 1, columns: (64 * panels.lowerBound)..<min(n, 64 * panels.upperBound),
                                       stride: n, bias: nil, activation: activation, residual: residualPointer?.pointer)
                }
            }
        }
        withExtendedLifetime((weights, x, quantized, output, self.bias, residual)) {}
    }

    private static func makePrimitive(rows: Int, inFeatures: Int, outFeatures: Int, weights: dnnl_memory_desc_t,
                                      weightScales: [Float], hasBias: Bool, activation: Activation,
                                      residual: Bool) -> Primitive? {
        var source = memoryDescriptor([1, rows, inFeatures], type: dnnl_s8)
        var weights = weights
        var destination = memoryDescriptor([1, rows, outFeatures])
        var operation = dnnl_matmul_desc_t()
        checkDNNL(dnnl_matmul_desc_init(&operation, &source, &weights, nil, &destination), "int8 Linear matmul descriptor")
        var attributes = PrimitiveAttributes(outputScales: (mask: 1 << 2, values: weightScales))
        attributes.postOps.append(.multiply(memoryDescriptor([1, rows, 1])))
        if hasBias { attributes.postOps.append(.add(memoryDescriptor([1, 1, outFeatures]))) }
        attributes.postOps += activation.postOps
        if residual { attributes.postOps.append(.add(destination)) }
        return Primitive("int8 Linear matmul [\(rows), \(inFeatures)] -> \(outFeatures)", operation: operation, attributes: attributes)
    }
}

#endif
