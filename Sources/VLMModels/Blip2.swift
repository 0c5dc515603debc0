import Foundation
import VLMCheckpoint
import VLMTensor

// BLIP-2 (Li et al. 2023) as transformers' models/blip_2/modeling_blip_2.py builds `Blip2ForConditionalGeneration`:
// a frozen ViT (BlipVision.swift), a Querying Transformer whose learned query tokens cross-attend to the image, a
// linear projection into the language model's embedding space, and a frozen decoder (OPT here) that reads the
// projected queries where the prompt holds its image tokens.

/// transformers' `Blip2QFormerConfig`, with its defaults (the fields the query path reads).
public struct Blip2QFormerConfig: Decodable, Sendable {
    public var hiddenSize: Int
    public var numHiddenLayers: Int
    public var numAttentionHeads: Int
    public var intermediateSize: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// Layers `0, f, 2f, …` cross-attend to the image.
    public var crossAttentionFrequency: Int
    /// Width of the image features cross-attended to; `Blip2Config` sets it to the vision tower's `hidden_size`.
    public var encoderHiddenSize: Int

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case intermediateSize = "intermediate_size", hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps"
        case crossAttentionFrequency = "cross_attention_frequency", encoderHiddenSize = "encoder_hidden_size"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        hiddenSize = try c.value(.hiddenSize, default: 768)
        numHiddenLayers = try c.value(.numHiddenLayers, default: 12)
        numAttentionHeads = try c.value(.numAttentionHeads, default: 12)
        intermediateSize = try c.value(.intermediateSize, default: 3072)
        hiddenAct = try c.value(.hiddenAct, default: "gelu")
        layerNormEps = try c.value(.layerNormEps, default: 1e-12)
        crossAttentionFrequency = try c.value(.crossAttentionFrequency, default: 2)
        encoderHiddenSize = try c.value(.encoderHiddenSize, default: 1408)
    }
}

/// transformers' `Blip2Config`: the three sub-models and how many query tokens stand for an image.
public struct Blip2Config: Decodable, Sendable {
    public var visionConfig: BlipVisionConfig
    public var qformerConfig: Blip2QFormerConfig
    /// The language model's config, by `text_config.model_type` (`opt` when absent, as transformers defaults it).
    public var textConfig: Blip2TextConfig
    /// Query tokens, and so image tokens in a prompt, per image.
    public var numQueryTokens: Int
    /// The token id that marks where image features go (`image_token_index`, also read as `image_token_id`);
    /// older checkpoints have none.
    public var imageTokenIndex: Int?

    enum CodingKeys: String, CodingKey {
        case visionConfig = "vision_config", qformerConfig = "qformer_config", textConfig = "text_config"
        case numQueryTokens = "num_query_tokens", imageTokenIndex = "image_token_index", imageTokenId = "image_token_id"
    }

    /// `vision_config` read with BLIP-2's defaults whatever its `model_type`, as `Blip2Config` does.
    private struct VisionConfig: Decodable {
        let config: BlipVisionConfig
        init(from decoder: any Decoder) throws { config = try BlipVisionConfig(from: decoder, family: .blip2) }
    }

    private struct ModelType: Decodable {
        let modelType: String?
        enum CodingKeys: String, CodingKey { case modelType = "model_type" }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let empty = Data("{}".utf8)
        // An absent sub-config means all of its defaults, as Blip2Config(vision_config=None) does.
        visionConfig = try (c.decodeIfPresent(VisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(VisionConfig.self, from: empty)).config
        qformerConfig = try c.decodeIfPresent(Blip2QFormerConfig.self, forKey: .qformerConfig)
            ?? JSONDecoder().decode(Blip2QFormerConfig.self, from: empty)
        // Blip2Config.__post_init__: the Q-Former cross-attends to the vision tower's output, whatever its own says.
        qformerConfig.encoderHiddenSize = visionConfig.hiddenSize
        switch try c.decodeIfPresent(ModelType.self, forKey: .textConfig)?.modelType ?? "opt" {
        case "opt":
            textConfig = .opt(try c.decodeIfPresent(OPTConfig.self, forKey: .textConfig) ?? JSONDecoder().decode(OPTConfig.self, from: empty))
        case "t5":
            textConfig = .t5(try c.decode(T5Config.self, forKey: .textConfig))
        case let type:
            throw DecodingError.dataCorruptedError(forKey: .textConfig, in: c,
                                                   debugDescription: "text_config.model_type \"\(type)\" is not supported here (supported: opt, t5)")
        }
        numQueryTokens = try c.value(.numQueryTokens, default: 32)
        imageTokenIndex = try c.decodeIfPresent(Int.self, forKey: .imageTokenIndex)
            ?? c.decodeIfPresent(Int.self, forKey: .imageTokenId)
    }
}

/// The config of BLIP-2's language model: a decoder-only OPT, or a T5 encoder–decoder (Flan-T5).
public enum Blip2TextConfig: Sendable {
    case opt(OPTConfig)
    case t5(T5Config)

    /// The width of the token embeddings, which the projected image features replace.
    public var embeddingWidth: Int {
        switch self {
        case .opt(let config): config.wordEmbedProjDim
        case .t5(let config): config.dModel
        }
    }
}

/// BLIP-2's language model, `language_model.*`.
public enum Blip2LanguageModel: Sendable {
    /// Reads the image features and the prompt as one sequence and continues it.
    case opt(OPTForCausalLM)
    /// Encodes the image features and the prompt; the decoder writes the text from `decoder_start_token_id`.
    case t5(T5ForConditionalGeneration)

    var vocabularySize: Int {
        switch self {
        case .opt(let model): model.vocabularySize
        case .t5(let model): model.vocabularySize
        }
    }

    func embed(_ ids: [[Int]]) throws -> Tensor {
        switch self {
        case .opt(let model): try model.embed(ids)
        case .t5(let model): try model.embed(ids)
        }
    }
}

/// A BERT-style attention block of the Q-Former (`attention` or `crossattention`): multi-head attention over
/// `attention.{query,key,value}`, then `output.dense`, the residual, and `output.LayerNorm` (post-norm).
struct QFormerAttention {
    let query: Linear, key: Linear, value: Linear
    let output: Linear
    let norm: LayerNorm
    let heads: Int

    /// - Parameter contextSize: width of what keys and values are computed from (the image features' for
    ///   cross-attention).
    init(_ weights: Weights, hiddenSize: Int, contextSize: Int, heads: Int, eps: Float) throws {
        let attention = weights.scoped("attention")
        query = try Linear(attention.scoped("query"), inFeatures: hiddenSize, outFeatures: hiddenSize)
        key = try Linear(attention.scoped("key"), inFeatures: contextSize, outFeatures: hiddenSize)
        value = try Linear(attention.scoped("value"), inFeatures: contextSize, outFeatures: hiddenSize)
        output = try Linear(weights.scoped("output.dense"), inFeatures: hiddenSize, outFeatures: hiddenSize)
        norm = try LayerNorm(weights.scoped("output.LayerNorm"), size: hiddenSize, eps: eps)
        self.heads = heads
    }

    /// `hidden [B, Q, hiddenSize]` attending to every position of `context [B, T, contextSize]` (`hidden` itself
    /// for self-attention). No mask: the queries and the image features are never padded.
    func callAsFunction(_ hidden: Tensor, context: Tensor) -> Tensor {
        let attended = attention(query: query(hidden), key: key(context), value: value(context), heads: heads)
        return norm(output(attended, residual: hidden))
    }
}

/// `Blip2QFormerLayer` on query positions only: self-attention, cross-attention to the image in every
/// `cross_attention_frequency`-th layer, and the query feed-forward (`intermediate_query`, `output_query`). The text
/// feed-forward (`intermediate`, `output`) serves text inputs, which captioning and VQA never give the Q-Former.
struct QFormerLayer {
    let selfAttention: QFormerAttention
    let crossAttention: QFormerAttention?
    let intermediate: Linear
    let output: Linear
    let outputNorm: LayerNorm
    let activation: Activation

    init(_ weights: Weights, index: Int, config c: Blip2QFormerConfig, activation: Activation) throws {
        let h = c.hiddenSize
        selfAttention = try QFormerAttention(weights.scoped("attention"), hiddenSize: h, contextSize: h,
                                             heads: c.numAttentionHeads, eps: c.layerNormEps)
        crossAttention = index % c.crossAttentionFrequency == 0
            ? try QFormerAttention(weights.scoped("crossattention"), hiddenSize: h, contextSize: c.encoderHiddenSize,
                                   heads: c.numAttentionHeads, eps: c.layerNormEps)
            : nil
        intermediate = try Linear(weights.scoped("intermediate_query.dense"), inFeatures: h, outFeatures: c.intermediateSize)
        output = try Linear(weights.scoped("output_query.dense"), inFeatures: c.intermediateSize, outFeatures: h)
        outputNorm = try LayerNorm(weights.scoped("output_query.LayerNorm"), size: h, eps: c.layerNormEps)
        self.activation = activation
    }

    func callAsFunction(_ hidden: Tensor, imageFeatures: Tensor) -> Tensor {
        var attended = selfAttention(hidden, context: hidden)
        if let crossAttention { attended = crossAttention(attended, context: imageFeatures) }
        return outputNorm(output(intermediate(attended, activation: activation), residual: attended))
    }
}

/// transformers' `Blip2QFormerModel` as BLIP-2 generation runs it: query embeddings in, no text.
final class Blip2QFormerModel: @unchecked Sendable {
    let layerNorm: LayerNorm
    let layers: [QFormerLayer]

    init(_ config: Blip2QFormerConfig, weights: Weights, file: String) throws {
        guard config.crossAttentionFrequency > 0, config.numAttentionHeads > 0,
              config.hiddenSize % config.numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("qformer_config: cross_attention_frequency \(config.crossAttentionFrequency) must be positive and hidden_size \(config.hiddenSize) a multiple of num_attention_heads \(config.numAttentionHeads)", file: file)
        }
        layerNorm = try LayerNorm(weights.scoped("layernorm"), size: config.hiddenSize, eps: config.layerNormEps)
        let activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        layers = try (0..<config.numHiddenLayers).map {
            try QFormerLayer(weights.scoped("encoder.layer.\($0)"), index: $0, config: config, activation: activation)
        }
    }

    /// `queryEmbeds [B, Q, hiddenSize]` cross-attending to `imageFeatures [B, T, encoderHiddenSize]`: the last
    /// hidden state `[B, Q, hiddenSize]`.
    func callAsFunction(queryEmbeds: Tensor, imageFeatures: Tensor) -> Tensor {
        var hidden = layerNorm(queryEmbeds)
        for layer in layers { hidden = layer(hidden, imageFeatures: imageFeatures) }
        return hidden
    }
}

/// transformers' `Blip2ForConditionalGeneration` with an OPT or a T5 (Flan-T5) language model: image captioning and
/// visual question answering.
///
/// A prompt holds `numQueryTokens` image tokens per image (`image_token_index`), in front of the text as
/// `Blip2Processor` lays it out; the model puts the image's projected query outputs in their place.
public final class Blip2ForConditionalGeneration: ImageToTextModel, @unchecked Sendable {
    public let config: Blip2Config
    /// The image tower.
    public let visionModel: BlipVisionModel
    /// `query_tokens` `[1, numQueryTokens, qformer hiddenSize]`.
    let queryTokens: Tensor
    let qformer: Blip2QFormerModel
    let languageProjection: Linear
    /// The language model that reads the projected image features and generates.
    public let languageModel: Blip2LanguageModel

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `blip-2`.
    public convenience init(directory: ModelDirectory) throws {
        let configPath = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard type == "blip-2" else { throw ModelError.unsupportedModelType(type, supported: ["blip-2"], file: configPath) }
        try self.init(config: directory.decode(Blip2Config.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: configPath)
    }

    /// Builds the model from `weights` named as transformers saves `Blip2ForConditionalGeneration` (`vision_model.…`,
    /// `query_tokens`, `qformer.…`, `language_projection.…`, and the language model under `language_model.`: OPT's
    /// `model.decoder.…` and `lm_head.weight`, or T5's `shared.weight`, `encoder.…`, `decoder.…`, `lm_head.weight`);
    /// `file` is what configuration errors name.
    public init(config: Blip2Config, weights: Weights, file: String = "config.json") throws {
        guard config.numQueryTokens > 0 else {
            throw ModelError.invalidConfig("num_query_tokens is \(config.numQueryTokens), expected a positive count", file: file)
        }
        self.config = config
        let queryWidth = config.qformerConfig.hiddenSize
        let width = config.textConfig.embeddingWidth
        visionModel = try BlipVisionModel(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        queryTokens = try weights("query_tokens", shape: [1, config.numQueryTokens, queryWidth])
        qformer = try Blip2QFormerModel(config.qformerConfig, weights: weights.scoped("qformer"), file: file)
        languageProjection = try Linear(weights.scoped("language_projection"), inFeatures: queryWidth, outFeatures: width)
        switch config.textConfig {
        case .opt(let text):
            // The projected queries replace token embeddings, so they must be as wide.
            guard text.hiddenSize == text.wordEmbedProjDim else {
                throw ModelError.invalidConfig("text_config: hidden_size \(text.hiddenSize) (the language projection's width) differs from word_embed_proj_dim \(text.wordEmbedProjDim) (the token embeddings')", file: file)
            }
            let decoder = weights.scoped("language_model.model.decoder")
            languageModel = .opt(try OPTForCausalLM(
                config: text, file: file, tensor: { try decoder($0, shape: $1) },
                lmHeadWeight: { try weights("language_model.lm_head.weight", shape: [text.vocabSize, width]) }))
        case .t5(let text):
            languageModel = .t5(try T5ForConditionalGeneration(config: text, file: file, weights: weights.scoped("language_model")))
        }
    }

    /// The Q-Former's last hidden state `[B, numQueryTokens, qformer hiddenSize]` for the vision tower's last hidden
    /// state `[B, T, vision hiddenSize]`.
    public func queryOutput(imageHiddenStates: Tensor) throws -> Tensor {
        let width = config.visionConfig.hiddenSize
        guard imageHiddenStates.rank == 3, imageHiddenStates.shape[2] == width, imageHiddenStates.shape[0] > 0 else {
            throw ModelError.invalidInput("the Q-Former expects image hidden states [batch, tokens, \(width)], got \(imageHiddenStates.shape)")
        }
        let queries = concatenate(Array(repeating: queryTokens, count: imageHiddenStates.shape[0]), axis: 0)
        return qformer(queryEmbeds: queries, imageFeatures: imageHiddenStates)
    }

    /// `get_image_features`: what stands in for each image's tokens, `[B, numQueryTokens, text hiddenSize]`, for
    /// pixel values `[B, 3, imageSize, imageSize]`.
    public func imageEmbeddings(pixelValues: Tensor) throws -> Tensor {
        try languageProjection(queryOutput(imageHiddenStates: visionModel(pixelValues: pixelValues).lastHiddenState))
    }

    /// The token embeddings of `inputIds` (`[B][T]`, equal lengths) with the image tokens' rows replaced, in
    /// order, by the rows of `imageEmbeddings` (`[images, numQueryTokens, text hiddenSize]`), as transformers'
    /// `masked_scatter` does: `[B, T, text hiddenSize]`.
    ///
    /// - Throws: `ModelError.invalidInput` unless the prompt holds exactly one image token per image embedding row
    ///   (transformers would silently use only the first features when it holds fewer).
    public func inputsEmbeds(inputIds: [[Int]], imageEmbeddings: Tensor) throws -> Tensor {
        try placingImageFeatures(imageEmbeddings, into: languageModel.embed(inputIds), inputIds: inputIds,
                                 imageToken: imageTokenIndex(), width: config.textConfig.embeddingWidth)
    }

    /// The forward pass's logits `[B, T, vocab]` for images `[B, 3, S, S]` and a left-padded prompt holding their
    /// image tokens (an OPT language model's; T5's logits are its decoder's, see `generate`).
    public func logits(pixelValues: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        guard case .opt(let model) = languageModel else {
            throw ModelError.invalidInput("prompt logits are an OPT language model's; a T5 one decodes in generate")
        }
        let embeds = try inputsEmbeds(inputIds: inputIds, imageEmbeddings: imageEmbeddings(pixelValues: pixelValues))
        return try model.logits(inputsEmbeds: embeds, attentionMask: attentionMask)
    }

    /// Captions or answers for image embeddings computed once by ``imageEmbeddings(pixelValues:)``, as transformers'
    /// `Blip2ForConditionalGeneration.generate`: greedy decoding, sampling or beam search by `config`.
    ///
    /// - Parameters:
    ///   - inputIds: prompts (`[B][T]`, left-padded for OPT) holding `numQueryTokens` image tokens each, as
    ///     `Blip2Processor` makes them; nil captions without a prompt: OPT reads the image tokens followed by its bos
    ///     token, as transformers does; T5's encoder reads the image tokens alone (transformers 5.23 fails there:
    ///     it appends T5's bos token, which is null).
    ///   - attentionMask: `[B][T]`; nil attends to every token.
    /// - Returns: the new tokens only. transformers' `sequences` are, for OPT, the prompt ids (the made-up one too)
    ///   followed by these, padded; for T5, `decoder_start_token_id` followed by these.
    public func generate(imageEmbeddings: Tensor, inputIds: [[Int]]? = nil, attentionMask: [[Int]]? = nil,
                         config generation: GenerationConfig, stoppingCriteria: [any StoppingCriterion] = [],
                         seed: UInt64 = 0, onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        let ids = try inputIds ?? captionPrompt(images: imageEmbeddings.shape.first ?? 0)
        let embeds = try inputsEmbeds(inputIds: ids, imageEmbeddings: imageEmbeddings)
        switch languageModel {
        case .opt(let model):
            return try model.generate(inputsEmbeds: embeds, promptIds: ids, attentionMask: attentionMask, config: generation,
                                      stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
        case .t5(let model):
            guard let start = model.config.decoderStartTokenId else {
                throw ModelError.invalidInput("a T5 language model decodes from text_config.decoder_start_token_id, which is null")
            }
            let decoder = try model.attending(to: model.encode(inputsEmbeds: embeds, attentionMask: attentionMask),
                                              attentionMask: attentionMask)
            return try decoder.generate(inputIds: Array(repeating: [start], count: ids.count), config: generation,
                                        stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
        }
    }

    public var vocabularySize: Int { languageModel.vocabularySize }

    /// OPT's learned positions hold the prompt and the new tokens; T5's relative positions are unbounded.
    public func positionsLeft(promptLength: Int?) -> Int? {
        guard case .opt(let text) = config.textConfig else { return nil }
        return text.maxPositionEmbeddings - (promptLength ?? config.numQueryTokens + 1)
    }

    /// What generate() prompts with when given none: each image's tokens, then OPT's bos; T5's encoder reads the
    /// image tokens alone.
    private func captionPrompt(images: Int) throws -> [[Int]] {
        let imageTokens = Array(repeating: try imageTokenIndex(), count: config.numQueryTokens)
        switch config.textConfig {
        case .opt(let text):
            guard let bos = text.bosTokenId else {
                throw ModelError.invalidInput("captioning without a prompt starts from text_config.bos_token_id, which is null")
            }
            return Array(repeating: imageTokens + [bos], count: images)
        case .t5:
            return Array(repeating: imageTokens, count: images)
        }
    }

    private func imageTokenIndex() throws -> Int {
        guard let index = config.imageTokenIndex else {
            throw ModelError.invalidInput("config.json has no image_token_index, so no prompt can mark where the image goes")
        }
        return index
    }
}
