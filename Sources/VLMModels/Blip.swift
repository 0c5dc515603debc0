import Foundation
import VLMCheckpoint
import VLMTensor

// BLIP (Li et al. 2022) as transformers' models/blip/modeling_blip.py builds its task heads: a ViT vision tower
// (`vision_model.*`, BlipVision.swift) whose last hidden state, the image embeds, feeds a BERT-style text model
// (BlipText.swift) through cross-attention. Captioning decodes from the image embeds; VQA encodes the question
// against them and decodes the answer from the question's encoding; retrieval scores image–text pairs with a match
// head over the image-aware text encoding (ITM) or with cosine similarity of projected [CLS] states (ITC).
// Each head holds its vision tower (`BlipVisionModel`) and also takes image embeds computed once.

/// transformers' `BlipConfig`: the text model's config and the shared sizes of the heads, with their defaults.
public struct BlipConfig: Decodable, Sendable {
    /// `text_config`, its `encoder_hidden_size` set to the vision tower's width as `BlipConfig` sets it.
    public var textConfig: BlipTextConfig
    /// `vision_config`, with `BlipVisionConfig`'s defaults.
    public var visionConfig: BlipVisionConfig
    public var projectionDim: Int
    public var logitScaleInitValue: Float
    /// Width of the shared space of retrieval's `vision_proj` and `text_proj`.
    public var imageTextHiddenSize: Int
    public var labelSmoothing: Float
    /// The text decoder's LM head reuses the word embeddings when this or `text_config.tie_word_embeddings` says so
    /// (transformers ties at both levels).
    public var tieWordEmbeddings: Bool

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config", projectionDim = "projection_dim"
        case logitScaleInitValue = "logit_scale_init_value", imageTextHiddenSize = "image_text_hidden_size"
        case labelSmoothing = "label_smoothing", tieWordEmbeddings = "tie_word_embeddings"
    }

    /// `vision_config` read with BLIP's defaults whatever its `model_type`, as `BlipConfig` does.
    private struct VisionConfig: Decodable {
        let config: BlipVisionConfig
        init(from decoder: any Decoder) throws { config = try BlipVisionConfig(from: decoder, family: .blip) }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        // An absent sub-config means all of its defaults, as BlipConfig(text_config=None) does.
        let empty = Data("{}".utf8)
        textConfig = try c.decodeIfPresent(BlipTextConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(BlipTextConfig.self, from: empty)
        visionConfig = try (c.decodeIfPresent(VisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(VisionConfig.self, from: empty)).config
        textConfig.encoderHiddenSize = visionConfig.hiddenSize
        projectionDim = try c.value(.projectionDim, default: 512)
        logitScaleInitValue = try c.value(.logitScaleInitValue, default: 2.6592)
        imageTextHiddenSize = try c.value(.imageTextHiddenSize, default: 256)
        labelSmoothing = try c.value(.labelSmoothing, default: 0)
        tieWordEmbeddings = try c.value(.tieWordEmbeddings, default: true)
    }
}

extension BlipConfig {
    /// The width of the image embeds.
    public var visionHiddenSize: Int { visionConfig.hiddenSize }

    /// Whether the text decoder's LM head is the word embedding table (see ``tieWordEmbeddings``).
    var tiesTextDecoderEmbeddings: Bool { tieWordEmbeddings || textConfig.tieWordEmbeddings }
}

/// What BLIP's three heads share: the config, the vision tower under `vision_model`, and loading.
public protocol BlipHead: AnyObject {
    var config: BlipConfig { get }
    var visionModel: BlipVisionModel { get }
    /// Builds the head from a checkpoint's weights by Hugging Face name; `file` is what configuration errors name.
    init(config: BlipConfig, weights: Weights, file: String) throws
}

extension BlipHead {
    /// Loads config.json and the safetensors weights of a checkpoint directory whose `model_type` is `blip`.
    public init(directory: ModelDirectory) throws {
        let file = directory.url.appendingPathComponent("config.json").path
        let type = try directory.modelType
        guard type == "blip" else { throw ModelError.unsupportedModelType(type, supported: ["blip"], file: file) }
        try self.init(config: directory.decode(BlipConfig.self), weights: Weights(WeightStore(directory: directory.url)), file: file)
    }

    /// The vision tower's last hidden state `[N, patches + 1, vision]`: the image embeds the text side attends to.
    public func imageEmbeddings(pixelValues: Tensor) throws -> Tensor {
        try visionModel(pixelValues: pixelValues).lastHiddenState
    }
}

/// Checks that `imageEmbeds` is `[B, P, width]` and returns `B`.
private func imageBatch(_ imageEmbeds: Tensor, width: Int) throws -> Int {
    guard imageEmbeds.rank == 3, imageEmbeds.shape[0] > 0, imageEmbeds.shape[1] > 0, imageEmbeds.shape[2] == width else {
        throw ModelError.invalidInput("image embeds must be the vision tower's last hidden state [B, patches + 1, \(width)], got \(imageEmbeds.shape)")
    }
    return imageEmbeds.shape[0]
}

/// `generate`'s settings for BLIP's text decoder: it stops at `[SEP]` and pads with `[PAD]`, whatever `config` says.
private func decoderGeneration(_ config: GenerationConfig, text: BlipTextConfig) -> GenerationConfig {
    var config = config
    config.eosTokenIds = text.sepTokenId.map { [$0] } ?? []
    config.padTokenId = text.padTokenId
    return config
}

/// transformers' `BlipForConditionalGeneration`: image captioning, unconditional or continuing a prompt.
public final class BlipForConditionalGeneration: BlipHead, ImageToTextModel, @unchecked Sendable {
    public let config: BlipConfig
    /// `vision_model`.
    public let visionModel: BlipVisionModel
    /// `text_decoder`.
    public let textDecoder: BlipTextLMHeadModel

    /// Builds the model from a checkpoint's weights by Hugging Face name (`vision_model.…`, `text_decoder.…`).
    public init(config: BlipConfig, weights: Weights, file: String = "config.json") throws {
        self.config = config
        visionModel = try BlipVisionModel(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        textDecoder = try BlipTextLMHeadModel(config: config.textConfig, weights: weights.scoped("text_decoder"), file: file,
                                              tiesWordEmbeddings: config.tiesTextDecoderEmbeddings)
    }

    /// The forward pass's logits `[B, T, vocab]` for `decoderInputIds [B][T]` over `imageEmbeds [B, P, vision]`.
    public func logits(imageEmbeds: Tensor, decoderInputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        _ = try imageBatch(imageEmbeds, width: config.visionHiddenSize)
        return try textDecoder.attending(to: imageEmbeds).logits(inputIds: decoderInputIds, attentionMask: attentionMask)
    }

    /// The decoder's prompt as transformers' `generate` makes it: without `inputIds`, `[bos]` for each of `batch`
    /// images; with the processor's ids (`[CLS] prompt [SEP]`), the first replaced by bos and the last dropped,
    /// and the mask's last column with it.
    public func decoderPrompt(inputIds: [[Int]]?, attentionMask: [[Int]]? = nil, batch: Int) throws -> (ids: [[Int]], mask: [[Int]]?) {
        let text = config.textConfig
        guard let bos = text.bosTokenId else {
            throw ModelError.invalidInput("captioning needs text_config.bos_token_id")
        }
        guard let inputIds else { return (Array(repeating: [bos], count: batch), nil) }
        let length = try equalRowLength(inputIds, "input ids")
        guard inputIds.count == batch, length >= 2 else {
            throw ModelError.invalidInput("a captioning prompt needs \(batch) rows of at least 2 tokens ([CLS] … [SEP]), got \(inputIds.count) rows of \(length)")
        }
        if let attentionMask, attentionMask.count != batch || attentionMask.contains(where: { $0.count != length }) {
            throw ModelError.invalidInput("the attention mask must be [\(batch)][\(length)]")
        }
        return (inputIds.map { [bos] + $0[1..<(length - 1)] }, attentionMask?.map { Array($0.dropLast()) })
    }

    /// Captions `imageEmbeds [B, P, vision]` as transformers' `generate` does: from `[bos]`, or continuing the
    /// processor's prompt ids (see ``decoderPrompt(inputIds:attentionMask:batch:)``), stopping at `[SEP]`.
    /// `config` chooses greedy decoding, sampling or beam search and the length; its eos and pad ids are replaced.
    /// - Returns: each caption's new tokens (after the prompt), ending with `[SEP]` where one ended it.
    public func generate(imageEmbeds: Tensor, inputIds: [[Int]]? = nil, attentionMask: [[Int]]? = nil,
                         config generation: GenerationConfig = GenerationConfig(), stoppingCriteria: [any StoppingCriterion] = [],
                         seed: UInt64 = 0, onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        let batch = try imageBatch(imageEmbeds, width: config.visionHiddenSize)
        let prompt = try decoderPrompt(inputIds: inputIds, attentionMask: attentionMask, batch: batch)
        return try textDecoder.attending(to: imageEmbeds).generate(
            inputIds: prompt.ids, attentionMask: prompt.mask, config: decoderGeneration(generation, text: config.textConfig),
            stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
    }

    public func generate(imageEmbeddings: Tensor, inputIds: [[Int]]?, attentionMask: [[Int]]?, config: GenerationConfig,
                         stoppingCriteria: [any StoppingCriterion], seed: UInt64,
                         onStep: ((_ tokens: [Int?]) throws -> Void)?) throws -> GenerationOutput {
        try generate(imageEmbeds: imageEmbeddings, inputIds: inputIds, attentionMask: attentionMask, config: config,
                     stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
    }

    public var vocabularySize: Int { textDecoder.vocabularySize }

    /// The decoder reads `[bos]` and the prompt without its `[CLS]` and `[SEP]`.
    public func positionsLeft(promptLength: Int?) -> Int? {
        config.textConfig.maxPositionEmbeddings - (promptLength.map { $0 - 1 } ?? 1)
    }
}

/// transformers' `BlipForQuestionAnswering`: the question encoded against the image, the answer decoded from the
/// question's encoding.
public final class BlipForQuestionAnswering: BlipHead, ImageToTextModel, @unchecked Sendable {
    public let config: BlipConfig
    /// `vision_model`.
    public let visionModel: BlipVisionModel
    /// `text_encoder`: the question, cross-attending to the image.
    public let textEncoder: BlipTextModel
    /// `text_decoder`: the answer, cross-attending to the encoded question.
    public let textDecoder: BlipTextLMHeadModel

    /// Builds the model from a checkpoint's weights by Hugging Face name (`vision_model.…`, `text_encoder.…`,
    /// `text_decoder.…`).
    public init(config: BlipConfig, weights: Weights, file: String = "config.json") throws {
        guard config.textConfig.hiddenSize == config.visionHiddenSize else {
            // The answer decoder reads the question encoding through keys sized for the image embeds.
            throw ModelError.invalidConfig("VQA needs text_config.hidden_size (\(config.textConfig.hiddenSize)) equal to vision_config.hidden_size (\(config.visionHiddenSize))", file: file)
        }
        self.config = config
        visionModel = try BlipVisionModel(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        textEncoder = try BlipTextModel(config: config.textConfig, weights: weights.scoped("text_encoder"), file: file)
        textDecoder = try BlipTextLMHeadModel(config: config.textConfig, weights: weights.scoped("text_decoder"), file: file,
                                              tiesWordEmbeddings: config.tiesTextDecoderEmbeddings)
    }

    /// The question encoder's last hidden state `[B, T, hidden]` for question ids `[B][T]` (right-padded) over
    /// `imageEmbeds [B, P, vision]`.
    public func questionStates(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        _ = try imageBatch(imageEmbeds, width: config.visionHiddenSize)
        return try textEncoder.lastHiddenState(inputIds: inputIds, attentionMask: attentionMask, encoderHiddenStates: imageEmbeds)
    }

    /// The answer decoder bound to `questionStates [B, T, hidden]`. It attends to every question position, padding
    /// included, as transformers' `generate` does (its forward masks the padding instead).
    public func answerDecoder(questionStates: Tensor) throws -> CrossAttendingDecoder {
        try textDecoder.attending(to: questionStates)
    }

    /// Answers the questions `inputIds [B][T]` about `imageEmbeds [B, P, vision]` as transformers' `generate`
    /// does: the decoder starts from `[bos]` and stops at `[SEP]`; `config` chooses the decoding and the length,
    /// its eos and pad ids are replaced.
    /// - Returns: each answer's tokens after `[bos]`, ending with `[SEP]` where one ended it.
    public func generate(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil,
                         config generation: GenerationConfig = GenerationConfig(), stoppingCriteria: [any StoppingCriterion] = [],
                         seed: UInt64 = 0, onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        guard let bos = config.textConfig.bosTokenId else {
            throw ModelError.invalidInput("answering needs text_config.bos_token_id")
        }
        let states = try questionStates(imageEmbeds: imageEmbeds, inputIds: inputIds, attentionMask: attentionMask)
        return try answerDecoder(questionStates: states).generate(
            inputIds: Array(repeating: [bos], count: inputIds.count), config: decoderGeneration(generation, text: config.textConfig),
            stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
    }

    /// `inputIds` are the questions, which this model cannot do without.
    public func generate(imageEmbeddings: Tensor, inputIds: [[Int]]?, attentionMask: [[Int]]?, config: GenerationConfig,
                         stoppingCriteria: [any StoppingCriterion], seed: UInt64,
                         onStep: ((_ tokens: [Int?]) throws -> Void)?) throws -> GenerationOutput {
        guard let inputIds else { throw ModelError.invalidInput("BLIP's question answering needs a question") }
        return try generate(imageEmbeds: imageEmbeddings, inputIds: inputIds, attentionMask: attentionMask, config: config,
                            stoppingCriteria: stoppingCriteria, seed: seed, onStep: onStep)
    }

    public var vocabularySize: Int { textDecoder.vocabularySize }

    /// The question is encoded at its own positions; the answer decoder starts from `[bos]`.
    public func positionsLeft(promptLength: Int?) -> Int? {
        let limit = config.textConfig.maxPositionEmbeddings
        return (promptLength ?? 0) > limit ? 0 : limit - 1
    }
}

/// transformers' `BlipForImageTextRetrieval`: image–text matching (ITM) and contrastive similarity (ITC).
public final class BlipForImageTextRetrieval: BlipHead, ImageTextMatchingModel, @unchecked Sendable {
    public let config: BlipConfig
    /// `vision_model`.
    public let visionModel: BlipVisionModel
    /// `text_encoder`: with cross-attention to the image for ITM, without for ITC.
    public let textEncoder: BlipTextModel
    let visionProjection: Linear
    let textProjection: Linear
    let itmHead: Linear

    /// Builds the model from a checkpoint's weights by Hugging Face name (`vision_model.…`, `text_encoder.…`,
    /// `vision_proj`, `text_proj`, `itm_head`).
    public init(config: BlipConfig, weights: Weights, file: String = "config.json") throws {
        self.config = config
        visionModel = try BlipVisionModel(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        let text = config.textConfig
        textEncoder = try BlipTextModel(config: text, weights: weights.scoped("text_encoder"), file: file)
        visionProjection = try Linear(weights.scoped("vision_proj"), inFeatures: config.visionHiddenSize,
                                      outFeatures: config.imageTextHiddenSize)
        textProjection = try Linear(weights.scoped("text_proj"), inFeatures: text.hiddenSize, outFeatures: config.imageTextHiddenSize)
        itmHead = try Linear(weights.scoped("itm_head"), inFeatures: text.hiddenSize, outFeatures: 2)
    }

    /// `itm_score` with `use_itm_head=True`: [no match, match] logits `[B, 2]` for texts `[B][T]` (right-padded),
    /// text `b` read against image `b` of `imageEmbeds [B, P, vision]` (or of `[1, P, vision]` for every text).
    public func matchLogits(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        _ = try imageBatch(imageEmbeds, width: config.visionHiddenSize)
        let states = try textEncoder.lastHiddenState(inputIds: inputIds, attentionMask: attentionMask, encoderHiddenStates: imageEmbeds)
        return itmHead(gatherTokens(states, positions: Array(repeating: 0, count: inputIds.count)))
    }

    /// The probability that text `b` describes image `b`: `softmax(itm_score)[:, 1]`, `B` values.
    public func matchProbabilities(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> [Float] {
        let probabilities = softmax(try matchLogits(imageEmbeds: imageEmbeds, inputIds: inputIds, attentionMask: attentionMask)).scalars
        return stride(from: 1, to: probabilities.count, by: 2).map { probabilities[$0] }
    }

    /// L2-normalized `vision_proj` of each image's [CLS] embed: `[B, image_text_hidden_size]`.
    public func imageFeatures(imageEmbeds: Tensor) throws -> Tensor {
        let batch = try imageBatch(imageEmbeds, width: config.visionHiddenSize)
        return l2Normalized(visionProjection(gatherTokens(imageEmbeds, positions: Array(repeating: 0, count: batch))))
    }

    /// L2-normalized `text_proj` of each text's [CLS] state, the text encoded without the image:
    /// `[B, image_text_hidden_size]`.
    public func textFeatures(inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        let states = try textEncoder.lastHiddenState(inputIds: inputIds, attentionMask: attentionMask)
        return l2Normalized(textProjection(gatherTokens(states, positions: Array(repeating: 0, count: inputIds.count))))
    }

    /// `itm_score` with `use_itm_head=False`: the cosine similarity of every image with every text, `[images, texts]`.
    public func cosineSimilarities(imageEmbeds: Tensor, inputIds: [[Int]], attentionMask: [[Int]]? = nil) throws -> Tensor {
        matmul(try imageFeatures(imageEmbeds: imageEmbeds), try textFeatures(inputIds: inputIds, attentionMask: attentionMask),
               transposeB: true)
    }

    public var imageSize: Int { config.visionConfig.imageSize }
}
