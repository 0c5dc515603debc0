import Foundation
import VLMImages
import VLMTensor

/// transformers' `ignore_index`: a label that the loss leaves out (a prompt's tokens in supervised fine-tuning,
/// padding).
public let ignoredLabel = -100

/// A sum of per-token negative log-likelihoods and how many tokens it holds.
public struct NegativeLogLikelihood: Sendable, Equatable {
    public var sum: Double
    public var count: Int

    /// The mean, transformers' `loss`; NaN over no tokens, as torch's mean over nothing is.
    public var mean: Double { count == 0 ? .nan : sum / Double(count) }
}

extension CausalLanguageModel {
    /// transformers' `model(input_ids, attention_mask=…, labels=labels).loss`: the mean cross-entropy of each
    /// position's logits against the next position's label, over every label that is not ``ignoredLabel``.
    ///
    /// - Parameters:
    ///   - labels: `[B][T]` like `inputIds` (usually the ids themselves with the prompt and padding set to -100);
    ///     position `t`'s logits are scored against `labels[b][t + 1]`, so each row's first label never counts.
    /// - Throws: `ModelError.invalidInput` for labels of another shape or outside the vocabulary.
    public func loss(inputIds: [[Int]], attentionMask: [[Int]]? = nil, labels: [[Int]]) throws -> Float {
        Float(try negativeLogLikelihood(inputIds: inputIds, attentionMask: attentionMask, labels: labels).mean)
    }

    /// The sum behind ``loss(inputIds:attentionMask:labels:)`` and the number of labels it counts, for averaging
    /// over several passes (a perplexity's windows).
    public func negativeLogLikelihood(inputIds: [[Int]], attentionMask: [[Int]]? = nil,
                                      labels: [[Int]]) throws -> NegativeLogLikelihood {
        try checkLabels(labels, shapedLike: inputIds, vocabulary: vocabularySize)
        return scoredNegativeLogLikelihood(try self.logits(inputIds: inputIds, attentionMask: attentionMask),
                                           labels: labels, vocabulary: vocabularySize)
    }
}

/// Throws unless `labels` has the shape of `inputIds` and holds vocabulary ids or ``ignoredLabel``.
func checkLabels(_ labels: [[Int]], shapedLike inputIds: [[Int]], vocabulary: Int) throws {
    guard labels.count == inputIds.count, zip(labels, inputIds).allSatisfy({ $0.count == $1.count }) else {
        throw ModelError.invalidInput("labels must have the shape of the input ids")
    }
    if let label = labels.joined().first(where: { $0 != ignoredLabel && !(0..<vocabulary).contains($0) }) {
        throw ModelError.invalidInput("label \(label) is outside the vocabulary of \(vocabulary) (use \(ignoredLabel) to leave a position out)")
    }
}

/// The cross-entropy of each position of `logits` `[B, T, vocabulary]` against the next position's label, summed
/// over the labels that count, as transformers' `ForCausalLMLoss` shifts them.
func scoredNegativeLogLikelihood(_ logits: Tensor, labels: [[Int]], vocabulary: Int) -> NegativeLogLikelihood {
    let length = labels.first?.count ?? 0
    var total = NegativeLogLikelihood(sum: 0, count: 0)
    logits.withUnsafeBufferPointer { scores in
        for (row, rowLabels) in labels.enumerated() {
            for position in 0..<max(length - 1, 0) where rowLabels[position + 1] != ignoredLabel {
                let start = (row * length + position) * vocabulary
                let nll = crossEntropy(UnsafeBufferPointer(rebasing: scores[start..<(start + vocabulary)]),
                                       label: rowLabels[position + 1])
                total.sum += Double(nll)
                total.count += 1
            }
        }
    }
    return total
}

extension ImageChatModel {
    /// transformers' `model(**processor(images, text), labels=labels).loss` for one prompt: its embeddings with each
    /// image's features in its tokens' places, through the language model, scored as
    /// ``CausalLanguageModel/loss(inputIds:attentionMask:labels:)`` scores text. With the answer's ids as labels and
    /// -100 on the image tokens and the question, the objective of LLaVA's projector alignment and instruction
    /// tuning.
    ///
    /// - Throws: `ModelError.invalidInput` for labels of another length or outside the vocabulary, or a prompt
    ///   whose image tokens do not match the images.
    public func loss(images: ProcessedImages, inputIds: [Int], labels: [Int]) throws -> Float {
        try checkLabels([labels], shapedLike: [inputIds], vocabulary: textDecoder.vocabularySize)
        let embeds = try inputsEmbeds(inputIds: inputIds, imageFeatures: imageFeatures(images))
        let logits = try textDecoder.logits(inputsEmbeds: embeds, attentionMask: attentionMask(promptIds: inputIds).map { [$0] },
                                            positionIds: nil, cache: nil, lastPositionOnly: false)
        return Float(scoredNegativeLogLikelihood(logits, labels: [labels], vocabulary: textDecoder.vocabularySize).mean)
    }
}

extension CausalLanguageModel {
    /// Each token of `ids` after the first with its log-probability given the tokens before it and the `top` most
    /// likely tokens there (float32 log-softmax, as generation reports its own tokens'), from one pass over `ids`:
    /// what OpenAI's completions return for the prompt with `echo` and `logprobs`.
    public func promptLogprobs(_ ids: [Int], top: Int) throws -> [BatchToken] {
        try promptLogprobs(ids, top: top, chunk: Self.logitsChunk)
    }

    func promptLogprobs(_ ids: [Int], top: Int, chunk: Int) throws -> [BatchToken] {
        guard ids.count > 1 else { return [] }
        var tokens: [BatchToken] = []
        let vocabulary = vocabularySize
        try forEachLogitsChunk(ids, chunk: chunk) { first, scores in
            for row in 0..<(scores.count / vocabulary) where first + row + 1 < ids.count {
                let logprobs = logSoftmax(Array(scores[(row * vocabulary)..<((row + 1) * vocabulary)]))
                let next = ids[first + row + 1]
                tokens.append(BatchToken(id: next, logprob: logprobs[next], topLogprobs: mostLikely(logprobs, count: top)))
            }
        }
        return tokens
    }

    /// Positions whose logits a long sequence's pass holds at once: 256 × a vocabulary of 152,000 is 156 MB, where
    /// a whole 8,000-token prompt's would be 4.9 GB.
    static var logitsChunk: Int { 256 }

    /// The logits of one sequence `ids`, handed to `body` a chunk of about `chunk` positions at a time (`[count,
    /// vocabulary]`, from position `first`), the chunks run over a KV cache so that each sees every token before it.
    /// The chunks are as equal as can be: a short last one of 16 positions or fewer would take the decoding
    /// products, whose numbers differ slightly from a prompt's.
    func forEachLogitsChunk(_ ids: [Int], chunk: Int,
                            _ body: (_ first: Int, _ scores: UnsafeBufferPointer<Float>) throws -> Void) throws {
        let chunks = max(1, (ids.count + chunk - 1) / chunk)
        let cache = chunks > 1 ? try makeCache(batch: 1, capacity: ids.count) : nil
        var first = 0
        for index in 0..<chunks {
            let end = ids.count * (index + 1) / chunks
            let logits = try self.logits(inputIds: [Array(ids[first..<end])], cache: cache)
            try logits.withUnsafeBufferPointer { try body(first, $0) }
            first = end
        }
    }

    /// The negative log-likelihood of `ids[scoredFrom...]` (from 1 on), each token given every one before it.
    func negativeLogLikelihood(_ ids: [Int], scoredFrom: Int, chunk: Int) throws -> NegativeLogLikelihood {
        var total = NegativeLogLikelihood(sum: 0, count: 0)
        let vocabulary = vocabularySize
        try forEachLogitsChunk(ids, chunk: chunk) { first, scores in
            for row in 0..<(scores.count / vocabulary) {
                let next = first + row + 1
                guard next < ids.count, next >= scoredFrom else { continue }
                total.sum += Double(crossEntropy(UnsafeBufferPointer(rebasing: scores[(row * vocabulary)..<((row + 1) * vocabulary)]),
                                                 label: ids[next]))
                total.count += 1
            }
        }
        return total
    }
}

/// −log softmax(scores)[label] in float32, as torch's `cross_entropy` computes it: shifted by the maximum, the
/// exponentials summed, their log taken.
func crossEntropy(_ scores: UnsafeBufferPointer<Float>, label: Int) -> Float {
    let maximum = scores.max() ?? 0
    var sum: Float = 0
    for score in scores { sum += expf(score - maximum) }
    return maximum + logf(sum) - scores[label]
}

/// The perplexity of a token sequence under a language model: exp of the mean negative log-likelihood of every
/// token after the first.
public struct Perplexity: Sendable, Equatable {
    /// Tokens in the sequence.
    public var tokens: Int
    /// Windows the model read.
    public var windows: Int
    /// Over every token after the first, each scored once.
    public var negativeLogLikelihood: NegativeLogLikelihood

    public var perplexity: Double { exp(negativeLogLikelihood.mean) }
}

extension CausalLanguageModel {
    /// The perplexity of `ids` by the strided sliding-window recipe of transformers' perplexity guide: windows of
    /// `context` tokens starting every `stride` tokens, each scoring the tokens the window before did not reach, so
    /// that every token after the first `context` is scored with at least `context − stride` tokens before it. The
    /// guide counts each window's scored tokens as its unmasked labels less one, one too few after the first window;
    /// this weights each window by the tokens it really scores.
    ///
    /// - Throws: `ModelError.invalidInput` for fewer than two tokens, a `context` under 2 or over the model's
    ///   positions, or a `stride` outside 1..<`context` (windows that do not overlap could not score their first
    ///   tokens, which have nothing before them in their window).
    public func perplexity(of ids: [Int], context: Int, stride: Int) throws -> Perplexity {
        try perplexity(of: ids, context: context, stride: stride, chunk: Self.logitsChunk)
    }

    func perplexity(of ids: [Int], context: Int, stride: Int, chunk: Int) throws -> Perplexity {
        guard ids.count >= 2 else { throw ModelError.invalidInput("a perplexity needs at least two tokens, got \(ids.count)") }
        guard context >= 2 else { throw ModelError.invalidInput("the context must be at least 2 tokens, got \(context)") }
        if let limit = contextLength, context > limit {
            throw ModelError.invalidInput("a context of \(context) tokens exceeds the model's \(limit) positions")
        }
        guard (1..<context).contains(stride) else {
            throw ModelError.invalidInput("the stride must be from 1 to less than the context (\(context)), got \(stride)")
        }
        var total = NegativeLogLikelihood(sum: 0, count: 0)
        var (windows, reached) = (0, 0)
        for begin in Swift.stride(from: 0, to: ids.count, by: stride) {
            let end = min(begin + context, ids.count)
            let window = Array(ids[begin..<end])
            let part = try negativeLogLikelihood(window, scoredFrom: window.count - (end - reached), chunk: chunk)
            total.sum += part.sum
            total.count += part.count
            windows += 1
            reached = end
            if end == ids.count { break }
        }
        return Perplexity(tokens: ids.count, windows: windows, negativeLogLikelihood: total)
    }
}

/// The positions transformers' causal language-model loss scores in `labels` `[B][T]`, in order (flat indices
/// `b · T + t` into the rows of logits `[B, T, vocabulary]`), and each one's target: position t is scored against
/// label t + 1 where that is not -100; a row's last position never is. Only these rows' logits matter to the loss
/// and its gradient, so training computes no others.
///
/// - Throws: `ModelError.invalidInput` for rows of different lengths, labels outside the vocabulary, or none that
///   counts.
public func causalLanguageModelTargets(labels: [[Int]], vocabulary: Int) throws -> (positions: [Int], targets: [Int]) {
    let length = labels.first?.count ?? 0
    try checkLabels(labels, shapedLike: labels.map { _ in Array(repeating: 0, count: length) }, vocabulary: vocabulary)
    var (positions, targets) = ([Int](), [Int]())
    for (row, rowLabels) in labels.enumerated() {
        for t in 0..<max(length - 1, 0) where rowLabels[t + 1] != ignoredLabel {
            positions.append(row * length + t)
            targets.append(rowLabels[t + 1])
        }
    }
    guard !positions.isEmpty else { throw ModelError.invalidInput("no label counts: every one is \(ignoredLabel) or a row's first") }
    return (positions, targets)
}

/// transformers' causal language-model loss from the logits of the positions it scores, `[N, vocabulary]` for the N
/// targets of ``causalLanguageModelTargets(labels:vocabulary:)`` (the mean cross-entropy of each against its
/// target), and its gradient with respect to them: `(softmax − one-hot) / N`.
public func causalLanguageModelLossGradient(scoredLogits logits: Tensor, targets: [Int]) -> (loss: Float, gradient: Tensor) {
    let (losses, gradient) = crossEntropyBackward(logits: logits, targets: targets, scale: 1 / Float(targets.count))
    return (Float(losses.compactMap { $0 }.reduce(0, +) / Double(targets.count)), gradient)
}
