internal import CVLMKernels

/// One decoding step (one new token of one sequence) of a pre-norm decoder with RMSNorm, rotary grouped-query
/// attention over a head-major KV cache and a SiLU-gated MLP (Llama, Mistral, Qwen2; Qwen3 with its query and key
/// heads normalized; SmolLM3 with layers that do not rotate; Gemma 3 with its output norms, GELU gating and local
/// rotary tables) whose products are all
/// GGUF-quantized, run as one parallel region in which the threads meet at barriers between stages
/// (vlm_decoder_step in vlm_kernels.h). It computes what the layer-by-layer path computes, bit for bit, without a
/// region per product and the serial work between them.
package final class FusedDecoderStep: @unchecked Sendable {
    /// A decoder layer's weights.
    package struct Layer {
        package let inputNorm: Tensor, postAttentionNorm: Tensor
        /// q, k and v, or fewer layers stacking them, in that order.
        package let attention: [Linear]
        /// The RMS norm weights of each query and key head (Qwen3's q_norm and k_norm), `[headDim]`, or nil.
        package let queryNorm: Tensor?, keyNorm: Tensor?
        /// Whether queries and keys are rotated by position (not in SmolLM3's NoPE layers).
        package let rotatesPositions: Bool
        /// Whether they rotate by the step's local table (Gemma 3's sliding layers).
        package let localRotary: Bool
        /// Gemma's norms of the attention's and the MLP's outputs, `[hiddenSize]`, or nil.
        package let attentionOutputNorm: Tensor?, mlpOutputNorm: Tensor?
        /// GELU (tanh) gating instead of SiLU.
        package let geluGate: Bool
        /// The positions a query sees, itself included, where it sees only the latest (sliding-window layers); nil:
        /// all of them. One step's windowed layers share one window.
        package let window: Int?
        package let output: Linear
        /// gate and up, or one layer stacking them.
        package let gateUp: [Linear]
        package let down: Linear

        /// `postAttentionNorm` is the norm before the MLP (Llama's post_attention_layernorm, Gemma's
        /// pre_feedforward_layernorm).
        package init(inputNorm: Tensor, postAttentionNorm: Tensor, attention: [Linear], queryNorm: Tensor? = nil,
                     keyNorm: Tensor? = nil, rotatesPositions: Bool = true, localRotary: Bool = false,
                     attentionOutputNorm: Tensor? = nil, mlpOutputNorm: Tensor? = nil, geluGate: Bool = false,
                     window: Int? = nil, output: Linear, gateUp: [Linear], down: Linear) {
            (self.inputNorm, self.postAttentionNorm, self.attention, self.output, self.gateUp, self.down) =
                (inputNorm, postAttentionNorm, attention, output, gateUp, down)
            (self.queryNorm, self.keyNorm, self.rotatesPositions) = (queryNorm, keyNorm, rotatesPositions)
            (self.localRotary, self.attentionOutputNorm, self.mlpOutputNorm, self.geluGate, self.window) =
                (localRotary, attentionOutputNorm, mlpOutputNorm, geluGate, window)
        }
    }

    /// Whether this machine runs fused steps: the packed quantized products, on the OpenMP threads oneDNN uses.
    package static let isSupported = vlm_quant_packed_supported() != 0 && vlm_parallel_team_available() != 0
        && KernelPath.best == .vector

    private let hiddenSize: Int, heads: Int, keyHeads: Int, headDim: Int, intermediateSize: Int
    /// The head's output width, or nil where the step ends with the final norm (the head is not packed).
    package let vocabularySize: Int?
    private let eps: Float
    /// Attention scores' scale (1/√headDim, or Gemma's query_pre_attn_scalar^-½).
    private let scale: Float
    /// The windowed layers' window.
    private let window: Int?
    /// Whether the products run in int8 (the layers were built in it) rather than on the fixed point.
    package let int8: Bool
    private let descriptors: [vlm_decoder_layer]
    private let head: vlm_decoder_product?
    /// What the descriptors point into.
    private let layers: [Layer], finalNorm: Tensor, headLayer: Linear

    /// Nil unless every product of `layers` decodes on the packed quantized products here and has the widths the
    /// geometry gives. A `head` that does not is left to the caller, after the step's final norm.
    package init?(layers: [Layer], finalNorm: Tensor, head: Linear, hiddenSize: Int, heads: Int, keyHeads: Int,
                  headDim: Int, intermediateSize: Int, eps: Float, scale: Float? = nil) {
        let width = heads * headDim, keyWidth = keyHeads * headDim
        let windows = Set(layers.compactMap(\.window))
        guard Self.isSupported, !layers.isEmpty, heads > 0, keyHeads > 0, heads % keyHeads == 0, headDim % 2 == 0,
              finalNorm.shape == [hiddenSize], windows.count <= 1, windows.allSatisfy({ $0 > 0 }) else { return nil }
        /// The layers' products placed one after another in their stage's output, if they have the expected widths.
        func products(_ linears: [Linear], inFeatures: Int, outFeatures: Int) -> [vlm_decoder_product]? {
            var offset = 0
            var products: [vlm_decoder_product] = []
            for linear in linears {
                guard var product = linear.decoderProduct, linear.inFeatures == inFeatures else { return nil }
                product.offset = offset
                offset += linear.outFeatures
                products.append(product)
            }
            return offset == outFeatures ? products : nil
        }
        var descriptors: [vlm_decoder_layer] = []
        for layer in layers {
            guard layer.inputNorm.shape == [hiddenSize], layer.postAttentionNorm.shape == [hiddenSize],
                  (layer.queryNorm == nil) == (layer.keyNorm == nil),
                  [layer.queryNorm, layer.keyNorm].allSatisfy({ $0 == nil || $0!.shape == [headDim] }),
                  [layer.attentionOutputNorm, layer.mlpOutputNorm].allSatisfy({ $0 == nil || $0!.shape == [hiddenSize] }),
                  (1...3).contains(layer.attention.count), (1...2).contains(layer.gateUp.count),
                  let attention = products(layer.attention, inFeatures: hiddenSize, outFeatures: width + 2 * keyWidth),
                  let output = products([layer.output], inFeatures: width, outFeatures: hiddenSize),
                  let gateUp = products(layer.gateUp, inFeatures: hiddenSize, outFeatures: 2 * intermediateSize),
                  let down = products([layer.down], inFeatures: intermediateSize, outFeatures: hiddenSize),
                  layer.gateUp.count == 1 || layer.gateUp[0].outFeatures == intermediateSize else { return nil }
            var descriptor = vlm_decoder_layer()
            descriptor.input_norm = UnsafePointer(layer.inputNorm.storage.pointer)
            descriptor.post_attention_norm = UnsafePointer(layer.postAttentionNorm.storage.pointer)
            Self.place(attention, in: &descriptor.attention)
            descriptor.attention_products = attention.count
            descriptor.query_norm = layer.queryNorm.map { UnsafePointer($0.storage.pointer) }
            descriptor.key_norm = layer.keyNorm.map { UnsafePointer($0.storage.pointer) }
            descriptor.unrotated = layer.rotatesPositions ? 0 : 1
            descriptor.local_rotary = layer.localRotary ? 1 : 0
            descriptor.attention_output_norm = layer.attentionOutputNorm.map { UnsafePointer($0.storage.pointer) }
            descriptor.mlp_output_norm = layer.mlpOutputNorm.map { UnsafePointer($0.storage.pointer) }
            descriptor.gelu_gate = layer.geluGate ? 1 : 0
            descriptor.windowed = layer.window == nil ? 0 : 1
            descriptor.output = output[0]
            Self.place(gateUp, in: &descriptor.gate_up)
            descriptor.gate_up_products = gateUp.count
            descriptor.down = down[0]
            descriptors.append(descriptor)
        }
        // One activation row serves every product of a stage, so all of them multiply in one precision.
        let precisions = Set((layers.flatMap { $0.attention + [$0.output] + $0.gateUp + [$0.down] }).map(\.precision))
        guard precisions.count == 1 else { return nil }
        int8 = precisions.first == .int8
        self.head = head.precision == precisions.first
            ? products([head], inFeatures: hiddenSize, outFeatures: head.outFeatures)?[0] : nil
        vocabularySize = self.head == nil ? nil : head.outFeatures
        (self.hiddenSize, self.heads, self.keyHeads, self.headDim, self.intermediateSize, self.eps) =
            (hiddenSize, heads, keyHeads, headDim, intermediateSize, eps)
        self.scale = scale ?? 1 / Float(headDim).squareRoot()
        window = windows.first
        self.descriptors = descriptors
        (self.layers, self.finalNorm, headLayer) = (layers, finalNorm, head)
    }

    /// Writes `products` to the first slots of a descriptor's fixed-size C array (a tuple in Swift).
    private static func place<Slots>(_ products: [vlm_decoder_product], in slots: inout Slots) {
        withUnsafeMutableBytes(of: &slots) { bytes in
            precondition(products.count * MemoryLayout<vlm_decoder_product>.stride <= bytes.count)
            for (index, product) in products.enumerated() {
                bytes.storeBytes(of: product, toByteOffset: index * MemoryLayout<vlm_decoder_product>.stride,
                                 as: vlm_decoder_product.self)
            }
        }
    }

    /// What the steps over one cache reuse, so that a step allocates nothing: the addresses of the cache's keys and
    /// values, the step's scratch, the row the step runs on (the caller writes the token's embedding into `hidden`),
    /// the rotary rows of its position (`cos` and `sin`, `localCos` and `localSin` for layers with a local table;
    /// `headDim / 2` floats each) and two logits rows handed out in turn, each written again only once no caller
    /// holds it.
    package final class Workspace {
        /// Weak: a cache that outlives its model does not keep the model's weights.
        fileprivate weak var step: FusedDecoderStep?
        /// What the addresses point into.
        fileprivate let cache: [KeysAndValues]
        fileprivate let capacity: Int
        fileprivate let keys: [UnsafeMutablePointer<Float>?], values: [UnsafeMutablePointer<Float>?]
        fileprivate let halfKeys: [UnsafeMutablePointer<UInt16>?], halfValues: [UnsafeMutablePointer<UInt16>?]
        fileprivate var scratch: Tensor
        package let hidden: Tensor
        package let cos: UnsafeMutablePointer<Float>, sin: UnsafeMutablePointer<Float>
        package let localCos: UnsafeMutablePointer<Float>, localSin: UnsafeMutablePointer<Float>
        private let rotary: Tensor
        private var logits: (TensorStorage, TensorStorage)?
        private let logitsShape: [Int]

        fileprivate init(step: FusedDecoderStep, cache: [KeysAndValues], capacity: Int) {
            self.step = step
            (self.cache, self.capacity) = (cache, capacity)
            var keys: [UnsafeMutablePointer<Float>?] = [], values: [UnsafeMutablePointer<Float>?] = []
            var halfKeys: [UnsafeMutablePointer<UInt16>?] = [], halfValues: [UnsafeMutablePointer<UInt16>?] = []
            for layer in cache {
                switch layer {
                case let .floats(key, value):
                    keys.append(key.storage.pointer)
                    values.append(value.storage.pointer)
                case let .halves(key, value):
                    halfKeys.append(key.pointer)
                    halfValues.append(value.pointer)
                }
            }
            (self.keys, self.values, self.halfKeys, self.halfValues) = (keys, values, halfKeys, halfValues)
            scratch = Tensor(uninitialized: [0])
            hidden = Tensor(uninitialized: [1, 1, step.hiddenSize])
            let half = step.headDim / 2
            rotary = Tensor(uninitialized: [4, half])
            (cos, sin) = (rotary.storage.pointer, rotary.storage.pointer + half)
            (localCos, localSin) = (rotary.storage.pointer + 2 * half, rotary.storage.pointer + 3 * half)
            logitsShape = [1, 1, step.vocabularySize ?? 0]
            if let vocabularySize = step.vocabularySize {
                logits = (TensorStorage(count: vocabularySize), TensorStorage(count: vocabularySize))
            }
        }

        /// Whether this workspace is `step`'s.
        package func serves(_ step: FusedDecoderStep) -> Bool { self.step === step }

        /// A logits row no caller holds: one of the two, or a new one in place of the first where callers hold both.
        fileprivate func freeLogits() -> Tensor? {
            guard var (first, second) = logits else { return nil }
            logits = nil
            defer { logits = (first, second) }
            if isKnownUniquelyReferenced(&first) { return Tensor(shape: logitsShape, storage: first) }
            if isKnownUniquelyReferenced(&second) {
                swap(&first, &second)
                return Tensor(shape: logitsShape, storage: first)
            }
            first = TensorStorage(count: first.count)
            return Tensor(shape: logitsShape, storage: first)
        }

        /// The scratch for `step`, grown where its attention has more parts than before.
        fileprivate func scratch(floats: Int) -> Tensor {
            if scratch.count < floats { scratch = Tensor(uninitialized: [floats]) }
            return scratch
        }
    }

    /// A workspace for steps over `cache` (each layer `[keyHeads·capacity, headDim]`, head-major, all layers floats
    /// or all halves).
    package func makeWorkspace(cache: [KeysAndValues], capacity: Int) -> Workspace {
        precondition(cache.count == descriptors.count
                     && cache.allSatisfy { $0.shapesMatch && Tensor.elementCount($0.keyShape) >= keyHeads * capacity * headDim },
                     "a fused decoding step's workspace got a cache that does not fit it")
        return Workspace(step: self, cache: cache, capacity: capacity)
    }

    /// Runs the step for the token whose embedding is in `workspace.hidden`, at cache position `position`, whose
    /// rotary rows are in the workspace: stores its key and value in each layer of the workspace's cache and attends
    /// to positions `0 ... position`.
    /// Returns the logits `[1, 1, vocabularySize]` (one of the workspace's rows), or without a head the final norm's
    /// output `[1, 1, hiddenSize]` (a copy: the workspace's row is the next step's).
    package func callAsFunction(_ workspace: Workspace, position: Int) -> Tensor {
        precondition(workspace.serves(self) && position >= 0 && position < workspace.capacity,
                     "a fused decoding step at position \(position) of \(workspace.capacity) got another step's workspace")
        let logits = workspace.freeLogits()
        var step = vlm_decoder_step()
        step.layer_count = descriptors.count
        (step.hidden_size, step.heads, step.key_heads, step.head_dim, step.intermediate_size) =
            (hiddenSize, heads, keyHeads, headDim, intermediateSize)
        step.eps = eps
        step.scale = scale
        step.int8 = int8 ? 1 : 0
        step.final_norm = UnsafePointer(finalNorm.storage.pointer)
        step.head = head ?? vlm_decoder_product()
        step.capacity = workspace.capacity
        step.position = position
        step.parts = decodingAttentionParts(keyLength: position + 1, units: keyHeads)
        if let window {
            step.window = window
            step.window_parts = decodingAttentionParts(keyLength: window, units: keyHeads)
        }
        step.cos = UnsafePointer(workspace.cos)
        step.sin = UnsafePointer(workspace.sin)
        step.local_cos = UnsafePointer(workspace.localCos)
        step.local_sin = UnsafePointer(workspace.localSin)
        step.hidden = workspace.hidden.storage.pointer
        step.logits = logits?.storage.pointer
        let scratch = workspace.scratch(floats: vlm_decoder_step_scratch_floats(&step))
        step.scratch = scratch.storage.pointer
        let status = descriptors.withUnsafeBufferPointer { layers in
            workspace.keys.withUnsafeBufferPointer { keys in
                workspace.values.withUnsafeBufferPointer { values in
                    workspace.halfKeys.withUnsafeBufferPointer { halfKeys in
                        workspace.halfValues.withUnsafeBufferPointer { halfValues in
                            step.layers = layers.baseAddress
                            (step.keys, step.values) = (keys.baseAddress, values.baseAddress)
                            if !halfKeys.isEmpty { (step.half_keys, step.half_values) = (halfKeys.baseAddress, halfValues.baseAddress) }
                            return vlm_decoder_step_run(&step, KernelPath.vectorISA)
                        }
                    }
                }
            }
        }
        precondition(status == 0, "out of memory for a decoding step's scratch")
        withExtendedLifetime((workspace, scratch, self)) {}
        if let logits { return logits }
        let output = Tensor(uninitialized: [1, 1, hiddenSize])
        output.storage.pointer.initialize(from: workspace.hidden.storage.pointer, count: hiddenSize)
        return output
    }
}
