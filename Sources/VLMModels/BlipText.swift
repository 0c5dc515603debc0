import Foundation
import VLMCheckpoint
import VLMTensor

// BLIP's text transformer as transformers' models/blip/modeling_blip_text.py builds it: BERT (learned absolute
// positions, a LayerNorm over the embeddings, post-norm layers) whose layers, under an `is_decoder` config, also
// cross-attend to encoder states between self-attention and MLP. The same weights run bidirectionally as an encoder
// (image–text matching, VQA's question encoder) or causally under the LM head (captions, VQA answers); which one is
// the caller's choice, as transformers' `is_decoder` forward argument is, not the config's.

/// transformers' `BlipTextConfig`, with its defaults.
public struct BlipTextConfig: Decodable, Sendable {
    public var vocabSize: Int
    public var hiddenSize: Int
    /// Width of the states cross-attention reads: the vision tower's `hidden_size` (`BlipConfig` sets it so).
    public var encoderHiddenSize: Int
    public var intermediateSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var maxPositionEmbeddings: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// `[DEC]` in the real checkpoints: the first token of every caption and answer.
    public var bosTokenId: Int?
    /// Only the second token of captioning's default prompt, which generate drops; generation stops at
    /// ``sepTokenId``.
    public var eosTokenIds: [Int]
    public var padTokenId: Int?
    /// `[SEP]`: where captions and answers end.
    public var sepTokenId: Int?
    /// Layers carry cross-attention (`crossattention.*`).
    public var isDecoder: Bool
    /// The LM head's decoder reuses the word embeddings.
    public var tieWordEmbeddings: Bool

    enum CodingKeys: String, CodingKey {
        case vocabSize = "vocab_size", hiddenSize = "hidden_size", encoderHiddenSize = "encoder_hidden_size"
        case intermediateSize = "intermediate_size", numHiddenLayers = "num_hidden_layers"
        case numAttentionHeads = "num_attention_heads", maxPositionEmbeddings = "max_position_embeddings"
        case hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps", bosTokenId = "bos_token_id"
        case eosTokenId = "eos_token_id", padTokenId = "pad_token_id", sepTokenId = "sep_token_id"
        case isDecoder = "is_decoder", tieWordEmbeddings = "tie_word_embeddings"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        vocabSize = try c.value(.vocabSize, default: 30524)
        hiddenSize = try c.value(.hiddenSize, default: 768)
        encoderHiddenSize = try c.value(.encoderHiddenSize, default: 768)
        intermediateSize = try c.value(.intermediateSize, default: 3072)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 8)
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 512)
        hiddenAct = try c.value(.hiddenAct, default: "gelu")
        layerNormEps = try c.value(.layerNormEps, default: 1e-12)
        // An explicit null is kept as no token, as transformers keeps it.
        bosTokenId = c.contains(.bosTokenId) ? try c.decodeIfPresent(Int.self, forKey: .bosTokenId) : 30522
        eosTokenIds = try decodeTokenIds(c, .eosTokenId, default: [2])
        padTokenId = c.contains(.padTokenId) ? try c.decodeIfPresent(Int.self, forKey: .padTokenId) : 0
        sepTokenId = c.contains(.sepTokenId) ? try c.decodeIfPresent(Int.self, forKey: .sepTokenId) : 102
        isDecoder = try c.value(.isDecoder, default: true)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: true)
    }

    func validate(file: String) throws {
        let counts = [("vocab_size", vocabSize), ("hidden_size", hiddenSize), ("encoder_hidden_size", encoderHiddenSize),
                      ("intermediate_size", intermediateSize), ("num_attention_heads", numAttentionHeads),
                      ("max_position_embeddings", maxPositionEmbeddings)]
        for (key, value) in counts where value <= 0 {
            throw ModelError.invalidConfig("text_config.\(key) is \(value), expected a positive count", file: file)
        }
        guard numHiddenLayers >= 0 else {
            throw ModelError.invalidConfig("text_config.num_hidden_layers is \(numHiddenLayers)", file: file)
        }
        guard hiddenSize % numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("text_config.hidden_size \(hiddenSize) does not split into \(numAttentionHeads) heads", file: file)
        }
    }
}

/// `BlipTextSelfOutput` and `BlipTextOutput`: a dense layer, then LayerNorm of its sum with the block's input.
struct PostNormOutput {
    let dense: Linear
    let norm: LayerNorm

    init(_ weights: Weights, inFeatures: Int, outFeatures: Int, eps: Float) throws {
        dense = try Linear(weights.scoped("dense"), inFeatures: inFeatures, outFeatures: outFeatures)
        norm = try LayerNorm(weights.scoped("LayerNorm"), size: outFeatures, eps: eps)
    }

    func callAsFunction(_ x: Tensor, residual: Tensor) -> Tensor { norm(dense(x, residual: residual)) }
}

/// `crossattention`: queries from the text, keys and values from the encoder states, which a binding projects
/// once (`CrossAttentionContext`).
struct BlipTextCrossAttention {
    let query: Linear
    let keyValue: StackedProjections
    let output: PostNormOutput

    init(_ weights: Weights, config c: BlipTextConfig) throws {
        let attention = weights.scoped("self")
        query = try Linear(attention.scoped("query"), inFeatures: c.hiddenSize, outFeatures: c.hiddenSize)
        keyValue = try StackedProjections(
            weights: ["key", "value"].map { try .dense(attention.scoped($0)("weight", shape: [c.hiddenSize, c.encoderHiddenSize])) },
            biases: ["key", "value"].map { try attention.scoped($0)("bias", shape: [c.hiddenSize]) })
        output = try PostNormOutput(weights.scoped("output"), inFeatures: c.hiddenSize, outFeatures: c.hiddenSize,
                                    eps: c.layerNormEps)
    }
}

/// `BlipTextLayer`: self-attention, cross-attention when the config has it and the pass has encoder states, MLP;
/// each followed by LayerNorm over its residual sum.
struct BlipTextLayer {
    let queryKeyValue: StackedProjections
    let attentionOutput: PostNormOutput
    let crossAttention: BlipTextCrossAttention?
    let intermediate: Linear
    let output: PostNormOutput

    init(_ weights: Weights, config c: BlipTextConfig) throws {
        let selfAttention = weights.scoped("attention.self")
        let names = ["query", "key", "value"]
        queryKeyValue = try StackedProjections(
            weights: names.map { try .dense(selfAttention.scoped($0)("weight", shape: [c.hiddenSize, c.hiddenSize])) },
            biases: names.map { try selfAttention.scoped($0)("bias", shape: [c.hiddenSize]) })
        attentionOutput = try PostNormOutput(weights.scoped("attention.output"), inFeatures: c.hiddenSize,
                                             outFeatures: c.hiddenSize, eps: c.layerNormEps)
        crossAttention = c.isDecoder ? try BlipTextCrossAttention(weights.scoped("crossattention"), config: c) : nil
        intermediate = try Linear(weights.scoped("intermediate.dense"), inFeatures: c.hiddenSize, outFeatures: c.intermediateSize)
        output = try PostNormOutput(weights.scoped("output"), inFeatures: c.intermediateSize, outFeatures: c.hiddenSize,
                                    eps: c.layerNormEps)
    }
}

/// transformers' `BlipTextModel` as BLIP's heads build it (`add_pooling_layer=False`): embeddings and layers,
/// returning the last hidden state.
///
/// ``lastHiddenState(inputIds:attentionMask:encoderHiddenStates:encoderAttentionMask:)`` runs it as an encoder
/// (bidirectional self-attention, transformers' default `is_decoder=False`); ``BlipTextLMHeadModel`` runs the same
/// layers causally.
public final class BlipTextModel: @unchecked Sendable {
    public let config: BlipTextConfig
    let wordEmbeddings: Tensor
    let positionEmbeddings: Tensor
    let embeddingNorm: LayerNorm
    let layers: [BlipTextLayer]
    let activation: Activation
    /// The config's path, for errors about the configuration.
    let configFile: String

    /// Builds the model from weights named as under transformers' `BlipTextModel` (`embeddings.word_embeddings.weight`,
    /// `encoder.layer.0.attention.self.query.weight`, …) relative to `weights`.
    public init(config: BlipTextConfig, weights: Weights, file: String = "config.json") throws {
        try config.validate(file: file)
        self.config = config
        configFile = file
        activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        let embeddings = weights.scoped("embeddings")
        wordEmbeddings = try embeddings("word_embeddings.weight", shape: [config.vocabSize, config.hiddenSize])
        positionEmbeddings = try embeddings("position_embeddings.weight", shape: [config.maxPositionEmbeddings, config.hiddenSize])
        embeddingNorm = try LayerNorm(embeddings.scoped("LayerNorm"), size: config.hiddenSize, eps: config.layerNormEps)
        layers = try (0..<config.numHiddenLayers).map { try BlipTextLayer(weights.scoped("encoder.layer.\($0)"), config: config) }
    }

    /// The last hidden state `[B, T, hiddenSize]` of token ids `[B][T]` (equal lengths, right-padded as BERT's
    /// tokenizer pads), self-attention bidirectional over the unmasked tokens.
    ///
    /// - Parameters:
    ///   - attentionMask: `[B][T]`, 1 for tokens and 0 for padding; nil means all tokens.
    ///   - encoderHiddenStates: `[E, S, encoderHiddenSize]` (image embeds, the vision tower's last hidden state) for
    ///     every layer's cross-attention, with `B` a multiple of `E` (row `b` attends to encoder row `b / (B / E)`);
    ///     nil skips cross-attention, as transformers does without them.
    ///   - encoderAttentionMask: `[E][S]`; nil attends to every encoder position.
    /// - Throws: `ModelError.invalidInput` for shapes and ids, `invalidConfig` for encoder states given to a model
    ///   without cross-attention.
    public func lastHiddenState(inputIds: [[Int]], attentionMask: [[Int]]? = nil, encoderHiddenStates: Tensor? = nil,
                                encoderAttentionMask: [[Int]]? = nil) throws -> Tensor {
        let length = try equalRowLength(inputIds, "input ids")
        guard length > 0, length <= config.maxPositionEmbeddings else {
            throw ModelError.invalidInput("BLIP text takes 1 to \(config.maxPositionEmbeddings) tokens per row, got \(length)")
        }
        let batch = inputIds.count
        var keyPaddingMask: Tensor?
        if let attentionMask {
            guard attentionMask.count == batch, attentionMask.allSatisfy({ $0.count == length }) else {
                throw ModelError.invalidInput("the attention mask must be [\(batch)][\(length)]")
            }
            if attentionMask.contains(where: { $0.contains(0) }) {
                keyPaddingMask = Tensor(shape: [batch, length], scalars: attentionMask.flatMap { $0.map { $0 != 0 ? 1 : 0 } })
            }
        }
        let encoder = try encoderHiddenStates.map { try crossAttentionContext($0, attentionMask: encoderAttentionMask) }
        try encoder?.check(rows: batch)
        let positions = Array(repeating: Array(0..<length), count: batch)
        let heads = config.numAttentionHeads
        return run(embedded(try tokenEmbeddings(inputIds, table: wordEmbeddings), positions: positions), encoder: encoder) { _, query, key, value in
            attention(query: query, key: key, value: value, heads: heads, keyPaddingMask: keyPaddingMask)
        }
    }

    /// `BlipTextEmbeddings`: LayerNorm of token embeddings `[B, T, hiddenSize]` plus the learned positions.
    func embedded(_ inputsEmbeds: Tensor, positions: [[Int]]) -> Tensor {
        embeddingNorm(add(inputsEmbeds, learnedPositions(positionEmbeddings, positions: positions)))
    }

    /// The layers over `hidden [B, T, hiddenSize]`; `selfAttention(layer, query, key, value)` is the attention of
    /// the pass (bidirectional, or causal through a KV cache), `encoder` the cross-attention operands, if any.
    func run(_ hidden: Tensor, encoder: CrossAttentionContext?,
             selfAttention: (_ layer: Int, _ query: Tensor, _ key: Tensor, _ value: Tensor) -> Tensor) -> Tensor {
        var hidden = hidden
        let rows = hidden.shape[0], heads = config.numAttentionHeads
        for (index, layer) in layers.enumerated() {
            let projections = layer.queryKeyValue(hidden)
            let attended = selfAttention(index, projections[0], projections[1], projections[2])
            var state = layer.attentionOutput(attended, residual: hidden)
            if let encoder, let cross = layer.crossAttention {
                let operands = encoder.operands(layer: index, rows: rows)
                let crossAttended = attention(query: cross.query(state), key: operands.keys, value: operands.values,
                                              heads: heads, keyPaddingMask: operands.mask)
                state = cross.output(crossAttended, residual: state)
            }
            hidden = layer.output(layer.intermediate(state, activation: activation), residual: state)
        }
        return hidden
    }

    /// Every layer's cross-attention keys and values for `states [E, S, encoderHiddenSize]` and its mask `[E][S]`.
    func crossAttentionContext(_ states: Tensor, attentionMask: [[Int]]?) throws -> CrossAttentionContext {
        guard config.isDecoder else {
            throw ModelError.invalidConfig("this BLIP text model has no cross-attention (text_config.is_decoder is false)", file: configFile)
        }
        guard states.rank == 3, states.shape[0] > 0, states.shape[1] > 0, states.shape[2] == config.encoderHiddenSize else {
            throw ModelError.invalidInput("encoder hidden states must be [B, S, \(config.encoderHiddenSize)], got \(states.shape)")
        }
        let (batch, length) = (states.shape[0], states.shape[1])
        let mask = try encoderKeyPaddingMask(attentionMask, batch: batch, length: length)
        let projected = layers.map { $0.crossAttention!.keyValue(states) }
        return CrossAttentionContext(keys: projected.map { $0[0] }, values: projected.map { $0[1] }, mask: mask, batch: batch,
                                     length: length)
    }
}

/// transformers' `BlipTextLMHeadModel`: ``BlipTextModel`` run causally (`bert.*`) under the masked-LM prediction
/// head (`cls.predictions.*`: dense, activation, LayerNorm, then the vocabulary projection).
///
/// As a ``CausalLanguageModel`` it runs without cross-attention, as transformers does without encoder states;
/// captioning and VQA bind it to their encoder states with ``attending(to:attentionMask:)``.
public final class BlipTextLMHeadModel: CausalLanguageModel, CrossAttendingModel, @unchecked Sendable {
    public let config: BlipTextConfig
    public let bert: BlipTextModel
    let transform: Linear
    let transformNorm: LayerNorm
    let decoder: Linear

    /// Builds the model from weights named as under transformers' `BlipTextLMHeadModel` (`bert.…`, `cls.…`)
    /// relative to `weights` (`text_decoder` in BLIP checkpoints).
    public convenience init(config: BlipTextConfig, weights: Weights, file: String = "config.json") throws {
        try self.init(config: config, weights: weights, file: file, tiesWordEmbeddings: config.tieWordEmbeddings)
    }

    /// `tiesWordEmbeddings`: the prediction head's decoder is the word embedding table and its bias
    /// `cls.predictions.bias`; otherwise both are stored as `cls.predictions.decoder.weight` and `.bias`.
    init(config: BlipTextConfig, weights: Weights, file: String, tiesWordEmbeddings: Bool) throws {
        self.config = config
        bert = try BlipTextModel(config: config, weights: weights.scoped("bert"), file: file)
        let predictions = weights.scoped("cls.predictions")
        transform = try Linear(predictions.scoped("transform.dense"), inFeatures: config.hiddenSize, outFeatures: config.hiddenSize)
        transformNorm = try LayerNorm(predictions.scoped("transform.LayerNorm"), size: config.hiddenSize, eps: config.layerNormEps)
        decoder = tiesWordEmbeddings
            ? try Linear(weight: bert.wordEmbeddings, bias: predictions("bias", shape: [config.vocabSize]))
            : try Linear(predictions.scoped("decoder"), inFeatures: config.hiddenSize, outFeatures: config.vocabSize)
    }

    public var vocabularySize: Int { config.vocabSize }

    public func embed(_ ids: [[Int]]) throws -> Tensor { try tokenEmbeddings(ids, table: bert.wordEmbeddings) }

    public func makeCache(batch: Int, capacity: Int) throws -> KVCache {
        try makeBoundedCache(batch: batch, capacity: capacity, layers: bert.layers.count, width: config.hiddenSize,
                             heads: config.numAttentionHeads)
    }

    public func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]? = nil, positionIds: [[Int]]? = nil,
                       cache: KVCache? = nil, lastPositionOnly: Bool = false) throws -> Tensor {
        try logits(inputsEmbeds: inputsEmbeds, attentionMask: attentionMask, positionIds: positionIds, cache: cache,
                   lastPositionOnly: lastPositionOnly, encoder: nil)
    }

    /// This decoder cross-attending to encoder states: every layer's keys and values are computed here, once, and
    /// every pass and generation step of the returned model reuses them.
    ///
    /// - Parameters:
    ///   - encoderHiddenStates: `[B, S, encoderHiddenSize]`: image embeds for captioning, the question encoder's
    ///     output for VQA.
    ///   - attentionMask: `[B][S]`, 1 for positions to attend to; nil attends to all (as BLIP's generate does).
    /// - Returns: a model whose passes take `B` rows, or `k·B` rows with row `r` attending to encoder row `r / k`
    ///   (beams, as generate expands them).
    /// - Throws: `ModelError.invalidConfig` when the layers have no cross-attention, `invalidInput` for shapes.
    public func attending(to encoderHiddenStates: Tensor, attentionMask: [[Int]]? = nil) throws -> CrossAttendingDecoder {
        CrossAttendingDecoder(model: self, context: try bert.crossAttentionContext(encoderHiddenStates, attentionMask: attentionMask))
    }

    func logits(inputsEmbeds: Tensor, attentionMask: [[Int]]?, positionIds: [[Int]]?, cache: KVCache?,
                lastPositionOnly: Bool, encoder: CrossAttentionContext?) throws -> Tensor {
        let width = config.hiddenSize
        let pass = try DecoderPass(inputsEmbeds: inputsEmbeds, width: width, attentionMask: attentionMask, cache: cache,
                                   layers: bert.layers.count, cacheWidth: width)
        let (batch, length) = (pass.batch, pass.length)
        try encoder?.check(rows: batch)
        if length == 0 { return Tensor(zeros: [batch, 0, config.vocabSize]) }
        let positions = try pass.positions(positionIds, below: config.maxPositionEmbeddings)
        let heads = config.numAttentionHeads, scale = 1 / Float(width / heads).squareRoot()
        var hidden = bert.run(bert.embedded(inputsEmbeds, positions: positions), encoder: encoder) { layer, query, key, value in
            pass.selfAttention(query: query, key: key, value: value, layer: layer, cache: cache, heads: heads, scale: scale)
        }
        cache?.advance(by: length)
        if lastPositionOnly && length > 1 {
            hidden = gatherTokens(hidden, positions: Array(repeating: length - 1, count: batch)).reshaped([batch, 1, width])
        }
        return decoder(transformNorm(transform(hidden, activation: bert.activation)))
    }
}
