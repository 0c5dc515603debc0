import Foundation
import VLMTensor

// The losses transformers' dual encoders return with `return_loss=True`, for a batch of pairs: N images and N texts,
// image i described by text i.

/// The pairs' side, throwing unless `logitsPerImage` is square.
private func pairCount(_ logitsPerImage: Tensor) throws -> Int {
    guard logitsPerImage.rank == 2, logitsPerImage.shape[0] == logitsPerImage.shape[1], logitsPerImage.shape[0] > 0 else {
        throw ModelError.invalidInput("a contrastive loss needs as many images as texts, image i paired with text i: got logits \(logitsPerImage.shape)")
    }
    return logitsPerImage.shape[0]
}

/// CLIP's contrastive loss (transformers' `image_text_contrastive_loss`): the mean of the cross-entropy of each
/// text's row over the images and of each image's row over the texts, the pair's own entry the target.
func clipContrastiveLoss(logitsPerImage: Tensor) throws -> Float {
    try clipContrastiveLossGradient(logitsPerImage: logitsPerImage).loss
}

/// SigLIP's sigmoid loss: for each text, −Σ log σ(±logit) over the images (+ for its own image, − for the others),
/// averaged over the texts.
func sigmoidContrastiveLoss(logitsPerImage: Tensor) throws -> Float {
    try sigmoidContrastiveLossGradient(logitsPerImage: logitsPerImage).loss
}

/// ``clipContrastiveLoss(logitsPerImage:)`` and its gradient with respect to `logitsPerImage`: each cross-entropy's
/// `(softmax − one-hot) / N`, halved, the text side's transposed back.
public func clipContrastiveLossGradient(logitsPerImage: Tensor) throws -> (loss: Float, gradient: Tensor) {
    let n = try pairCount(logitsPerImage)
    let logits = logitsPerImage.scalars
    let gradient = Tensor(zeros: [n, n])
    let g = gradient.storage.pointer
    var total = 0.0
    // Rows of logits_per_image (each image over the texts), then its columns (each text over the images).
    for imageRows in [true, false] {
        for i in 0..<n {
            let entry = { (j: Int) in imageRows ? i * n + j : j * n + i }
            // log Σ e^x as its largest term plus the log of the rest relative to it, which cannot overflow.
            let largest = (0..<n).map { Double(logits[entry($0)]) }.max()!
            let sum = (0..<n).reduce(0.0) { $0 + exp(Double(logits[entry($1)]) - largest) }
            total += largest + log(sum) - Double(logits[entry(i)])
            for j in 0..<n {
                let probability = exp(Double(logits[entry(j)]) - largest) / sum
                g[entry(j)] += Float((probability - (i == j ? 1 : 0)) / Double(2 * n))
            }
        }
    }
    return (Float(total / Double(2 * n)), gradient)
}

/// ``sigmoidContrastiveLoss(logitsPerImage:)`` and its gradient with respect to `logitsPerImage`: for each pair's
/// logit x with sign z (+1 for a pair, −1 otherwise), −z·σ(−z·x) / N.
public func sigmoidContrastiveLossGradient(logitsPerImage: Tensor) throws -> (loss: Float, gradient: Tensor) {
    let n = try pairCount(logitsPerImage)
    let logits = logitsPerImage.scalars
    let gradient = Tensor(uninitialized: [n, n])
    let g = gradient.storage.pointer
    var total = 0.0
    for index in 0..<(n * n) {
        let sign: Double = index / n == index % n ? 1 : -1
        let x = sign * Double(logits[index])
        // log σ(x) without overflow: min(x, 0) − log(1 + e^−|x|).
        total -= min(x, 0) - log1p(exp(-abs(x)))
        g[index] = Float(-sign / (1 + exp(x)) / Double(n))
    }
    return (Float(total / Double(n)), gradient)
}
