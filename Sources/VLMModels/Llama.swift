import Foundation
import VLMCheckpoint
import VLMTensor

// The Llama decoder as transformers' models/llama/modeling_llama.py builds it: RMSNorm, rotary position embeddings,
// grouped-query attention and a SwiGLU MLP, pre-norm residual blocks. Llama 2/3 and SmolLM2 checkpoints are this.

/// transformers' RoPE parameters (`rope_parameters`, or the legacy `rope_theta` + `rope_scaling`), for the types
/// this decoder computes: "default", "linear" and "llama3".
public struct RopeParameters: Sendable, Equatable {
    public var ropeType: String
    public var theta: Double
    /// "linear" and "llama3": how much longer the context is than in pretraining.
    public var factor: Double?
    /// "llama3" only.
    public var lowFrequencyFactor: Double?
    public var highFrequencyFactor: Double?
    public var originalMaxPositionEmbeddings: Int?

    public static let supportedTypes = ["default", "linear", "llama3"]

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
    func inverseFrequencies(headDim: Int, file: String) throws -> [Float] {
        let base = Float(theta)
        let standard = stride(from: 0, to: headDim, by: 2).map { 1 / pow(base, Float($0) / Float(headDim)) }
        switch ropeType {
        case "default":
            return standard
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

    private func required<T>(_ value: T?, _ key: String, file: String) throws -> T {
        guard let value else { throw ModelError.invalidConfig("rope type \"\(ropeType)\" needs \(key)", file: file) }
        return value
    }
}

/// transformers' `LlamaConfig`, with its defaults.
public struct LlamaConfig: Decodable, Sendable {
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
    /// Biases on the q, k, v and o projections.
    public var attentionBias: Bool
    /// Biases on the gate, up and down projections.
    public var mlpBias: Bool
    public var rope: RopeParameters
    public var bosTokenId: Int?
    /// `eos_token_id`, which checkpoints give as one id or a list.
    public var eosTokenIds: [Int]

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case numKeyValueHeads = "num_key_value_heads", headDim = "head_dim", hiddenAct = "hidden_act"
        case maxPositionEmbeddings = "max_position_embeddings", rmsNormEps = "rms_norm_eps"
        case tieWordEmbeddings = "tie_word_embeddings", attentionBias = "attention_bias", mlpBias = "mlp_bias"
        case ropeParameters = "rope_parameters", ropeScaling = "rope_scaling", ropeTheta = "rope_theta"
        case bosTokenId = "bos_token_id", eosTokenId = "eos_token_id"
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
        vocabSize = try c.value(.vocabSize, default: 32000)
        hiddenSize = try c.value(.hiddenSize, default: 4096)
        intermediateSize = try c.value(.intermediateSize, default: 11008)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 32)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 32)
        numKeyValueHeads = try c.value(.numKeyValueHeads, default: numAttentionHeads)
        headDim = try c.value(.headDim, default: numAttentionHeads > 0 ? hiddenSize / numAttentionHeads : 0)
        hiddenAct = try c.value(.hiddenAct, default: "silu")
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 2048)
        rmsNormEps = try c.value(.rmsNormEps, default: 1e-6)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: false)
        attentionBias = try c.value(.attentionBias, default: false)
        mlpBias = try c.value(.mlpBias, default: false)
        bosTokenId = try c.value(.bosTokenId, default: 1)
        if let list = try? c.decodeIfPresent([Int].self, forKey: .eosTokenId) {
            eosTokenIds = list
        } else {
            eosTokenIds = try c.decodeIfPresent(Int.self, forKey: .eosTokenId).map { [$0] } ?? (c.contains(.eosTokenId) ? [] : [2])
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
        let counts = [("vocab_size", vocabSize), ("hidden_size", hiddenSize), ("intermediate_size", intermediateSize),
                      ("num_attention_heads", numAttentionHeads), ("num_key_value_heads", numKeyValueHeads),
                      ("head_dim", headDim)]
        for (key, value) in counts where value <= 0 {
            throw ModelError.invalidConfig("\(key) is \(value), expected a positive count", file: file)
        }
        guard numHiddenLayers >= 0 else { throw ModelError.invalidConfig("num_hidden_layers is \(numHiddenLayers)", file: file) }
        guard numAttentionHeads % numKeyValueHeads == 0 else {
            throw ModelError.invalidConfig(
                "num_attention_heads \(numAttentionHeads) is not a multiple of num_key_value_heads \(numKeyValueHeads)", file: file)
        }
        guard headDim % 2 == 0 else { throw ModelError.invalidConfig("head_dim \(headDim) is odd; RoPE rotates pairs", file: file) }
    }
}

final class LlamaDecoderLayer: @unchecked Sendable {
    let inputNorm: Tensor, postAttentionNorm: Tensor
    let query: Linear, key: Linear, value: Linear, output: Linear
    let gate: Linear, up: Linear, down: Linear

    init(config c: LlamaConfig, tensor: (String, [Int]) throws -> Tensor, matrix: (String, [Int]) throws -> WeightMatrix,
         prefix: String) throws {
        func linear(_ name: String, _ outFeatures: Int, _ inFeatures: Int, bias: Bool) throws -> Linear {
            try Linear(weight: matrix("\(prefix).\(name).weight", [outFeatures, inFeatures]),
                       bias: bias ? tensor("\(prefix).\(name).bias", [outFeatures]) : nil)
        }
        let queryWidth = c.numAttentionHeads * c.headDim, keyWidth = c.numKeyValueHeads * c.headDim
        inputNorm = try tensor("\(prefix).input_layernorm.weight", [c.hiddenSize])
        postAttentionNorm = try tensor("\(prefix).post_attention_layernorm.weight", [c.hiddenSize])
        query = try linear("self_attn.q_proj", queryWidth, c.hiddenSize, bias: c.attentionBias)
        key = try linear("self_attn.k_proj", keyWidth, c.hiddenSize, bias: c.attentionBias)
        value = try linear("self_attn.v_proj", keyWidth, c.hiddenSize, bias: c.attentionBias)
        output = try linear("self_attn.o_proj", c.hiddenSize, queryWidth, bias: c.attentionBias)
        gate = try linear("mlp.gate_proj", c.intermediateSize, c.hiddenSize, bias: c.mlpBias)
        up = try linear("mlp.up_proj", c.intermediateSize, c.hiddenSize, bias: c.mlpBias)
        down = try linear("mlp.down_proj", c.hiddenSize, c.intermediateSize, bias: c.mlpBias)
    }
}

/// A Llama-family causal language model (transformers' `LlamaForCausalLM`), from a Hugging Face checkpoint
/// directory or a llama.cpp GGUF file.
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
        inverseFrequencies = try config.rope.inverseFrequencies(headDim: config.headDim, file: file)
        embedTokens = try matrix("model.embed_tokens.weight", [config.vocabSize, config.hiddenSize])
        layers = try (0..<config.numHiddenLayers).map {
            try LlamaDecoderLayer(config: config, tensor: tensor, matrix: matrix, prefix: "model.layers.\($0)")
        }
        norm = try tensor("model.norm.weight", [config.hiddenSize])
        lmHead = try Linear(weight: config.tieWordEmbeddings ? embedTokens
                                : matrix("lm_head.weight", [config.vocabSize, config.hiddenSize]), bias: nil)
    }

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `llama`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard type == "llama" else {
            throw ModelError.invalidConfig("model_type \"\(type)\" is not a Llama decoder (supported: llama)", file: configPath)
        }
        let weights = try WeightStore(directory: directory.url)
        try self.init(config: directory.decode(LlamaConfig.self), file: configPath) { try weights.tensor($0, shape: $1) }
    }

    public func makeCache(batch: Int, capacity: Int) throws -> KVCache {
        let width = config.numKeyValueHeads * config.headDim
        let positions = batch.multipliedReportingOverflow(by: capacity)
        let bytes = positions.partialValue.multipliedReportingOverflow(by: 2 * max(layers.count, 1) * width * 4)
        guard batch > 0, capacity > 0, !positions.overflow, !bytes.overflow, bytes.partialValue <= Self.maximumCacheBytes else {
            throw ModelError.invalidInput("a KV cache for \(batch) rows of \(capacity) positions is out of range")
        }
        return KVCache(batch: batch, capacity: capacity, layers: layers.count, width: width)
    }

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

    /// Logits for input embeddings `[B, T, hiddenSize]` (a VLM's text embeddings with image features spliced in);
    /// see ``CausalLanguageModel/logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``.
    public func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        let hidden = try hiddenStates(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache)
        let (batch, length) = (hidden.shape[0], hidden.shape[1])
        guard lastPositionOnly, length > 1 else { return lmHead(hidden) }
        return lmHead(gatherTokens(hidden, positions: Array(repeating: length - 1, count: batch)).reshaped([batch, 1, config.hiddenSize]))
    }

    /// The final normalized hidden states `[B, T, hiddenSize]` (transformers' `last_hidden_state`).
    public func hiddenStates(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                             cache: KVCache? = nil) throws -> Tensor {
        guard inputsEmbeds.rank == 3, inputsEmbeds.shape[2] == config.hiddenSize, inputsEmbeds.shape[0] > 0 else {
            throw ModelError.invalidInput("inputs_embeds must be [B, T, \(config.hiddenSize)], got \(inputsEmbeds.shape)")
        }
        let (batch, length) = (inputsEmbeds.shape[0], inputsEmbeds.shape[1])
        let past = cache?.length ?? 0
        if let cache {
            guard cache.batch == batch, past + length <= cache.capacity, cache.keys.count == layers.count,
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
        if length == 0 { return inputsEmbeds }

        let tables = rotaryTables(positions: positions.flatMap { $0 }, inverseFrequencies: inverseFrequencies)
        var hidden = inputsEmbeds
        for (index, layer) in layers.enumerated() {
            hidden = decoderLayer(layer, index: index, hidden: hidden, rotary: tables, keyPaddingMask: keyPaddingMask, cache: cache)
        }
        cache?.advance(by: length)
        return rmsNorm(hidden, weight: norm, eps: config.rmsNormEps)
    }

    private func decoderLayer(_ layer: LlamaDecoderLayer, index: Int, hidden: Tensor, rotary: (cos: Tensor, sin: Tensor),
                              keyPaddingMask: Tensor?, cache: KVCache?) -> Tensor {
        let heads = config.numAttentionHeads, keyHeads = config.numKeyValueHeads
        let normed = rmsNorm(hidden, weight: layer.inputNorm, eps: config.rmsNormEps)
        let query = applyRotaryEmbedding(layer.query(normed), heads: heads, cos: rotary.cos, sin: rotary.sin)
        let key = applyRotaryEmbedding(layer.key(normed), heads: keyHeads, cos: rotary.cos, sin: rotary.sin)
        let value = layer.value(normed)
        var keys = key, values = value
        if let cache {
            cache.store(layer: index, key: key, value: value)
            (keys, values) = (cache.keys[index], cache.values[index])
        }
        let attended = groupedQueryAttention(query: query, key: keys, value: values, heads: heads, keyHeads: keyHeads,
                                             keyLength: (cache?.length ?? 0) + hidden.shape[1], causal: true,
                                             keyPaddingMask: keyPaddingMask, scale: 1 / Float(config.headDim).squareRoot())
        let afterAttention = layer.output(attended, residual: hidden)
        let normedAgain = rmsNorm(afterAttention, weight: layer.postAttentionNorm, eps: config.rmsNormEps)
        let gated = multiply(layer.gate(normedAgain, activation: activation), layer.up(normedAgain))
        return layer.down(gated, residual: afterAttention)
    }

    static func rowLength(_ rows: [[Int]], _ what: String) throws -> Int {
        guard let length = rows.first?.count, rows.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("\(what) must be a non-empty batch of rows of equal length (pad on the left)")
        }
        return length
    }
}
