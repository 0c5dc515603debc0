import Foundation
import VLMCheckpoint
import VLMTensor

// OpenAI's GPT-2 as transformers' models/gpt2/modeling_gpt2.py builds it, also the decoder of VisionEncoderDecoder
// checkpoints (ViT-GPT2 captioners, TrOCR-style models): learned absolute positions, pre-norm blocks, gelu_new, and
// Conv1D weights stored [in, out] (transposed once at load). With `add_cross_attention` each block also attends to
// an encoder's output between its self-attention and its MLP.

/// transformers' `GPT2Config`, with its defaults.
public struct GPT2Config: Decodable, Sendable {
    public var vocabSize: Int
    /// `n_positions`: rows of the learned position table.
    public var maxPositionEmbeddings: Int
    /// `n_embd`.
    public var hiddenSize: Int
    /// `n_layer`.
    public var numHiddenLayers: Int
    /// `n_head`.
    public var numAttentionHeads: Int
    /// `n_inner`, 4·`n_embd` when absent.
    public var innerSize: Int
    public var activationFunction: String
    public var layerNormEpsilon: Float
    /// Attention scores divided by √headDim.
    public var scaleAttnWeights: Bool
    /// Attention scores of layer `i` also divided by `i + 1`.
    public var scaleAttnByInverseLayerIdx: Bool
    /// Scores computed in fp32 with the scale folded into the product: a mixed-precision safeguard, the same
    /// numbers in fp32, which is how SwiftVLM always computes.
    public var reorderAndUpcastAttn: Bool
    /// Blocks carry cross-attention to encoder hidden states (`crossattention`, `ln_cross_attn`).
    public var addCrossAttention: Bool
    public var tieWordEmbeddings: Bool
    public var bosTokenId: Int?
    public var eosTokenIds: [Int]

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", maxPositionEmbeddings = "n_positions", hiddenSize = "n_embd"
        case numHiddenLayers = "n_layer", numAttentionHeads = "n_head", innerSize = "n_inner"
        case activationFunction = "activation_function", layerNormEpsilon = "layer_norm_epsilon"
        case scaleAttnWeights = "scale_attn_weights", scaleAttnByInverseLayerIdx = "scale_attn_by_inverse_layer_idx"
        case reorderAndUpcastAttn = "reorder_and_upcast_attn", addCrossAttention = "add_cross_attention"
        case tieWordEmbeddings = "tie_word_embeddings", bosTokenId = "bos_token_id", eosTokenId = "eos_token_id"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 50257)
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 1024)
        hiddenSize = try c.value(.hiddenSize, default: 768)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 12)
        innerSize = try c.value(.innerSize, default: 4 * hiddenSize)
        activationFunction = try c.value(.activationFunction, default: "gelu_new")
        layerNormEpsilon = try c.value(.layerNormEpsilon, default: 1e-5)
        scaleAttnWeights = try c.value(.scaleAttnWeights, default: true)
        scaleAttnByInverseLayerIdx = try c.value(.scaleAttnByInverseLayerIdx, default: false)
        reorderAndUpcastAttn = try c.value(.reorderAndUpcastAttn, default: false)
        addCrossAttention = try c.value(.addCrossAttention, default: false)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: true)
        bosTokenId = c.contains(.bosTokenId) ? try c.decodeIfPresent(Int.self, forKey: .bosTokenId) : 50256
        eosTokenIds = try decodeTokenIds(c, .eosTokenId, default: [50256])
    }

    func validate(file: String) throws {
        let counts = [("vocab_size", vocabSize), ("n_positions", maxPositionEmbeddings), ("n_embd", hiddenSize),
                      ("n_head", numAttentionHeads), ("n_inner", innerSize)]
        for (key, value) in counts where value <= 0 {
            throw ModelError.invalidConfig("\(key) is \(value), expected a positive count", file: file)
        }
        guard numHiddenLayers >= 0 else { throw ModelError.invalidConfig("n_layer is \(numHiddenLayers)", file: file) }
        guard hiddenSize % numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("n_embd \(hiddenSize) does not split into \(numAttentionHeads) heads", file: file)
        }
    }

    /// The attention scale of layer `index` (`GPT2Attention.scaling`).
    func attentionScale(layer index: Int) -> Float {
        var scale: Float = scaleAttnWeights ? 1 / Float(hiddenSize / numAttentionHeads).squareRoot() : 1
        if scaleAttnByInverseLayerIdx { scale /= Float(index + 1) }
        return scale
    }
}

/// A Conv1D layer (`x·W + b` with `W [in, out]`) as Linears over column blocks of its weight: one block per
/// output split by `widths`.
private func conv1DSplit(_ tensor: (String, [Int]) throws -> Tensor, _ prefix: String, inFeatures: Int,
                         widths: [Int]) throws -> [Linear] {
    let outFeatures = widths.reduce(0, +)
    let weight = try tensor("\(prefix).weight", [inFeatures, outFeatures])
    let bias = try tensor("\(prefix).bias", [outFeatures])
    var start = 0
    return try widths.map { width in
        defer { start += width }
        // Linear wants PyTorch's nn.Linear layout, [out, in]: the transpose of the block.
        let block = Tensor(uninitialized: [width, inFeatures])
        for row in 0..<width {
            for column in 0..<inFeatures {
                block.storage.pointer[row * inFeatures + column] = weight.storage.pointer[column * outFeatures + start + row]
            }
        }
        return try Linear(weight: block, bias: Tensor(shape: [width], scalars: Array(bias.scalars[start..<(start + width)])))
    }
}

final class GPT2Block: @unchecked Sendable {
    let norm1: (weight: Tensor, bias: Tensor), norm2: (weight: Tensor, bias: Tensor)
    let query: Linear, key: Linear, value: Linear, output: Linear
    let crossNorm: (weight: Tensor, bias: Tensor)?
    let crossQuery: Linear?, crossKey: Linear?, crossValue: Linear?, crossOutput: Linear?
    let up: Linear, down: Linear

    init(config c: GPT2Config, tensor: (String, [Int]) throws -> Tensor, prefix: String) throws {
        let width = c.hiddenSize
        norm1 = try layerNormParameters(tensor, "\(prefix).ln_1", size: width, affine: true)
        norm2 = try layerNormParameters(tensor, "\(prefix).ln_2", size: width, affine: true)
        let selfProjections = try conv1DSplit(tensor, "\(prefix).attn.c_attn", inFeatures: width, widths: [width, width, width])
        (query, key, value) = (selfProjections[0], selfProjections[1], selfProjections[2])
        output = try conv1DSplit(tensor, "\(prefix).attn.c_proj", inFeatures: width, widths: [width])[0]
        if c.addCrossAttention {
            crossNorm = try layerNormParameters(tensor, "\(prefix).ln_cross_attn", size: width, affine: true)
            crossQuery = try conv1DSplit(tensor, "\(prefix).crossattention.q_attn", inFeatures: width, widths: [width])[0]
            let keyValue = try conv1DSplit(tensor, "\(prefix).crossattention.c_attn", inFeatures: width, widths: [width, width])
            (crossKey, crossValue) = (keyValue[0], keyValue[1])
            crossOutput = try conv1DSplit(tensor, "\(prefix).crossattention.c_proj", inFeatures: width, widths: [width])[0]
        } else {
            (crossNorm, crossQuery, crossKey, crossValue, crossOutput) = (nil, nil, nil, nil, nil)
        }
        up = try conv1DSplit(tensor, "\(prefix).mlp.c_fc", inFeatures: width, widths: [c.innerSize])[0]
        down = try conv1DSplit(tensor, "\(prefix).mlp.c_proj", inFeatures: c.innerSize, widths: [width])[0]
    }
}

/// A GPT-2 causal language model (transformers' `GPT2LMHeadModel`).
///
/// Inputs are batches of equal-length rows, left-padded, with transformers' `attention_mask` and `position_ids`
/// (nil positions are `cached ..< cached + T` for every row, padding included, as GPT-2's forward does; `generate`
/// passes each row's own count). A checkpoint with `add_cross_attention` runs as a plain decoder through this type
/// (its cross-attention skipped, as transformers does without encoder states), and attends to an encoder's output
/// through ``attending(to:attentionMask:)``.
public final class GPT2LMHeadModel: CausalLanguageModel, CrossAttendingModel, @unchecked Sendable {
    public let config: GPT2Config
    let tokenTable: Tensor
    let positionTable: Tensor
    let blocks: [GPT2Block]
    let finalNorm: (weight: Tensor, bias: Tensor)
    let lmHead: Linear
    let activation: Activation
    /// The config's path, for errors about what the checkpoint lacks.
    let configFile: String

    /// Builds the model from `config` and a source of weights by Hugging Face name relative to the transformer
    /// (`wte.weight`, `h.0.…`; `lm_head` is `lmHeadWeight`), each of which must have the given shape.
    init(config: GPT2Config, file: String, tensor: (String, [Int]) throws -> Tensor,
         lmHeadWeight: () throws -> Tensor) throws {
        try config.validate(file: file)
        self.config = config
        configFile = file
        activation = try Activation(huggingFaceName: config.activationFunction, file: file)
        tokenTable = try tensor("wte.weight", [config.vocabSize, config.hiddenSize])
        positionTable = try tensor("wpe.weight", [config.maxPositionEmbeddings, config.hiddenSize])
        blocks = try (0..<config.numHiddenLayers).map { try GPT2Block(config: config, tensor: tensor, prefix: "h.\($0)") }
        finalNorm = try layerNormParameters(tensor, "ln_f", size: config.hiddenSize, affine: true)
        lmHead = try Linear(weight: config.tieWordEmbeddings ? tokenTable : lmHeadWeight(), bias: nil)
    }

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `gpt2`, saved
    /// as `GPT2LMHeadModel` (`transformer.…`) or as `GPT2Model` (no prefix, as OpenAI's gpt2 repository).
    public convenience init(directory: ModelDirectory) throws {
        let configPath = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard type == "gpt2" else {
            throw ModelError.unsupportedModelType(type, supported: ["gpt2"], file: configPath)
        }
        let config = try directory.decode(GPT2Config.self)
        let weights = try WeightStore(directory: directory.url)
        let prefix = weights.contains("transformer.wte.weight") ? "transformer." : ""
        try self.init(config: config, file: configPath, tensor: { try weights.tensor(prefix + $0, shape: $1) },
                      lmHeadWeight: { try weights.tensor("lm_head.weight", shape: [config.vocabSize, config.hiddenSize]) })
    }

    public var vocabularySize: Int { config.vocabSize }
    public var contextLength: Int? { config.maxPositionEmbeddings }

    public func embed(_ ids: [[Int]]) throws -> Tensor { try tokenEmbeddings(ids, table: tokenTable) }

    public func makeCache(batch: Int, capacity: Int) throws -> KVCache {
        try makeBoundedCache(batch: batch, capacity: capacity, layers: blocks.count, width: config.hiddenSize,
                             heads: config.numAttentionHeads, elementType: cacheElementType)
    }

    /// What `makeCache`'s self-attention caches hold keys and values in: ``KVCache/ElementType/forNewModels`` where
    /// the model was built (cross-attention keeps its encoder's keys and values in fp32).
    public let cacheElementType = KVCache.ElementType.forNewModels

    public func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        try logits(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache,
                   lastPositionOnly: lastPositionOnly, encoder: nil)
    }

    /// This decoder attending to an encoder's output: the cross-attention keys and values of every layer are
    /// computed here, once, and every pass and generation step of the returned model reuses them.
    ///
    /// - Parameters:
    ///   - encoderHiddenStates: `[B, S, hiddenSize]` (a vision encoder's last hidden state, projected if need be).
    ///   - attentionMask: `[B][S]`, 1 for positions to attend to; nil attends to all.
    /// - Returns: a model whose passes take `B` rows, or `k·B` rows with row `r` attending to encoder row `r / k`
    ///   (beams or several sequences per input, as generate expands them).
    /// - Throws: `ModelError.invalidConfig` when the checkpoint has no cross-attention, `invalidInput` for shapes.
    public func attending(to encoderHiddenStates: Tensor, attentionMask: [[Int]]? = nil) throws -> CrossAttendingDecoder {
        guard config.addCrossAttention else {
            throw ModelError.invalidConfig("this GPT-2 has no cross-attention (add_cross_attention is false)", file: configFile)
        }
        guard encoderHiddenStates.rank == 3, encoderHiddenStates.shape[0] > 0, encoderHiddenStates.shape[1] > 0,
              encoderHiddenStates.shape[2] == config.hiddenSize else {
            throw ModelError.invalidInput("encoder hidden states must be [B, S, \(config.hiddenSize)], got \(encoderHiddenStates.shape)")
        }
        let (batch, length) = (encoderHiddenStates.shape[0], encoderHiddenStates.shape[1])
        let mask = try encoderKeyPaddingMask(attentionMask, batch: batch, length: length)
        let context = CrossAttentionContext(keys: blocks.map { $0.crossKey!(encoderHiddenStates) },
                                         values: blocks.map { $0.crossValue!(encoderHiddenStates) },
                                         mask: mask, batch: batch, length: length)
        return CrossAttendingDecoder(model: self, context: context)
    }

    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool, encoder: CrossAttentionContext?) throws -> Tensor {
        let pass = try DecoderPass(inputsEmbeds: inputsEmbeds, width: config.hiddenSize, attentionMask: attentionMask,
                                   cache: cache, layers: blocks.count, cacheWidth: config.hiddenSize)
        let (batch, length) = (pass.batch, pass.length)
        try encoder?.check(rows: batch)
        if length == 0 { return Tensor(zeros: [batch, 0, config.vocabSize]) }
        let positions = try pass.positions(positionIds, below: config.maxPositionEmbeddings)
        var hidden = add(inputsEmbeds, learnedPositions(positionTable, positions: positions))
        for (index, block) in blocks.enumerated() {
            hidden = self.block(block, index: index, hidden: hidden, pass: pass, cache: cache, encoder: encoder)
        }
        cache?.advance(by: length)
        hidden = layerNorm(hidden, weight: finalNorm.weight, bias: finalNorm.bias, eps: config.layerNormEpsilon)
        if lastPositionOnly && length > 1 {
            hidden = gatherTokens(hidden, positions: Array(repeating: length - 1, count: batch)).reshaped([batch, 1, config.hiddenSize])
        }
        return lmHead(hidden)
    }

    private func block(_ block: GPT2Block, index: Int, hidden: Tensor, pass: DecoderPass, cache: KVCache?,
                       encoder: CrossAttentionContext?) -> Tensor {
        let eps = config.layerNormEpsilon, scale = config.attentionScale(layer: index)
        let normed = layerNorm(hidden, weight: block.norm1.weight, bias: block.norm1.bias, eps: eps)
        let attended = pass.selfAttention(query: block.query(normed), key: block.key(normed), value: block.value(normed),
                                          layer: index, cache: cache, heads: config.numAttentionHeads, scale: scale)
        var residual = block.output(attended, residual: hidden)
        if let encoder, let crossNorm = block.crossNorm, let crossQuery = block.crossQuery, let crossOutput = block.crossOutput {
            let crossNormed = layerNorm(residual, weight: crossNorm.weight, bias: crossNorm.bias, eps: eps)
            let operands = encoder.operands(layer: index, rows: pass.batch)
            let crossAttended = attention(query: crossQuery(crossNormed), key: operands.keys, value: operands.values,
                                          heads: config.numAttentionHeads, keyPaddingMask: operands.mask, scale: scale)
            residual = crossOutput(crossAttended, residual: residual)
        }
        let normedAgain = layerNorm(residual, weight: block.norm2.weight, bias: block.norm2.bias, eps: eps)
        return block.down(block.up(normedAgain, activation: activation), residual: residual)
    }
}
