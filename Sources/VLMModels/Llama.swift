import Foundation
import VLMCheckpoint
import VLMTensor

// The Llama decoder as transformers' models/llama/modeling_llama.py builds it: RMSNorm, rotary position embeddings,
// grouped-query attention and a SwiGLU MLP, pre-norm residual blocks. Llama 2/3 and SmolLM2 checkpoints are this;
// Mistral (modeling_mistral.py), Qwen2 (modeling_qwen2.py), Qwen3 (modeling_qwen3.py) and SmolLM3
// (modeling_smollm3.py) are the same network with their own biases, defaults and sliding-window attention; Qwen3
// also RMS-normalizes each query and key head before the rotation, and SmolLM3 leaves positions unrotated in some
// layers (NoPE: every fourth by default).

/// transformers' RoPE parameters (`rope_parameters`, or the legacy `rope_theta` + `rope_scaling`), for the types
/// this decoder computes: "default", "linear", "llama3" and "dynamic".
public struct RopeParameters: Sendable, Equatable {
    public var ropeType: String
    public var theta: Double
    /// "linear", "llama3" and "dynamic": how much longer the context is than in pretraining.
    public var factor: Double?
    /// "llama3" only.
    public var lowFrequencyFactor: Double?
    public var highFrequencyFactor: Double?
    public var originalMaxPositionEmbeddings: Int?

    public static let supportedTypes = ["default", "linear", "llama3", "dynamic"]

    public init(ropeType: String = "default", theta: Double = 10000, factor: Double? = nil, lowFrequencyFactor: Double? = nil,
                highFrequencyFactor: Double? = nil, originalMaxPositionEmbeddings: Int? = nil) {
        self.ropeType = ropeType
        self.theta = theta
        self.factor = factor
        self.lowFrequencyFactor = lowFrequencyFactor
        self.highFrequencyFactor = highFrequencyFactor
        self.originalMaxPositionEmbeddings = originalMaxPositionEmbeddings
    }

    /// The inverse frequencies of the `headDim/2` rotated pairs, in fp32 as modeling_rope_utils.py computes them.
    /// For "dynamic" these are the frequencies of sequences up to `maxPositionEmbeddings`; longer ones use
    /// ``dynamicInverseFrequencies(headDim:sequenceLength:maxPositionEmbeddings:)``.
    func inverseFrequencies(headDim: Int, maxPositionEmbeddings: Int, file: String) throws -> [Float] {
        let standard = Self.frequencies(base: Float(theta), headDim: headDim)
        switch ropeType {
        case "default":
            return standard
        case "dynamic":
            _ = try required(factor, "factor", file: file)
            return dynamicInverseFrequencies(headDim: headDim, sequenceLength: maxPositionEmbeddings,
                                             maxPositionEmbeddings: maxPositionEmbeddings)
        case "linear":
            let factor = Float(try required(factor, "factor", file: file))
            return standard.map { $0 / factor }
        case "llama3":
            let factor = Float(try required(factor, "factor", file: file))
            let low = Float(try required(lowFrequencyFactor, "low_freq_factor", file: file))
            let high = Float(try required(highFrequencyFactor, "high_freq_factor", file: file))
            let context = Float(try required(originalMaxPositionEmbeddings, "original_max_position_embeddings", file: file))
            let lowWavelength = context / low, highWavelength = context / high
            return standard.map { frequency in
                let wavelength = 2 * Float.pi / frequency
                let scaled = wavelength > lowWavelength ? frequency / factor : frequency
                guard wavelength >= highWavelength, wavelength <= lowWavelength else { return scaled }
                let smooth = (context / wavelength - low) / (high - low)
                return (1 - smooth) * scaled / factor + smooth * scaled
            }
        default:
            throw ModelError.invalidConfig(
                "rope type \"\(ropeType)\" is not supported (supported: \(Self.supportedTypes.joined(separator: ", ")))", file: file)
        }
    }

    /// "dynamic" (NTK-aware) scaling for a pass whose largest position is `sequenceLength - 1`: the base grows with
    /// the sequence beyond `maxPositionEmbeddings` (`_compute_dynamic_ntk_parameters`, in fp32 as its tensor path).
    ///
    /// transformers recomputes these in every forward from that pass's `max(position_ids) + 1` and keeps the
    /// largest seen; cached keys keep the rotation they were stored with. Within one generation positions only
    /// grow, so computing them per pass, as here, gives the same numbers without state in the model.
    func dynamicInverseFrequencies(headDim: Int, sequenceLength: Int, maxPositionEmbeddings: Int) -> [Float] {
        let factor = Float(factor ?? 1)
        let length = Float(max(sequenceLength, maxPositionEmbeddings)), context = Float(maxPositionEmbeddings)
        let growth = pow(factor * length / context - (factor - 1), Float(Double(headDim) / Double(headDim - 2)))
        return Self.frequencies(base: Float(theta) * growth, headDim: headDim)
    }

    private static func frequencies(base: Float, headDim: Int) -> [Float] {
        stride(from: 0, to: headDim, by: 2).map { 1 / pow(base, Float($0) / Float(headDim)) }
    }

    private func required<T>(_ value: T?, _ key: String, file: String) throws -> T {
        guard let value else { throw ModelError.invalidConfig("rope type \"\(ropeType)\" needs \(key)", file: file) }
        return value
    }
}

/// transformers' `LlamaConfig`, `MistralConfig`, `Qwen2Config`, `Qwen3Config` or `SmolLM3Config` (by `model_type`),
/// with that class's defaults.
public struct LlamaConfig: Decodable, Sendable {
    /// The most layers a config may declare (published decoders have at most a few hundred).
    static let maximumLayerCount = 1 << 16

    /// The `model_type`s this config and ``LlamaForCausalLM`` read.
    public static let supportedModelTypes = ["llama", "mistral", "qwen2", "qwen3", "smollm3"]

    /// "llama", "mistral", "qwen2", "qwen3" or "smollm3".
    public var modelType = "llama"
    public var vocabSize: Int
    public var hiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var numKeyValueHeads: Int
    public var headDim: Int
    public var hiddenAct: String
    public var maxPositionEmbeddings: Int
    public var rmsNormEps: Float
    public var tieWordEmbeddings: Bool
    /// Biases on the q, k and v projections (Llama's, Qwen3's and SmolLM3's `attention_bias`, always on for Qwen2,
    /// off for Mistral); the o projection has one only in those three with `attention_bias`.
    public var attentionBias: Bool
    /// Biases on the gate, up and down projections.
    public var mlpBias: Bool
    public var rope: RopeParameters
    public var bosTokenId: Int?
    /// `pad_token_id`: the token embedding's `padding_idx`, the one row training never updates.
    public var padTokenId: Int?
    /// `eos_token_id`, which checkpoints give as one id or a list.
    public var eosTokenIds: [Int]
    /// Mistral's `sliding_window`, or Qwen2's and Qwen3's with `use_sliding_window`: a query at sequence index `i` attends to
    /// keys `i - slidingWindow + 1 ... i` only (indices count padding, as transformers' masks do). Nil: full causal.
    public var slidingWindow: Int? = nil
    /// Qwen2's and Qwen3's per-layer `layer_types` ("full_attention" or "sliding_attention"); empty means every layer slides
    /// when ``slidingWindow`` is set.
    public var layerTypes: [String] = []
    /// SmolLM3's `no_rope_layers`: per layer, whether its queries and keys are rotated by position (1) or not (0, a
    /// NoPE layer). Empty: every layer rotates.
    public var ropeLayers: [Bool] = []

    /// Whether layer `index` rotates its queries and keys by position.
    public func rotatesPositions(layer index: Int) -> Bool { ropeLayers.isEmpty || ropeLayers[index] }

    /// Whether `o_proj` has a bias: Llama's, Qwen3's and SmolLM3's `attention_bias` cover it, Qwen2's q/k/v biases
    /// do not.
    public var outputProjectionBias: Bool { modelType != "qwen2" && attentionBias }

    /// Whether each query and key head is RMS-normalized (`self_attn.q_norm`, `self_attn.k_norm`, over `head_dim`)
    /// before the rotation: Qwen3's.
    public var normalizesQueryKeyHeads: Bool { modelType == "qwen3" }

    /// The rotary embedding's inverse frequencies for sequences up to `maxPositionEmbeddings`, as the model's
    /// forward pass takes them; an incomplete `rope_parameters` is an error naming `file`.
    public func rotaryInverseFrequencies(file: String) throws -> [Float] {
        try rope.inverseFrequencies(headDim: headDim, maxPositionEmbeddings: maxPositionEmbeddings, file: file)
    }

    /// The rotary tables of `positions` from ``rotaryInverseFrequencies(file:)``, "dynamic" scaling's frequencies
    /// recomputed for a pass reaching past `maxPositionEmbeddings`.
    public func rotaryTables(positions: [Int], inverseFrequencies: [Float]) -> (cos: Tensor, sin: Tensor) {
        VLMTensor.rotaryTables(positions: positions,
                               inverseFrequencies: rotaryFrequencies(reaching: positions.max() ?? 0, inverseFrequencies))
    }

    /// The inverse frequencies of a pass whose largest position is `largest`: `inverseFrequencies`, or "dynamic"
    /// scaling's recomputed past `maxPositionEmbeddings`.
    func rotaryFrequencies(reaching largest: Int, _ inverseFrequencies: [Float]) -> [Float] {
        guard rope.ropeType == "dynamic" && largest >= maxPositionEmbeddings else { return inverseFrequencies }
        return rope.dynamicInverseFrequencies(headDim: headDim, sequenceLength: largest + 1, maxPositionEmbeddings: maxPositionEmbeddings)
    }

    /// The sliding window of layer `index`, nil where it attends to every earlier position.
    public func attentionWindow(layer index: Int) -> Int? {
        guard let slidingWindow else { return nil }
        return layerTypes.isEmpty || layerTypes[index] == "sliding_attention" ? slidingWindow : nil
    }

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case numKeyValueHeads = "num_key_value_heads", headDim = "head_dim", hiddenAct = "hidden_act"
        case maxPositionEmbeddings = "max_position_embeddings", rmsNormEps = "rms_norm_eps"
        case tieWordEmbeddings = "tie_word_embeddings", attentionBias = "attention_bias", mlpBias = "mlp_bias"
        case ropeParameters = "rope_parameters", ropeScaling = "rope_scaling", ropeTheta = "rope_theta"
        case bosTokenId = "bos_token_id", eosTokenId = "eos_token_id", padTokenId = "pad_token_id"
        case modelType = "model_type", slidingWindow = "sliding_window", useSlidingWindow = "use_sliding_window"
        case maxWindowLayers = "max_window_layers", layerTypes = "layer_types"
        case noRopeLayers = "no_rope_layers", noRopeLayerInterval = "no_rope_layer_interval"
    }

    /// The defaults in which the three config classes differ.
    private struct Defaults {
        var vocabSize = 32000, intermediateSize = 11008, numKeyValueHeads: Int?, maxPositionEmbeddings = 2048
        var bosTokenId: Int? = 1, eosTokenIds = [2], slidingWindow: Int?, headDim: Int?
        var hiddenSize = 4096, numHiddenLayers = 32, numAttentionHeads = 32, tieWordEmbeddings = false
        var padTokenId: Int? = nil
    }

    /// One `rope_parameters` / `rope_scaling` dict; the legacy form says `type` where the new one says `rope_type`.
    private struct RopeDictionary: Decodable {
        var ropeType: String?, type: String?, ropeTheta: Double?, factor: Double?
        var lowFreqFactor: Double?, highFreqFactor: Double?, originalMaxPositionEmbeddings: Int?

        enum CodingKeys: String, CodingKey {
            case ropeType = "rope_type", type, ropeTheta = "rope_theta", factor
            case lowFreqFactor = "low_freq_factor", highFreqFactor = "high_freq_factor"
            case originalMaxPositionEmbeddings = "original_max_position_embeddings"
        }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        modelType = try c.value(.modelType, default: "llama")
        let defaults = switch modelType {
        case "mistral": Defaults(intermediateSize: 14336, numKeyValueHeads: 8, maxPositionEmbeddings: 4096 * 32, slidingWindow: 4096)
        case "qwen2": Defaults(vocabSize: 151936, intermediateSize: 22016, numKeyValueHeads: 32, maxPositionEmbeddings: 32768,
                               bosTokenId: nil, eosTokenIds: [], slidingWindow: 4096)
        // Qwen3Config has a head_dim of its own rather than hidden_size / num_attention_heads.
        case "qwen3": Defaults(vocabSize: 151936, intermediateSize: 22016, numKeyValueHeads: 32, maxPositionEmbeddings: 32768,
                               bosTokenId: nil, eosTokenIds: [], slidingWindow: 4096, headDim: 128)
        case "smollm3": Defaults(vocabSize: 128256, intermediateSize: 11008, numKeyValueHeads: 4, maxPositionEmbeddings: 32768,
                                 bosTokenId: 128000, eosTokenIds: [128001], slidingWindow: nil, hiddenSize: 2048,
                                 numHiddenLayers: 36, numAttentionHeads: 16, tieWordEmbeddings: true, padTokenId: 128004)
        default: Defaults()
        }
        vocabSize = try c.value(.vocabSize, default: defaults.vocabSize)
        hiddenSize = try c.value(.hiddenSize, default: defaults.hiddenSize)
        intermediateSize = try c.value(.intermediateSize, default: defaults.intermediateSize)
        numHiddenLayers = try c.value(.numHiddenLayers, default: defaults.numHiddenLayers)
        // Per-layer tables are built from the count below: a corrupt count must not become a huge allocation.
        guard numHiddenLayers <= Self.maximumLayerCount else {
            throw DecodingError.dataCorruptedError(forKey: .numHiddenLayers, in: c, debugDescription: "num_hidden_layers is \(numHiddenLayers), more than the \(Self.maximumLayerCount) any decoder here is built with")
        }
        numAttentionHeads = try c.value(.numAttentionHeads, default: defaults.numAttentionHeads)
        numKeyValueHeads = try c.value(.numKeyValueHeads, default: defaults.numKeyValueHeads ?? numAttentionHeads)
        headDim = try c.value(.headDim, default: defaults.headDim ?? (numAttentionHeads > 0 ? hiddenSize / numAttentionHeads : 0))
        hiddenAct = try c.value(.hiddenAct, default: "silu")
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: defaults.maxPositionEmbeddings)
        rmsNormEps = try c.value(.rmsNormEps, default: 1e-6)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: defaults.tieWordEmbeddings)
        // Mistral and Qwen2 hard-code their projections' biases and ignore these keys; Qwen3 reads attention_bias.
        attentionBias = try modelType == "qwen2"
            || (["llama", "qwen3", "smollm3"].contains(modelType) && c.value(.attentionBias, default: false))
        mlpBias = try (modelType == "llama" || modelType == "smollm3") && c.value(.mlpBias, default: false)
        bosTokenId = c.contains(.bosTokenId) ? try c.decodeIfPresent(Int.self, forKey: .bosTokenId) : defaults.bosTokenId
        padTokenId = c.contains(.padTokenId) ? try c.decodeIfPresent(Int.self, forKey: .padTokenId) : defaults.padTokenId
        if let list = try? c.decodeIfPresent([Int].self, forKey: .eosTokenId) {
            eosTokenIds = list
        } else {
            eosTokenIds = try c.decodeIfPresent(Int.self, forKey: .eosTokenId).map { [$0] }
                ?? (c.contains(.eosTokenId) ? [] : defaults.eosTokenIds)
        }
        // A present `null` turns the window off; an absent key takes the class default.
        let window = c.contains(.slidingWindow) ? try c.decodeIfPresent(Int.self, forKey: .slidingWindow) : defaults.slidingWindow
        switch modelType {
        case "mistral":
            slidingWindow = window
        case "qwen2", "qwen3":
            // Qwen2Config.__post_init__ (and Qwen3Config's): the window only with use_sliding_window, on layers from max_window_layers on.
            let sliding = try c.value(.useSlidingWindow, default: false) ? window : nil
            let firstSlidingLayer = try c.value(.maxWindowLayers, default: 28)
            slidingWindow = sliding
            layerTypes = try c.decodeIfPresent([String].self, forKey: .layerTypes) ?? (0..<max(numHiddenLayers, 0)).map {
                sliding != nil && $0 >= firstSlidingLayer ? "sliding_attention" : "full_attention"
            }
        case "smollm3":
            // SmolLM3Config.__post_init__: every no_rope_layer_interval-th layer leaves positions unrotated, and with
            // use_sliding_window those layers (only) slide.
            let interval = try c.value(.noRopeLayerInterval, default: 4)
            let given = try c.decodeIfPresent([Int].self, forKey: .noRopeLayers)
            if given == nil && interval <= 0 {
                throw DecodingError.dataCorruptedError(forKey: .noRopeLayerInterval, in: c, debugDescription: "no_rope_layer_interval is \(interval), expected a positive count")
            }
            ropeLayers = try given.map { try $0.map { value in
                guard value == 0 || value == 1 else {
                    throw DecodingError.dataCorruptedError(forKey: .noRopeLayers, in: c, debugDescription: "no_rope_layers holds \(value), expected 0 or 1")
                }
                return value == 1
            } } ?? (0..<max(numHiddenLayers, 0)).map { ($0 + 1) % interval != 0 }
            let sliding = try c.value(.useSlidingWindow, default: false) ? window : nil
            slidingWindow = sliding
            layerTypes = try c.decodeIfPresent([String].self, forKey: .layerTypes) ?? ropeLayers.map {
                sliding != nil && !$0 ? "sliding_attention" : "full_attention"
            }
        default:
            break
        }
        // Priority as convert_rope_params_to_dict: the dict (rope_scaling wins over rope_parameters), then a
        // top-level rope_theta, then 10000.
        let dictionary = try c.decodeIfPresent(RopeDictionary.self, forKey: .ropeScaling)
            ?? c.decodeIfPresent(RopeDictionary.self, forKey: .ropeParameters)
        let theta = try dictionary?.ropeTheta ?? c.value(.ropeTheta, default: 10000.0)
        let ropeType = dictionary?.ropeType ?? dictionary?.type ?? "default"
        rope = RopeParameters(
            ropeType: ropeType, theta: theta, factor: dictionary?.factor, lowFrequencyFactor: dictionary?.lowFreqFactor,
            highFrequencyFactor: dictionary?.highFreqFactor,
            originalMaxPositionEmbeddings: dictionary?.originalMaxPositionEmbeddings
                ?? (ropeType == "llama3" ? maxPositionEmbeddings : nil))
    }

    /// Checks what the model needs to be built at all, so that a bad config is an error rather than a crash.
    func validate(file: String) throws {
        try validateRotaryDecoderShape(vocabSize: vocabSize, hiddenSize: hiddenSize, intermediateSize: intermediateSize,
                                       numHiddenLayers: numHiddenLayers, numAttentionHeads: numAttentionHeads,
                                       numKeyValueHeads: numKeyValueHeads, headDim: headDim, file: file)
        guard rope.ropeType != "dynamic" || headDim > 2 else {
            throw ModelError.invalidConfig("dynamic RoPE needs head_dim above 2, got \(headDim)", file: file)
        }
        guard Self.supportedModelTypes.contains(modelType) else {
            throw ModelError.unsupportedModelType(modelType, supported: Self.supportedModelTypes, file: file)
        }
        if let slidingWindow, slidingWindow <= 0 {
            throw ModelError.invalidConfig("sliding_window is \(slidingWindow), expected a positive count", file: file)
        }
        guard ropeLayers.isEmpty || ropeLayers.count == numHiddenLayers else {
            throw ModelError.invalidConfig("no_rope_layers lists \(ropeLayers.count) layers, num_hidden_layers is \(numHiddenLayers)", file: file)
        }
        if !layerTypes.isEmpty {
            guard layerTypes.count == numHiddenLayers else {
                throw ModelError.invalidConfig("layer_types lists \(layerTypes.count) layers, num_hidden_layers is \(numHiddenLayers)", file: file)
            }
            if let unknown = layerTypes.first(where: { $0 != "full_attention" && $0 != "sliding_attention" }) {
                throw ModelError.invalidConfig("layer_types has \"\(unknown)\" (supported: full_attention, sliding_attention)", file: file)
            }
        }
    }
}

final class LlamaDecoderLayer: @unchecked Sendable {
    let inputNorm: Tensor, postAttentionNorm: Tensor
    /// q_proj, k_proj, v_proj.
    let queryKeyValue: StackedProjections
    /// Qwen3's q_norm and k_norm, each `[headDim]`.
    let queryNorm: Tensor?, keyNorm: Tensor?
    let output: Linear
    /// gate_proj, up_proj.
    let gateUp: StackedProjections
    let down: Linear

    init(config c: LlamaConfig, tensor: (String, [Int]) throws -> Tensor, matrix: (String, [Int]) throws -> WeightMatrix,
         prefix: String) throws {
        func weight(_ name: String, _ outFeatures: Int, _ inFeatures: Int) throws -> WeightMatrix {
            try matrix("\(prefix).\(name).weight", [outFeatures, inFeatures])
        }
        func bias(_ name: String, _ outFeatures: Int, _ present: Bool) throws -> Tensor? {
            present ? try tensor("\(prefix).\(name).bias", [outFeatures]) : nil
        }
        let queryWidth = c.numAttentionHeads * c.headDim, keyWidth = c.numKeyValueHeads * c.headDim
        inputNorm = try tensor("\(prefix).input_layernorm.weight", [c.hiddenSize])
        postAttentionNorm = try tensor("\(prefix).post_attention_layernorm.weight", [c.hiddenSize])
        let attention = [("q_proj", queryWidth), ("k_proj", keyWidth), ("v_proj", keyWidth)]
        (queryNorm, keyNorm) = c.normalizesQueryKeyHeads
            ? (try tensor("\(prefix).self_attn.q_norm.weight", [c.headDim]), try tensor("\(prefix).self_attn.k_norm.weight", [c.headDim]))
            : (nil, nil)
        queryKeyValue = try StackedProjections(
            weights: attention.map { try weight("self_attn.\($0.0)", $0.1, c.hiddenSize) },
            biases: attention.map { try bias("self_attn.\($0.0)", $0.1, c.attentionBias) })
        output = try Linear(weight: weight("self_attn.o_proj", c.hiddenSize, queryWidth),
                            bias: bias("self_attn.o_proj", c.hiddenSize, c.outputProjectionBias))
        gateUp = try StackedProjections(
            weights: ["gate_proj", "up_proj"].map { try weight("mlp.\($0)", c.intermediateSize, c.hiddenSize) },
            biases: ["gate_proj", "up_proj"].map { try bias("mlp.\($0)", c.intermediateSize, c.mlpBias) })
        down = try Linear(weight: weight("mlp.down_proj", c.hiddenSize, c.intermediateSize),
                          bias: bias("mlp.down_proj", c.hiddenSize, c.mlpBias))
    }
}

/// A Llama-family causal language model (transformers' `LlamaForCausalLM`, and `MistralForCausalLM`,
/// `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `SmolLM3ForCausalLM`), from a Hugging Face checkpoint directory or a llama.cpp GGUF file.
///
/// Inputs are batches of equal-length rows, left-padded, with transformers' `attention_mask` (1 for tokens, 0 for
/// padding) and `position_ids`. With a ``KVCache`` a pass sees the cached positions as well as its own, so a
/// prompt is prefilled in one pass and each new token costs one more.
public final class LlamaForCausalLM: CausalLanguageModel, @unchecked Sendable {
    public let config: LlamaConfig
    let embedTokens: WeightMatrix
    let layers: [LlamaDecoderLayer]
    let norm: Tensor
    let lmHead: Linear
    let activation: Activation
    let inverseFrequencies: [Float]
    /// Decoding steps of one sequence in one parallel region, where every product is quantized and packed.
    let fusedStep: FusedDecoderStep?

    /// Builds the model from `config` and a source of weights by Hugging Face name (`model.layers.0.…`,
    /// `lm_head.weight`), each of which must have the given shape. `matrix` gives the embedding table and the
    /// projection weights (quantized ones stay quantized); without it they are `tensor`'s fp32 tensors.
    init(config: LlamaConfig, file: String, tensor: (String, [Int]) throws -> Tensor,
         matrix matrixSource: ((String, [Int]) throws -> WeightMatrix)? = nil) throws {
        func matrix(_ name: String, _ shape: [Int]) throws -> WeightMatrix {
            try matrixSource?(name, shape) ?? .dense(tensor(name, shape))
        }
        try config.validate(file: file)
        self.config = config
        activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        inverseFrequencies = try config.rotaryInverseFrequencies(file: file)
        // The head first, so that a bf16 table does not live beside its fp32 original while the layers load.
        (embedTokens, lmHead) = try {
            let table = try matrix("model.embed_tokens.weight", [config.vocabSize, config.hiddenSize])
            let head = try Linear(weight: config.tieWordEmbeddings ? table
                                      : matrix("lm_head.weight", [config.vocabSize, config.hiddenSize]), bias: nil)
            guard case let .dense(fp32) = table else { return (table, head) }
            return (.embeddingTable(fp32), head)
        }()
        layers = try (0..<config.numHiddenLayers).map {
            try LlamaDecoderLayer(config: config, tensor: tensor, matrix: matrix, prefix: "model.layers.\($0)")
        }
        norm = try tensor("model.norm.weight", [config.hiddenSize])
        fusedStep = activation == .silu ? FusedDecoderStep(
            layers: layers.enumerated().map { index, layer in
                .init(inputNorm: layer.inputNorm, postAttentionNorm: layer.postAttentionNorm,
                      attention: layer.queryKeyValue.linears, queryNorm: layer.queryNorm, keyNorm: layer.keyNorm,
                      rotatesPositions: config.rotatesPositions(layer: index), window: config.attentionWindow(layer: index),
                      output: layer.output, gateUp: layer.gateUp.linears, down: layer.down)
            },
            finalNorm: norm, head: lmHead, hiddenSize: config.hiddenSize, heads: config.numAttentionHeads,
            keyHeads: config.numKeyValueHeads, headDim: config.headDim, intermediateSize: config.intermediateSize,
            eps: config.rmsNormEps) : nil
    }

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `llama`,
    /// `mistral`, `qwen2`, `qwen3` or `smollm3`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard LlamaConfig.supportedModelTypes.contains(type) else {
            throw ModelError.unsupportedModelType(type, supported: LlamaConfig.supportedModelTypes, file: configPath)
        }
        let weights = try WeightStore(directory: directory.url)
        try self.init(config: directory.decode(LlamaConfig.self), file: configPath) { try weights.tensor($0, shape: $1) }
    }

    public func makeCache(batch: Int, capacity: Int) throws -> KVCache {
        try makeBoundedCache(batch: batch, capacity: capacity, layers: layers.count,
                             width: config.numKeyValueHeads * config.headDim, heads: config.numKeyValueHeads,
                             elementType: cacheElementType)
    }

    /// What `makeCache` holds keys and values in: ``KVCache/ElementType/forNewModels`` where the model was built.
    public let cacheElementType = KVCache.ElementType.forNewModels

    /// 16 GiB: more than this machine class has, so a larger request is a mistake, not a workload.
    static let maximumCacheBytes = 16 << 30

    /// Rows of the embedding table for `ids` (`[B][T]`, equal lengths): `[B, T, hiddenSize]`.
    public func embed(_ ids: [[Int]]) throws -> Tensor {
        let length = try Self.rowLength(ids, "input ids")
        for row in ids {
            if let bad = row.first(where: { $0 < 0 || $0 >= config.vocabSize }) {
                throw ModelError.invalidInput("token id \(bad) is outside the vocabulary of \(config.vocabSize)")
            }
        }
        return embedTokens.rows(ids.flatMap { $0 }).reshaped([ids.count, length, config.hiddenSize])
    }

    public var vocabularySize: Int { config.vocabSize }
    public var contextLength: Int? { config.maxPositionEmbeddings }

    /// Dynamic RoPE's frequencies follow the batch's longest row past `max_position_embeddings`. A sliding window
    /// sets no limit: rows are padded on the left, so a row's last `window` positions hold the keys it holds alone.
    public var batchInvariantLength: Int? {
        config.rope.ropeType == "dynamic" ? config.maxPositionEmbeddings : nil
    }

    /// Logits for input embeddings `[B, T, hiddenSize]` (a VLM's text embeddings with image features spliced in);
    /// see ``CausalLanguageModel/logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``.
    public func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        try logits(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache,
                   lastPositionOnly: lastPositionOnly, fusing: true)
    }

    /// `fusing` false keeps decoding steps on the layer-by-layer path (tests compare the two).
    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool, fusing: Bool) throws -> Tensor {
        let inputs = try checkedInputs(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache)
        if fusing, let step = fusedStep, let cache, inputs.keyPaddingMask == nil, inputsEmbeds.shape[0] == 1,
           inputsEmbeds.shape[1] == 1, cache.heads == config.numKeyValueHeads {
            return runFusedStep(step, cache: cache, position: inputs.positions[0][0]) {
                $0.initialize(from: inputsEmbeds.storage.pointer, count: config.hiddenSize)
            }
        }
        let hidden = try hiddenStates(inputsEmbeds: inputsEmbeds, inputs: inputs, cache: cache)
        let (batch, length) = (hidden.shape[0], hidden.shape[1])
        guard lastPositionOnly, length > 1 else { return lmHead(hidden) }
        return lmHead(gatherTokens(hidden, positions: Array(repeating: length - 1, count: batch)).reshaped([batch, 1, config.hiddenSize]))
    }

    /// See ``CausalLanguageModel/logits(nextToken:cache:)``: the fused step, its embedding row and rotary row written
    /// into the cache's workspace, where the inputs fit it; else the general path, which names what does not fit.
    public func logits(nextToken token: Int, cache: KVCache) throws -> Tensor {
        guard let step = fusedStep, token >= 0, token < config.vocabSize,
              cache.takesOneStep(layers: layers.count, heads: config.numKeyValueHeads,
                                 width: config.numKeyValueHeads * config.headDim) else {
            return try logits(inputIds: [[token]], cache: cache)
        }
        return runFusedStep(step, cache: cache, position: cache.length) { embedTokens.copyRow(token, into: $0) }
    }

    /// One fused step over `cache` for the embedding `embed` writes, its queries and keys rotated to `position`.
    private func runFusedStep(_ step: FusedDecoderStep, cache: KVCache, position: Int,
                              embed: (UnsafeMutablePointer<Float>) -> Void) -> Tensor {
        cache.runFusedStep(step, head: { lmHead($0) }) { workspace in
            embed(workspace.hidden.storage.pointer)
            VLMTensor.rotaryRow(position: position, inverseFrequencies: config.rotaryFrequencies(reaching: position, inverseFrequencies),
                                cosines: workspace.cos, sines: workspace.sin)
        }
    }

    /// The final normalized hidden states `[B, T, hiddenSize]` (transformers' `last_hidden_state`).
    public func hiddenStates(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                             cache: KVCache? = nil) throws -> Tensor {
        try hiddenStates(inputsEmbeds: inputsEmbeds,
                         inputs: checkedInputs(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache),
                         cache: cache)
    }

    /// A pass's position ids and its key padding mask (nil where nothing is padding), after checking that the inputs
    /// fit each other and the cache.
    private func checkedInputs(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?,
                               cache: KVCache?) throws -> (positions: [[Int]], keyPaddingMask: Tensor?) {
        guard inputsEmbeds.rank == 3, inputsEmbeds.shape[2] == config.hiddenSize, inputsEmbeds.shape[0] > 0 else {
            throw ModelError.invalidInput("inputs_embeds must be [B, T, \(config.hiddenSize)], got \(inputsEmbeds.shape)")
        }
        let (batch, length) = (inputsEmbeds.shape[0], inputsEmbeds.shape[1])
        let past = cache?.length ?? 0
        if let cache {
            guard cache.batch == batch, past + length <= cache.capacity, cache.layerCount == layers.count,
                  cache.width == config.numKeyValueHeads * config.headDim else {
                throw ModelError.invalidInput(
                    "the KV cache holds \(cache.batch) rows of \(cache.capacity) positions (\(past) used); \(batch) rows of \(length) more do not fit")
            }
        }
        let positions = positionIds ?? Array(repeating: Array(past..<(past + length)), count: batch)
        guard positions.count == batch, try Self.rowLength(positions, "position ids") == length,
              positions.allSatisfy({ $0.allSatisfy { $0 >= 0 && $0 < 1 << 24 } }) else {
            throw ModelError.invalidInput("position ids must be [\(batch)][\(length)] of non-negative positions")
        }
        var keyPaddingMask: Tensor?
        if let attentionMask {
            guard attentionMask.count == batch, try Self.rowLength(attentionMask, "attention mask") == past + length else {
                throw ModelError.invalidInput("the attention mask must be [\(batch)][\(past + length)] (cached and new positions)")
            }
            if attentionMask.contains(where: { $0.contains(0) }) {
                keyPaddingMask = Tensor(shape: [batch, past + length], scalars: attentionMask.flatMap { $0.map { $0 != 0 ? 1 : 0 } })
            }
        }
        return (positions, keyPaddingMask)
    }

    private func hiddenStates(inputsEmbeds: Tensor, inputs: (positions: [[Int]], keyPaddingMask: Tensor?),
                              cache: KVCache?) throws -> Tensor {
        let (keyPaddingMask, length) = (inputs.keyPaddingMask, inputsEmbeds.shape[1])
        if length == 0 { return inputsEmbeds }
        let tables = rotaryTables(positions: inputs.positions.flatMap { $0 })
        var hidden = inputsEmbeds
        for (index, layer) in layers.enumerated() {
            hidden = decoderLayer(layer, index: index, hidden: hidden, rotary: tables, keyPaddingMask: keyPaddingMask, cache: cache)
        }
        cache?.advance(by: length)
        return rmsNorm(hidden, weight: norm, eps: config.rmsNormEps)
    }

    /// The rotary tables of `positions` (`[positions, headDim/2]` each), at the frequencies of a pass whose largest
    /// position is theirs, as ``applyRotaryEmbedding(_:heads:cos:sin:)`` reads them.
    public func rotaryTables(positions: [Int]) -> (cos: Tensor, sin: Tensor) {
        config.rotaryTables(positions: positions, inverseFrequencies: inverseFrequencies)
    }

    private func decoderLayer(_ layer: LlamaDecoderLayer, index: Int, hidden: Tensor, rotary: (cos: Tensor, sin: Tensor),
                              keyPaddingMask: Tensor?, cache: KVCache?) -> Tensor {
        let heads = config.numAttentionHeads, keyHeads = config.numKeyValueHeads
        let normed = rmsNorm(hidden, weight: layer.inputNorm, eps: config.rmsNormEps)
        let projected = layer.queryKeyValue(normed)
        func prepared(_ x: Tensor, norm: Tensor?, heads: Int) -> Tensor {
            let normed = norm.map { headRMSNorm(x, weight: $0, eps: config.rmsNormEps) } ?? x
            guard config.rotatesPositions(layer: index) else { return normed }
            return applyRotaryEmbedding(normed, heads: heads, cos: rotary.cos, sin: rotary.sin)
        }
        let attended = causalSelfAttention(
            query: prepared(projected[0], norm: layer.queryNorm, heads: heads),
            key: prepared(projected[1], norm: layer.keyNorm, heads: keyHeads), value: projected[2], heads: heads,
            keyHeads: keyHeads, layer: index, cache: cache, keyLength: (cache?.length ?? 0) + hidden.shape[1],
            window: config.attentionWindow(layer: index), keyPaddingMask: keyPaddingMask,
            scale: 1 / Float(config.headDim).squareRoot())
        let afterAttention = layer.output(attended, residual: hidden)
        let normedAgain = rmsNorm(afterAttention, weight: layer.postAttentionNorm, eps: config.rmsNormEps)
        let gated = layer.gateUp.gated(normedAgain, activation: activation)
        return layer.down(gated, residual: afterAttention)
    }

    static func rowLength(_ rows: [[Int]], _ what: String) throws -> Int {
        guard let length = rows.first?.count, rows.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("\(what) must be a non-empty batch of rows of equal length (pad on the left)")
        }
        return length
    }
}
