import Foundation
import VLMCheckpoint
import VLMTensor

// Meta's OPT decoder as transformers' models/opt/modeling_opt.py builds it (BLIP-2's OPT-2.7B/6.7B language models):
// learned positions offset by 2, layer norm before (125m and most sizes) or after (350m) each residual block, a
// ReLU MLP, and, where the word embeddings are narrower than the decoder (350m), projections in and out.

/// transformers' `OPTConfig`, with its defaults.
public struct OPTConfig: Decodable, Sendable {
    public var vocabSize: Int
    public var hiddenSize: Int
    public var numHiddenLayers: Int
    public var ffnDim: Int
    public var maxPositionEmbeddings: Int
    /// Layer norm before attention and MLP (true), or after each residual addition (OPT-350m).
    public var doLayerNormBefore: Bool
    /// `_remove_final_layer_norm`: checkpoints fine-tuned before transformers 4.20.1 lack the final layer norm.
    public var removeFinalLayerNorm: Bool
    /// Width of the token embeddings; the decoder projects them in and out when it differs from `hiddenSize`.
    public var wordEmbedProjDim: Int
    public var numAttentionHeads: Int
    public var activationFunction: String
    public var enableBias: Bool
    public var layerNormElementwiseAffine: Bool
    public var tieWordEmbeddings: Bool
    public var padTokenId: Int?
    public var bosTokenId: Int?
    public var eosTokenIds: [Int]

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", hiddenSize = "hidden_size", numHiddenLayers = "num_hidden_layers", ffnDim = "ffn_dim"
        case maxPositionEmbeddings = "max_position_embeddings", doLayerNormBefore = "do_layer_norm_before"
        case removeFinalLayerNorm = "_remove_final_layer_norm", wordEmbedProjDim = "word_embed_proj_dim"
        case numAttentionHeads = "num_attention_heads", activationFunction = "activation_function"
        case enableBias = "enable_bias", layerNormElementwiseAffine = "layer_norm_elementwise_affine"
        case tieWordEmbeddings = "tie_word_embeddings", padTokenId = "pad_token_id", bosTokenId = "bos_token_id"
        case eosTokenId = "eos_token_id"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 50272)
        hiddenSize = try c.value(.hiddenSize, default: 768)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        ffnDim = try c.value(.ffnDim, default: 3072)
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 2048)
        doLayerNormBefore = try c.value(.doLayerNormBefore, default: true)
        removeFinalLayerNorm = try c.value(.removeFinalLayerNorm, default: false)
        wordEmbedProjDim = try c.value(.wordEmbedProjDim, default: hiddenSize)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 12)
        activationFunction = try c.value(.activationFunction, default: "relu")
        enableBias = try c.value(.enableBias, default: true)
        layerNormElementwiseAffine = try c.value(.layerNormElementwiseAffine, default: true)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: true)
        padTokenId = c.contains(.padTokenId) ? try c.decodeIfPresent(Int.self, forKey: .padTokenId) : 1
        bosTokenId = c.contains(.bosTokenId) ? try c.decodeIfPresent(Int.self, forKey: .bosTokenId) : 2
        eosTokenIds = try decodeTokenIds(c, .eosTokenId, default: [2])
    }

    func validate(file: String) throws {
        let counts = [("vocab_size", vocabSize), ("hidden_size", hiddenSize), ("ffn_dim", ffnDim),
                      ("num_attention_heads", numAttentionHeads), ("word_embed_proj_dim", wordEmbedProjDim),
                      ("max_position_embeddings", maxPositionEmbeddings)]
        for (key, value) in counts where value <= 0 {
            throw ModelError.invalidConfig("\(key) is \(value), expected a positive count", file: file)
        }
        guard numHiddenLayers >= 0 else { throw ModelError.invalidConfig("num_hidden_layers is \(numHiddenLayers)", file: file) }
        guard hiddenSize % numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("hidden_size \(hiddenSize) does not split into \(numAttentionHeads) heads", file: file)
        }
    }
}

/// `eos_token_id` as one id or a list; absent takes `default`, `null` none.
func decodeTokenIds<Key: CodingKey>(_ c: KeyedDecodingContainer<Key>, _ key: Key, default defaultValue: [Int]) throws -> [Int] {
    if let list = try? c.decodeIfPresent([Int].self, forKey: key) { return list }
    return try c.decodeIfPresent(Int.self, forKey: key).map { [$0] } ?? (c.contains(key) ? [] : defaultValue)
}

final class OPTDecoderLayer: @unchecked Sendable {
    let query: Linear, key: Linear, value: Linear, output: Linear
    let attentionNorm: (weight: Tensor, bias: Tensor), finalNorm: (weight: Tensor, bias: Tensor)
    let fc1: Linear, fc2: Linear

    init(config c: OPTConfig, tensor: (String, [Int]) throws -> Tensor, prefix: String) throws {
        func linear(_ name: String, _ outFeatures: Int, _ inFeatures: Int) throws -> Linear {
            try Linear(weight: tensor("\(prefix).\(name).weight", [outFeatures, inFeatures]),
                       bias: c.enableBias ? tensor("\(prefix).\(name).bias", [outFeatures]) : nil)
        }
        let width = c.hiddenSize
        query = try linear("self_attn.q_proj", width, width)
        key = try linear("self_attn.k_proj", width, width)
        value = try linear("self_attn.v_proj", width, width)
        output = try linear("self_attn.out_proj", width, width)
        attentionNorm = try layerNormParameters(tensor, "\(prefix).self_attn_layer_norm", size: width, affine: c.layerNormElementwiseAffine)
        finalNorm = try layerNormParameters(tensor, "\(prefix).final_layer_norm", size: width, affine: c.layerNormElementwiseAffine)
        fc1 = try linear("fc1", c.ffnDim, width)
        fc2 = try linear("fc2", width, c.ffnDim)
    }
}

/// An OPT causal language model (transformers' `OPTForCausalLM`).
///
/// Inputs are batches of equal-length rows, left-padded, with transformers' `attention_mask`. Without
/// `positionIds` each row's positions come from its mask, as OPT's forward derives them (`cumsum(mask)·mask − 1`,
/// padding at −1), offset by 2 into the learned table; given ones (such as `generate`'s) are offset the same way.
public final class OPTForCausalLM: CausalLanguageModel, @unchecked Sendable {
    public let config: OPTConfig
    let embedTokens: WeightMatrix
    let embedPositions: Tensor
    let projectIn: Linear?, projectOut: Linear?
    let layers: [OPTDecoderLayer]
    let finalNorm: (weight: Tensor, bias: Tensor)?
    let lmHead: Linear
    let activation: Activation

    /// OPT's learned position table has 2 extra rows in front (fairseq's padding convention).
    static let positionOffset = 2
    /// nn.LayerNorm's default, which OPT keeps.
    static let layerNormEps: Float = 1e-5

    /// Builds the model from `config` and a source of weights by Hugging Face name relative to the decoder
    /// (`embed_tokens.weight`, `layers.0.…`; `lm_head` is `lmHeadWeight`), each of which must have the given shape.
    init(config: OPTConfig, file: String, tensor: (String, [Int]) throws -> Tensor,
         lmHeadWeight: () throws -> Tensor) throws {
        try config.validate(file: file)
        self.config = config
        activation = try Activation(huggingFaceName: config.activationFunction, file: file)
        let (width, words) = (config.hiddenSize, config.wordEmbedProjDim)
        // The head first, so that a bf16 table does not live beside its fp32 original while the layers load.
        (embedTokens, lmHead) = try {
            let table = try tensor("embed_tokens.weight", [config.vocabSize, words])
            return (.embeddingTable(table), try Linear(weight: config.tieWordEmbeddings ? table : lmHeadWeight(), bias: nil))
        }()
        embedPositions = try tensor("embed_positions.weight", [config.maxPositionEmbeddings + Self.positionOffset, width])
        if words != width {
            projectIn = try Linear(weight: tensor("project_in.weight", [width, words]), bias: nil)
            projectOut = try Linear(weight: tensor("project_out.weight", [words, width]), bias: nil)
        } else {
            (projectIn, projectOut) = (nil, nil)
        }
        layers = try (0..<config.numHiddenLayers).map { try OPTDecoderLayer(config: config, tensor: tensor, prefix: "layers.\($0)") }
        finalNorm = config.doLayerNormBefore && !config.removeFinalLayerNorm
            ? try layerNormParameters(tensor, "final_layer_norm", size: width, affine: config.layerNormElementwiseAffine) : nil
    }

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `opt`, saved
    /// as `OPTForCausalLM` (`model.decoder.…`) or as `OPTModel` (`decoder.…`).
    public convenience init(directory: ModelDirectory) throws {
        let configPath = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard type == "opt" else {
            throw ModelError.unsupportedModelType(type, supported: ["opt"], file: configPath)
        }
        let config = try directory.decode(OPTConfig.self)
        let weights = try WeightStore(directory: directory.url)
        let prefix = weights.contains("model.decoder.embed_tokens.weight") ? "model.decoder." : "decoder."
        try self.init(config: config, file: configPath, tensor: { try weights.tensor(prefix + $0, shape: $1) },
                      lmHeadWeight: { try weights.tensor("lm_head.weight", shape: [config.vocabSize, config.wordEmbedProjDim]) })
    }

    public var vocabularySize: Int { config.vocabSize }
    public var contextLength: Int? { config.maxPositionEmbeddings }

    /// Rows of the token embedding table: `[B, T, wordEmbedProjDim]`.
    public func embed(_ ids: [[Int]]) throws -> Tensor { try tokenEmbeddings(ids, table: embedTokens) }

    public func makeCache(batch: Int, capacity: Int) throws -> KVCache {
        try makeBoundedCache(batch: batch, capacity: capacity, layers: layers.count, width: config.hiddenSize,
                             heads: config.numAttentionHeads, elementType: cacheElementType)
    }

    /// What `makeCache` holds keys and values in: ``KVCache/ElementType/forNewModels`` where the model was built.
    public let cacheElementType = KVCache.ElementType.forNewModels

    /// Logits for input embeddings `[B, T, wordEmbedProjDim]`; see
    /// ``CausalLanguageModel/logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``, except that
    /// nil `positionIds` with an attention mask count each row's tokens, as OPT does.
    public func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        let pass = try DecoderPass(inputsEmbeds: inputsEmbeds, width: config.wordEmbedProjDim, attentionMask: attentionMask,
                                   cache: cache, layers: layers.count, cacheWidth: config.hiddenSize)
        let (batch, length) = (pass.batch, pass.length)
        if length == 0 { return Tensor(zeros: [batch, 0, config.vocabSize]) }
        let positions: [[Int]]
        if positionIds == nil, let attentionMask {
            // OPTLearnedPositionalEmbedding: cumsum(mask)·mask − 1 over cached and new positions, the new ones kept.
            positions = attentionMask.map { row in
                var count = 0
                return row.map { flag in
                    if flag != 0 { count += 1 }
                    return flag != 0 ? count - 1 : -1
                }.suffix(length).map { $0 }
            }
        } else {
            positions = try pass.positions(positionIds, below: config.maxPositionEmbeddings)
        }
        // −1 (padding) is the table's row 1; anything past the table is an error, not a crash.
        guard positions.allSatisfy({ $0.allSatisfy { $0 >= -1 && $0 < config.maxPositionEmbeddings } }) else {
            throw ModelError.invalidInput("positions reach beyond OPT's \(config.maxPositionEmbeddings) learned positions")
        }
        var hidden = add(projectIn.map { $0(inputsEmbeds) } ?? inputsEmbeds,
                         learnedPositions(embedPositions, positions: positions, offset: Self.positionOffset))
        for (index, layer) in layers.enumerated() {
            hidden = decoderLayer(layer, index: index, hidden: hidden, pass: pass, cache: cache)
        }
        cache?.advance(by: length)
        if let finalNorm { hidden = layerNorm(hidden, weight: finalNorm.weight, bias: finalNorm.bias, eps: Self.layerNormEps) }
        if lastPositionOnly && length > 1 {
            hidden = gatherTokens(hidden, positions: Array(repeating: length - 1, count: batch)).reshaped([batch, 1, config.hiddenSize])
        }
        return lmHead(projectOut.map { $0(hidden) } ?? hidden)
    }

    private func decoderLayer(_ layer: OPTDecoderLayer, index: Int, hidden: Tensor, pass: DecoderPass, cache: KVCache?) -> Tensor {
        let before = config.doLayerNormBefore
        func norm(_ x: Tensor, _ parameters: (weight: Tensor, bias: Tensor)) -> Tensor {
            layerNorm(x, weight: parameters.weight, bias: parameters.bias, eps: Self.layerNormEps)
        }
        let attentionInput = before ? norm(hidden, layer.attentionNorm) : hidden
        let attended = pass.selfAttention(
            query: layer.query(attentionInput), key: layer.key(attentionInput), value: layer.value(attentionInput),
            layer: index, cache: cache, heads: config.numAttentionHeads,
            scale: 1 / Float(config.hiddenSize / config.numAttentionHeads).squareRoot())
        var afterAttention = layer.output(attended, residual: hidden)
        if !before { afterAttention = norm(afterAttention, layer.attentionNorm) }
        let mlpInput = before ? norm(afterAttention, layer.finalNorm) : afterAttention
        let output = layer.fc2(layer.fc1(mlpInput, activation: activation), residual: afterAttention)
        return before ? output : norm(output, layer.finalNorm)
    }
}
