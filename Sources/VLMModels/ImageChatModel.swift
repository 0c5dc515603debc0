import VLMImages
import VLMTensor

/// An image-to-text model whose language model is a chat model reading image features where its prompt holds image
/// tokens (LLaVA): conversations with images go through the checkpoint's chat template, and each image's features
/// are computed once and put in place of its tokens wherever the conversation has grown to.
public protocol ImageChatModel: ImageToTextModel {
    /// The decoder that reads the prompt's embeddings and generates.
    var textDecoder: any CausalLanguageModel { get }
    /// The token id each image's tokens carry in a prompt.
    var imageTokenId: Int { get }
    /// Per image of `images`, in order, the rows `[tokens, hidden]` that take its image tokens' places.
    func imageFeatures(_ images: ProcessedImages) throws -> [Tensor]
    /// The attention mask the language model reads a prompt with, where it reads image tokens otherwise than
    /// causally (Gemma 3: each image's tokens see each other; see
    /// ``CausalLanguageModel/logits(inputsEmbeds:attentionMask:positionIds:cache:lastPositionOnly:)``); nil when
    /// the whole prompt is causal.
    func attentionMask(promptIds: [Int]) -> [Int]?
}

extension ImageChatModel {
    public func attentionMask(promptIds: [Int]) -> [Int]? { nil }
    public var cacheElementType: KVCache.ElementType { textDecoder.cacheElementType }
}

extension ImageChatModel {
    /// The embeddings `[1, inputIds.count - start, hidden]` of a prompt's positions from `start` on, each image token
    /// replaced by the next row of `imageFeatures` (every image of the prompt, in order: the features of images
    /// before `start` are skipped), as transformers' `masked_scatter` puts them in place.
    ///
    /// - Throws: `ModelError.invalidInput` unless the prompt holds exactly one image token per feature row.
    public func inputsEmbeds(inputIds: [Int], from start: Int = 0, imageFeatures: [Tensor]) throws -> Tensor {
        precondition(start >= 0 && start < inputIds.count, "inputsEmbeds: start \(start) outside a prompt of \(inputIds.count)")
        let embeds = try textDecoder.embed([Array(inputIds[start...])])
        let width = embeds.shape[2]
        guard imageFeatures.allSatisfy({ $0.rank == 2 && $0.shape[1] == width }) else {
            throw ModelError.invalidInput("image features must be [tokens, \(width)] each, got \(imageFeatures.map(\.shape))")
        }
        let positions = inputIds.indices.filter { inputIds[$0] == imageTokenId }
        let rows = imageFeatures.reduce(0) { $0 + $1.shape[0] }
        guard positions.count == rows else {
            throw ModelError.invalidInput("the prompt holds \(positions.count) image tokens (id \(imageTokenId)) for \(rows) image feature rows (\(imageFeatures.count) images)")
        }
        let skipped = positions.prefix { $0 < start }.count
        guard skipped < rows else { return embeds }
        let all = concatenate(imageFeatures, axis: 0).reshaped([1, rows, width])
        return replacingRows(of: embeds, at: positions[skipped...].map { $0 - start },
                             with: sequenceSlice(all, skipped..<rows))
    }
}
