import CDNNL
import Foundation

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
    private let primitives = PrimitiveCache<Key>(capacity: 32)
    private var packedWeights: [PackedBuffer] = []
    private let packingLock = NSLock()

    private struct Key: Hashable {
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
        let output = Tensor(uninitialized: channelsLast ? [batch, outHeight, outWidth, outChannels] : [batch, outChannels, outHeight, outWidth])
        if output.count == 0 { return output }
        let primitive = primitives.primitive(for: Key(batch: batch, height: height, width: width, channelsLast: channelsLast)) {
            makePrimitive(batch: batch, height: height, width: width, outHeight: outHeight, outWidth: outWidth, channelsLast: channelsLast)
        }
        let weights = packed(as: primitive.descriptor(for: DNNL_ARG_WEIGHTS))
        var arguments: [(Int32, UnsafeMutableRawPointer)] = [
            (DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_WEIGHTS, weights.pointer), (DNNL_ARG_DST, output.rawPointer),
        ]
        if let bias { arguments.append((DNNL_ARG_BIAS, bias.rawPointer)) }
        primitive.execute(arguments)
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

    private func makePrimitive(batch: Int, height: Int, width: Int, outHeight: Int, outWidth: Int, channelsLast: Bool) -> Primitive {
        var source = memoryDescriptor([batch, inChannels, height, width])
        var weights = memoryDescriptor(weight.shape, tag: dnnl_format_tag_any)
        var bias = memoryDescriptor([outChannels])
        var destination = memoryDescriptor([batch, outChannels, outHeight, outWidth], tag: channelsLast ? dnnl_nhwc : dnnl_nchw)
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
