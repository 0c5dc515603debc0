/// `nn.Conv2d` with `groups=1`, square stride and symmetric zero padding, on NCHW input. Safe to call from several
/// threads.
public final class Conv2d: @unchecked Sendable {
    /// Input channels.
    public let inChannels: Int
    /// Output channels.
    public let outChannels: Int
    /// Kernel height and width.
    public let kernelSize: (height: Int, width: Int)
    public let stride: Int
    public let padding: Int

    private let implementation: Implementation

    private enum Implementation {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case oneDNN(OneDNNConvolution)
        #endif
        /// The flattened weight applied to each output pixel's patch (im2col, then a matmul). oneDNN also takes this
        /// path when the kernel tiles the input (stride = kernel size, no padding), as in a ViT patch embedding,
        /// where a matmul beats its convolution.
        case patchProjection(Linear)
    }

    /// - Parameters:
    ///   - weight: `[out, in, kh, kw]`, as PyTorch stores it.
    ///   - bias: `[out]`, or nil.
    /// - Throws: `LayerError` on a weight that is not 4-D, a bias that does not match it, or a stride below 1 or
    ///   negative padding.
    public convenience init(weight: Tensor, bias: Tensor?, stride: Int, padding: Int) throws {
        try self.init(weight: weight, bias: bias, stride: stride, padding: padding, backend: .best)
    }

    init(weight: Tensor, bias: Tensor?, stride: Int, padding: Int, backend: Backend) throws {
        guard weight.rank == 4 else { throw LayerError.weightRank(layer: "Conv2d", expected: 4, shape: weight.shape) }
        outChannels = weight.shape[0]
        inChannels = weight.shape[1]
        kernelSize = (weight.shape[2], weight.shape[3])
        if let bias, bias.shape != [outChannels] {
            throw LayerError.biasShape(layer: "Conv2d", expected: [outChannels], shape: bias.shape)
        }
        guard stride >= 1, padding >= 0 else { throw LayerError.geometry(layer: "Conv2d", stride: stride, padding: padding) }
        self.stride = stride
        self.padding = padding
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        let tilesInput = stride == kernelSize.height && stride == kernelSize.width && padding == 0
        if backend == .oneDNN && !tilesInput {
            implementation = .oneDNN(OneDNNConvolution(weight: weight, bias: bias, stride: stride, padding: padding))
            return
        }
        #endif
        implementation = .patchProjection(try Linear(weight: weight.reshaped([outChannels, -1]), bias: bias, backend: backend))
    }

    /// Convolves `x` of shape `[N, inChannels, H, W]`.
    ///
    /// - Parameter channelsLast: return `[N, H', W', outChannels]` (a ViT patch embedding's tokens) instead of
    ///   `[N, outChannels, H', W']`.
    public func callAsFunction(_ x: Tensor, channelsLast: Bool = false) -> Tensor {
        precondition(x.rank == 4 && x.shape[1] == inChannels, "Conv2d(\(inChannels) -> \(outChannels)) got input \(x.shape), expected [N, \(inChannels), H, W]")
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        precondition(height + 2 * padding >= kernelSize.height && width + 2 * padding >= kernelSize.width,
                     "Conv2d kernel \(kernelSize) larger than padded input \(x.shape)")
        let outHeight = (height + 2 * padding - kernelSize.height) / stride + 1
        let outWidth = (width + 2 * padding - kernelSize.width) / stride + 1
        let shape = channelsLast ? [batch, outHeight, outWidth, outChannels] : [batch, outChannels, outHeight, outWidth]
        if Tensor.elementCount(shape) == 0 { return Tensor(zeros: shape) }
        switch implementation {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case let .oneDNN(convolution):
            return convolution(x, outHeight: outHeight, outWidth: outWidth, channelsLast: channelsLast)
        #endif
        case let .patchProjection(projection):
            let tokens = projection(convolutionPatches(x, kernelSize: kernelSize, stride: stride, padding: padding))
            return channelsLast ? tokens.reshaped(shape) : channelsFirst(tokens, batch: batch).reshaped(shape)
        }
    }

    /// `[N, C, H', W']` from `tokens [N·H'·W', C]`.
    private func channelsFirst(_ tokens: Tensor, batch: Int) -> Tensor {
        let pixels = tokens.shape[0] / batch
        let output = Tensor(uninitialized: [batch, outChannels, pixels])
        for item in 0..<batch {
            let source = tokens.storage.pointer + item * pixels * outChannels
            let destination = output.storage.pointer + item * outChannels * pixels
            for pixel in 0..<pixels {
                for channel in 0..<outChannels { destination[channel * pixels + pixel] = source[pixel * outChannels + channel] }
            }
        }
        return output
    }
}

/// The rows a convolution's matrix product reads (im2col): `[N·H'·W', C·kh·kw]` from `x [N, C, H, W]`, each row the
/// patch under one output pixel, flattened in a PyTorch weight's (channel, row, column) order, with zeros where it
/// overlaps the padding. A ViT's patch embedding is these rows times its flattened weight, and the weight's gradient
/// their product with the output's.
public func convolutionPatches(_ x: Tensor, kernelSize: (height: Int, width: Int), stride: Int, padding: Int) -> Tensor {
    precondition(x.rank == 4 && stride >= 1 && padding >= 0, "convolutionPatches needs [N, C, H, W], a positive stride, padding ≥ 0")
    let (batch, inChannels, height, width) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3])
    let (kh, kw) = kernelSize
    precondition(height + 2 * padding >= kh && width + 2 * padding >= kw, "kernel \(kernelSize) larger than padded input \(x.shape)")
    let outHeight = (height + 2 * padding - kh) / stride + 1
    let outWidth = (width + 2 * padding - kw) / stride + 1
    let patchSize = inChannels * kh * kw
    let rows = Tensor(uninitialized: [batch * outHeight * outWidth, patchSize])
    parallelFor(batch) { item in
        let (source, destination) = (x.storage.pointer, rows.storage.pointer)
        for py in 0..<outHeight {
            for px in 0..<outWidth {
                var target = destination + ((item * outHeight + py) * outWidth + px) * patchSize
                let left = px * stride - padding
                for channel in 0..<inChannels {
                    for ky in 0..<kh {
                        let y = py * stride - padding + ky
                        let row = source + ((item * inChannels + channel) * height + y) * width + left
                        if y >= 0 && y < height && left >= 0 && left + kw <= width {
                            target.initialize(from: row, count: kw)
                        } else {
                            for kx in 0..<kw {
                                let inside = y >= 0 && y < height && left + kx >= 0 && left + kx < width
                                target[kx] = inside ? row[kx] : 0
                            }
                        }
                        target += kw
                    }
                }
            }
        }
    }
    return rows
}
