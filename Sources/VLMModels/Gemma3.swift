import Foundation
import VLMCheckpoint
import VLMTensor

// Gemma 3's text decoder as transformers' models/gemma3/modeling_gemma3.py builds it (`Gemma3ForCausalLM`, model type
// gemma3_text): Llama's rotary grouped-query attention and gated MLP, with Gemma's own choices: token embeddings
// scaled by √hidden_size, RMS norms that multiply by (1 + weight), a norm after attention and after the MLP as well as
// before each, query and key heads normalized before the rotation, GELU (tanh) gating, attention scaled by
// query_pre_attn_scalar^-½, and sliding-window layers (five of every six by default) with a rotary base of their own.

/// transformers' `Gemma3TextConfig`, with its defaults (Gemma 3 4B's text decoder).
public struct Gemma3TextConfig: Decodable, Sendable {
    public var vocabSize: Int
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var numKeyValueHeads: Int
    public var headDim: Int
    /// `hidden_activation`: the MLP's gate activation.
    public var hiddenActivation: String
    public var maxPositionEmbeddings: Int
    public var rmsNormEps: Float
    public var tieWordEmbeddings: Bool
    /// Biases on the q, k, v and o projections.
    public var attentionBias: Bool
    /// Attention scores are scaled by `query_pre_attn_scalar^-½` rather than `head_dim^-½`.
    public var queryPreAttnScalar: Double
    /// The window of the "sliding_attention" layers: a query at index `i` sees keys `i - slidingWindow + 1 ... i`.
    public var slidingWindow: Int?
    /// Per layer, "full_attention" or "sliding_attention" (from `sliding_window_pattern` when not given: every
    /// pattern-th layer full).
    public var layerTypes: [String]
    /// Logits become `cap · tanh(logits / cap)` (Gemma 2's; nil in Gemma 3).
    public var finalLogitSoftcapping: Double?
    /// RoPE of the full-attention layers (`rope_parameters["full_attention"]`: `rope_theta` 1,000,000 by default,
    /// legacy `rope_scaling` merged in) and of the sliding ones (`rope_local_base_freq`, 10,000 by default).
    public var fullAttentionRope: RopeParameters
    public var slidingAttentionRope: RopeParameters
    public var bosTokenId: Int?
    public var padTokenId: Int?
    public var eosTokenIds: [Int]
    /// What this decoder does not compute, refused by ``validate(file:)``: Gemma 2's attention logit soft-capping
    /// and EmbeddingGemma's bidirectional attention.
    var attnLogitSoftcapping: Double?
    var useBidirectionalAttention: Bool

    public static let modelType = "gemma3_text"

    /// The window of layer `index`, nil where it attends to every earlier position.
    public func attentionWindow(layer index: Int) -> Int? {
        layerTypes[index] == "sliding_attention" ? slidingWindow : nil
    }

    /// Attention scores' scale, query_pre_attn_scalar^-½ in fp32.
    var attentionScale: Float { Float(pow(queryPreAttnScalar, -0.5)) }

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case numKeyValueHeads = "num_key_value_heads", headDim = "head_dim", hiddenActivation = "hidden_activation"
        case maxPositionEmbeddings = "max_position_embeddings", rmsNormEps = "rms_norm_eps"
        case tieWordEmbeddings = "tie_word_embeddings", attentionBias = "attention_bias"
        case queryPreAttnScalar = "query_pre_attn_scalar", slidingWindow = "sliding_window", layerTypes = "layer_types"
        case slidingWindowPattern = "sliding_window_pattern", finalLogitSoftcapping = "final_logit_softcapping"
        case attnLogitSoftcapping = "attn_logit_softcapping", useBidirectionalAttention = "use_bidirectional_attention"
        case ropeParameters = "rope_parameters", ropeScaling = "rope_scaling", ropeTheta = "rope_theta"
        case ropeLocalBaseFreq = "rope_local_base_freq"
        case bosTokenId = "bos_token_id", eosTokenId = "eos_token_id", padTokenId = "pad_token_id"
    }

    /// One rotary dict; the legacy `rope_scaling` says `type` where the new form says `rope_type`.
    private struct RopeDictionary: Decodable {
        var ropeType: String?, type: String?, ropeTheta: Double?, factor: Double?

        enum CodingKeys: String, CodingKey { case ropeType = "rope_type", type, ropeTheta = "rope_theta", factor }

        func parameters(theta: Double) -> RopeParameters {
            RopeParameters(ropeType: ropeType ?? type ?? "default", theta: ropeTheta ?? theta, factor: factor)
        }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 262_208)
        hiddenSize = try c.value(.hiddenSize, default: 2304)
        intermediateSize = try c.value(.intermediateSize, default: 9216)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 26)
        guard numHiddenLayers <= LlamaConfig.maximumLayerCount else {
            throw DecodingError.dataCorruptedError(forKey: .numHiddenLayers, in: c, debugDescription: "num_hidden_layers is \(numHiddenLayers), more than the \(LlamaConfig.maximumLayerCount) any decoder here is built with")
        }
        numAttentionHeads = try c.value(.numAttentionHeads, default: 8)
        numKeyValueHeads = try c.value(.numKeyValueHeads, default: 4)
        headDim = try c.value(.headDim, default: 256)
        hiddenActivation = try c.value(.hiddenActivation, default: "gelu_pytorch_tanh")
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 131_072)
        rmsNormEps = try c.value(.rmsNormEps, default: 1e-6)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: true)
        attentionBias = try c.value(.attentionBias, default: false)
        queryPreAttnScalar = try c.value(.queryPreAttnScalar, default: 256)
        slidingWindow = c.contains(.slidingWindow) ? try c.decodeIfPresent(Int.self, forKey: .slidingWindow) : 4096
        let pattern = try c.value(.slidingWindowPattern, default: 6)
        if let given = try c.decodeIfPresent([String].self, forKey: .layerTypes) {
            layerTypes = given
        } else {
            guard pattern > 0 else {
                throw DecodingError.dataCorruptedError(forKey: .slidingWindowPattern, in: c, debugDescription: "sliding_window_pattern is \(pattern), expected a positive count")
            }
            layerTypes = (0..<max(numHiddenLayers, 0)).map { ($0 + 1) % pattern != 0 ? "sliding_attention" : "full_attention" }
        }
        finalLogitSoftcapping = try c.decodeIfPresent(Double.self, forKey: .finalLogitSoftcapping)
        attnLogitSoftcapping = try c.decodeIfPresent(Double.self, forKey: .attnLogitSoftcapping)
        useBidirectionalAttention = try c.decodeIfPresent(Bool.self, forKey: .useBidirectionalAttention) ?? false
        // Gemma3TextConfig.convert_rope_params_to_dict: a dict per layer type; the legacy rope_scaling updates the
        // full-attention one; each takes its legacy base where it gives none.
        let nested = try c.decodeIfPresent([String: RopeDictionary].self, forKey: .ropeParameters)
        var full = nested?["full_attention"] ?? RopeDictionary()
        if let scaling = try c.decodeIfPresent(RopeDictionary.self, forKey: .ropeScaling) {
            full.ropeType = scaling.ropeType ?? scaling.type ?? full.ropeType
            full.factor = scaling.factor ?? full.factor
            full.ropeTheta = scaling.ropeTheta ?? full.ropeTheta
        }
        fullAttentionRope = full.parameters(theta: try c.value(.ropeTheta, default: 1_000_000))
        slidingAttentionRope = (nested?["sliding_attention"] ?? RopeDictionary())
            .parameters(theta: try c.value(.ropeLocalBaseFreq, default: 10_000))
        bosTokenId = c.contains(.bosTokenId) ? try c.decodeIfPresent(Int.self, forKey: .bosTokenId) : 2
        padTokenId = c.contains(.padTokenId) ? try c.decodeIfPresent(Int.self, forKey: .padTokenId) : 0
        if let list = try? c.decodeIfPresent([Int].self, forKey: .eosTokenId) {
            eosTokenIds = list
        } else {
            eosTokenIds = try c.decodeIfPresent(Int.self, forKey: .eosTokenId).map { [$0] } ?? (c.contains(.eosTokenId) ? [] : [1])
        }
    }

    /// Checks what the model needs to be built at all, so that a bad config is an error rather than a crash.
    func validate(file: String) throws {
        try validateRotaryDecoderShape(vocabSize: vocabSize, hiddenSize: hiddenSize, intermediateSize: intermediateSize,
                                       numHiddenLayers: numHiddenLayers, numAttentionHeads: numAttentionHeads,
                                       numKeyValueHeads: numKeyValueHeads, headDim: headDim, file: file)
        guard queryPreAttnScalar > 0 else {
            throw ModelError.invalidConfig("query_pre_attn_scalar is \(queryPreAttnScalar), expected a positive number", file: file)
        }
        guard layerTypes.count == numHiddenLayers else {
            throw ModelError.invalidConfig("layer_types lists \(layerTypes.count) layers, num_hidden_layers is \(numHiddenLayers)", file: file)
        }
        if let unknown = layerTypes.first(where: { $0 != "full_attention" && $0 != "sliding_attention" }) {
            throw ModelError.invalidConfig("layer_types has \"\(unknown)\" (supported: full_attention, sliding_attention)", file: file)
        }
        if let slidingWindow, slidingWindow <= 0 {
            throw ModelError.invalidConfig("sliding_window is \(slidingWindow), expected a positive count", file: file)
        }
        for rope in [fullAttentionRope, slidingAttentionRope] where !["default", "linear"].contains(rope.ropeType) {
            throw ModelError.invalidConfig("rope type \"\(rope.ropeType)\" is not supported for Gemma 3 (supported: default, linear)", file: file)
        }
        if let cap = finalLogitSoftcapping, !(cap > 0) {
            throw ModelError.invalidConfig("final_logit_softcapping is \(cap), expected a positive number", file: file)
        }
        if attnLogitSoftcapping != nil {
            throw ModelError.invalidConfig("attn_logit_softcapping is set; soft-capped attention scores are not supported", file: file)
        }
        if useBidirectionalAttention {
            throw ModelError.invalidConfig("use_bidirectional_attention is true (EmbeddingGemma); only causal Gemma 3 decoders are supported", file: file)
        }
    }
}

final class Gemma3DecoderLayer: @unchecked Sendable {
    /// The four norms' `1 + weight`, what Gemma's RMS norm multiplies by.
    let inputNorm: Tensor, postAttentionNorm: Tensor, preFeedforwardNorm: Tensor, postFeedforwardNorm: Tensor
    /// q_proj, k_proj, v_proj.
    let queryKeyValue: StackedProjections
    /// q_norm's and k_norm's `1 + weight`, each `[headDim]`.
    let queryNorm: Tensor, keyNorm: Tensor
    let output: Linear
    /// gate_proj, up_proj.
    let gateUp: StackedProjections
    let down: Linear

    init(config c: Gemma3TextConfig, tensor: (String, [Int]) throws -> Tensor, matrix: (String, [Int]) throws -> WeightMatrix,
         prefix: String) throws {
        func norm(_ name: String, _ size: Int) throws -> Tensor { gemmaNormWeight(try tensor("\(prefix).\(name).weight", [size])) }
        func weight(_ name: String, _ outFeatures: Int, _ inFeatures: Int) throws -> WeightMatrix {
            try matrix("\(prefix).\(name).weight", [outFeatures, inFeatures])
        }
        func bias(_ name: String, _ outFeatures: Int, _ present: Bool) throws -> Tensor? {
            present ? try tensor("\(prefix).\(name).bias", [outFeatures]) : nil
        }
        let queryWidth = c.numAttentionHeads * c.headDim, keyWidth = c.numKeyValueHeads * c.headDim
        inputNorm = try norm("input_layernorm", c.hiddenSize)
        postAttentionNorm = try norm("post_attention_layernorm", c.hiddenSize)
        preFeedforwardNorm = try norm("pre_feedforward_layernorm", c.hiddenSize)
        postFeedforwardNorm = try norm("post_feedforward_layernorm", c.hiddenSize)
        let attention = [("q_proj", queryWidth), ("k_proj", keyWidth), ("v_proj", keyWidth)]
        queryKeyValue = try StackedProjections(
            weights: attention.map { try weight("self_attn.\($0.0)", $0.1, c.hiddenSize) },
            biases: attention.map { try bias("self_attn.\($0.0)", $0.1, c.attentionBias) })
        queryNorm = try norm("self_attn.q_norm", c.headDim)
        keyNorm = try norm("self_attn.k_norm", c.headDim)
        output = try Linear(weight: weight("self_attn.o_proj", c.hiddenSize, queryWidth),
                            bias: bias("self_attn.o_proj", c.hiddenSize, c.attentionBias))
        gateUp = try StackedProjections(
            weights: ["gate_proj", "up_proj"].map { try weight("mlp.\($0)", c.intermediateSize, c.hiddenSize) }, biases: [nil, nil])
        down = try Linear(weight: weight("mlp.down_proj", c.hiddenSize, c.intermediateSize), bias: nil)
    }
}

/// Gemma's RMS norm multiplies the normalized input by `1 + weight` (in fp32): that factor, once.
func gemmaNormWeight(_ weight: Tensor) -> Tensor {
    Tensor(shape: weight.shape, scalars: weight.scalars.map { 1 + $0 })
}

/// Gemma 3's text decoder (transformers' `Gemma3ForCausalLM`) from a Hugging Face checkpoint directory (in fp32) or a
/// llama.cpp GGUF file (quantized matrices stay quantized).
///
/// Inputs are batches of equal-length rows, left-padded, with transformers' `attention_mask` and `position_ids`, as
/// for ``LlamaForCausalLM``.
public final class Gemma3ForCausalLM: CausalLanguageModel, @unchecked Sendable {
    public let config: Gemma3TextConfig
    let embedTokens: WeightMatrix
    let layers: [Gemma3DecoderLayer]
    let norm: Tensor
    let lmHead: Linear
    let activation: Activation
    /// √hidden_size in fp32, the factor token embeddings are scaled by.
    let embeddingScale: Float
    let fullAttentionFrequencies: [Float], slidingAttentionFrequencies: [Float]
    /// Decoding steps of one sequence in one parallel region, where every product is quantized and packed.
    let fusedStep: FusedDecoderStep?

    /// Builds the model from `config` and a source of weights by Hugging Face name, each of the given shape: `matrix`
    /// gives the embedding table and the projections (quantized ones stay quantized); without it they are `tensor`'s.
    init(config: Gemma3TextConfig, file: String, tensor: (String, [Int]) throws -> Tensor,
         matrix matrixSource: ((String, [Int]) throws -> WeightMatrix)? = nil) throws {
        func matrix(_ name: String, _ shape: [Int]) throws -> WeightMatrix {
            try matrixSource?(name, shape) ?? .dense(tensor(name, shape))
        }
        try config.validate(file: file)
        self.config = config
        activation = try Activation(huggingFaceName: config.hiddenActivation, file: file)
        fullAttentionFrequencies = try config.fullAttentionRope.inverseFrequencies(
            headDim: config.headDim, maxPositionEmbeddings: config.maxPositionEmbeddings, file: file)
        slidingAttentionFrequencies = try config.slidingAttentionRope.inverseFrequencies(
            headDim: config.headDim, maxPositionEmbeddings: config.maxPositionEmbeddings, file: file)
        embeddingScale = Float(Double(config.hiddenSize).squareRoot())
        let table = try matrix("model.embed_tokens.weight", [config.vocabSize, config.hiddenSize])
        lmHead = try Linear(weight: config.tieWordEmbeddings ? table : matrix("lm_head.weight", [config.vocabSize, config.hiddenSize]),
                            bias: nil)
        if case let .dense(fp32) = table { embedTokens = .embeddingTable(fp32) } else { embedTokens = table }
        layers = try (0..<config.numHiddenLayers).map {
            try Gemma3DecoderLayer(config: config, tensor: tensor, matrix: matrix, prefix: "model.layers.\($0)")
        }
        norm = gemmaNormWeight(try tensor("model.norm.weight", [config.hiddenSize]))
        fusedStep = activation == .geluTanh ? FusedDecoderStep(
            layers: layers.enumerated().map { index, layer in
                .init(inputNorm: layer.inputNorm, postAttentionNorm: layer.preFeedforwardNorm,
                      attention: layer.queryKeyValue.linears, queryNorm: layer.queryNorm, keyNorm: layer.keyNorm,
                      localRotary: config.layerTypes[index] == "sliding_attention",
                      attentionOutputNorm: layer.postAttentionNorm, mlpOutputNorm: layer.postFeedforwardNorm,
                      geluGate: true, window: config.attentionWindow(layer: index), output: layer.output,
                      gateUp: layer.gateUp.linears, down: layer.down)
            },
            finalNorm: norm, head: lmHead, hiddenSize: config.hiddenSize, heads: config.numAttentionHeads,
            keyHeads: config.numKeyValueHeads, headDim: config.headDim, intermediateSize: config.intermediateSize,
            eps: config.rmsNormEps, scale: config.attentionScale) : nil
    }

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `gemma3_text`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = try directory.configPath(checkingModelType: Gemma3TextConfig.modelType)
        let weights = try WeightStore(directory: directory.url)
        try self.init(config: directory.decode(Gemma3TextConfig.self), file: configPath) { try weights.tensor($0, shape: $1) }
    }

    public var vocabularySize: Int { config.vocabSize }
    public var contextLength: Int? { config.maxPositionEmbeddings }

    public func makeCache(batch: Int, capacity: Int) throws -> KVCache {
        try makeBoundedCache(batch: batch, capacity: capacity, layers: layers.count,
                             width: config.numKeyValueHeads * config.headDim, heads: config.numKeyValueHeads,
                             elementType: cacheElementType)
    }

    /// What `makeCache` holds keys and values in: ``KVCache/ElementType/forNewModels`` where the model was built.
    public let cacheElementType = KVCache.ElementType.forNewModels

    /// The scaled token embeddings of `ids` (`[B][T]`, equal lengths), `[B, T, hiddenSize]`: what
    /// `Gemma3TextScaledWordEmbedding` returns, and so what a VLM's image features are spliced into.
    public func embed(_ ids: [[Int]]) throws -> Tensor {
        let rows = try tokenEmbeddings(ids, table: embedTokens)
        scale(rows, inPlaceBy: embeddingScale)
        return rows
    }

    public func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        try logits(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache,
                   lastPositionOnly: lastPositionOnly, fusing: true)
    }

    /// `fusing` false keeps decoding steps on the layer-by-layer path (tests compare the two).
    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool, fusing: Bool) throws -> Tensor {
        let pass = try DecoderPass(inputsEmbeds: inputsEmbeds, width: config.hiddenSize, attentionMask: attentionMask,
                                   cache: cache, layers: layers.count, cacheWidth: config.numKeyValueHeads * config.headDim)
        let logits: Tensor
        if fusing, let step = fusedStep, let cache, pass.keyPaddingMask == nil, pass.batch == 1, pass.length == 1,
           cache.heads == config.numKeyValueHeads {
            let position = try pass.positions(positionIds, below: 1 << 24)[0][0]
            logits = runFusedStep(step, cache: cache, position: position) {
                $0.initialize(from: inputsEmbeds.storage.pointer, count: config.hiddenSize)
            }
        } else {
            var hidden = try hiddenStates(inputsEmbeds: inputsEmbeds, pass: pass, positionIds: positionIds, cache: cache,
                                          blocks: attentionBlocks(attentionMask))
            if lastPositionOnly, pass.length > 1 {
                hidden = gatherTokens(hidden, positions: Array(repeating: pass.length - 1, count: pass.batch))
                    .reshaped([pass.batch, 1, config.hiddenSize])
            }
            logits = lmHead(hidden)
        }
        return softCapped(logits)
    }

    /// See ``CausalLanguageModel/logits(nextToken:cache:)``: the fused step, its scaled embedding row and rotary rows
    /// written into the cache's workspace, where the inputs fit it; else the general path, which names what does not.
    public func logits(nextToken token: Int, cache: KVCache) throws -> Tensor {
        guard let step = fusedStep, token >= 0, token < config.vocabSize,
              cache.takesOneStep(layers: layers.count, heads: config.numKeyValueHeads,
                                 width: config.numKeyValueHeads * config.headDim) else {
            return try logits(inputIds: [[token]], cache: cache)
        }
        return softCapped(runFusedStep(step, cache: cache, position: cache.length) { row in
            embedTokens.copyRow(token, into: row)
            for index in 0..<config.hiddenSize { row[index] *= embeddingScale }
        })
    }

    /// One fused step over `cache` for the embedding `embed` writes, its queries and keys rotated to `position`.
    private func runFusedStep(_ step: FusedDecoderStep, cache: KVCache, position: Int,
                              embed: (UnsafeMutablePointer<Float>) -> Void) -> Tensor {
        cache.runFusedStep(step, head: { lmHead($0) }) { workspace in
            embed(workspace.hidden.storage.pointer)
            rotaryRow(position: position, inverseFrequencies: fullAttentionFrequencies, cosines: workspace.cos,
                      sines: workspace.sin)
            rotaryRow(position: position, inverseFrequencies: slidingAttentionFrequencies, cosines: workspace.localCos,
                      sines: workspace.localSin)
        }
    }

    /// `logits` through Gemma 2's soft cap where the config sets one, as transformers computes it: divide, tanh,
    /// multiply (in place).
    private func softCapped(_ logits: Tensor) -> Tensor {
        guard let cap = config.finalLogitSoftcapping.map(Float.init) else { return logits }
        let pointer = logits.storage.pointer
        for index in 0..<logits.count { pointer[index] = tanh(pointer[index] / cap) * cap }
        return logits
    }

    /// The final normalized hidden states `[B, T, hiddenSize]` (transformers' `last_hidden_state`).
    public func hiddenStates(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                             cache: KVCache? = nil) throws -> Tensor {
        let pass = try DecoderPass(inputsEmbeds: inputsEmbeds, width: config.hiddenSize, attentionMask: attentionMask,
                                   cache: cache, layers: layers.count, cacheWidth: config.numKeyValueHeads * config.headDim)
        return try hiddenStates(inputsEmbeds: inputsEmbeds, pass: pass, positionIds: positionIds, cache: cache,
                                blocks: attentionBlocks(attentionMask))
    }

    private func hiddenStates(inputsEmbeds: Tensor, pass: DecoderPass, positionIds: [[Int]]?, cache: KVCache?,
                              blocks: [Range<Int>]) throws -> Tensor {
        let positions = try pass.positions(positionIds, below: 1 << 24).flatMap { $0 }
        if pass.length == 0 { return inputsEmbeds }
        let tables = (full: rotaryTables(positions: positions, inverseFrequencies: fullAttentionFrequencies),
                      sliding: rotaryTables(positions: positions, inverseFrequencies: slidingAttentionFrequencies))
        var hidden = inputsEmbeds
        for (index, layer) in layers.enumerated() {
            let rotary = config.layerTypes[index] == "sliding_attention" ? tables.sliding : tables.full
            hidden = decoderLayer(layer, index: index, hidden: hidden, rotary: rotary, pass: pass, cache: cache, blocks: blocks)
        }
        cache?.advance(by: pass.length)
        return rmsNorm(hidden, weight: norm, eps: config.rmsNormEps)
    }

    private func decoderLayer(_ layer: Gemma3DecoderLayer, index: Int, hidden: Tensor, rotary: (cos: Tensor, sin: Tensor),
                              pass: DecoderPass, cache: KVCache?, blocks: [Range<Int>]) -> Tensor {
        let (heads, keyHeads, eps) = (config.numAttentionHeads, config.numKeyValueHeads, config.rmsNormEps)
        func prepared(_ x: Tensor, norm: Tensor, heads: Int) -> Tensor {
            applyRotaryEmbedding(headRMSNorm(x, weight: norm, eps: eps), heads: heads, cos: rotary.cos, sin: rotary.sin)
        }
        let projected = layer.queryKeyValue(rmsNorm(hidden, weight: layer.inputNorm, eps: eps))
        let attended = causalSelfAttention(
            query: prepared(projected[0], norm: layer.queryNorm, heads: heads),
            key: prepared(projected[1], norm: layer.keyNorm, heads: keyHeads), value: projected[2], heads: heads,
            keyHeads: keyHeads, layer: index, cache: cache, keyLength: pass.past + pass.length,
            window: config.attentionWindow(layer: index), keyPaddingMask: pass.keyPaddingMask, scale: config.attentionScale,
            blocks: blocks)
        let afterAttention = add(hidden, rmsNorm(layer.output(attended), weight: layer.postAttentionNorm, eps: eps))
        let gated = layer.gateUp.gated(rmsNorm(afterAttention, weight: layer.preFeedforwardNorm, eps: eps), activation: activation)
        return add(afterAttention, rmsNorm(layer.down(gated), weight: layer.postFeedforwardNorm, eps: eps))
    }
}

// Gemma 3 from llama.cpp GGUF files (general.architecture "gemma3"). The weights as transformers' GGUF loader reads
// them (integrations/ggml.py, modeling_gguf_pytorch_utils.py's Gemma2TensorProcessor): llama.cpp's converter stores
// every norm weight plus one (what Gemma's RMS norm multiplies by), and the loader takes the one off again. The config
// as llama.cpp reads it (src/models/gemma3.cpp), which gives back the source checkpoint's where transformers' table
// drops keys: the full layers' linear RoPE scaling (Gemma 3 4B-27B's factor 8), the sliding layers' own base, the
// layer pattern, and the attention scale.

extension Gemma3TextConfig {
    /// The config of a file's `gemma3.*` metadata, read as llama.cpp reads it: `rope.scaling.type`/`factor` scale the
    /// full-attention layers' positions, `rope.freq_base_swa` (10,000 when absent) is the sliding layers' base,
    /// `attention.sliding_window_pattern` (a count or one flag per layer; every sixth layer full when absent) places
    /// the sliding layers, and without `attention.sliding_window` every layer is full. Attention scores are scaled by
    /// `key_length^-½`, by `(embedding_length / head_count)^-½` for 27B's 62 layers (Gemma 3 27B's
    /// query_pre_attn_scalar 168); transformers' GGUF loader takes 256 for every file and drops the RoPE scaling and
    /// base, which gives the same model only for files without them. Gemma3TextConfig's defaults elsewhere; tied
    /// embeddings when the file has no `output.weight`, the vocabulary from `vocab_size` or the token list;
    /// `final_logit_softcapping` when the file has it.
    public init(gguf file: GGUFFile) throws {
        let path = file.url.path
        func invalid(_ reason: String) -> CheckpointError { .invalidGGUF(file: path, tensor: nil, reason: reason) }
        guard file.metadata["general.architecture"]?.string == "gemma3" else {
            throw invalid("general.architecture is not \"gemma3\"")
        }
        func integer(_ key: String) throws -> Int? {
            guard let value = file.metadata["gemma3.\(key)"] else { return nil }
            guard let integer = value.integer, integer >= 0 else { throw invalid("gemma3.\(key) is \(value), expected a count") }
            return integer
        }
        func required(_ key: String) throws -> Int {
            guard let value = try integer(key) else { throw invalid("gemma3.\(key) is missing") }
            return value
        }
        func number(_ key: String) throws -> Double? {
            guard let value = file.metadata["gemma3.\(key)"] else { return nil }
            guard let number = value.number, number.isFinite else { throw invalid("gemma3.\(key) is \(value), expected a number") }
            return number
        }
        let (hidden, layers, heads) = (try required("embedding_length"), try required("block_count"), try required("attention.head_count"))
        let headDim = try integer("attention.key_length") ?? (heads > 0 ? hidden / heads : 0)
        var json: [String: Any] = [
            "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "intermediate_size": try required("feed_forward_length"), "head_dim": headDim,
            "query_pre_attn_scalar": layers == 62 && heads > 0 ? hidden / heads : headDim,
            "tie_word_embeddings": file.info("output.weight") == nil,
        ]
        let optional = ["context_length": "max_position_embeddings", "attention.head_count_kv": "num_key_value_heads"]
        for (key, name) in optional { if let value = try integer(key) { json[name] = value } }
        if let window = try integer("attention.sliding_window"), window > 0 {
            json["sliding_window"] = window
            switch file.metadata["gemma3.attention.sliding_window_pattern"] {
            case nil: break
            case let value?:
                if let pattern = value.integer, pattern > 0 {
                    json["sliding_window_pattern"] = pattern
                } else if let flags = value.array?.compactMap({ if case let .bool(flag) = $0 { flag } else { nil } }),
                          flags.count == value.array?.count, flags.count == layers {
                    json["layer_types"] = flags.map { $0 ? "sliding_attention" : "full_attention" }
                } else {
                    throw invalid("gemma3.attention.sliding_window_pattern is \(value), expected a positive count or \(layers) flags")
                }
            }
        } else {
            json["sliding_window"] = NSNull()
            json["layer_types"] = Array(repeating: "full_attention", count: layers)
        }
        if let size = try integer("vocab_size") {
            json["vocab_size"] = size
        } else if let tokens = file.metadata["tokenizer.ggml.tokens"]?.array {
            json["vocab_size"] = tokens.count
        } else {
            throw invalid("neither gemma3.vocab_size nor tokenizer.ggml.tokens gives the vocabulary size")
        }
        if let eps = try number("attention.layer_norm_rms_epsilon") { json["rms_norm_eps"] = eps }
        if let theta = try number("rope.freq_base") { json["rope_theta"] = theta }
        json["rope_local_base_freq"] = try number("rope.freq_base_swa") ?? 10_000
        if let scaling = file.metadata["gemma3.rope.scaling.type"], scaling.string != "none" {
            guard let type = scaling.string else { throw invalid("gemma3.rope.scaling.type is \(scaling), expected a name") }
            json["rope_scaling"] = ["rope_type": type, "factor": try number("rope.scaling.factor") ?? 1]
        }
        if let cap = try number("final_logit_softcapping") { json["final_logit_softcapping"] = cap }
        if let bos = file.metadata["tokenizer.ggml.bos_token_id"]?.integer { json["bos_token_id"] = bos }
        if let eos = file.metadata["tokenizer.ggml.eos_token_id"]?.integer { json["eos_token_id"] = eos }
        if let pad = file.metadata["tokenizer.ggml.padding_token_id"]?.integer { json["pad_token_id"] = pad }
        self = try JSONDecoder().decode(Gemma3TextConfig.self, from: JSONSerialization.data(withJSONObject: json))
    }
}

extension Gemma3ForCausalLM {
    /// Loads a llama.cpp GGUF file whose `general.architecture` is `gemma3` (the text decoder; a multimodal file's
    /// vision tower is its separate mmproj file).
    public convenience init(gguf file: GGUFFile) throws {
        let path = file.url.path
        let config = try Gemma3TextConfig(gguf: file)
        try self.init(config: config, file: path, tensor: { name, shape in
            let tensor = try file.tensor(Self.ggufName(for: name, file: path), shape: shape)
            guard name.hasSuffix("norm.weight") else { return tensor }
            return Tensor(shape: tensor.shape, scalars: tensor.scalars.map { $0 - 1 })
        }, matrix: { name, shape in
            try file.matrix(Self.ggufName(for: name, file: path), shape: shape)
        })
    }

    static func ggufName(for name: String, file: String) throws -> String {
        let fixed = ["model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"]
        if let mapped = fixed[name] { return mapped }
        let modules = ["input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                       "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
                       "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                       "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                       "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"]
        let parts = name.split(separator: ".", maxSplits: 3).map(String.init)
        if parts.count == 4, parts[0] == "model", parts[1] == "layers", let rest = parts.last {
            let module = rest.split(separator: ".").dropLast().joined(separator: ".")
            let kind = rest.split(separator: ".").last.map(String.init) ?? ""
            if let mapped = modules[module] { return "blk.\(parts[2]).\(mapped).\(kind)" }
        }
        throw CheckpointError.missingTensor(file: file, tensor: name)
    }
}
