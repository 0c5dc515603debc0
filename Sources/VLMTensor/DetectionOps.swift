#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Ops of open-vocabulary detection heads (OWL-ViT): per-patch features modulated by a class token, compared with
// queries under a per-patch shift and scale.

/// `x / (‖x‖₂ + epsilon)` over the last dimension (`x / (torch.linalg.norm(x, dim=-1, keepdim=True) + epsilon)`):
/// a normalization that keeps a zero vector zero.
public func l2Normalized(_ x: Tensor, epsilon: Float) -> Tensor {
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let columns = x.shape.last!
    let rows = x.count / columns
    let (source, destination) = (x.storage.pointer, output.storage.pointer)
    for row in 0..<rows {
        let input = source + row * columns
        // Accumulating in Double makes the norm correctly rounded, which PyTorch's float reduction approximates.
        var sumOfSquares = 0.0
        for column in 0..<columns { sumOfSquares += Double(input[column]) * Double(input[column]) }
        let denominator = Float(sumOfSquares.squareRoot()) + epsilon
        for column in 0..<columns { destination[row * columns + column] = input[column] / denominator }
    }
    return output
}

/// `x [B, T, D]` with each of batch item `b`'s tokens multiplied elementwise by `factors[b]` (`factors [B, D]`):
/// `x * factors[:, None, :]`.
public func multiplyingTokens(_ x: Tensor, by factors: Tensor) -> Tensor {
    precondition(x.rank == 3 && factors.shape == [x.shape[0], x.shape[2]],
                 "multiplyingTokens: \(x.shape) by \(factors.shape)")
    let (batch, length, features) = (x.shape[0], x.shape[1], x.shape[2])
    let output = Tensor(uninitialized: x.shape)
    for item in 0..<batch {
        let scale = factors.storage.pointer + item * features
        for token in 0..<length {
            let row = (item * length + token) * features
            for feature in 0..<features {
                output.storage.pointer[row + feature] = x.storage.pointer[row + feature] * scale[feature]
            }
        }
    }
    return output
}

/// `(x + shift) * scale` where `x` is `[..., N]` and `shift` and `scale` are `[..., 1]`: each row of `x` shifted and
/// scaled by its own pair of numbers, in that order of float operations.
public func shiftedAndScaled(_ x: Tensor, shift: Tensor, scale: Tensor) -> Tensor {
    let columns = x.shape.last ?? 0
    let rows = columns == 0 ? 0 : x.count / columns
    precondition(shift.count == rows && scale.count == rows,
                 "shiftedAndScaled: \(x.shape) by shift \(shift.shape) and scale \(scale.shape)")
    let output = Tensor(uninitialized: x.shape)
    for row in 0..<rows {
        let (offset, factor) = (shift.storage.pointer[row], scale.storage.pointer[row])
        for column in 0..<columns {
            output.storage.pointer[row * columns + column] = (x.storage.pointer[row * columns + column] + offset) * factor
        }
    }
    return output
}
