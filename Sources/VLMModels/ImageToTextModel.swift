import VLMImages
import VLMTensor

/// A model that writes text about images (captioning, prompted captioning, visual question answering, image chat): BLIP,
/// BLIP-2, LLaVA and LLaVA-NeXT. Image features are computed once per image, so a conversation about one image reuses them every turn.
public protocol ImageToTextModel: AnyObject, Sendable {
    /// Size of the language model's logits' last dimension.
    var vocabularySize: Int { get }
    /// How many new tokens fit after a prompt of `promptLength` tokens (nil: the start the model makes itself)
    /// before the language model's positions run out; nil when they do not.
    func positionsLeft(promptLength: Int?) -> Int?

    /// What generation conditions on, one row per image of `pixelValues` `[N, 3, H, W]`.
    func imageEmbeddings(pixelValues: Tensor) throws -> Tensor

    /// What generation conditions on for images as their processor made them, one row per image: by default
    /// ``imageEmbeddings(pixelValues:)`` of their pixel values; LLaVA-NeXT reads each image's size too.
    func imageEmbeddings(_ images: ProcessedImages) throws -> Tensor

    /// The new tokens for each image of `imageEmbeddings`, continuing its prompt row as transformers' `generate`
    /// does for this model by `config` (greedy decoding, sampling or beam search).
    ///
    /// - Parameters:
    ///   - inputIds: one prompt per image (`[N][T]`, left-padded) as the family's processor makes it; nil lets the
    ///     model start on its own, as transformers' `generate` does without `input_ids`.
    ///   - onStep: called after each greedy or sampling step with every row's new token (nil once a row ended).
    func generate(imageEmbeddings: Tensor, inputIds: [[Int]]?, attentionMask: [[Int]]?, config: GenerationConfig,
                  stoppingCriteria: [any StoppingCriterion], seed: UInt64,
                  onStep: ((_ tokens: [Int?]) throws -> Void)?) throws -> GenerationOutput
    /// What its language model's KV caches hold keys and values in.
    var cacheElementType: KVCache.ElementType { get }
}

extension ImageToTextModel {
    public var cacheElementType: KVCache.ElementType { .float32 }
}

extension ImageToTextModel {
    public func imageEmbeddings(_ images: ProcessedImages) throws -> Tensor {
        try imageEmbeddings(pixelValues: images.pixelValues)
    }

    /// ``generate(imageEmbeddings:inputIds:attentionMask:config:stoppingCriteria:seed:onStep:)`` for pixel values
    /// `[B, 3, H, W]`, their image embeddings computed first.
    public func generate(pixelValues: Tensor, inputIds: [[Int]]? = nil, attentionMask: [[Int]]? = nil,
                         config: GenerationConfig, stoppingCriteria: [any StoppingCriterion] = [], seed: UInt64 = 0,
                         onStep: ((_ tokens: [Int?]) throws -> Void)? = nil) throws -> GenerationOutput {
        try generate(imageEmbeddings: imageEmbeddings(pixelValues: pixelValues), inputIds: inputIds,
                     attentionMask: attentionMask, config: config, stoppingCriteria: stoppingCriteria, seed: seed,
                     onStep: onStep)
    }
}

/// `embeds` (the token embeddings of `inputIds`, `[B, T, width]`) with the image tokens' rows replaced, in order, by
/// the rows of `features` (`[images, tokens, width]`), as transformers' `masked_scatter` puts image features in place.
///
/// - Throws: `ModelError.invalidInput` unless the prompts hold exactly one image token per feature row (transformers
///   silently uses only the first features when there are fewer tokens).
func placingImageFeatures(_ features: Tensor, into embeds: Tensor, inputIds: [[Int]], imageToken: Int,
                          width: Int) throws -> Tensor {
    guard features.rank == 3, features.shape[2] == width else {
        throw ModelError.invalidInput("image embeddings must be [images, tokens, \(width)], got \(features.shape)")
    }
    return try placingImageRows(features, described: "\(features.shape[0]) images of \(features.shape[1])", into: embeds,
                                inputIds: inputIds, imageToken: imageToken, width: width)
}

/// ``placingImageFeatures(_:into:inputIds:imageToken:width:)`` for features kept per image (`[tokens, width]` each,
/// as many tokens as each image has: LLaVA-NeXT's differ), their rows taken image after image.
func placingImageFeatures(_ features: [Tensor], into embeds: Tensor, inputIds: [[Int]], imageToken: Int,
                          width: Int) throws -> Tensor {
    guard features.allSatisfy({ $0.rank == 2 && $0.shape[1] == width }) else {
        throw ModelError.invalidInput("image features must be [tokens, \(width)] per image, got \(features.map(\.shape))")
    }
    let rows = features.isEmpty ? Tensor(zeros: [0, width]) : concatenate(features, axis: 0)
    return try placingImageRows(rows, described: "\(features.count) images of \(features.map { String($0.shape[0]) }.joined(separator: ", "))",
                                into: embeds, inputIds: inputIds, imageToken: imageToken, width: width)
}

private func placingImageRows(_ rows: Tensor, described: String, into embeds: Tensor, inputIds: [[Int]], imageToken: Int,
                              width: Int) throws -> Tensor {
    let imagePositions = inputIds.joined().enumerated().filter { $0.element == imageToken }.map(\.offset)
    let featureRows = rows.count / width
    guard imagePositions.count == featureRows else {
        throw ModelError.invalidInput("the prompt holds \(imagePositions.count) image tokens (id \(imageToken)) for \(featureRows) image feature rows (\(described))")
    }
    return replacingRows(of: embeds, at: imagePositions, with: rows)
}
