internal import CDNNL

/// Why a layer could not be built from the given weights.
public enum LayerError: Error, CustomStringConvertible {
    case weightRank(layer: String, expected: Int, shape: [Int])
    case biasShape(layer: String, expected: [Int], shape: [Int])
    case geometry(layer: String, stride: Int, padding: Int)

    public var description: String {
        switch self {
        case let .weightRank(layer, expected, shape):
            "\(layer) weight must have rank \(expected), got shape \(shape)"
        case let .biasShape(layer, expected, shape):
            "\(layer) bias must have shape \(expected), got \(shape)"
        case let .geometry(layer, stride, padding):
            "\(layer) needs stride >= 1 and padding >= 0, got stride \(stride), padding \(padding)"
        }
    }
}

/// `nn.Linear`: `y = x·Wᵀ + b`, optionally followed by a fused activation and a residual addition.
///
/// The weight is reordered once, at init, into the blocked layout oneDNN's matmul prefers; the primitive for each
/// row count is created on first use and cached. Safe to call from several threads.
public final class Linear: @unchecked Sendable {
    /// Size of the last dimension of the input.
    public let inFeatures: Int
    /// Size of the last dimension of the output.
    public let outFeatures: Int

    private let weights: PackedBuffer
    private let bias: Tensor?
    private let primitives = PrimitiveCache<Key>(capacity: 64)

    private struct Key: Hashable {
        let rows: Int
        let activation: Activation
        let residual: Bool
    }

    /// - Parameters:
    ///   - weight: `[out, in]`, as PyTorch stores it.
    ///   - bias: `[out]`, or nil.
    /// - Throws: `LayerError` when the weight is not 2-D or the bias does not match it.
    public init(weight: Tensor, bias: Tensor?) throws {
        guard weight.rank == 2 else { throw LayerError.weightRank(layer: "Linear", expected: 2, shape: weight.shape) }
        outFeatures = weight.shape[0]
        inFeatures = weight.shape[1]
        if let bias, bias.shape != [outFeatures] {
            throw LayerError.biasShape(layer: "Linear", expected: [outFeatures], shape: bias.shape)
        }
        self.bias = bias
        // PyTorch's [out, in] row-major weight is the matmul's [in, out] operand with strides (1, in). The
        // blocked layout brgemm picks does not depend on the row count, so any row count serves to ask for it.
        let plain = memoryDescriptor([inFeatures, outFeatures], strides: [1, inFeatures])
        let probe = Linear.makePrimitive(rows: 128, inFeatures: inFeatures, outFeatures: outFeatures,
                                         weights: memoryDescriptor([inFeatures, outFeatures], tag: dnnl_format_tag_any),
                                         hasBias: bias != nil, activation: .identity, residual: false)
        weights = PackedBuffer(descriptor: probe.descriptor(for: DNNL_ARG_WEIGHTS), from: weight.rawPointer, sourceDescriptor: plain)
    }

    /// Applies the layer to `x` of shape `[..., inFeatures]`, giving `[..., outFeatures]`.
    ///
    /// - Parameters:
    ///   - activation: applied to `x·Wᵀ + b` inside the matmul.
    ///   - residual: a tensor of the output's shape added after the activation.
    public func callAsFunction(_ x: Tensor, activation: Activation = .identity, residual: Tensor? = nil) -> Tensor {
        precondition(x.rank >= 1 && x.shape.last == inFeatures, "Linear(\(inFeatures) -> \(outFeatures)) got input \(x.shape)")
        let outputShape = x.shape.dropLast() + [outFeatures]
        if let residual {
            precondition(residual.shape == Array(outputShape), "Linear residual \(residual.shape) does not match output \(outputShape)")
        }
        let rows = x.count / inFeatures
        let output = Tensor(uninitialized: Array(outputShape))
        if rows == 0 { return output }
        let key = Key(rows: rows, activation: activation, residual: residual != nil)
        let primitive = primitives.primitive(for: key) {
            Linear.makePrimitive(rows: rows, inFeatures: inFeatures, outFeatures: outFeatures, weights: weights.descriptor,
                                 hasBias: bias != nil, activation: activation, residual: residual != nil)
        }
        var arguments: [(Int32, UnsafeMutableRawPointer)] = [
            (DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_WEIGHTS, weights.pointer), (DNNL_ARG_DST, output.rawPointer),
        ]
        if let bias { arguments.append((DNNL_ARG_BIAS, bias.rawPointer)) }
        if let residual { arguments.append((postOpSource(activation == .identity ? 0 : 1), residual.rawPointer)) }
        primitive.execute(arguments)
        return output
    }

    private static func makePrimitive(rows: Int, inFeatures: Int, outFeatures: Int, weights: dnnl_memory_desc_t,
                                      hasBias: Bool, activation: Activation, residual: Bool) -> Primitive {
        var source = memoryDescriptor([rows, inFeatures])
        var weights = weights
        var bias = memoryDescriptor([1, outFeatures])
        var destination = memoryDescriptor([rows, outFeatures])
        var operation = dnnl_matmul_desc_t()
        let status = hasBias
            ? dnnl_matmul_desc_init(&operation, &source, &weights, &bias, &destination)
            : dnnl_matmul_desc_init(&operation, &source, &weights, nil, &destination)
        checkDNNL(status, "Linear matmul descriptor [\(rows), \(inFeatures)] -> \(outFeatures)")
        var attributes = PrimitiveAttributes(postOps: activation.postOps)
        if residual { attributes.postOps.append(.add(destination)) }
        guard let primitive = Primitive("Linear matmul", operation: operation, attributes: attributes) else {
            fatalError("oneDNN has no matmul for Linear [\(rows), \(inFeatures)] -> \(outFeatures) with the packed weight layout")
        }
        return primitive
    }
}
