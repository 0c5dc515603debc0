import VLMCheckpoint
import VLMModels
import VLMTensor

/// LoRA (Hu et al. 2021) as PEFT's `LoraConfig` sets it up for a Llama-family decoder: beside each targeted linear
/// layer `W` (frozen), a rank-`rank` update `B·A` scaled by `alpha / rank` (`y = W·x + b + (alpha/rank)·B·A·x`), `A`
/// drawn as `nn.Linear` draws weights (kaiming-uniform with a = √5: uniform in ±1/√in), `B` zero, no dropout, no
/// bias; everything else frozen. The defaults are PEFT's for these families (r 8, lora_alpha 8, q_proj and v_proj).
public struct LoraSettings: Sendable, Equatable {
    public var rank = 8
    public var alpha: Float = 8
    /// The projections that get an update, by their names in a decoder layer.
    public var targetModules = ["q_proj", "v_proj"]
    /// The seed of `A`'s draw.
    public var seed: UInt64 = 0

    public init() {}

    /// The projections a decoder layer has, which ``targetModules`` may name.
    public static let modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
}

/// A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, SmolLM3) for training: its weights read once as ``Parameter``s (fp32,
/// unpacked, under the checkpoint's names), run forward keeping what the backward pass reads, and backward to the
/// input embeddings' gradient and, when it trains, every weight's.
struct DecoderTraining {
    struct Projection {
        let weight: Parameter
        let bias: Parameter?
        /// LoRA's update beside the frozen weight, when it has one.
        var lora: (a: Parameter, b: Parameter, scaling: Float)?
    }

    struct Layer {
        let inputNorm, postAttentionNorm: Parameter
        let query, key, value, output: Projection
        /// Qwen3's RMS norms of each query and key head.
        let queryNorm, keyNorm: Parameter?
        let gate, up, down: Projection
    }

    let config: LlamaConfig
    let embedTokens: Parameter
    let layers: [Layer]
    let norm: Parameter
    /// `lm_head.weight`, or ``embedTokens`` itself where the checkpoint ties them.
    let head: Parameter
    let activation: Activation
    private let inverseFrequencies: [Float]
    /// The narrowest sliding window of any layer (Mistral's `sliding_window`): sequences no longer than it attend as
    /// fully causal ones do, the only ones training runs.
    private let attentionWindow: Int?
    /// Every parameter, each once (a tied head is the embedding), in the checkpoint's order of layers.
    let parameters: [Parameter]
    /// LoRA's `A` and `B` of every targeted projection, layer by layer, under PEFT's names; empty without LoRA.
    let loraParameters: [Parameter]

    /// - Parameter lora: LoRA's settings, when it trains; `moduleName` turns a projection's checkpoint name
    ///   (`….q_proj`) into its module path in transformers' model, the name PEFT keys its update by.
    init(config: LlamaConfig, weights: Weights, file: String, lora: LoraSettings? = nil,
         moduleName: (String) -> String = { $0 }) throws {
        self.config = config
        if let lora {
            guard lora.rank > 0, !lora.targetModules.isEmpty, lora.targetModules.allSatisfy(LoraSettings.modules.contains) else {
                throw ModelError.invalidInput("LoRA needs a positive rank and target modules among \(LoraSettings.modules.joined(separator: ", ")), got rank \(lora.rank) and \(lora.targetModules)")
            }
        }
        let decoder = weights.scoped(firstOf: ["language_model.model", "model.language_model", "model"], holding: "embed_tokens.weight")
        inverseFrequencies = try config.rotaryInverseFrequencies(file: file)
        let (d, heads, keyHeads, headDim, mlp) = (config.hiddenSize, config.numAttentionHeads, config.numKeyValueHeads,
                                                  config.headDim, config.intermediateSize)
        func parameter(_ scope: Weights, _ name: String, shape: [Int]) throws -> Parameter {
            let isNorm = name.hasSuffix("norm.weight")
            return Parameter(name: scope.fullName(name), value: try scope(name, shape: shape), decays: !(isNorm || name.hasSuffix("bias")))
        }
        embedTokens = try parameter(decoder, "embed_tokens.weight", shape: [config.vocabSize, d])
        var generator = SeededGenerator(seed: lora?.seed ?? 0)
        attentionWindow = (0..<config.numHiddenLayers).compactMap { config.attentionWindow(layer: $0) }.min()
        layers = try (0..<config.numHiddenLayers).map { index in
            let layer = decoder.scoped("layers.\(index)")
            func projection(_ name: String, out: Int, in width: Int, bias: Bool) throws -> Projection {
                var projection = Projection(weight: try parameter(layer, name + ".weight", shape: [out, width]),
                                            bias: bias ? try parameter(layer, name + ".bias", shape: [out]) : nil)
                if let lora, lora.targetModules.contains(String(name.split(separator: ".").last!)) {
                    let module = "base_model.model." + moduleName(layer.fullName(name))
                    let bound = 1 / Float(width).squareRoot()
                    let a = (0..<(lora.rank * width)).map { _ in Float.random(in: -bound...bound, using: &generator) }
                    projection.lora = (Parameter(name: module + ".lora_A.weight", value: Tensor(shape: [lora.rank, width], scalars: a), decays: true),
                                       Parameter(name: module + ".lora_B.weight", value: Tensor(zeros: [out, lora.rank]), decays: true),
                                       lora.alpha / Float(lora.rank))
                }
                return projection
            }
            return Layer(
                inputNorm: try parameter(layer, "input_layernorm.weight", shape: [d]),
                postAttentionNorm: try parameter(layer, "post_attention_layernorm.weight", shape: [d]),
                query: try projection("self_attn.q_proj", out: heads * headDim, in: d, bias: config.attentionBias),
                key: try projection("self_attn.k_proj", out: keyHeads * headDim, in: d, bias: config.attentionBias),
                value: try projection("self_attn.v_proj", out: keyHeads * headDim, in: d, bias: config.attentionBias),
                output: try projection("self_attn.o_proj", out: d, in: heads * headDim, bias: config.outputProjectionBias),
                queryNorm: config.normalizesQueryKeyHeads ? try parameter(layer, "self_attn.q_norm.weight", shape: [headDim]) : nil,
                keyNorm: config.normalizesQueryKeyHeads ? try parameter(layer, "self_attn.k_norm.weight", shape: [headDim]) : nil,
                gate: try projection("mlp.gate_proj", out: mlp, in: d, bias: config.mlpBias),
                up: try projection("mlp.up_proj", out: mlp, in: d, bias: config.mlpBias),
                down: try projection("mlp.down_proj", out: d, in: mlp, bias: config.mlpBias))
        }
        norm = try parameter(decoder, "norm.weight", shape: [d])
        if config.tieWordEmbeddings {
            head = embedTokens
        } else {
            let scope = weights.contains("language_model.lm_head.weight") ? weights.scoped("language_model") : weights
            head = try parameter(scope, "lm_head.weight", shape: [config.vocabSize, d])
        }
        activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        var parameters = [embedTokens]
        for layer in layers {
            parameters += [layer.inputNorm, layer.postAttentionNorm]
            for projection in [layer.query, layer.key, layer.value, layer.output, layer.gate, layer.up, layer.down] {
                parameters.append(projection.weight)
                if let bias = projection.bias { parameters.append(bias) }
            }
            parameters += [layer.queryNorm, layer.keyNorm].compactMap { $0 }
        }
        parameters.append(norm)
        if !config.tieWordEmbeddings { parameters.append(head) }
        self.parameters = parameters
        loraParameters = layers.flatMap { layer in
            [layer.query, layer.key, layer.value, layer.output, layer.gate, layer.up, layer.down].flatMap { projection in
                projection.lora.map { [$0.a, $0.b] } ?? []
            }
        }
    }

    /// Refuses token ids and labels that are not rows of one length, and ids outside the vocabulary other than
    /// `placeholder` (an image token whose embedding is replaced).
    func validate(inputIds: [[Int]], labels: [[Int]], placeholder: Int? = nil) throws {
        let length = inputIds.first?.count ?? 0
        guard !inputIds.isEmpty, length > 0, inputIds.allSatisfy({ $0.count == length }),
              labels.count == inputIds.count, labels.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("training needs token ids and labels of one length per row")
        }
        if let attentionWindow, length > attentionWindow {
            throw ModelError.invalidInput("a batch of \(length) tokens is longer than the language model's sliding window of \(attentionWindow), which training does not run")
        }
        if let id = inputIds.lazy.flatMap({ $0 }).first(where: { ($0 < 0 || $0 >= config.vocabSize) && $0 != placeholder }) {
            throw ModelError.invalidInput("token id \(id) is outside the language model's vocabulary of \(config.vocabSize)")
        }
    }

    /// transformers' causal LM loss on `labels` (-100 where nothing is scored, shifted by one) for `embeddings`
    /// `[B, T, hidden]`; with `backward`, also the embeddings' gradient, every weight's gradient set when
    /// `weightGradients`.
    ///
    /// The head runs on the scored positions alone: the others' logits take no part in the loss, and their gradient
    /// is zero (transformers computes every position's; with a prompt or an image left unscored, that is most of
    /// them, and the head over a large vocabulary is a large part of a step).
    func loss(_ embeddings: Tensor, attentionMask: [[Int]]?, labels: [[Int]], backward: Bool,
              weightGradients: Bool) throws -> (loss: Float, embeddingsGradient: Tensor?) {
        let scored = try causalLanguageModelTargets(labels: labels, vocabulary: config.vocabSize)
        let pass = forward(embeddings, attentionMask: attentionMask, scoredPositions: scored.positions)
        let (loss, logitsGradient) = causalLanguageModelLossGradient(scoredLogits: pass.logits, targets: scored.targets)
        guard backward else { return (loss, nil) }
        return (loss, self.backward(logitsGradient, through: pass, weightGradients: weightGradients))
    }

    /// Each LoRA-updated projection's weight with its update merged in, `W + (alpha/rank)·B·A`, by the weight's
    /// name (PEFT's `merge_and_unload`).
    func mergedLoraWeights() -> [String: Tensor] {
        var merged: [String: Tensor] = [:]
        for layer in layers {
            for projection in [layer.query, layer.key, layer.value, layer.output, layer.gate, layer.up, layer.down] {
                guard let (a, b, scaling) = projection.lora else { continue }
                let update = matmul(b.value, a.value)
                scale(update, inPlaceBy: scaling)
                merged[projection.weight.name] = add(projection.weight.value, update)
            }
        }
        return merged
    }

    /// The token embeddings of `ids` `[B][T]`, `[B, T, hidden]`.
    func embed(_ ids: [[Int]]) -> Tensor {
        embedding(embedTokens.value, ids: ids.flatMap { $0 }).reshaped([ids.count, ids.first?.count ?? 0, config.hiddenSize])
    }

    struct LayerActivations {
        /// The query and key projections before their heads' norms (Qwen3), for the norms' backward pass.
        let projectedQuery, projectedKey: Tensor?
        let input, normed1, query, key, value: Tensor
        let attention: AttentionForTraining
        let afterAttention, normed2, gate, activated, up: Tensor
    }

    struct Pass {
        let layers: [LayerActivations]
        let last: Tensor
        /// The final norm's output at the scored positions, `[N, hidden]`, and those positions (flat `b · T + t`).
        let scoredNormed: Tensor
        let scoredPositions: [Int]
        /// The head's logits there, `[N, vocabulary]`.
        let logits: Tensor
        let rotary: (cos: Tensor, sin: Tensor)
    }

    private func forward(_ embeddings: Tensor, attentionMask: [[Int]]?, scoredPositions: [Int]) -> Pass {
        let (batch, length) = (embeddings.shape[0], embeddings.shape[1])
        let rotary = config.rotaryTables(positions: Array(0..<length), inverseFrequencies: inverseFrequencies)
        let (heads, keyHeads) = (config.numAttentionHeads, config.numKeyValueHeads)
        // The rows' tables: positions 0..<T for every row (right padding).
        let cos = Tensor(shape: [batch * length, rotary.cos.shape[1]], scalars: Array((0..<batch).map { _ in rotary.cos.scalars }.joined()))
        let sin = Tensor(shape: [batch * length, rotary.sin.shape[1]], scalars: Array((0..<batch).map { _ in rotary.sin.scalars }.joined()))
        let mask = attentionMask.map { Tensor(shape: [batch, length], scalars: $0.flatMap { $0.map(Float.init) }) }
        var hidden = embeddings
        var activations: [LayerActivations] = []
        for (index, layer) in layers.enumerated() {
            func rotated(_ x: Tensor, heads: Int) -> Tensor {
                config.rotatesPositions(layer: index) ? applyRotaryEmbedding(x, heads: heads, cos: cos, sin: sin) : x
            }
            let normed1 = rmsNorm(hidden, weight: layer.inputNorm.value, eps: config.rmsNormEps)
            let projectedQuery = apply(layer.query, normed1), projectedKey = apply(layer.key, normed1)
            func headNormed(_ x: Tensor, _ norm: Parameter?) -> Tensor {
                norm.map { headRMSNorm(x, weight: $0.value, eps: config.rmsNormEps) } ?? x
            }
            let query = rotated(headNormed(projectedQuery, layer.queryNorm), heads: heads)
            let key = rotated(headNormed(projectedKey, layer.keyNorm), heads: keyHeads)
            let value = apply(layer.value, normed1)
            let attention = attentionForTraining(query: query, key: repeatingKeyValueHeads(key, keyHeads: keyHeads, heads: heads),
                                                 value: repeatingKeyValueHeads(value, keyHeads: keyHeads, heads: heads),
                                                 heads: heads, causal: true, keyPaddingMask: mask)
            let afterAttention = add(hidden, apply(layer.output, attention.output))
            let normed2 = rmsNorm(afterAttention, weight: layer.postAttentionNorm.value, eps: config.rmsNormEps)
            let gate = apply(layer.gate, normed2)
            let activated = VLMTensor.activation(gate, activation)
            let up = apply(layer.up, normed2)
            let normalized = layer.queryNorm != nil
            activations.append(LayerActivations(projectedQuery: normalized ? projectedQuery : nil,
                                                projectedKey: normalized ? projectedKey : nil,
                                                input: hidden, normed1: normed1, query: query, key: key, value: value,
                                                attention: attention, afterAttention: afterAttention, normed2: normed2,
                                                gate: gate, activated: activated, up: up))
            hidden = add(afterAttention, apply(layer.down, multiply(activated, up)))
        }
        let normed = rmsNorm(hidden, weight: norm.value, eps: config.rmsNormEps)
        let scoredNormed = embedding(normed.reshaped([-1, config.hiddenSize]), ids: scoredPositions)
        return Pass(layers: activations, last: hidden, scoredNormed: scoredNormed, scoredPositions: scoredPositions,
                    logits: linear(scoredNormed, weight: head.value, bias: nil), rotary: (cos, sin))
    }

    /// The gradient of the loss with respect to the input embeddings, from the gradient of the logits; with
    /// `weightGradients`, every parameter's gradient set as well (the embedding's from the head alone where they are
    /// tied: ``embeddingBackward(_:ids:)`` adds the lookup's).
    private func backward(_ logitsGradient: Tensor, through pass: Pass, weightGradients: Bool) -> Tensor {
        let (heads, keyHeads) = (config.numAttentionHeads, config.numKeyValueHeads)
        let eps = config.rmsNormEps
        func backward(_ outputGradient: Tensor, _ projection: Projection, input: @autoclosure () -> Tensor) -> Tensor {
            let weight = projection.weight.value
            let rows = outputGradient.reshaped([-1, weight.shape[0]])
            if weightGradients {
                let gradient = projection.weight.gradientBuffer
                matmul(rows, input().reshaped([-1, weight.shape[1]]), transposeA: true, into: gradient)
                projection.weight.gradient = gradient
                projection.bias?.gradient = columnSums(rows)
            }
            var inputGradient = matmul(rows, weight)
            if let (a, b, scaling) = projection.lora {
                // y += s·B·(A·x): dB = s·dyᵀ·(A·x), d(A·x) = s·dy·B, dA = d(A·x)ᵀ·x, dx += d(A·x)·A.
                let x = input().reshaped([-1, weight.shape[1]])
                let down = matmul(x, a.value, transposeB: true)
                let downGradient = matmul(rows, b.value)
                scale(downGradient, inPlaceBy: scaling)
                let bGradient = matmul(rows, down, transposeA: true)
                scale(bGradient, inPlaceBy: scaling)
                b.gradient = bGradient
                a.gradient = matmul(downGradient, x, transposeA: true)
                inputGradient = add(inputGradient, matmul(downGradient, a.value))
            }
            return inputGradient.reshaped(Array(outputGradient.shape.dropLast()) + [weight.shape[1]])
        }
        func normBackward(_ outputGradient: Tensor, _ weight: Parameter, input: Tensor) -> Tensor {
            if weightGradients { weight.gradient = rmsNormWeightGradient(outputGradient, input: input, eps: eps) }
            return rmsNormBackward(outputGradient, input: input, weight: weight.value, eps: eps)
        }
        /// Through a norm of each head, where there is one.
        func headNormBackward(_ outputGradient: Tensor, _ weight: Parameter?, input: Tensor?) -> Tensor {
            guard let weight, let input else { return outputGradient }
            let width = config.headDim
            return normBackward(outputGradient.reshaped([-1, width]), weight, input: input.reshaped([-1, width]))
                .reshaped(outputGradient.shape)
        }

        // The scored positions' gradient back through the head, zero at every other position.
        let scoredGradient = backward(logitsGradient, Projection(weight: head, bias: nil), input: pass.scoredNormed)
        let normedGradient = VLMTensor.embeddingBackward(scoredGradient, ids: pass.scoredPositions, rows: pass.last.count / config.hiddenSize)
            .reshaped(pass.last.shape)
        var hiddenGradient = normBackward(normedGradient, norm, input: pass.last)
        for (index, (layer, saved)) in zip(layers, pass.layers).enumerated().reversed() {
            func unrotated(_ gradient: Tensor, heads: Int) -> Tensor {
                guard config.rotatesPositions(layer: index) else { return gradient }
                return applyRotaryEmbeddingBackward(gradient, heads: heads, cos: pass.rotary.cos, sin: pass.rotary.sin)
            }
            // The MLP: down(act(gate) · up).
            let productGradient = backward(hiddenGradient, layer.down, input: multiply(saved.activated, saved.up))
            let gateGradient = activationBackward(multiply(productGradient, saved.up), input: saved.gate, activation)
            let upGradient = multiply(productGradient, saved.activated)
            let normed2Gradient = add(backward(gateGradient, layer.gate, input: saved.normed2),
                                      backward(upGradient, layer.up, input: saved.normed2))
            let residualGradient = add(hiddenGradient, normBackward(normed2Gradient, layer.postAttentionNorm, input: saved.afterAttention))
            // Attention over the rotated queries and keys, the key heads repeated for their query heads.
            let attention = attentionBackward(backward(residualGradient, layer.output, input: saved.attention.output),
                                              query: saved.query,
                                              key: repeatingKeyValueHeads(saved.key, keyHeads: keyHeads, heads: heads),
                                              value: repeatingKeyValueHeads(saved.value, keyHeads: keyHeads, heads: heads),
                                              probabilities: saved.attention.probabilities, heads: heads)
            let queryGradient = headNormBackward(unrotated(attention.query, heads: heads), layer.queryNorm,
                                                 input: saved.projectedQuery)
            let keyGradient = headNormBackward(
                unrotated(repeatingKeyValueHeadsBackward(attention.key, keyHeads: keyHeads, heads: heads), heads: keyHeads),
                layer.keyNorm, input: saved.projectedKey)
            let valueGradient = repeatingKeyValueHeadsBackward(attention.value, keyHeads: keyHeads, heads: heads)
            let normed1Gradient = add(add(backward(queryGradient, layer.query, input: saved.normed1),
                                          backward(keyGradient, layer.key, input: saved.normed1)),
                                      backward(valueGradient, layer.value, input: saved.normed1))
            hiddenGradient = add(residualGradient, normBackward(normed1Gradient, layer.inputNorm, input: saved.input))
        }
        return hiddenGradient
    }

    /// The token embedding's gradient from its lookup of `ids` (flattened as ``embed(_:)`` read them) given the
    /// embeddings' gradient, the positions `replaced` (whose embeddings were replaced after the lookup) left out, as
    /// are those of `pad_token_id`, the embedding's `padding_idx`, whose row torch never updates; added to the tied
    /// head's where there is one (called after ``loss(_:attentionMask:labels:backward:weightGradients:)`` with
    /// `weightGradients` set the head's).
    func embeddingBackward(_ embeddingsGradient: Tensor, ids: [Int], replaced: [Int]) {
        let skipped = replaced + (config.padTokenId.map { pad in ids.indices.filter { ids[$0] == pad } } ?? [])
        let width = embeddingsGradient.shape.last ?? 0
        let gradient = replacingRows(of: embeddingsGradient, at: skipped.sorted(), with: Tensor(zeros: [skipped.count, width]))
        if config.tieWordEmbeddings, let headGradient = embedTokens.gradient {
            VLMTensor.embeddingBackward(gradient, ids: ids, addingInto: headGradient)
        } else {
            let table = embedTokens.gradientBuffer
            VLMTensor.embeddingBackward(gradient, ids: ids, into: table)
            embedTokens.gradient = table
        }
    }

    private func apply(_ projection: Projection, _ x: Tensor) -> Tensor {
        let y = linear(x, weight: projection.weight.value, bias: projection.bias?.value)
        guard let (a, b, scaling) = projection.lora else { return y }
        let update = linear(linear(x, weight: a.value, bias: nil), weight: b.value, bias: nil)
        scale(update, inPlaceBy: scaling)
        return add(y, update)
    }
}
