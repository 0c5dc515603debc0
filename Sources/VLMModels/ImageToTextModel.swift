import VLMTensor

/// A model that writes text about images (captioning, prompted captioning, visual question answering, image chat): BLIP,
/// BLIP-2 and LLaVA. Image features are computed once per image, so a conversation about one image reuses them every turn.
public protocol ImageToTextModel: AnyObject, Sendable {
    /// Size of the language model's logits' last dimension.
    var vocabularySize: Int { get }
    /// How many new tokens fit after a prompt of `promptLength` tokens (nil: the start the model makes itself)
    /// before the language model's positions run out; nil when they do not.
    func positionsLeft(promptLength: Int?) -> Int?

    /// What generation conditions on, one row per image of `pixelValues` `[N, 3, H, W]`.
    func imageEmbeddings(pixelValues: Tensor) throws -> Tensor

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
}
