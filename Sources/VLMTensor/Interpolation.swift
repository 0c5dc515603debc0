/// How ``interpolate(_:height:width:mode:)`` reads between source pixels.
public enum InterpolationMode: Sendable {
    /// Two taps per axis (`mode="bilinear"`).
    case bilinear
    /// Four taps per axis, Keys' cubic convolution with a = -0.75 (`mode="bicubic"`).
    case bicubic
}

/// `torch.nn.functional.interpolate(x, size=(height, width), mode=mode, align_corners=False)` of `x [..., H, W]`
/// (each of the leading planes resized on its own): `[..., height, width]`.
///
/// As PyTorch's CPU kernels do: the source coordinate of output pixel `i` is `(i + 0.5) · in/out − 0.5` (bilinear
/// clamps it at 0), taps outside the input repeat its edge, no antialiasing when shrinking. The two axes are applied
/// one after the other, rows first.
public func interpolate(_ x: Tensor, height: Int, width: Int, mode: InterpolationMode) -> Tensor {
    precondition(x.rank >= 2 && height > 0 && width > 0, "interpolate of \(x.shape) to \(height)x\(width)")
    let (inHeight, inWidth) = (x.shape[x.rank - 2], x.shape[x.rank - 1])
    let output = Tensor(uninitialized: x.shape.dropLast(2) + [height, width])
    if output.count == 0 { return output }
    precondition(inHeight > 0 && inWidth > 0, "interpolate of the empty planes of \(x.shape)")
    let planes = x.count / (inHeight * inWidth)
    let rows = InterpolationTaps(input: inHeight, output: height, mode: mode)
    let columns = InterpolationTaps(input: inWidth, output: width, mode: mode)
    let taps = rows.count
    // Work units of a few output rows, so that one large plane (a probability map the size of a photo) spreads
    // over the cores as well as many small ones (a position embedding's channels) do.
    let rowsPerUnit = 32, unitsPerPlane = (height + rowsPerUnit - 1) / rowsPerUnit
    parallelFor(planes * unitsPerPlane) { unit in
        let plane = unit / unitsPerPlane, firstRow = unit % unitsPerPlane * rowsPerUnit
        let source = x.storage.pointer + plane * inHeight * inWidth
        let destination = output.storage.pointer + plane * height * width
        // Each output row mixes `taps` source rows, each already resized along its width.
        var resizedRows = [Float](repeating: 0, count: taps * width)
        for y in firstRow..<min(firstRow + rowsPerUnit, height) {
            for tap in 0..<taps {
                let sourceRow = source + rows.indices[y * taps + tap] * inWidth
                for column in 0..<width {
                    var sum: Float = 0
                    for k in 0..<taps {
                        sum += columns.weights[column * taps + k] * sourceRow[columns.indices[column * taps + k]]
                    }
                    resizedRows[tap * width + column] = sum
                }
            }
            for column in 0..<width {
                var sum: Float = 0
                for tap in 0..<taps { sum += rows.weights[y * taps + tap] * resizedRows[tap * width + column] }
                destination[y * width + column] = sum
            }
        }
    }
    return output
}

/// For each output index along one axis, the source indices it reads (clamped into the input) and their weights.
struct InterpolationTaps {
    let count: Int
    var indices: [Int]
    var weights: [Float]

    init(input: Int, output: Int, mode: InterpolationMode) {
        count = mode == .bilinear ? 2 : 4
        indices = [Int](repeating: 0, count: output * count)
        weights = [Float](repeating: 0, count: output * count)
        let scale = Float(input) / Float(output)
        for i in 0..<output {
            var real = scale * (Float(i) + 0.5) - 0.5
            if mode == .bilinear { real = max(real, 0) }
            let first = min(Int(real.rounded(.down)), input - 1)
            let t = min(max(real - Float(first), 0), 1)
            switch mode {
            case .bilinear:
                indices[i * 2] = first
                indices[i * 2 + 1] = first + (first < input - 1 ? 1 : 0)
                weights[i * 2] = 1 - t
                weights[i * 2 + 1] = t
            case .bicubic:
                let a: Float = -0.75
                // Keys' kernel at distances 1 + t, t, 1 - t and 2 - t.
                let near = { (d: Float) in ((a + 2) * d - (a + 3)) * d * d + 1 }
                let far = { (d: Float) in ((a * d - 5 * a) * d + 8 * a) * d - 4 * a }
                let w = [far(t + 1), near(t), near(1 - t), far(2 - t)]
                for k in 0..<4 {
                    indices[i * 4 + k] = min(max(first - 1 + k, 0), input - 1)
                    weights[i * 4 + k] = w[k]
                }
            }
        }
    }
}

/// `torch.nn.functional.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=True)`
/// of `x [..., H, W]`: `[..., height, width]`.
///
/// As PyTorch's separable CPU kernel does (the same filter as Pillow's bilinear resize): along each axis, output `i`
/// is centred at `(i + 0.5) · in/out` and averages the inputs under a triangle as wide as one input pixel when growing
/// and as one output pixel when shrinking, its weights normalised to sum to 1. Width first, then height; an axis
/// whose size does not change is copied.
public func interpolateAntialiased(_ x: Tensor, height: Int, width: Int) -> Tensor {
    precondition(x.rank >= 2 && height > 0 && width > 0, "interpolateAntialiased of \(x.shape) to \(height)x\(width)")
    let (inHeight, inWidth) = (x.shape[x.rank - 2], x.shape[x.rank - 1])
    let output = Tensor(uninitialized: x.shape.dropLast(2) + [height, width])
    if output.count == 0 { return output }
    precondition(inHeight > 0 && inWidth > 0, "interpolateAntialiased of the empty planes of \(x.shape)")
    let planes = x.count / (inHeight * inWidth)
    let rows = AntialiasTaps(input: inHeight, output: height)
    let columns = AntialiasTaps(input: inWidth, output: width)
    parallelFor(planes) { plane in
        let source = x.storage.pointer + plane * inHeight * inWidth
        let destination = output.storage.pointer + plane * height * width
        // Every input row resized along its width, then the columns along the height.
        var resized = [Float](repeating: 0, count: inHeight * width)
        for y in 0..<inHeight {
            let row = source + y * inWidth
            for column in 0..<width { resized[y * width + column] = columns.apply(column) { row[$0] } }
        }
        for y in 0..<height {
            for column in 0..<width {
                destination[y * width + column] = rows.apply(y) { resized[$0 * width + column] }
            }
        }
    }
    return output
}

/// The gradient of ``interpolateAntialiased(_:height:width:)``'s input from its output's, `[..., height, width]` of
/// planes resized from `height`×`width`: each output's gradient handed back to the inputs it was summed from, by the
/// same weights (the resize is linear, so this is its transpose).
public func interpolateAntialiasedBackward(_ outputGradient: Tensor, height inHeight: Int, width inWidth: Int) -> Tensor {
    precondition(outputGradient.rank >= 2 && inHeight > 0 && inWidth > 0, "interpolateAntialiasedBackward of \(outputGradient.shape) to \(inHeight)x\(inWidth)")
    let (height, width) = (outputGradient.shape[outputGradient.rank - 2], outputGradient.shape[outputGradient.rank - 1])
    let input = Tensor(zeros: outputGradient.shape.dropLast(2) + [inHeight, inWidth])
    guard height > 0, width > 0 else { return input }
    let planes = input.count / (inHeight * inWidth)
    let rows = AntialiasTaps(input: inHeight, output: height)
    let columns = AntialiasTaps(input: inWidth, output: width)
    parallelFor(planes) { plane in
        let gradient = outputGradient.storage.pointer + plane * height * width
        let destination = input.storage.pointer + plane * inHeight * inWidth
        // The forward pass's two passes backwards: the columns' resize along the height, then each row's along the width.
        var resized = [Float](repeating: 0, count: inHeight * width)
        for y in 0..<height {
            for column in 0..<width {
                rows.distribute(y, gradient[y * width + column]) { resized[$0 * width + column] += $1 }
            }
        }
        for y in 0..<inHeight {
            for column in 0..<width {
                columns.distribute(column, resized[y * width + column]) { destination[y * inWidth + $0] += $1 }
            }
        }
    }
    return input
}

/// PyTorch's `_compute_weights_aa` for the bilinear (triangle) filter along one axis, in float as it computes them
/// for float tensors; an unchanged size reads each input as is.
private struct AntialiasTaps {
    /// For each output index: its first input index and weights for the inputs from there on.
    var first: [Int] = []
    var weights: [[Float]] = []

    init(input: Int, output: Int) {
        guard input != output else {
            first = Array(0..<output)
            weights = Array(repeating: [1], count: output)
            return
        }
        let scale = Float(input) / Float(output)
        let support: Float = scale >= 1 ? scale : 1
        let inverseScale: Float = scale >= 1 ? 1 / scale : 1
        for i in 0..<output {
            let center = scale * (Float(i) + 0.5)
            let low = max(Int(center - support + 0.5), 0)
            let count = min(Int(center + support + 0.5), input) - low
            var w = (0..<count).map { j -> Float in
                let distance = abs((Float(j + low) - center + 0.5) * inverseScale)
                return distance < 1 ? 1 - distance : 0
            }
            let total = w.reduce(0, +)
            if total != 0 { w = w.map { $0 / total } }
            first.append(low)
            weights.append(w)
        }
    }

    /// The weighted sum for output `i` of the inputs `value(index)`, added in index order.
    @inline(__always)
    func apply(_ i: Int, _ value: (Int) -> Float) -> Float {
        var sum: Float = 0
        for (k, weight) in weights[i].enumerated() { sum += weight * value(first[i] + k) }
        return sum
    }

    /// `gradient` of output `i` handed to each input it was summed from, times its weight: `add(index, share)`.
    @inline(__always)
    func distribute(_ i: Int, _ gradient: Float, _ add: (Int, Float) -> Void) {
        for (k, weight) in weights[i].enumerated() { add(first[i] + k, weight * gradient) }
    }
}
