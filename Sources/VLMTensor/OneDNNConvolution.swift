#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL
internal import Foundation

/// `Conv2d` as a direct oneDNN convolution, or `ConvTranspose2d` as a oneDNN deconvolution. The weight is kept as
/// given and reordered into the layout oneDNN picks for the first input shape; shapes that want another layout get
/// their own reordered copy.
final class OneDNNConvolution: @unchecked Sendable {
    private let weight: Tensor
    private let bias: Tensor?
    private let stride: Int
    private let padding: Int
    /// A deconvolution, whose PyTorch weight is `[in, out, kh, kw]`.
    private let transposed: Bool
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
        transposed = false
    }

    /// `weight [in, out, kh, kw]` and `bias [out]`, already checked by `ConvTranspose2d`.
    init(transposedWeight weight: Tensor, bias: Tensor?, stride: Int, padding: Int) {
        self.weight = weight
        self.bias = bias
        self.stride = stride
        self.padding = padding
        transposed = true
    }

    /// (out, in) channels.
    private var channels: (out: Int, in: Int) {
        transposed ? (weight.shape[1], weight.shape[0]) : (weight.shape[0], weight.shape[1])
    }

    /// The weight as oneDNN reads it, `[out, in, kh, kw]`: a deconvolution's PyTorch layout, in and out swapped,
    /// described by strides rather than copied.
    private var weightDescriptor: dnnl_memory_desc_t {
        guard transposed else { return memoryDescriptor(weight.shape) }
        let (outChannels, _) = channels
        let (kh, kw) = (weight.shape[2], weight.shape[3])
        return memoryDescriptor([outChannels, weight.shape[0], kh, kw], strides: [kh * kw, outChannels * kh * kw, kw, 1])
    }

    /// Convolves the non-empty `x [N, C, H, W]`. Its output goes to the layout oneDNN prefers, then is reordered to
    /// the one asked for: asking for NHWC output from NCHW input directly gets a reference implementation, orders of
    /// magnitude slower.
    func callAsFunction(_ x: Tensor, outHeight: Int, outWidth: Int, channelsLast: Bool) -> Tensor {
        let (batch, height, width) = (x.shape[0], x.shape[2], x.shape[3])
        let outChannels = channels.out
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
        let buffer = PackedBuffer(descriptor: descriptor, from: weight.rawPointer, sourceDescriptor: weightDescriptor)
        packedWeights.append(buffer)
        return buffer
    }

    private func makePrimitive(batch: Int, height: Int, width: Int, outHeight: Int, outWidth: Int) -> Primitive {
        let (outChannels, inChannels) = channels
        let name = transposed ? "ConvTranspose2d" : "Conv2d"
        var source = memoryDescriptor([batch, inChannels, height, width])
        var weights = memoryDescriptor([outChannels, inChannels, weight.shape[2], weight.shape[3]], tag: dnnl_format_tag_any)
        var bias = memoryDescriptor([outChannels])
        var destination = memoryDescriptor([batch, outChannels, outHeight, outWidth], tag: dnnl_format_tag_any)
        var strides: dnnl_dims_t = (dnnl_dim_t(stride), dnnl_dim_t(stride), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var pads: dnnl_dims_t = (dnnl_dim_t(padding), dnnl_dim_t(padding), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        let input = "input [\(batch), \(inChannels), \(height), \(width)]"
        let primitive = withUnsafePointer(to: &strides) { stridesPointer in
            withUnsafePointer(to: &pads) { padsPointer in
                withUnsafePointer(to: &bias) { biasPointer in
                    stridesPointer.withMemoryRebound(to: dnnl_dim_t.self, capacity: 2) { s in
                        padsPointer.withMemoryRebound(to: dnnl_dim_t.self, capacity: 2) { p in
                            let biasDescriptor = self.bias == nil ? nil : biasPointer
                            if transposed {
                                var operation = dnnl_deconvolution_desc_t()
                                checkDNNL(dnnl_deconvolution_forward_desc_init(
                                    &operation, dnnl_forward_inference, dnnl_deconvolution_direct, &source, &weights,
                                    biasDescriptor, &destination, s, p, p), "\(name) descriptor for \(input)")
                                return Primitive(name, operation: operation)
                            }
                            var operation = dnnl_convolution_desc_t()
                            checkDNNL(dnnl_convolution_forward_desc_init(
                                &operation, dnnl_forward_inference, dnnl_convolution_direct, &source, &weights,
                                biasDescriptor, &destination, s, p, p), "\(name) descriptor for \(input)")
                            return Primitive(name, operation: operation)
                        }
                    }
                }
            }
        }
        guard let primitive else { fatalError("oneDNN has no implementation of \(name) for \(input)") }
        return primitive
    }
}

#endif
