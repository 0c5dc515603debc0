internal import CVLMKernels

// The optimizers' elementwise updates, spread over the cores.

/// Elements per parallel unit of an elementwise update: large enough that a unit's work dwarfs handing it out.
private let updateUnit = 1 << 16

/// One `torch.optim.AdamW` update of `parameter` in place from `gradient`, its moments updated in place: decoupled
/// weight decay `p ← p·(1 − lr·λ)`, then `m ← m + (g − m)(1 − β₁)` (torch's `lerp_`), `v ← β₂v + (1 − β₂)g²`, and
/// `p ← p − stepSize · m / (√v / correction2 + ε)` with `stepSize = lr / (1 − β₁ᵗ)` and `correction2 = √(1 − β₂ᵗ)`,
/// in fp32 in that order, as torch's single-tensor implementation computes it.
public func adamWUpdate(_ parameter: Tensor, gradient: Tensor, firstMoment: Tensor, secondMoment: Tensor, decay: Float,
                        beta1: Float, beta2: Float, stepSize: Float, correction2: Float, epsilon: Float) {
    let count = parameter.count
    precondition(gradient.count == count && firstMoment.count == count && secondMoment.count == count,
                 "AdamW update of \(parameter.shape) with gradient \(gradient.shape) and moments \(firstMoment.shape), \(secondMoment.shape)")
    let run: @Sendable (Int) -> Void = { unit in
        let first = unit * updateUnit
        vlm_adamw_update(parameter.storage.pointer + first, gradient.storage.pointer + first, firstMoment.storage.pointer + first,
                         secondMoment.storage.pointer + first, min(updateUnit, count - first), decay, beta1, beta2,
                         stepSize, correction2, epsilon)
    }
    let units = (count + updateUnit - 1) / updateUnit
    if units <= 1 { run(0) } else { parallelFor(units, run) }
}

/// `x ← x·factor` in place.
public func scale(_ x: Tensor, inPlaceBy factor: Float) {
    let count = x.count
    let run: @Sendable (Int) -> Void = { unit in
        let p = x.storage.pointer
        for i in (unit * updateUnit)..<min(count, (unit + 1) * updateUnit) { p[i] *= factor }
    }
    let units = (count + updateUnit - 1) / updateUnit
    if units <= 1 { run(0) } else { parallelFor(units, run) }
}

/// `sum ← sum + factor·x` in place (`sum ← factor·x` when `overwriting`): a gradient added to a running sum.
public func accumulate(_ x: Tensor, into sum: Tensor, scaledBy factor: Float, overwriting: Bool = false) {
    let count = x.count
    precondition(sum.count == count, "accumulating \(x.shape) into \(sum.shape)")
    let run: @Sendable (Int) -> Void = { unit in
        let (source, destination) = (x.storage.pointer, sum.storage.pointer)
        let range = (unit * updateUnit)..<min(count, (unit + 1) * updateUnit)
        if overwriting {
            for i in range { destination[i] = factor * source[i] }
        } else {
            for i in range { destination[i] += factor * source[i] }
        }
    }
    let units = (count + updateUnit - 1) / updateUnit
    if units <= 1 { run(0) } else { parallelFor(units, run) }
}

/// The sum of the squares of `x`'s elements, accumulated in Double.
public func sumOfSquares(_ x: Tensor) -> Double {
    x.withUnsafeBufferPointer { values in values.reduce(0.0) { $0 + Double($1) * Double($1) } }
}
