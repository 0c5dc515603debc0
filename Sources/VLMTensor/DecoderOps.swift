internal import CVLMKernels
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Small ops of decoder-only language models (Llama and its kin), memory-bound and cheap next to the matmuls. The
// RMS norm and the rotary embedding are the C functions the fused decoding step (vlm_decoder_step) runs, so that
// both paths compute the same floats.

/// RMS normalization over the last dimension, as transformers' `LlamaRMSNorm`: `weight · x / √(mean(x²) + eps)`.
public func rmsNorm(_ x: Tensor, weight: Tensor, eps: Float) -> Tensor {
    let features = x.shape.last ?? 0
    precondition(x.rank >= 1 && weight.shape == [features], "rmsNorm of \(x.shape) needs weight [\(features)], got \(weight.shape)")
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let source = UnsafeSendablePointer(pointer: x.storage.pointer), weights = UnsafeSendablePointer(pointer: weight.storage.pointer)
    let destination = UnsafeSendablePointer(pointer: output.storage.pointer)
    // A prompt's rows are split among the cores (rows are normalized independently, so the floats are the same);
    // 64 rows of SmolLM2's 576 features take about 6 µs, well above a parallel region's hand-over.
    parallelRanges(x.count / features, grain: 64) { rows in
        vlm_rms_norm(source.pointer + rows.lowerBound * features, weights.pointer, rows.count, features, eps,
                     destination.pointer + rows.lowerBound * features)
    }
    withExtendedLifetime((x, weight, output)) {}
    return output
}

/// RMS normalization of each head of `x [..., heads·headDim]` on its own, `weight` the `[headDim]` weights every head
/// shares (Qwen3's and Gemma 3's q_norm and k_norm).
public func headRMSNorm(_ x: Tensor, weight: Tensor, eps: Float) -> Tensor {
    rmsNorm(x.reshaped([-1, weight.count]), weight: weight, eps: eps).reshaped(x.shape)
}

/// Rotary position embedding tables: `cos` and `sin` of `position · inverseFrequency`, each `[positions.count,
/// inverseFrequencies.count]` (transformers concatenates the table with itself; half is enough here).
public func rotaryTables(positions: [Int], inverseFrequencies: [Float]) -> (cos: Tensor, sin: Tensor) {
    let half = inverseFrequencies.count
    let cosines = Tensor(uninitialized: [positions.count, half])
    let sines = Tensor(uninitialized: [positions.count, half])
    for (row, position) in positions.enumerated() {
        rotaryRow(position: position, inverseFrequencies: inverseFrequencies, cosines: cosines.storage.pointer + row * half,
                  sines: sines.storage.pointer + row * half)
    }
    return (cosines, sines)
}

/// One position's row of ``rotaryTables(positions:inverseFrequencies:)`` (`inverseFrequencies.count` cosines and as
/// many sines), written where a decoding step reads it.
public func rotaryRow(position: Int, inverseFrequencies: [Float], cosines: UnsafeMutablePointer<Float>,
                      sines: UnsafeMutablePointer<Float>) {
    for index in inverseFrequencies.indices {
        // fp32 product, then fp32 cos/sin, as transformers' LlamaRotaryEmbedding.
        let angle = Float(position) * inverseFrequencies[index]
        cosines[index] = cos(angle)
        sines[index] = sin(angle)
    }
}

/// Rotates each head of `x [B, T, heads·headDim]` by its position: transformers' `apply_rotary_pos_emb`, the
/// "rotate half" form (`x·cos + rotate_half(x)·sin`). `cos` and `sin` are `[B·T, headDim/2]` from ``rotaryTables``.
public func applyRotaryEmbedding(_ x: Tensor, heads: Int, cos: Tensor, sin: Tensor) -> Tensor {
    precondition(x.rank == 3 && heads > 0 && x.shape[2] % heads == 0, "applyRotaryEmbedding needs [B, T, heads·headDim], got \(x.shape)")
    let tokens = x.shape[0] * x.shape[1]
    let headDim = x.shape[2] / heads
    let half = headDim / 2
    precondition(headDim % 2 == 0 && cos.shape == [tokens, half] && sin.shape == [tokens, half],
                 "applyRotaryEmbedding: tables \(cos.shape) do not fit \(x.shape) with \(heads) heads")
    let output = Tensor(uninitialized: x.shape)
    vlm_rotate_half(x.storage.pointer, tokens, heads, headDim, cos.storage.pointer, sin.storage.pointer, output.storage.pointer)
    return output
}

/// Elementwise `a · b` of two tensors of one shape (the gating product of SwiGLU).
public func multiply(_ a: Tensor, _ b: Tensor) -> Tensor {
    precondition(a.shape == b.shape, "multiply: \(a.shape) and \(b.shape) differ")
    let output = Tensor(uninitialized: a.shape)
    for index in 0..<a.count { output.storage.pointer[index] = a.storage.pointer[index] * b.storage.pointer[index] }
    return output
}

/// `x · scale + shift` where `x` is `[B, T, D]` and `scale` and `shift` are `[B, D]`: each batch item's features
/// scaled and shifted by its own vector, over all its tokens (FiLM, feature-wise linear modulation).
public func modulated(_ x: Tensor, scale: Tensor, shift: Tensor) -> Tensor {
    precondition(x.rank == 3 && scale.shape == [x.shape[0], x.shape[2]] && shift.shape == scale.shape,
                 "modulated: \(x.shape) by scale \(scale.shape) and shift \(shift.shape)")
    let (batch, length, features) = (x.shape[0], x.shape[1], x.shape[2])
    let output = Tensor(uninitialized: x.shape)
    for item in 0..<batch {
        let factors = scale.storage.pointer + item * features, offsets = shift.storage.pointer + item * features
        for token in 0..<length {
            let row = (item * length + token) * features
            for feature in 0..<features {
                output.storage.pointer[row + feature] = x.storage.pointer[row + feature] * factors[feature] + offsets[feature]
            }
        }
    }
    return output
}

/// The index of the largest value of each row of `x [..., N]`; the first one on ties, as `torch.argmax`. NaN counts as
/// largest, also as torch does.
public func argmaxLastDimension(_ x: Tensor) -> [Int] {
    let columns = x.shape.last ?? 0
    precondition(columns > 0, "argmax over an empty dimension of \(x.shape)")
    return (0..<(x.count / columns)).map { row in
        argmax(UnsafeBufferPointer(start: x.storage.pointer + row * columns, count: columns))
    }
}

/// The index of the first largest of `values`, a NaN counting as larger than any number (the first NaN where there
/// is one), as `torch.argmax`. Vectorized: greedy decoding takes it over a vocabulary's scores every step (SmolLM2's
/// 49,152 in 3 µs with AVX-512 on a Zen 5, against about 25 µs element by element: 1% of its decoding step).
public func argmax(_ values: UnsafeBufferPointer<Float>) -> Int { argmax(values, path: .best) }

func argmax(_ values: UnsafeBufferPointer<Float>, path: KernelPath) -> Int {
    precondition(!values.isEmpty, "argmax of no values")
    return vlm_argmax(values.baseAddress!, values.count, path.isa)
}

/// `x [..., Σ widths]` cut along the last dimension into `[..., widths[0]]`, `[..., widths[1]]`, …, copied.
public func splitLastDimension(_ x: Tensor, widths: [Int]) -> [Tensor] {
    let features = x.shape.last ?? 0
    precondition(x.rank >= 1 && widths.reduce(0, +) == features, "cannot split \(x.shape) into widths \(widths)")
    let rows = features == 0 ? 0 : x.count / features
    var start = 0
    return widths.map { width in
        let part = Tensor(uninitialized: x.shape.dropLast() + [width])
        for row in 0..<rows {
            (part.storage.pointer + row * width).initialize(from: x.storage.pointer + row * features + start, count: width)
        }
        start += width
        return part
    }
}

/// `activation(a) · b` for `x = [..., a | b]` (two equal halves): a gated MLP's input (SwiGLU) from its stacked
/// gate and up projections.
public func gatedActivation(_ x: Tensor, activation: Activation) -> Tensor {
    gatedActivation(x, activation: activation, path: .best)
}

func gatedActivation(_ x: Tensor, activation: Activation, path: KernelPath) -> Tensor {
    let features = x.shape.last ?? 0
    precondition(x.rank >= 1 && features % 2 == 0, "gatedActivation needs an even last dimension, got \(x.shape)")
    let half = features / 2, rows = features == 0 ? 0 : x.count / features
    let output = Tensor(uninitialized: x.shape.dropLast() + [half])
    let source = UnsafeSendablePointer(pointer: x.storage.pointer), destination = UnsafeSendablePointer(pointer: output.storage.pointer)
    let isa = path.isa
    let gate: @Sendable (Range<Int>) -> Void = { rows in
        if activation == .silu {
            vlm_gated_silu(source.pointer + rows.lowerBound * features, rows.count, half,
                           destination.pointer + rows.lowerBound * half, isa)
            return
        }
        for row in rows {
            let input = source.pointer + row * features, out = destination.pointer + row * half
            for column in 0..<half { out[column] = activation(input[column]) * input[half + column] }
        }
    }
    // A prompt's rows are split among the cores: the scalar activations (GELU's tanh and erf from libm) cost tens of
    // nanoseconds an element (Gemma 3 270M's GELU gating was a fifth of its prompt's time on one core of two), and
    // even SiLU's vector kernel was 3% of SmolLM2-135M's 1,000-token prompt on one core while the other waited.
    if rows * half < 1 << 16 { gate(0..<rows) } else { parallelRanges(rows, grain: 1, gate) }
    withExtendedLifetime((x, output)) {}
    return output
}
