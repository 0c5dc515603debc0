import Foundation
import VLMCheckpoint
import VLMTensor

// BLIP-2 (Li et al. 2023) as transformers' models/blip_2/modeling_blip_2.py builds `Blip2ForConditionalGeneration`:
// a frozen ViT (BlipVision.swift), a Querying Transformer whose learned query tokens cross-attend to the image, a
// linear projection into the language model's embedding space, and a frozen decoder (OPT here) that reads the
// projected queries where the prompt holds its image tokens.

/// transformers' `Blip2QFormerConfig`, with its defaults.
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
    /// Whether the layers have a text feed-forward (`intermediate`, `output`): the Q-Former of the retrieval model
    /// reads text too.
    public var useQformerTextInput: Bool
    /// The text embeddings' vocabulary and positions (`Blip2TextEmbeddings`, the retrieval model's).
    public var vocabSize: Int
    public var maxPositionEmbeddings: Int

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case intermediateSize = "intermediate_size", hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps"
        case crossAttentionFrequency = "cross_attention_frequency", encoderHiddenSize = "encoder_hidden_size"
        case useQformerTextInput = "use_qformer_text_input", vocabSize = "vocab_size"
        case maxPositionEmbeddings = "max_position_embeddings"
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
        useQformerTextInput = try c.value(.useQformerTextInput, default: false)
        vocabSize = try c.value(.vocabSize, default: 30522)
        maxPositionEmbeddings = try c.value(.maxPositionEmbeddings, default: 512)
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
    /// Width of the space the retrieval model's image and text projections share.
    public var imageTextHiddenSize: Int

    enum CodingKeys: String, CodingKey {
        case visionConfig = "vision_config", qformerConfig = "qformer_config", textConfig = "text_config"
        case numQueryTokens = "num_query_tokens", imageTokenIndex = "image_token_index", imageTokenId = "image_token_id"
        case imageTextHiddenSize = "image_text_hidden_size"
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
        imageTextHiddenSize = try c.value(.imageTextHiddenSize, default: 256)
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

    /// `hidden [B, L, hiddenSize]` attending to `context [B / contextCopies, T, contextSize]` (`hidden` itself for
    /// self-attention; each context row serving `contextCopies` consecutive rows of `hidden`, its keys and values
    /// computed once), to the positions `keyPaddingMask [B, T]` keeps (all without one: queries and image features
    /// are never padded).
    func callAsFunction(_ hidden: Tensor, context: Tensor, contextCopies: Int = 1, keyPaddingMask: Tensor? = nil) -> Tensor {
        let attended = attention(query: query(hidden), key: repeatRows(key(context), contextCopies),
                                 value: repeatRows(value(context), contextCopies), heads: heads, keyPaddingMask: keyPaddingMask)
        return norm(output(attended, residual: hidden))
    }
}

/// A Q-Former feed-forward (`intermediate_query` and `output_query` for queries, `intermediate` and `output` for
/// text): dense, activation, dense, the residual, LayerNorm.
struct QFormerFeedForward {
    let intermediate: Linear
    let output: Linear
    let norm: LayerNorm

    init(_ weights: Weights, intermediate name: String, output outputName: String, config c: Blip2QFormerConfig) throws {
        intermediate = try Linear(weights.scoped("\(name).dense"), inFeatures: c.hiddenSize, outFeatures: c.intermediateSize)
        output = try Linear(weights.scoped("\(outputName).dense"), inFeatures: c.intermediateSize, outFeatures: c.hiddenSize)
        norm = try LayerNorm(weights.scoped("\(outputName).LayerNorm"), size: c.hiddenSize, eps: c.layerNormEps)
    }

    func callAsFunction(_ x: Tensor, activation: Activation) -> Tensor {
        norm(output(intermediate(x, activation: activation), residual: x))
    }
}

/// `Blip2QFormerLayer`: self-attention over queries and text together, the queries' cross-attention to the image in
/// every `cross_attention_frequency`-th layer, then the query feed-forward on query positions and the text one
/// (loaded with `use_qformer_text_input`; captioning and VQA give the Q-Former no text) on the rest.
struct QFormerLayer {
    let selfAttention: QFormerAttention
    let crossAttention: QFormerAttention?
    let queryFeedForward: QFormerFeedForward
    let textFeedForward: QFormerFeedForward?
    let activation: Activation

    init(_ weights: Weights, index: Int, config c: Blip2QFormerConfig, activation: Activation) throws {
        let h = c.hiddenSize
        selfAttention = try QFormerAttention(weights.scoped("attention"), hiddenSize: h, contextSize: h,
                                             heads: c.numAttentionHeads, eps: c.layerNormEps)
        crossAttention = index % c.crossAttentionFrequency == 0
            ? try QFormerAttention(weights.scoped("crossattention"), hiddenSize: h, contextSize: c.encoderHiddenSize,
                                   heads: c.numAttentionHeads, eps: c.layerNormEps)
            : nil
        queryFeedForward = try QFormerFeedForward(weights, intermediate: "intermediate_query", output: "output_query", config: c)
        textFeedForward = c.useQformerTextInput
            ? try QFormerFeedForward(weights, intermediate: "intermediate", output: "output", config: c) : nil
        self.activation = activation
    }

    /// `hidden [B, L, hiddenSize]` whose first `queryLength` positions are queries and the rest text, attending to
    /// the positions `keyPaddingMask [B, L]` keeps; the queries cross-attend to `imageFeatures [B / imageCopies, T,
    /// encoderHiddenSize]`, which a pass with queries must give, and only a layer with the text feed-forward takes text.
    func callAsFunction(_ hidden: Tensor, queryLength: Int, imageFeatures: Tensor?, imageCopies: Int = 1,
                        keyPaddingMask: Tensor?) -> Tensor {
        let attended = selfAttention(hidden, context: hidden, keyPaddingMask: keyPaddingMask)
        let length = hidden.shape[1]
        let text = queryLength == length ? nil : textFeedForward.map { feedForward in
            feedForward(queryLength == 0 ? attended : sequenceSlice(attended, queryLength..<length), activation: activation)
        }
        precondition(queryLength == length || text != nil, "Q-Former text input without use_qformer_text_input")
        guard queryLength > 0 else { return text! }
        var queries = queryLength == length ? attended : sequenceSlice(attended, 0..<queryLength)
        if let crossAttention {
            guard let imageFeatures else { preconditionFailure("Q-Former queries without image features") }
            queries = crossAttention(queries, context: imageFeatures, contextCopies: imageCopies)
        }
        let queryOutput = queryFeedForward(queries, activation: activation)
        return text.map { concatenate([queryOutput, $0], axis: 1) } ?? queryOutput
    }
}

/// transformers' `Blip2QFormerModel`: query embeddings cross-attending to the image, text embeddings after them, or
/// either alone.
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
        self(embeddings: queryEmbeds, queryLength: queryEmbeds.shape[1], imageFeatures: imageFeatures, keyPaddingMask: nil)
    }

    /// `embeddings [B, L, hiddenSize]`, queries in the first `queryLength` positions and text after them, attending
    /// to the positions `keyPaddingMask [B, L]` keeps, each image of `imageFeatures` for `imageCopies` consecutive
    /// rows: the last hidden state `[B, L, hiddenSize]`.
    func callAsFunction(embeddings: Tensor, queryLength: Int, imageFeatures: Tensor?, imageCopies: Int = 1,
                        keyPaddingMask: Tensor?) -> Tensor {
        var hidden = layerNorm(embeddings)
        for layer in layers {
            hidden = layer(hidden, queryLength: queryLength, imageFeatures: imageFeatures, imageCopies: imageCopies,
                           keyPaddingMask: keyPaddingMask)
        }
        return hidden
    }
}

/// The config, weights and config.json path of a checkpoint directory whose `model_type` is `blip-2`.
private func blip2Checkpoint(_ directory: ModelDirectory) throws -> (Blip2Config, Weights, String) {
    let configPath = directory.url.appendingPathComponent("config.json").path
    let type = try directory.modelType
    guard type == "blip-2" else { throw ModelError.unsupportedModelType(type, supported: ["blip-2"], file: configPath) }
    return (try directory.decode(Blip2Config.self), Weights(try WeightStore(directory: directory.url)), configPath)
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
        let (config, weights, file) = try blip2Checkpoint(directory)
        try self.init(config: config, weights: weights, file: file)
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

    /// OPT's caches as it was built; T5's decoder keeps fp32 ones.
    public var cacheElementType: KVCache.ElementType {
        if case .opt(let model) = languageModel { return model.cacheElementType }
        return .float32
    }

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

/// transformers' `Blip2ForImageTextRetrieval` (the blip2-itm checkpoints): the Q-Former reads text as well as
/// images. Image–text matching (ITM) runs the queries and the text through it together, the queries cross-attending
/// to the image, and averages the `itm_head` logits over the query outputs; the contrastive score (ITC) is the best
/// cosine between any of an image's projected query outputs and the text's projected [CLS] state, the text read by
/// the Q-Former alone. Texts are BERT-style `[CLS] … [SEP]` in the Q-Former's own vocabulary, right-padded.
public final class Blip2ForImageTextRetrieval: ImageTextMatchingModel, @unchecked Sendable {
    public let config: Blip2Config
    /// The image tower.
    public let visionModel: BlipVisionModel
    /// `query_tokens` `[1, numQueryTokens, qformer hiddenSize]`.
    let queryTokens: Tensor
    /// `embeddings.word_embeddings` `[vocab, hiddenSize]` and `embeddings.position_embeddings` `[positions, hiddenSize]`.
    let wordEmbeddings: Tensor, positionEmbeddings: Tensor
    let qformer: Blip2QFormerModel
    let visionProjection: Linear, textProjection: Linear
    let itmHead: Linear

    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `blip-2`.
    public convenience init(directory: ModelDirectory) throws {
        let (config, weights, file) = try blip2Checkpoint(directory)
        try self.init(config: config, weights: weights, file: file)
    }

    /// Builds the model from `weights` named as transformers saves `Blip2ForImageTextRetrieval` (`vision_model.…`,
    /// `query_tokens`, `embeddings.…`, `qformer.…`, `vision_projection`, `text_projection`, `itm_head`).
    public init(config: Blip2Config, weights: Weights, file: String = "config.json") throws {
        let q = config.qformerConfig
        guard q.useQformerTextInput else {
            throw ModelError.invalidConfig("qformer_config.use_qformer_text_input is false, so the Q-Former has no text feed-forward to read texts with", file: file)
        }
        guard config.numQueryTokens > 0 else {
            throw ModelError.invalidConfig("num_query_tokens is \(config.numQueryTokens), expected a positive count", file: file)
        }
        self.config = config
        visionModel = try BlipVisionModel(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        queryTokens = try weights("query_tokens", shape: [1, config.numQueryTokens, q.hiddenSize])
        wordEmbeddings = try weights("embeddings.word_embeddings.weight", shape: [q.vocabSize, q.hiddenSize])
        positionEmbeddings = try weights("embeddings.position_embeddings.weight", shape: [q.maxPositionEmbeddings, q.hiddenSize])
        qformer = try Blip2QFormerModel(q, weights: weights.scoped("qformer"), file: file)
        visionProjection = try Linear(weights.scoped("vision_projection"), inFeatures: q.hiddenSize, outFeatures: config.imageTextHiddenSize)
        textProjection = try Linear(weights.scoped("text_projection"), inFeatures: q.hiddenSize, outFeatures: config.imageTextHiddenSize)
        itmHead = try Linear(weights.scoped("itm_head"), inFeatures: q.hiddenSize, outFeatures: 2)
    }

    public var imageSize: Int { config.visionConfig.imageSize }

    /// The vision tower's last hidden state `[B, patches + 1, vision hiddenSize]` for pixel values `[B, 3, S, S]`.
    public func imageEmbeddings(pixelValues: Tensor) throws -> Tensor {
        try visionModel(pixelValues: pixelValues).lastHiddenState
    }

    /// `logits_per_image` with `use_image_text_matching_head=True`: [no match, match] logits `[B, 2]` for texts
    /// `[B][T]`, text `b` read against image `b / (B / images)` of `imageEmbeds [images, P, vision]` (each image
    /// for as many consecutive texts).
    public func matchLogits(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        let images = try imageBatch(imageEmbeds)
        let (text, mask) = try textEmbeddings(inputIds, attentionMask: attentionMask)
        let (rows, queries) = (inputIds.count, config.numQueryTokens)
        guard rows % images == 0 else {
            throw ModelError.invalidInput("\(rows) texts do not pair with \(images) images (need a multiple)")
        }
        let keyPaddingMask = mask.map { textMask in
            concatenate([Tensor(shape: [rows, queries], scalars: Array(repeating: 1, count: rows * queries)), textMask], axis: 1)
        }
        // Each image's cross-attention keys and values are computed once for all of its texts.
        let hidden = qformer(embeddings: concatenate([repeatRows(queryTokens, rows), text], axis: 1), queryLength: queries,
                             imageFeatures: imageEmbeds, imageCopies: rows / images, keyPaddingMask: keyPaddingMask)
        let logits = itmHead(sequenceSlice(hidden, 0..<queries)).scalars
        // The mean over the query outputs, in order, as torch's mean(dim=1) sums them.
        var means = [Float](repeating: 0, count: rows * 2)
        for row in 0..<rows {
            for query in 0..<queries {
                means[row * 2] += logits[(row * queries + query) * 2]
                means[row * 2 + 1] += logits[(row * queries + query) * 2 + 1]
            }
        }
        return Tensor(shape: [rows, 2], scalars: means.map { $0 / Float(queries) })
    }

    /// The probability that text `b` describes its image: `softmax(logits_per_image)[:, 1]`, `B` values.
    public func matchProbabilities(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> [Float] {
        let probabilities = softmax(try matchLogits(imageEmbeds: imageEmbeds, inputIds: inputIds, attentionMask: attentionMask)).scalars
        return stride(from: 1, to: probabilities.count, by: 2).map { probabilities[$0] }
    }

    /// L2-normalized `vision_projection` of each image's query outputs: `[B, numQueryTokens, image_text_hidden_size]`.
    public func imageFeatures(imageEmbeds: Tensor) throws -> Tensor {
        let images = try imageBatch(imageEmbeds)
        return l2Normalized(visionProjection(qformer(queryEmbeds: repeatRows(queryTokens, images), imageFeatures: imageEmbeds)))
    }

    /// L2-normalized `text_projection` of each text's [CLS] state, the text read by the Q-Former alone:
    /// `[B, image_text_hidden_size]`.
    public func textFeatures(inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        let (text, mask) = try textEmbeddings(inputIds, attentionMask: attentionMask)
        let hidden = qformer(embeddings: text, queryLength: 0, imageFeatures: nil, keyPaddingMask: mask)
        return l2Normalized(textProjection(gatherTokens(hidden, positions: Array(repeating: 0, count: inputIds.count))))
    }

    /// `logits_per_image` with `use_image_text_matching_head=False`: for every image and text the largest cosine
    /// similarity between the image's query features and the text's, `[images, texts]`.
    public func cosineSimilarities(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        let images = try imageFeatures(imageEmbeds: imageEmbeds)
        let texts = try textFeatures(inputIds: inputIds, attentionMask: attentionMask)
        let (count, queries, width) = (images.shape[0], images.shape[1], images.shape[2])
        let cosines = matmul(images.reshaped([count * queries, width]), texts, transposeB: true).scalars
        let textCount = inputIds.count
        return Tensor(shape: [count, textCount], scalars: (0..<count).flatMap { image in
            (0..<textCount).map { text in
                (0..<queries).map { cosines[(image * queries + $0) * textCount + text] }.max()!
            }
        })
    }

    /// `Blip2TextEmbeddings` of right-padded texts `[B][T]`, `[B, T, hiddenSize]` (word plus learned position
    /// embeddings; the Q-Former normalizes them), and their key padding mask, nil when nothing is padded.
    private func textEmbeddings(_ inputIds: [[Int]], attentionMask: [[Int]]?) throws -> (Tensor, Tensor?) {
        let length = try equalRowLength(inputIds, "input ids")
        let limit = config.qformerConfig.maxPositionEmbeddings
        guard length > 0, length <= limit else {
            throw ModelError.invalidInput("the Q-Former takes 1 to \(limit) text tokens per row, got \(length)")
        }
        let positions = Array(repeating: Array(0..<length), count: inputIds.count)
        let embedded = add(try tokenEmbeddings(inputIds, table: wordEmbeddings), learnedPositions(positionEmbeddings, positions: positions))
        return (embedded, try encoderKeyPaddingMask(attentionMask, batch: inputIds.count, length: length))
    }

    /// Checks that `imageEmbeds` is the vision tower's `[B, P, width]` and returns `B`.
    private func imageBatch(_ imageEmbeds: Tensor) throws -> Int {
        let width = config.visionConfig.hiddenSize
        guard imageEmbeds.rank == 3, imageEmbeds.shape[0] > 0, imageEmbeds.shape[1] > 0, imageEmbeds.shape[2] == width else {
            throw ModelError.invalidInput("image embeds must be the vision tower's last hidden state [B, patches + 1, \(width)], got \(imageEmbeds.shape)")
        }
        return imageEmbeds.shape[0]
    }
}
