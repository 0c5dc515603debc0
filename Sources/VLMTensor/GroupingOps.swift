#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Operations GroupViT's grouping blocks and its projection heads are made of: products of batched matrices, the
// hard (straight-through) assignment of tokens to groups, batch normalization with running statistics, token means,
// and a map pasted into a larger zero plane.

/// `a [B, M, K] · b [B, K, N]` item by item (`torch.bmm`), or `a · bᵀ` with `b [B, N, K]` when `transposeB`.
public func batchedMatmul(_ a: Tensor, _ b: Tensor, transposeB: Bool = false) -> Tensor {
    precondition(a.rank == 3 && b.rank == 3 && a.shape[0] == b.shape[0],
                 "batchedMatmul needs [B, M, K] and [B, K, N] (or [B, N, K]), got \(a.shape) and \(b.shape)")
    let batch = a.shape[0]
    if batch == 1 {
        let product = matmul(a.reshaped(Array(a.shape.dropFirst())), b.reshaped(Array(b.shape.dropFirst())),
                             transposeB: transposeB)
        return product.reshaped([1] + product.shape)
    }
    let items = (0..<batch).map { item in
        matmul(batchItem(a, item), batchItem(b, item), transposeB: transposeB)
    }
    return concatenate(items.map { $0.reshaped([1] + $0.shape) }, axis: 0)
}

/// Item `index` of `x [B, ...]`, copied, without its batch axis.
public func batchItem(_ x: Tensor, _ index: Int) -> Tensor {
    precondition(x.rank >= 2 && (0..<x.shape[0]).contains(index), "batchItem \(index) of \(x.shape)")
    let inner = Array(x.shape.dropFirst()), size = x.count / x.shape[0]
    let output = Tensor(uninitialized: inner)
    output.storage.pointer.initialize(from: x.storage.pointer + index * size, count: size)
    return output
}

/// GroupViT's assignment of tokens to groups in eval mode, from `logits [B, G, N]` (group queries × tokens):
///
/// - `soft`: the softmax over the groups of each token (`softmax(logits, dim=-2)`);
/// - `assignment`: each token given to its most likely group (the first on ties, as `max` returns it) by the
///   straight-through `hard_softmax` (`one_hot - soft + soft`, computed as written, so a 1 may be off by an ulp),
///   then each group's row divided by its sum plus `eps` (`attn / (attn.sum(-1, keepdim=True) + assign_eps)`):
///   a group's output is the mean of its tokens, shrunk towards zero when it has few.
public func hardAssignment(_ logits: Tensor, eps: Float) -> (assignment: Tensor, soft: Tensor) {
    precondition(logits.rank == 3 && logits.shape[1] > 0, "hardAssignment needs logits [B, G, N], got \(logits.shape)")
    let (batch, groups, tokens) = (logits.shape[0], logits.shape[1], logits.shape[2])
    let soft = Tensor(uninitialized: logits.shape), assignment = Tensor(uninitialized: logits.shape)
    let input = logits.storage.pointer, probabilities = soft.storage.pointer, hard = assignment.storage.pointer
    for item in 0..<batch {
        let base = item * groups * tokens
        for token in 0..<tokens {
            var largest = -Float.infinity
            for group in 0..<groups { largest = max(largest, input[base + group * tokens + token]) }
            var sum: Float = 0
            for group in 0..<groups {
                let value = exp(input[base + group * tokens + token] - largest)
                probabilities[base + group * tokens + token] = value
                sum += value
            }
            var best = 0
            for group in 0..<groups {
                let index = base + group * tokens + token
                probabilities[index] /= sum
                if probabilities[index] > probabilities[base + best * tokens + token] { best = group }
            }
            for group in 0..<groups {
                let p = probabilities[base + group * tokens + token]
                hard[base + group * tokens + token] = ((group == best ? 1 : 0) - p) + p
            }
        }
        for group in 0..<groups {
            let row = hard + base + group * tokens
            var sum: Float = 0
            for token in 0..<tokens { sum += row[token] }
            for token in 0..<tokens { row[token] /= sum + eps }
        }
    }
    return (assignment, soft)
}

/// `nn.BatchNorm1d` in eval mode over the last dimension of `x [..., C]`, as PyTorch's CPU kernel computes it:
/// `x · α + β` with `α = weight / √(variance + eps)` and `β = bias − mean · α` per channel.
public func batchNormalized(_ x: Tensor, mean: Tensor, variance: Tensor, weight: Tensor, bias: Tensor,
                            eps: Float) -> Tensor {
    let channels = x.shape.last ?? 0
    precondition([mean, variance, weight, bias].allSatisfy { $0.count == channels },
                 "batchNormalized: statistics of \(mean.count) channels for \(x.shape)")
    var alpha = [Float](repeating: 0, count: channels), beta = [Float](repeating: 0, count: channels)
    for channel in 0..<channels {
        let inverse = 1 / (variance.storage.pointer[channel] + eps).squareRoot()
        alpha[channel] = inverse * weight.storage.pointer[channel]
        beta[channel] = bias.storage.pointer[channel] - mean.storage.pointer[channel] * alpha[channel]
    }
    let output = Tensor(uninitialized: x.shape)
    for index in 0..<x.count {
        let channel = index % channels
        output.storage.pointer[index] = x.storage.pointer[index] * alpha[channel] + beta[channel]
    }
    return output
}

/// The mean over the tokens of `x [B, T, D]` (`x.mean(dim=1)`): `[B, D]`.
public func tokenMean(_ x: Tensor) -> Tensor {
    precondition(x.rank == 3 && x.shape[1] > 0, "tokenMean needs [B, T, D] with tokens, got \(x.shape)")
    let (batch, tokens, features) = (x.shape[0], x.shape[1], x.shape[2])
    let output = Tensor(zeros: [batch, features])
    for item in 0..<batch {
        let sums = output.storage.pointer + item * features
        for token in 0..<tokens {
            let row = x.storage.pointer + (item * tokens + token) * features
            for feature in 0..<features { sums[feature] += row[feature] }
        }
        for feature in 0..<features { sums[feature] /= Float(tokens) }
    }
    return output
}

/// Planes `x [..., h, w]` placed with their top-left corner at (`top`, `left`) in zero planes of `height`×`width`,
/// whatever falls outside cut off: `[..., height, width]`.
public func pasted(_ x: Tensor, height: Int, width: Int, top: Int, left: Int) -> Tensor {
    precondition(x.rank >= 2 && height >= 0 && width >= 0, "pasted: \(x.shape) into \(height)x\(width)")
    let (inHeight, inWidth) = (x.shape[x.rank - 2], x.shape[x.rank - 1])
    let output = Tensor(zeros: x.shape.dropLast(2) + [height, width])
    let planes = inHeight * inWidth == 0 ? 0 : x.count / (inHeight * inWidth)
    let rows = max(top, 0)..<max(min(top + inHeight, height), max(top, 0))
    let columns = max(left, 0)..<max(min(left + inWidth, width), max(left, 0))
    guard !rows.isEmpty, !columns.isEmpty else { return output }
    for plane in 0..<planes {
        for row in rows {
            let source = x.storage.pointer + (plane * inHeight + row - top) * inWidth + columns.lowerBound - left
            let destination = output.storage.pointer + (plane * height + row) * width + columns.lowerBound
            destination.update(from: source, count: columns.count)
        }
    }
    return output
}
