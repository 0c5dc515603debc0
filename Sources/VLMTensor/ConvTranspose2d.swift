/// `nn.ConvTranspose2d` with `groups=1`, square stride, symmetric zero padding and no output padding or dilation,
/// on NCHW input: each input pixel spreads its kernel-sized, weighted patch over the output, `stride` pixels apart.
/// Safe to call from several threads.
public final class ConvTranspose2d: @unchecked Sendable {
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
        /// Every input pixel's channels times the weight viewed as `[in, out·kh·kw]` (one matmul), then each
        /// product patch added into the output where it lands.
        case portable(weight: Tensor, bias: Tensor?)
    }

    /// - Parameters:
    ///   - weight: `[in, out, kh, kw]`, as PyTorch stores a transposed convolution's weight.
    ///   - bias: `[out]`, or nil.
    /// - Throws: `LayerError` on a weight that is not 4-D, a bias that does not match it, or a stride below 1 or
    ///   negative padding.
    public convenience init(weight: Tensor, bias: Tensor?, stride: Int, padding: Int = 0) throws {
        try self.init(weight: weight, bias: bias, stride: stride, padding: padding, backend: .best)
    }

    init(weight: Tensor, bias: Tensor?, stride: Int, padding: Int, backend: Backend) throws {
        guard weight.rank == 4 else {
            throw LayerError.weightRank(layer: "ConvTranspose2d", expected: 4, shape: weight.shape)
        }
        inChannels = weight.shape[0]
        outChannels = weight.shape[1]
        kernelSize = (weight.shape[2], weight.shape[3])
        if let bias, bias.shape != [outChannels] {
            throw LayerError.biasShape(layer: "ConvTranspose2d", expected: [outChannels], shape: bias.shape)
        }
        guard stride >= 1, padding >= 0 else {
            throw LayerError.geometry(layer: "ConvTranspose2d", stride: stride, padding: padding)
        }
        self.stride = stride
        self.padding = padding
        switch backend {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case .oneDNN:
            implementation = .oneDNN(OneDNNConvolution(transposedWeight: weight, bias: bias, stride: stride, padding: padding))
        #endif
        case .portable: implementation = .portable(weight: weight, bias: bias)
        }
    }

    /// The output height and width for an input of `height`×`width`: `(in − 1)·stride − 2·padding + kernel`.
    public func outputSize(height: Int, width: Int) -> (height: Int, width: Int) {
        ((height - 1) * stride - 2 * padding + kernelSize.height, (width - 1) * stride - 2 * padding + kernelSize.width)
    }

    /// Applies the layer to `x` of shape `[N, inChannels, H, W]`, giving `[N, outChannels, H', W']`.
    public func callAsFunction(_ x: Tensor) -> Tensor {
        precondition(x.rank == 4 && x.shape[1] == inChannels,
                     "ConvTranspose2d(\(inChannels) -> \(outChannels)) got input \(x.shape), expected [N, \(inChannels), H, W]")
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        let (outHeight, outWidth) = outputSize(height: height, width: width)
        precondition(outHeight > 0 && outWidth > 0, "ConvTranspose2d padding \(padding) leaves no output for input \(x.shape)")
        let shape = [batch, outChannels, outHeight, outWidth]
        if Tensor.elementCount(shape) == 0 || height == 0 || width == 0 { return Tensor(zeros: shape) }
        switch implementation {
        #if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
        case let .oneDNN(deconvolution):
            return deconvolution(x, outHeight: outHeight, outWidth: outWidth, channelsLast: false)
        #endif
        case let .portable(weight, bias):
            return spread(x, weight: weight, bias: bias, outHeight: outHeight, outWidth: outWidth)
        }
    }

    private func spread(_ x: Tensor, weight: Tensor, bias: Tensor?, outHeight: Int, outWidth: Int) -> Tensor {
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        let (kh, kw) = kernelSize
        let pixels = height * width, patch = outChannels * kh * kw
        let output = Tensor(uninitialized: [batch, outChannels, outHeight, outWidth])
        let plane = outHeight * outWidth
        for item in 0..<batch {
            let pixelChannels = channelsLast(x, item: item)
            let products = Tensor(uninitialized: [pixels, patch])
            gemm(m: pixels, n: patch, k: inChannels, pixelChannels.storage.pointer, weight.storage.pointer,
                 transposeB: false, into: products.storage.pointer)
            let out = output.storage.pointer + item * outChannels * plane
            for channel in 0..<outChannels {
                (out + channel * plane).initialize(repeating: bias?.storage.pointer[channel] ?? 0, count: plane)
            }
            for pixel in 0..<pixels {
                let (row, column) = (pixel / width, pixel % width)
                let product = products.storage.pointer + pixel * patch
                for channel in 0..<outChannels {
                    for ky in 0..<kh {
                        let outY = row * stride - padding + ky
                        guard outY >= 0 && outY < outHeight else { continue }
                        for kx in 0..<kw {
                            let outX = column * stride - padding + kx
                            guard outX >= 0 && outX < outWidth else { continue }
                            out[channel * plane + outY * outWidth + outX] += product[(channel * kh + ky) * kw + kx]
                        }
                    }
                }
            }
        }
        return output
    }

    /// Item `item` of `x [N, C, H, W]` as `[H·W, C]`.
    private func channelsLast(_ x: Tensor, item: Int) -> Tensor {
        let pixels = x.shape[2] * x.shape[3]
        let result = Tensor(uninitialized: [pixels, inChannels])
        let source = x.storage.pointer + item * inChannels * pixels
        for channel in 0..<inChannels {
            for pixel in 0..<pixels { result.storage.pointer[pixel * inChannels + channel] = source[channel * pixels + pixel] }
        }
        return result
    }
}
