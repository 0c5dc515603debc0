import Foundation
import VLMCheckpoint
import VLMTensor

// Google's T5 as transformers' models/t5/modeling_t5.py builds it (the language model of BLIP-2 with Flan-T5): an
// encoder–decoder without biases, whose attention is unscaled and biased by learned buckets of relative position
// (computed by each stack's first layer, shared by the others), with RMS layer norms before each sublayer. The
// original T5 ties its lm_head to the shared embedding and scales decoder outputs by d_model^-0.5 before it; T5 v1.1
// and Flan-T5 have an lm_head of their own, a gated-GELU MLP, and no rescaling.

/// transformers' `T5Config`, with its defaults.
public struct T5Config: Decodable, Sendable {
    public var vocabSize: Int
    /// `d_model`: the width of the embeddings and of every residual stream.
    public var dModel: Int
    /// `d_kv`: the width of one attention head (heads · d_kv need not be d_model).
    public var dKv: Int
    /// `d_ff`: the MLP's inner width.
    public var dFf: Int
    /// Encoder layers.
    public var numLayers: Int
    /// Decoder layers, `num_layers` when absent.
    public var numDecoderLayers: Int
    public var numHeads: Int
    public var relativeAttentionNumBuckets: Int
    /// Relative distances from this one on share the last bucket.
    public var relativeAttentionMaxDistance: Int
    public var layerNormEpsilon: Float
    /// "relu", "gated-gelu", "gated-silu", …: `{act}` or `gated-{act}`.
    public var feedForwardProj: String
    /// The MLP's activation (`dense_act_fn`): the part of `feed_forward_proj` after "gated-", gelu_new for
    /// "gated-gelu", unless config.json names it.
    public var denseActFn: String
    /// The MLP multiplies the activation of `wi_0` by `wi_1` (`is_gated_act`), from `feed_forward_proj` unless
    /// config.json says.
    public var isGatedAct: Bool
    /// Decoder outputs are multiplied by d_model^-0.5 before the lm_head (`scale_decoder_outputs`): as config.json
    /// says, else unless `tie_word_embeddings` is false (the original T5 scales, T5 v1.1 and Flan-T5 do not).
    public var scaleDecoderOutputs: Bool
    /// The token every decoder sequence starts from (T5's checkpoints use the pad token, 0); nil when unset.
    public var decoderStartTokenId: Int?
    public var padTokenId: Int?
    public var eosTokenIds: [Int]

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", dModel = "d_model", dKv = "d_kv", dFf = "d_ff", numLayers = "num_layers"
        case numDecoderLayers = "num_decoder_layers", numHeads = "num_heads"
        case relativeAttentionNumBuckets = "relative_attention_num_buckets"
        case relativeAttentionMaxDistance = "relative_attention_max_distance", layerNormEpsilon = "layer_norm_epsilon"
        case feedForwardProj = "feed_forward_proj", denseActFn = "dense_act_fn", isGatedAct = "is_gated_act"
        case scaleDecoderOutputs = "scale_decoder_outputs", tieWordEmbeddings = "tie_word_embeddings"
        case decoderStartTokenId = "decoder_start_token_id", padTokenId = "pad_token_id", eosTokenId = "eos_token_id"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 32128)
        dModel = try c.value(.dModel, default: 512)
        dKv = try c.value(.dKv, default: 64)
        dFf = try c.value(.dFf, default: 2048)
        numLayers = try c.value(.numLayers, default: 6)
        numDecoderLayers = try c.value(.numDecoderLayers, default: numLayers)
        numHeads = try c.value(.numHeads, default: 8)
        relativeAttentionNumBuckets = try c.value(.relativeAttentionNumBuckets, default: 32)
        relativeAttentionMaxDistance = try c.value(.relativeAttentionMaxDistance, default: 128)
        layerNormEpsilon = try c.value(.layerNormEpsilon, default: 1e-6)
        feedForwardProj = try c.value(.feedForwardProj, default: "relu")
        let parts = feedForwardProj.split(separator: "-", omittingEmptySubsequences: false)
        let derivedActivation = feedForwardProj == "gated-gelu" ? "gelu_new" : String(parts.last ?? "")
        denseActFn = try c.value(.denseActFn, default: derivedActivation)
        isGatedAct = try c.value(.isGatedAct, default: parts.first == "gated")
        let tied = try c.decodeIfPresent(Bool.self, forKey: .tieWordEmbeddings)
        scaleDecoderOutputs = try c.value(.scaleDecoderOutputs, default: tied != false)
        decoderStartTokenId = try c.decodeIfPresent(Int.self, forKey: .decoderStartTokenId)
        padTokenId = c.contains(.padTokenId) ? try c.decodeIfPresent(Int.self, forKey: .padTokenId) : 0
        eosTokenIds = try decodeTokenIds(c, .eosTokenId, default: [1])
    }

    /// heads · d_kv: the width of the attention projections.
    var innerSize: Int { numHeads * dKv }

    func validate(file: String) throws {
        let counts = [("vocab_size", vocabSize), ("d_model", dModel), ("d_kv", dKv), ("d_ff", dFf),
                      ("num_layers", numLayers), ("num_decoder_layers", numDecoderLayers), ("num_heads", numHeads)]
        for (key, value) in counts where value <= 0 {
            throw ModelError.invalidConfig("\(key) is \(value), expected a positive count", file: file)
        }
        let parts = feedForwardProj.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 1 || (parts.count == 2 && parts[0] == "gated") else {
            throw ModelError.invalidConfig(
                "feed_forward_proj \"\(feedForwardProj)\" is neither an activation nor gated-{activation}", file: file)
        }
        // The logarithmic buckets start at a quarter of the bucket count (half, for the decoder's one-sided ones)
        // and must end further out.
        guard relativeAttentionNumBuckets >= 4, relativeAttentionMaxDistance > relativeAttentionNumBuckets / 2 else {
            throw ModelError.invalidConfig(
                "relative_attention_num_buckets \(relativeAttentionNumBuckets) and relative_attention_max_distance "
                    + "\(relativeAttentionMaxDistance): need at least 4 buckets and a maximum distance beyond half of them",
                file: file)
        }
    }
}

/// transformers' `T5Attention._relative_position_bucket`: the bucket of `relative = keyPosition − queryPosition`.
/// Distances below half the buckets (per direction, when `bidirectional`) have one bucket each; longer ones share
/// logarithmically wider buckets up to `maxDistance`, and the last bucket beyond. Computed in fp32 as PyTorch does.
func relativePositionBucket(_ relative: Int, bidirectional: Bool, buckets: Int, maxDistance: Int) -> Int {
    var buckets = buckets, bucket = 0, distance: Int
    if bidirectional {
        buckets /= 2
        if relative > 0 { bucket += buckets }
        distance = abs(relative)
    } else {
        distance = max(-relative, 0)
    }
    let maxExact = buckets / 2
    if distance < maxExact { return bucket + distance }
    // PyTorch divides the float tensor by math.log's double result rounded to float.
    let logarithmic = log(Float(distance) / Float(maxExact)) / Float(log(Double(maxDistance) / Double(maxExact)))
        * Float(buckets - maxExact)
    return bucket + min(maxExact + Int(logarithmic), buckets - 1)
}

/// A T5 attention sublayer's projections (`SelfAttention` or `EncDecAttention`): q, k, v from d_model to
/// heads · d_kv and o back, none with a bias.
struct T5Attention {
    let query: Linear, key: Linear, value: Linear, output: Linear

    init(_ weights: Weights, config: T5Config) throws {
        let (width, inner) = (config.dModel, config.innerSize)
        query = try Linear(weights.scoped("q"), inFeatures: width, outFeatures: inner, bias: false)
        key = try Linear(weights.scoped("k"), inFeatures: width, outFeatures: inner, bias: false)
        value = try Linear(weights.scoped("v"), inFeatures: width, outFeatures: inner, bias: false)
        output = try Linear(weights.scoped("o"), inFeatures: inner, outFeatures: width, bias: false)
    }
}

/// `T5LayerFF`: `x + wo(act(wi(norm(x))))`, or with a gated activation `x + wo(act(wi_0(norm(x))) · wi_1(norm(x)))`.
struct T5FeedForward {
    let norm: Tensor
    /// `wi`, or `wi_0` and `wi_1` stacked into one product whose halves the gated activation combines.
    let input: Linear
    let output: Linear
    let activation: Activation
    let gated: Bool
    let eps: Float

    /// `weights` is the sublayer (`….layer.1` in the encoder, `….layer.2` in the decoder).
    init(_ weights: Weights, config: T5Config, activation: Activation) throws {
        let (width, inner) = (config.dModel, config.dFf)
        norm = try weights("layer_norm.weight", shape: [width])
        let dense = weights.scoped("DenseReluDense")
        if config.isGatedAct {
            input = try Linear(weight: concatenate([dense("wi_0.weight", shape: [inner, width]),
                                                    dense("wi_1.weight", shape: [inner, width])], axis: 0), bias: nil)
        } else {
            input = try Linear(dense.scoped("wi"), inFeatures: width, outFeatures: inner, bias: false)
        }
        output = try Linear(dense.scoped("wo"), inFeatures: inner, outFeatures: width, bias: false)
        self.activation = activation
        gated = config.isGatedAct
        eps = config.layerNormEpsilon
    }

    func callAsFunction(_ x: Tensor) -> Tensor {
        let normed = rmsNorm(x, weight: norm, eps: eps)
        let inner = gated ? gatedActivation(input(normed), activation: activation) : input(normed, activation: activation)
        return output(inner, residual: x)
    }
}

/// An encoder `T5Block`: self-attention, then the MLP, each behind its own RMS norm and added to the residual stream.
struct T5EncoderBlock {
    let selfNorm: Tensor
    let selfAttention: T5Attention
    let feedForward: T5FeedForward

    /// `weights` is the block (`encoder.block.3`).
    init(_ weights: Weights, config: T5Config, activation: Activation) throws {
        selfNorm = try weights("layer.0.layer_norm.weight", shape: [config.dModel])
        selfAttention = try T5Attention(weights.scoped("layer.0.SelfAttention"), config: config)
        feedForward = try T5FeedForward(weights.scoped("layer.1"), config: config, activation: activation)
    }
}

/// A decoder `T5Block`: causal self-attention, attention to the encoder's output (`EncDecAttention`), then the MLP.
struct T5DecoderBlock {
    let selfNorm: Tensor
    let selfAttention: T5Attention
    let crossNorm: Tensor
    let crossAttention: T5Attention
    let feedForward: T5FeedForward

    /// `weights` is the block (`decoder.block.0`).
    init(_ weights: Weights, config: T5Config, activation: Activation) throws {
        selfNorm = try weights("layer.0.layer_norm.weight", shape: [config.dModel])
        selfAttention = try T5Attention(weights.scoped("layer.0.SelfAttention"), config: config)
        crossNorm = try weights("layer.1.layer_norm.weight", shape: [config.dModel])
        crossAttention = try T5Attention(weights.scoped("layer.1.EncDecAttention"), config: config)
        feedForward = try T5FeedForward(weights.scoped("layer.2"), config: config, activation: activation)
    }
}

/// A T5 encoder–decoder with its language-modeling head (transformers' `T5ForConditionalGeneration`): T5, T5 v1.1,
/// Flan-T5 checkpoints.
///
/// ``encode(inputIds:attentionMask:)`` (or ``encode(inputsEmbeds:attentionMask:)``, for embeddings with image
/// features spliced in) runs the encoder; ``attending(to:attentionMask:)`` binds the decoder to its output as a
/// ``CausalLanguageModel`` that `generate` drives from `[[decoderStartTokenId]]`. ``generate(inputIds:attentionMask:config:)``
/// does both. Computation is fp32 whatever the stored precision.
public final class T5ForConditionalGeneration: CrossAttendingModel, @unchecked Sendable {
    public let config: T5Config
    /// `shared`: the token embeddings of both stacks, and the lm_head when it is tied.
    let shared: Tensor
    let encoderBlocks: [T5EncoderBlock], decoderBlocks: [T5DecoderBlock]
    /// Each stack's first-layer `relative_attention_bias` table, `[buckets, heads]`.
    let encoderPositionTable: Tensor, decoderPositionTable: Tensor
    let encoderFinalNorm: Tensor, decoderFinalNorm: Tensor
    let lmHead: Linear
    /// The config's path, for errors about what the checkpoint lacks.
    let configFile: String

    /// Builds the model from `config` and weights by their Hugging Face names (`shared.weight`,
    /// `encoder.block.0.layer.0.SelfAttention.q.weight`, …). The lm_head is `lm_head.weight` where the checkpoint has
    /// one (Flan-T5's own; a tied copy equals `shared`), else `shared`, as transformers ties it.
    init(config: T5Config, file: String, weights: Weights) throws {
        try config.validate(file: file)
        self.config = config
        configFile = file
        let activation = try Activation(huggingFaceName: config.denseActFn, file: file)
        let embeddingShape = [config.vocabSize, config.dModel]
        shared = try weights("shared.weight", shape: embeddingShape)
        encoderBlocks = try (0..<config.numLayers).map {
            try T5EncoderBlock(weights.scoped("encoder.block.\($0)"), config: config, activation: activation)
        }
        decoderBlocks = try (0..<config.numDecoderLayers).map {
            try T5DecoderBlock(weights.scoped("decoder.block.\($0)"), config: config, activation: activation)
        }
        let tableName = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        let tableShape = [config.relativeAttentionNumBuckets, config.numHeads]
        encoderPositionTable = try weights.scoped("encoder")(tableName, shape: tableShape)
        decoderPositionTable = try weights.scoped("decoder")(tableName, shape: tableShape)
        encoderFinalNorm = try weights("encoder.final_layer_norm.weight", shape: [config.dModel])
        decoderFinalNorm = try weights("decoder.final_layer_norm.weight", shape: [config.dModel])
        let ownHead = weights.contains("lm_head.weight")
        lmHead = try Linear(weight: ownHead ? weights("lm_head.weight", shape: embeddingShape) : shared, bias: nil)
    }

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `t5`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard type == "t5" else {
            throw ModelError.unsupportedModelType(type, supported: ["t5"], file: configPath)
        }
        try self.init(config: directory.decode(T5Config.self), file: configPath,
                      weights: Weights(WeightStore(directory: directory.url)))
    }

    /// Size of the logits' last dimension.
    public var vocabularySize: Int { config.vocabSize }

    /// Rows of the shared embedding table for token ids `[B][T]`: `[B, T, d_model]`, what either stack takes.
    public func embed(_ ids: [[Int]]) throws -> Tensor { try tokenEmbeddings(ids, table: shared) }

    /// The encoder's last hidden state for token ids `[B][S]` (right-padded, as T5's tokenizer pads): `[B, S, d_model]`.
    ///
    /// - Parameter attentionMask: `[B][S]`, 1 for tokens and 0 for padding; nil attends to all.
    public func encode(inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        try encode(inputsEmbeds: embed(inputIds), attentionMask: attentionMask)
    }

    /// The encoder's last hidden state for input embeddings `[B, S, d_model]` (BLIP-2 splices image features into
    /// them): `[B, S, d_model]`. Padded positions are computed too, attending to the unpadded ones.
    public func encode(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil) throws -> Tensor {
        guard inputsEmbeds.rank == 3, inputsEmbeds.shape[0] > 0, inputsEmbeds.shape[1] > 0,
              inputsEmbeds.shape[2] == config.dModel else {
            throw ModelError.invalidInput("inputs_embeds must be [B, S, \(config.dModel)], got \(inputsEmbeds.shape)")
        }
        let length = inputsEmbeds.shape[1]
        let mask = try encoderKeyPaddingMask(attentionMask, batch: inputsEmbeds.shape[0], length: length)
        let bias = positionBias(encoderPositionTable, bidirectional: true, queryLength: length, keyLength: length, past: 0)
        var hidden = inputsEmbeds
        for block in encoderBlocks {
            let normed = rmsNorm(hidden, weight: block.selfNorm, eps: config.layerNormEpsilon)
            let projections = block.selfAttention
            let attended = attention(query: projections.query(normed), key: projections.key(normed),
                                     value: projections.value(normed), heads: config.numHeads, scoreBias: bias,
                                     keyPaddingMask: mask)
            hidden = block.feedForward(projections.output(attended, residual: hidden))
        }
        return rmsNorm(hidden, weight: encoderFinalNorm, eps: config.layerNormEpsilon)
    }

    /// The decoder attending to an encoder's output: the cross-attention keys and values of every layer are
    /// computed here, once, and every pass and generation step of the returned model reuses them.
    ///
    /// - Parameters:
    ///   - encoderHiddenStates: `[B, S, d_model]`, from ``encode(inputIds:attentionMask:)``.
    ///   - attentionMask: the encoder's `[B][S]` mask; nil attends to all.
    /// - Returns: a model whose passes take `B` rows, or `k·B` rows with row `r` attending to encoder row `r / k`
    ///   (beams or several sequences per input, as generate expands them).
    public func attending(to encoderHiddenStates: Tensor, attentionMask: [[Int]]? = nil) throws -> CrossAttendingDecoder {
        guard encoderHiddenStates.rank == 3, encoderHiddenStates.shape[0] > 0, encoderHiddenStates.shape[1] > 0,
              encoderHiddenStates.shape[2] == config.dModel else {
            throw ModelError.invalidInput("encoder hidden states must be [B, S, \(config.dModel)], got \(encoderHiddenStates.shape)")
        }
        let (batch, length) = (encoderHiddenStates.shape[0], encoderHiddenStates.shape[1])
        let context = CrossAttentionContext(keys: decoderBlocks.map { $0.crossAttention.key(encoderHiddenStates) },
                                            values: decoderBlocks.map { $0.crossAttention.value(encoderHiddenStates) },
                                            mask: try encoderKeyPaddingMask(attentionMask, batch: batch, length: length),
                                            batch: batch, length: length)
        return CrossAttendingDecoder(model: self, context: context)
    }

    /// transformers' `generate` for this encoder–decoder: the prompts are encoded once, then every row decodes from
    /// `decoder_start_token_id` under `config` (greedy, sampling or beam search).
    ///
    /// - Returns: the new tokens, which are transformers' `sequences` without their first token (the decoder start).
    /// - Throws: `ModelError.invalidConfig` when config.json sets no `decoder_start_token_id`.
    public func generate(inputIds: [[Int]], attentionMask: [[Int]]? = nil,
                         config generation: GenerationConfig) throws -> GenerationOutput {
        try generate(inputsEmbeds: embed(inputIds), attentionMask: attentionMask, config: generation)
    }

    /// ``generate(inputIds:attentionMask:config:)`` from encoder input embeddings `[B, S, d_model]`.
    public func generate(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil,
                         config generation: GenerationConfig) throws -> GenerationOutput {
        guard let start = config.decoderStartTokenId else {
            throw ModelError.invalidConfig("decoder_start_token_id is not set", file: configFile)
        }
        let encoded = try encode(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask)
        let decoder = try attending(to: encoded, attentionMask: attentionMask)
        return try decoder.generate(inputIds: Array(repeating: [start], count: inputsEmbeds.shape[0]), config: generation)
    }

    /// `[heads, queryLength, keyLength]`: the relative position bias of queries at positions `past ..< past +
    /// queryLength` over keys at `0 ..< keyLength` (`T5Attention.compute_bias`).
    func positionBias(_ table: Tensor, bidirectional: Bool, queryLength: Int, keyLength: Int, past: Int) -> Tensor {
        let buckets = (past..<(past + queryLength)).flatMap { query in
            (0..<keyLength).map { key in
                relativePositionBucket(key - query, bidirectional: bidirectional, buckets: config.relativeAttentionNumBuckets,
                                       maxDistance: config.relativeAttentionMaxDistance)
            }
        }
        return embeddingColumns(table, ids: buckets).reshaped([config.numHeads, queryLength, keyLength])
    }

    /// The decoder's self-attention cache.
    func makeCache(batch: Int, capacity: Int) throws -> KVCache {
        try makeBoundedCache(batch: batch, capacity: capacity, layers: decoderBlocks.count, width: config.innerSize)
    }

    /// The decoder's logits. Position ids are ignored: its self-attention bias counts positions from the cache's
    /// length, as transformers' does.
    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool, encoder: CrossAttentionContext?) throws -> Tensor {
        let pass = try DecoderPass(inputsEmbeds: inputsEmbeds, width: config.dModel, attentionMask: attentionMask,
                                   cache: cache, layers: decoderBlocks.count, cacheWidth: config.innerSize)
        let (batch, length, past) = (pass.batch, pass.length, pass.past)
        try encoder?.check(rows: batch)
        if length == 0 { return Tensor(zeros: [batch, 0, config.vocabSize]) }
        let eps = config.layerNormEpsilon
        let bias = positionBias(decoderPositionTable, bidirectional: false, queryLength: length, keyLength: past + length,
                                past: past)
        var hidden = inputsEmbeds
        for (index, block) in decoderBlocks.enumerated() {
            let normed = rmsNorm(hidden, weight: block.selfNorm, eps: eps)
            let projections = block.selfAttention
            var keys = projections.key(normed), values = projections.value(normed)
            if let cache {
                cache.store(layer: index, key: keys, value: values)
                (keys, values) = (cache.keys[index], cache.values[index])
            }
            let attended = attention(query: projections.query(normed), key: keys, value: values, heads: config.numHeads,
                                     scoreBias: bias, keyLength: past + length, causal: true,
                                     keyPaddingMask: pass.keyPaddingMask)
            hidden = projections.output(attended, residual: hidden)
            if let encoder {
                let operands = encoder.operands(layer: index, rows: batch)
                let crossQuery = block.crossAttention.query(rmsNorm(hidden, weight: block.crossNorm, eps: eps))
                let crossAttended = attention(query: crossQuery, key: operands.keys, value: operands.values,
                                              heads: config.numHeads, keyPaddingMask: operands.mask, scale: 1)
                hidden = block.crossAttention.output(crossAttended, residual: hidden)
            }
            hidden = block.feedForward(hidden)
        }
        cache?.advance(by: length)
        hidden = rmsNorm(hidden, weight: decoderFinalNorm, eps: eps)
        if lastPositionOnly && length > 1 {
            hidden = gatherTokens(hidden, positions: Array(repeating: length - 1, count: batch))
                .reshaped([batch, 1, config.dModel])
        }
        if config.scaleDecoderOutputs {
            hidden = scaled(hidden, by: Float(pow(Double(config.dModel), -0.5)))
        }
        return lmHead(hidden)
    }
}
