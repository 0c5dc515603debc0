import Foundation
import VLMCheckpoint
import VLMTensor

/// A tensor training changes: its Hugging Face name, its value (updated in place by the optimizer), the gradient of
/// the last backward pass, and whether weight decay applies to it.
public final class Parameter: @unchecked Sendable {
    public let name: String
    /// Owned by the parameter: the optimizer writes it in place.
    public let value: Tensor
    public internal(set) var gradient: Tensor?
    /// False for biases and normalization layers' parameters, as transformers' Trainer groups them
    /// (`get_decay_parameter_names`).
    public let decays: Bool

    /// A buffer shaped like the value that a backward pass may write the gradient into, the same one step after
    /// step: a language model's weights are gigabytes of fresh pages a step otherwise.
    var gradientBuffer: Tensor {
        if let buffer { return buffer }
        let buffer = Tensor(uninitialized: value.shape)
        self.buffer = buffer
        return buffer
    }
    private var buffer: Tensor?

    /// A parameter holding a copy of `value`.
    public init(name: String, value: Tensor, decays: Bool) {
        self.name = name
        self.value = Tensor(shape: value.shape, scalars: value.scalars)
        self.decays = decays
    }
}

/// How a training run goes: transformers' `TrainingArguments` for its default optimizer and schedule (AdamW,
/// gradients clipped by their global norm, linear decay after a linear warmup) and its data loop, with its defaults.
public struct TrainingSettings: Sendable, Equatable {
    public var learningRate: Float = 5e-5
    public var weightDecay: Float = 0
    public var beta1: Float = 0.9
    public var beta2: Float = 0.999
    public var epsilon: Float = 1e-8
    /// Gradients are scaled down when their global L2 norm exceeds this; nil never clips.
    public var maxGradientNorm: Float? = 1
    public var warmupSteps = 0
    /// Examples per batch (`per_device_train_batch_size`).
    public var batchSize = 8
    /// Batches whose gradients each optimizer step sums (`gradient_accumulation_steps`); an epoch's last step may
    /// have fewer.
    public var gradientAccumulationSteps = 1
    /// Passes over the data when ``maxSteps`` is nil (`num_train_epochs`).
    public var epochs = 3
    /// Steps to take whatever the epochs say (`max_steps`), nil for ``epochs`` passes.
    public var maxSteps: Int?
    /// The data's order each epoch comes from this seed; nil keeps the order given.
    public var shuffleSeed: UInt64? = 42

    public init() {}

    /// The batches of an epoch over `examples` examples (Trainer's `len(train_dataloader)`).
    public func batchesPerEpoch(examples: Int) -> Int {
        (examples + batchSize - 1) / max(1, batchSize)
    }

    /// The optimizer steps of an epoch: its batches in groups of ``gradientAccumulationSteps``, the last group
    /// possibly short.
    public func stepsPerEpoch(examples: Int) -> Int {
        max(1, (batchesPerEpoch(examples: examples) + gradientAccumulationSteps - 1) / max(1, gradientAccumulationSteps))
    }

    /// The optimizer steps a run over `examples` examples takes, which the schedule decays over.
    public func totalSteps(examples: Int) -> Int {
        maxSteps ?? epochs * stepsPerEpoch(examples: examples)
    }

    /// The learning rate of step `step` (from 0) of `totalSteps`: `get_linear_schedule_with_warmup`'s factor times
    /// `learningRate`.
    public func learningRate(atStep step: Int, of totalSteps: Int) -> Float {
        if step < warmupSteps { return learningRate * Float(step) / Float(max(1, warmupSteps)) }
        return learningRate * max(0, Float(totalSteps - step) / Float(max(1, totalSteps - warmupSteps)))
    }
}

/// `torch.optim.AdamW` (decoupled weight decay, bias-corrected moments) behind `torch.nn.utils.clip_grad_norm_` and a
/// learning-rate schedule: one ``step()`` is what transformers' Trainer does after each backward pass.
public final class AdamW: @unchecked Sendable {
    public let parameters: [Parameter]
    public let settings: TrainingSettings
    /// The steps the learning rate decays over.
    public let totalSteps: Int
    /// Optimizer steps taken.
    public private(set) var steps = 0
    private let firstMoments: [Tensor]
    private let secondMoments: [Tensor]

    public init(parameters: [Parameter], settings: TrainingSettings, totalSteps: Int) {
        self.parameters = parameters
        self.settings = settings
        self.totalSteps = totalSteps
        firstMoments = parameters.map { Tensor(zeros: $0.value.shape) }
        secondMoments = parameters.map { Tensor(zeros: $0.value.shape) }
    }

    /// The learning rate the next ``step()`` applies.
    public var learningRate: Float { settings.learningRate(atStep: steps, of: totalSteps) }

    /// Clips the parameters' gradients, updates every parameter that has one, and clears them. Returns the gradients'
    /// global norm before clipping (what Trainer logs as `grad_norm`).
    @discardableResult
    public func step() -> Float {
        let norm = gradientNorm()
        if let limit = settings.maxGradientNorm {
            // clip_grad_norm_ scales by min(1, limit / (norm + 1e-6)) whether or not the norm exceeds the limit.
            let factor = min(1, limit / (norm + 1e-6))
            for parameter in parameters { parameter.gradient.map { scale($0, inPlaceBy: factor) } }
        }
        let learningRate = self.learningRate
        steps += 1
        let stepSize = learningRate / (1 - pow(settings.beta1, Float(steps)))
        let correction2 = (1 - pow(settings.beta2, Float(steps))).squareRoot()
        for (index, parameter) in parameters.enumerated() {
            guard let gradient = parameter.gradient else { continue }
            adamWUpdate(parameter.value, gradient: gradient, firstMoment: firstMoments[index], secondMoment: secondMoments[index],
                        decay: 1 - learningRate * (parameter.decays ? settings.weightDecay : 0), beta1: settings.beta1,
                        beta2: settings.beta2, stepSize: stepSize, correction2: correction2, epsilon: settings.epsilon)
            parameter.gradient = nil
        }
        return norm
    }

    /// Writes what a run needs to continue after ``steps`` steps beside its model: each parameter's value under its
    /// name and AdamW's moments under `exp_avg.<name>` and `exp_avg_sq.<name>` (torch's names for them), in one
    /// safetensors file. The values are kept here because a checkpoint's model may not hold them as they are (a LoRA
    /// update merged into its weight, a projector under PEFT's module name).
    public func writeState(to url: URL) throws {
        var tensors: [String: Tensor] = [:]
        for (index, parameter) in parameters.enumerated() {
            tensors[parameter.name] = parameter.value
            tensors["exp_avg." + parameter.name] = firstMoments[index]
            tensors["exp_avg_sq." + parameter.name] = secondMoments[index]
        }
        try SafetensorsFile.write(tensors, to: url)
    }

    /// Continues a run from the state ``writeState(to:)`` wrote after `steps` steps: every parameter's value and
    /// moments read back, the schedule at that step.
    ///
    /// - Throws: `CheckpointError` when the file lacks a parameter's tensors or holds them in another shape.
    public func resume(from url: URL, steps: Int) throws {
        let file = try SafetensorsFile(url: url)
        for (index, parameter) in parameters.enumerated() {
            for (name, tensor) in [(parameter.name, parameter.value), ("exp_avg." + parameter.name, firstMoments[index]),
                                   ("exp_avg_sq." + parameter.name, secondMoments[index])] {
                let saved = try file.tensor(name)
                guard saved.shape == tensor.shape else {
                    throw CheckpointError.shapeMismatch(file: url.path, tensor: name, expected: tensor.shape, actual: saved.shape)
                }
                saved.scalars.withUnsafeBufferPointer { tensor.storage.pointer.update(from: $0.baseAddress!, count: $0.count) }
            }
        }
        self.steps = steps
    }

    /// The L2 norm of all gradients together: the norm of the per-tensor norms, as `clip_grad_norm_` takes it.
    public func gradientNorm() -> Float {
        var total: Float = 0
        for parameter in parameters {
            guard let gradient = parameter.gradient else { continue }
            let norm = Float(sumOfSquares(gradient).squareRoot())
            total += norm * norm
        }
        return total.squareRoot()
    }
}

/// Sums the gradients of an optimizer step's batches, as Trainer's `gradient_accumulation_steps` lets backward passes
/// add into `.grad`: after each batch's backward pass ``add(weight:)`` adds every parameter's gradient, times the
/// weight that batch's loss carries in the step's, to a sum kept per parameter (between steps too), and ``finish()``
/// hands the sums to the parameters for ``AdamW/step()``.
public final class GradientAccumulator {
    private let parameters: [Parameter]
    private var sums: [Tensor?]
    /// Whether a batch was added since the last ``finish()``, per parameter.
    private var started: [Bool]

    public init(parameters: [Parameter]) {
        self.parameters = parameters
        sums = Array(repeating: nil, count: parameters.count)
        started = Array(repeating: false, count: parameters.count)
    }

    /// Adds each parameter's gradient times `weight` to its sum and clears the gradient (a parameter without one adds
    /// nothing, and a weight of 0 adds nothing: a batch without scored tokens).
    public func add(weight: Float) {
        for (index, parameter) in parameters.enumerated() {
            guard let gradient = parameter.gradient else { continue }
            parameter.gradient = nil
            guard weight != 0 else { continue }
            let sum = sums[index] ?? Tensor(uninitialized: gradient.shape)
            sums[index] = sum
            accumulate(gradient, into: sum, scaledBy: weight, overwriting: !started[index])
            started[index] = true
        }
    }

    /// Sets each parameter's gradient to its sum over the batches added since the last call, times `scale` (none
    /// where no batch gave it one).
    public func finish(scale factor: Float) {
        for (index, parameter) in parameters.enumerated() {
            if started[index], let sum = sums[index] {
                scale(sum, inPlaceBy: factor)
                parameter.gradient = sum
            }
            started[index] = false
        }
    }
}
