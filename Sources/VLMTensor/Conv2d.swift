internal import CDNNL
internal import Foundation

/// `nn.Conv2d` with `groups=1`, square stride and symmetric zero padding, on NCHW input.
///
/// The weight is kept as given and reordered into the layout oneDNN picks for the first input shape; shapes that
/// want another layout get their own reordered copy. Safe to call from several threads.
public final class Conv2d: @unchecked Sendable {
    /// Input channels.
    public let inChannels: Int
    /// Output channels.
    public let outChannels: Int
    /// Kernel height and width.
    public let kernelSize: (height: Int, width: Int)
    public let stride: Int
    public let padding: Int

    private let weight: Tensor
    private let bias: Tensor?
    /// Set when the kernel tiles the input (stride = kernel size, no padding), as in a ViT patch embedding: the
    /// convolution is then a matmul of the flattened patches with the flattened weight.
    private let patchProjection: Linear?
    private let primitives = PrimitiveCache<Key>(capacity: 32)
    private var packedWeights: [PackedBuffer] = []
    private let packingLock = NSLock()

    private enum Stage: Hashable { case convolution, reorder }

    private struct Key: Hashable {
        let stage: Stage
        let batch, height, width: Int
        let channelsLast: Bool
    }

    /// - Parameters:
    ///   - weight: `[out, in, kh, kw]`, as PyTorch stores it.
    ///   - bias: `[out]`, or nil.
    /// - Throws: `LayerError` on a weight that is not 4-D, a bias that does not match it, or a stride below 1 or
    ///   negative padding.
    public init(weight: Tensor, bias: Tensor?, stride: Int, padding: Int) throws {
        guard weight.rank == 4 else { throw LayerError.weightRank(layer: "Conv2d", expected: 4, shape: weight.shape) }
        outChannels = weight.shape[0]
        inChannels = weight.shape[1]
        kernelSize = (weight.shape[2], weight.shape[3])
        if let bias, bias.shape != [outChannels] {
            throw LayerError.biasShape(layer: "Conv2d", expected: [outChannels], shape: bias.shape)
        }
        guard stride >= 1, padding >= 0 else { throw LayerError.geometry(layer: "Conv2d", stride: stride, padding: padding) }
        self.weight = weight
        self.bias = bias
        let tilesInput = stride == kernelSize.height && stride == kernelSize.width && padding == 0
        patchProjection = tilesInput ? try Linear(weight: weight.reshaped([outChannels, -1]), bias: bias) : nil
        self.stride = stride
        self.padding = padding
    }

    /// Convolves `x` of shape `[N, inChannels, H, W]`.
    ///
    /// - Parameter channelsLast: return `[N, H', W', outChannels]` (a ViT patch embedding's tokens) instead of
    ///   `[N, outChannels, H', W']`.
    public func callAsFunction(_ x: Tensor, channelsLast: Bool = false) -> Tensor {
        precondition(x.rank == 4 && x.shape[1] == inChannels, "Conv2d(\(inChannels) -> \(outChannels)) got input \(x.shape), expected [N, \(inChannels), H, W]")
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        let outHeight = (height + 2 * padding - kernelSize.height) / stride + 1
        let outWidth = (width + 2 * padding - kernelSize.width) / stride + 1
        precondition(height + 2 * padding >= kernelSize.height && width + 2 * padding >= kernelSize.width,
                     "Conv2d kernel \(kernelSize) larger than padded input \(x.shape)")
        let shape = channelsLast ? [batch, outHeight, outWidth, outChannels] : [batch, outChannels, outHeight, outWidth]
        if Tensor.elementCount(shape) == 0 { return Tensor(zeros: shape) }
        guard let patchProjection else { return convolve(x, outHeight: outHeight, outWidth: outWidth, channelsLast: channelsLast) }
        let tokens = patchProjection(patches(x, outHeight: outHeight, outWidth: outWidth)).reshaped([batch, outHeight, outWidth, outChannels])
        if channelsLast { return tokens }
        let key = Key(stage: .reorder, batch: batch, height: outHeight, width: outWidth, channelsLast: false)
        let reorder = primitives.primitive(for: key) {
            let dims = [batch, outChannels, outHeight, outWidth]
            return Primitive(reorderFrom: memoryDescriptor(dims, tag: dnnl_nhwc), to: memoryDescriptor(dims, tag: dnnl_nchw))
        }
        let output = Tensor(uninitialized: shape)
        reorder.execute([(DNNL_ARG_FROM, tokens.rawPointer), (DNNL_ARG_TO, output.rawPointer)])
        return output
    }

    /// `[N·H'·W', C·kh·kw]`: each row one patch, flattened in the weight's (channel, row, column) order.
    private func patches(_ x: Tensor, outHeight: Int, outWidth: Int) -> Tensor {
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        let (kh, kw) = kernelSize
        let patchSize = inChannels * kh * kw
        let rows = Tensor(uninitialized: [batch * outHeight * outWidth, patchSize])
        parallelFor(batch) { item in
            let (source, destination) = (x.storage.pointer, rows.storage.pointer)
            for py in 0..<outHeight {
                for px in 0..<outWidth {
                    var target = destination + ((item * outHeight + py) * outWidth + px) * patchSize
                    for channel in 0..<inChannels {
                        for ky in 0..<kh {
                            let row = source + ((item * inChannels + channel) * height + py * stride + ky) * width + px * stride
                            target.initialize(from: row, count: kw)
                            target += kw
                        }
                    }
                }
            }
        }
        return rows
    }

    /// A direct oneDNN convolution. Its output goes to the layout oneDNN prefers, then is reordered to the one
    /// asked for: asking for NHWC output from NCHW input directly gets a reference implementation, orders of
    /// magnitude slower.
    private func convolve(_ x: Tensor, outHeight: Int, outWidth: Int, channelsLast: Bool) -> Tensor {
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        let convolution = primitives.primitive(for: Key(stage: .convolution, batch: batch, height: height, width: width, channelsLast: false)) {
            makePrimitive(batch: batch, height: height, width: width, outHeight: outHeight, outWidth: outWidth)
        }
        let weights = packed(as: convolution.descriptor(for: DNNL_ARG_WEIGHTS))
        let result = PackedBuffer(descriptor: convolution.descriptor(for: DNNL_ARG_DST))
        var arguments: [(Int32, UnsafeMutableRawPointer)] = [
            (DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_WEIGHTS, weights.pointer), (DNNL_ARG_DST, result.pointer),
        ]
        if let bias { arguments.append((DNNL_ARG_BIAS, bias.rawPointer)) }
        convolution.execute(arguments)
        let dims = [batch, outChannels, outHeight, outWidth]
        let reorder = primitives.primitive(for: Key(stage: .reorder, batch: batch, height: height, width: width, channelsLast: channelsLast)) {
            Primitive(reorderFrom: result.descriptor, to: memoryDescriptor(dims, tag: channelsLast ? dnnl_nhwc : dnnl_nchw))
        }
        let output = Tensor(uninitialized: channelsLast ? [batch, outHeight, outWidth, outChannels] : dims)
        reorder.execute([(DNNL_ARG_FROM, result.pointer), (DNNL_ARG_TO, output.rawPointer)])
        return output
    }

    private func packed(as descriptor: dnnl_memory_desc_t) -> PackedBuffer {
        packingLock.lock()
        defer { packingLock.unlock() }
        if let existing = packedWeights.first(where: { descriptorsEqual($0.descriptor, descriptor) }) { return existing }
        let buffer = PackedBuffer(descriptor: descriptor, from: weight.rawPointer, sourceDescriptor: memoryDescriptor(weight.shape))
        packedWeights.append(buffer)
        return buffer
    }

    private func makePrimitive(batch: Int, height: Int, width: Int, outHeight: Int, outWidth: Int) -> Primitive {
        var source = memoryDescriptor([batch, inChannels, height, width])
        var weights = memoryDescriptor(weight.shape, tag: dnnl_format_tag_any)
        var bias = memoryDescriptor([outChannels])
        var destination = memoryDescriptor([batch, outChannels, outHeight, outWidth], tag: dnnl_format_tag_any)
        var strides: dnnl_dims_t = (dnnl_dim_t(stride), dnnl_dim_t(stride), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var pads: dnnl_dims_t = (dnnl_dim_t(padding), dnnl_dim_t(padding), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var operation = dnnl_convolution_desc_t()
        let status = withUnsafePointer(to: &strides) { stridesPointer in
            withUnsafePointer(to: &pads) { padsPointer in
                stridesPointer.withMemoryRebound(to: dnnl_dim_t.self, capacity: 2) { s in
                    padsPointer.withMemoryRebound(to: dnnl_dim_t.self, capacity: 2) { p in
                        self.bias == nil
                            ? dnnl_convolution_forward_desc_init(&operation, dnnl_forward_inference, dnnl_convolution_direct,
                                                                 &source, &weights, nil, &destination, s, p, p)
                            : dnnl_convolution_forward_desc_init(&operation, dnnl_forward_inference, dnnl_convolution_direct,
                                                                 &source, &weights, &bias, &destination, s, p, p)
                    }
                }
            }
        }
        checkDNNL(status, "Conv2d descriptor for input [\(batch), \(inChannels), \(height), \(width)]")
        guard let primitive = Primitive("Conv2d", operation: operation) else {
            fatalError("oneDNN has no convolution for Conv2d input [\(batch), \(inChannels), \(height), \(width)]")
        }
        return primitive
    }
}
