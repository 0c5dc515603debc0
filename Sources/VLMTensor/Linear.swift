internal import CVLMKernels

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
/// On oneDNN the weight is packed once, at init, and the matmul for each row count is created on first use and
/// cached. A dense layer multiplies in ``MatrixPrecision/forNewLayers`` as it was when the layer was built. Safe to
/// call from several threads.
public final class Linear: @unchecked Sendable {
    /// Size of the last dimension of the input.
    public let inFeatures: Int
    /// Size of the last dimension of the output.
    public let outFeatures: Int

    private let implementation: Implementation

    private enum Implementation {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case oneDNN(OneDNNLinear)
        case oneDNNInt8(OneDNNInt8Linear)
        #endif
        /// PyTorch's `[out, in]` weight as given, then the bias, the activation and the residual one row at a time.
        case portable(weight: Tensor, bias: Tensor?)
        /// GGUF quantized blocks, multiplied without expanding them to fp32 for good.
        case quantized(QuantizedLinear)
    }

    /// - Parameters:
    ///   - weight: `[out, in]`, as PyTorch stores it.
    ///   - bias: `[out]`, or nil.
    /// - Throws: `LayerError` when the weight is not 2-D or the bias does not match it.
    public convenience init(weight: Tensor, bias: Tensor?) throws {
        try self.init(weight: weight, bias: bias, backend: .best)
    }

    /// - Parameters:
    ///   - weight: `[out, in]`: an fp32 tensor, or a quantized matrix that stays quantized.
    ///   - bias: `[out]`, or nil.
    /// - Throws: `LayerError` when a dense weight is not 2-D or the bias does not match the weight.
    public convenience init(weight: WeightMatrix, bias: Tensor?) throws {
        try self.init(weight: weight, bias: bias, backend: .best)
    }

    convenience init(weight: WeightMatrix, bias: Tensor?, backend: Backend) throws {
        switch weight {
        case let .dense(tensor): try self.init(weight: tensor, bias: bias, backend: backend)
        case let .quantized(matrix): try self.init(quantized: matrix, bias: bias, backend: backend)
        }
    }

    private init(quantized weight: QuantizedMatrix, bias: Tensor?, backend: Backend) throws {
        outFeatures = weight.rows
        inFeatures = weight.columns
        if let bias, bias.shape != [outFeatures] {
            throw LayerError.biasShape(layer: "Linear", expected: [outFeatures], shape: bias.shape)
        }
        implementation = .quantized(QuantizedLinear(weight: weight, bias: bias, backend: backend))
    }

    init(weight: Tensor, bias: Tensor?, backend: Backend) throws {
        guard weight.rank == 2 else { throw LayerError.weightRank(layer: "Linear", expected: 2, shape: weight.shape) }
        outFeatures = weight.shape[0]
        inFeatures = weight.shape[1]
        if let bias, bias.shape != [outFeatures] {
            throw LayerError.biasShape(layer: "Linear", expected: [outFeatures], shape: bias.shape)
        }
        switch backend {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case .oneDNN:
            let precision = MatrixPrecision.forNewLayers.available
            implementation = precision == .int8 ? .oneDNNInt8(OneDNNInt8Linear(weight: weight, bias: bias))
                : .oneDNN(OneDNNLinear(weight: weight, bias: bias, precision: precision))
        #endif
        case .portable: implementation = .portable(weight: weight, bias: bias)
        }
    }

    /// The precision the layer's products run in: fp32, or what the layer was built in where this machine runs it.
    /// GGUF-quantized layers keep their file's block formats and report the precision of their prompts' products
    /// (fp32, or bf16 or int8 where they were built in it and the CPU has it).
    public var precision: MatrixPrecision {
        switch implementation {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case let .oneDNN(layer): layer.precision
        case .oneDNNInt8: .int8
        #endif
        case let .quantized(layer): layer.precision
        case .portable: .float32
        }
    }

    /// The layer as one product of a ``FusedDecoderStep``: nil unless it is GGUF-quantized and decodes on the packed
    /// products here.
    var decoderProduct: vlm_decoder_product? {
        guard case let .quantized(layer) = implementation else { return nil }
        return layer.decoderProduct
    }

    /// Each layer applied to the one row `x` (`[..., inFeatures]` holding a single row), where all of them are
    /// GGUF-quantized layers whose products run together (see `QuantizedLinear.applyPacked(together:)`); nil otherwise.
    public static func together(_ layers: [Linear], _ x: Tensor) -> [Tensor]? {
        var quantized: [QuantizedLinear] = []
        for layer in layers {
            guard case let .quantized(inner) = layer.implementation else { return nil }
            quantized.append(inner)
        }
        let outputs = layers.map { Tensor(uninitialized: x.shape.dropLast() + [$0.outFeatures]) }
        return QuantizedLinear.applyPacked(together: quantized, x, into: outputs) ? outputs : nil
    }

    /// Applies the layer to `x` of shape `[..., inFeatures]`, giving `[..., outFeatures]`.
    ///
    /// - Parameters:
    ///   - activation: applied to `x·Wᵀ + b`.
    ///   - residual: a tensor of the output's shape added after the activation.
    public func callAsFunction(_ x: Tensor, activation: Activation = .identity, residual: Tensor? = nil) -> Tensor {
        precondition(x.rank >= 1 && x.shape.last == inFeatures, "Linear(\(inFeatures) -> \(outFeatures)) got input \(x.shape)")
        let outputShape = x.shape.dropLast() + [outFeatures]
        if let residual {
            precondition(residual.shape == Array(outputShape), "Linear residual \(residual.shape) does not match output \(outputShape)")
        }
        let rows = Tensor.elementCount(Array(x.shape.dropLast()))
        let output = Tensor(uninitialized: Array(outputShape))
        if output.count == 0 { return output }
        switch implementation {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case let .oneDNN(layer): layer.apply(x, rows: rows, activation: activation, residual: residual, into: output)
        case let .oneDNNInt8(layer): layer.apply(x, rows: rows, activation: activation, residual: residual, into: output)
        #endif
        case let .quantized(layer): layer.apply(x, rows: rows, activation: activation, residual: residual, into: output)
        case let .portable(weight, bias):
            gemm(m: rows, n: outFeatures, k: inFeatures, x.storage.pointer, weight.storage.pointer, transposeB: true,
                 into: output.storage.pointer)
            for row in 0..<rows {
                let out = output.storage.pointer + row * outFeatures
                for column in 0..<outFeatures {
                    out[column] = activation(out[column] + (bias?.storage.pointer[column] ?? 0))
                }
                if let residual {
                    for column in 0..<outFeatures { out[column] += residual.storage.pointer[row * outFeatures + column] }
                }
            }
        }
        return output
    }
}
