#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL
internal import Foundation

/// `Conv2d` as a direct oneDNN convolution. The weight is kept as given and reordered into the layout oneDNN picks
/// for the first input shape; shapes that want another layout get their own reordered copy.
final class OneDNNConvolution: @unchecked Sendable {
    private let weight: Tensor
    private let bias: Tensor?
    private let stride: Int
    private let padding: Int
    private let primitives = PrimitiveCache<Key>(capacity: 32)
    private var packedWeights: [PackedBuffer] = []
    private let packingLock = NSLock()

    private enum Stage: Hashable { case convolution, reorder }

    private struct Key: Hashable {
        let stage: Stage
        let batch, height, width: Int
        let channelsLast: Bool
    }

    /// `weight [out, in, kh, kw]` and `bias [out]`, already checked by `Conv2d`.
    init(weight: Tensor, bias: Tensor?, stride: Int, padding: Int) {
        self.weight = weight
        self.bias = bias
        self.stride = stride
        self.padding = padding
    }

    /// Convolves the non-empty `x [N, C, H, W]`. Its output goes to the layout oneDNN prefers, then is reordered to
    /// the one asked for: asking for NHWC output from NCHW input directly gets a reference implementation, orders of
    /// magnitude slower.
    func callAsFunction(_ x: Tensor, outHeight: Int, outWidth: Int, channelsLast: Bool) -> Tensor {
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        let outChannels = weight.shape[0]
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
        let (outChannels, inChannels) = (weight.shape[0], weight.shape[1])
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

#endif
