import Foundation
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMTensor

/// CLIP's, SigLIP's or SigLIP 2's vision transformer as contrastive training runs it, to its pooled output: the patch
/// embedding, learned positions, the encoder (both ways), then CLIP's class token after `post_layernorm` (its
/// embeddings `pre_layrnorm`ed first), or SigLIP's attention-pooling head over the post-layernormed patches. CLIP and
/// SigLIP take images of the configured size, as transformers does without `interpolate_pos_encoding`, their patch
/// embedding a convolution whose kernel tiles the image (each patch's pixels times the flattened weight); SigLIP 2 takes
/// the NaFlex processor's flattened patches through a linear layer, its square grid of positions resized to each
/// image's patch grid, the padding masked in every attention.
struct VisionTowerTraining {
    enum Kind {
        /// CLIP: a class token in front, layer norms before the encoder and on the class token after it.
        case classToken
        /// SigLIP: the attention-pooling head (`vision_use_head`, which SiglipModel's image features need).
        case attentionHead
        /// SigLIP 2: NaFlex patches, positions resized from a `side`×`side` grid, then the attention-pooling head.
        case naflex(side: Int)
    }

    let kind: Kind
    let channels, imageSize, patchSize, hiddenSize: Int
    let eps: Float
    let encoder: EncoderTraining
    let activation: Activation

    init(_ directory: ModelDirectory, file: String) throws {
        let (layers, heads, hiddenAct, usesHead): (Int, Int, String, Bool)
        switch try directory.modelType {
        case "clip":
            let config = try directory.decode(CLIPConfig.self).visionConfig
            (channels, imageSize, patchSize, hiddenSize) = (config.numChannels, config.imageSize, config.patchSize, config.hiddenSize)
            (layers, heads, eps, hiddenAct, kind, usesHead) = (config.numHiddenLayers, config.numAttentionHeads, config.layerNormEps,
                                                              config.hiddenAct, .classToken, true)
        case "siglip":
            let config = try directory.decode(SiglipConfig.self).visionConfig
            (channels, imageSize, patchSize, hiddenSize) = (config.numChannels, config.imageSize, config.patchSize, config.hiddenSize)
            (layers, heads, eps, hiddenAct, kind, usesHead) = (config.numHiddenLayers, config.numAttentionHeads, config.layerNormEps,
                                                              config.hiddenAct, .attentionHead, config.visionUseHead)
        case "siglip2":
            let config = try directory.decode(Siglip2Config.self).visionConfig
            let side = Int(Double(config.numPatches).squareRoot())
            guard side * side == config.numPatches else {
                throw ModelError.invalidConfig("vision_config: num_patches \(config.numPatches) must be a square", file: file)
            }
            (channels, imageSize, patchSize, hiddenSize) = (config.numChannels, 0, config.patchSize, config.hiddenSize)
            (layers, heads, eps, hiddenAct, kind, usesHead) = (config.numHiddenLayers, config.numAttentionHeads, config.layerNormEps,
                                                              config.hiddenAct, .naflex(side: side), config.visionUseHead)
        case let other:
            throw ModelError.unsupportedModelType(other, supported: ["clip", "siglip", "siglip2"], file: file)
        }
        guard usesHead else {
            throw ModelError.invalidConfig("vision_config.vision_use_head is false: the model's image features are its attention-pooling head's output", file: file)
        }
        activation = try Activation(huggingFaceName: hiddenAct, file: file)
        guard patchSize > 0, imageSize >= patchSize || imageSize == 0, heads > 0, hiddenSize % heads == 0 else {
            throw ModelError.invalidConfig("vision_config: image_size \(imageSize) must be at least patch_size \(patchSize), hidden_size \(hiddenSize) a multiple of num_attention_heads \(heads)", file: file)
        }
        encoder = EncoderTraining(prefix: "vision_model.encoder.layers.", layers: layers, heads: heads, eps: eps,
                                  activation: activation, causal: false)
    }

    private var classToken: Bool {
        if case .classToken = kind { return true }
        return false
    }

    private var patchesPerImage: Int { (imageSize / patchSize) * (imageSize / patchSize) }

    /// What the backward pass reads from the forward pass.
    struct Activations {
        let batch: Int
        /// `[B·patches, C·p·p]`: each patch's pixels.
        let patches: Tensor
        /// SigLIP 2: each image's patch grid, and which of its `[B, length]` rows are patches (1) or padding (0).
        let shapes: [ImageSize]?
        let mask: Tensor?
        /// CLIP's embeddings before `pre_layrnorm`.
        let embeddings: Tensor?
        let layers: [EncoderTraining.LayerActivations]
        /// CLIP: the class token's last state; SigLIP: the whole last hidden state.
        let last: Tensor
        let head: HeadActivations?
    }

    /// SigLIP's pooling head's forward pass.
    struct HeadActivations {
        let postNormed: Tensor
        let query: Tensor, key: Tensor, value: Tensor
        let probabilities: Tensor
        let context: Tensor
        let attended: Tensor
        let normed: Tensor
        let hidden: Tensor
        let activated: Tensor
    }

    /// The pooled output `[B, hidden]` of the image processor's output (CLIP's before `visual_projection`), with what
    /// its backward pass reads when `keeping`.
    func forward(_ images: ProcessedImages, keeping: Bool, weights value: (String) -> Tensor) throws -> (pooled: Tensor, activations: Activations?) {
        if case .naflex(let side) = kind { return try naflexForward(images, side: side, keeping: keeping, weights: value) }
        let pixelValues = images.pixelValues
        guard pixelValues.shape.count == 4, pixelValues.shape[0] > 0,
              Array(pixelValues.shape.dropFirst()) == [channels, imageSize, imageSize] else {
            throw ModelError.invalidInput("pixel values must be [batch, \(channels), \(imageSize), \(imageSize)], got \(pixelValues.shape)")
        }
        let (batch, d) = (pixelValues.shape[0], hiddenSize)
        let embeddings = "vision_model.embeddings."
        let patches = convolutionPatches(pixelValues, kernelSize: (patchSize, patchSize), stride: patchSize, padding: 0)
        let weight = value(embeddings + "patch_embedding.weight").reshaped([d, -1])
        var tokens = linear(patches, weight: weight, bias: classToken ? nil : value(embeddings + "patch_embedding.bias"))
            .reshaped([batch, patchesPerImage, d])
        if classToken {
            let classEmbedding = value(embeddings + "class_embedding").reshaped([1, 1, d])
            tokens = concatenate([concatenate(Array(repeating: classEmbedding, count: batch), axis: 0), tokens], axis: 1)
        }
        let positioned = add(tokens, value(embeddings + "position_embedding.weight"))
        let input = classToken ? layerNorm(positioned, weight: value("vision_model.pre_layrnorm.weight"),
                                           bias: value("vision_model.pre_layrnorm.bias"), eps: eps) : positioned
        let (hidden, layers) = encoder.forward(input, mask: nil, keeping: keeping, weights: value)
        let postNorm = (weight: value("vision_model.post_layernorm.weight"), bias: value("vision_model.post_layernorm.bias"))
        if classToken {
            let last = gatherTokens(hidden, positions: Array(repeating: 0, count: batch))
            let pooled = layerNorm(last, weight: postNorm.weight, bias: postNorm.bias, eps: eps)
            return (pooled, keeping ? Activations(batch: batch, patches: patches, shapes: nil, mask: nil, embeddings: positioned,
                                                  layers: layers, last: last, head: nil) : nil)
        }
        let head = self.head(layerNorm(hidden, weight: postNorm.weight, bias: postNorm.bias, eps: eps), mask: nil, weights: value)
        return (head.pooled, keeping ? Activations(batch: batch, patches: patches, shapes: nil, mask: nil, embeddings: nil,
                                                   layers: layers, last: hidden, head: head.activations) : nil)
    }

    /// SigLIP 2's forward pass (`Siglip2VisionTransformer`): the flattened patches through `patch_embedding`, plus the
    /// positions resized to each image's grid, the encoder and the head masking the padding.
    private func naflexForward(_ images: ProcessedImages, side: Int, keeping: Bool,
                               weights value: (String) -> Tensor) throws -> (pooled: Tensor, activations: Activations?) {
        let pixels = images.pixelValues
        let width = channels * patchSize * patchSize
        guard pixels.rank == 3, pixels.shape[0] > 0, pixels.shape[2] == width else {
            throw ModelError.invalidInput("SigLIP 2 vision model expects flattened patches [batch, patches, \(width)], got \(pixels.shape)")
        }
        let (batch, length, d) = (pixels.shape[0], pixels.shape[1], hiddenSize)
        guard let mask = images.pixelAttentionMask, let shapes = images.spatialShapes, mask.shape == [batch, length], shapes.count == batch else {
            throw ModelError.invalidInput("SigLIP 2 vision model needs a pixel attention mask [\(batch), \(length)] and \(batch) spatial shapes, as Siglip2ImageProcessor makes them")
        }
        if let bad = shapes.first(where: { $0.height <= 0 || $0.width <= 0 || $0.height * $0.width > length }) {
            throw ModelError.invalidInput("spatial shape \(bad.height)×\(bad.width) does not fit \(length) patches")
        }
        let embeddings = "vision_model.embeddings."
        let patches = pixels.reshaped([batch * length, width])
        let tokens = linear(patches, weight: value(embeddings + "patch_embedding.weight"), bias: value(embeddings + "patch_embedding.bias"))
        let grid = channelsFirst(value(embeddings + "position_embedding.weight").reshaped([1, side * side, d])).reshaped([1, d, side, side])
        // `resize_positional_embeddings`: each image's grid row-major, its padding rows given the first position.
        var resized: [ImageSize: Tensor] = [:]
        let positions = concatenate(shapes.map { shape -> Tensor in
            let count = shape.height * shape.width
            let rows = resized[shape] ?? channelsFirst(interpolateAntialiased(grid, height: shape.height, width: shape.width)
                .reshaped([1, d, count]))
            resized[shape] = rows
            return count < length ? concatenate([rows] + Array(repeating: sequenceSlice(rows, 0..<1), count: length - count), axis: 1) : rows
        }, axis: 0)
        let (hidden, layers) = encoder.forward(add(tokens.reshaped([batch, length, d]), positions), mask: mask, keeping: keeping, weights: value)
        let postNormed = layerNorm(hidden, weight: value("vision_model.post_layernorm.weight"), bias: value("vision_model.post_layernorm.bias"), eps: eps)
        let head = self.head(postNormed, mask: mask, weights: value)
        return (head.pooled, keeping ? Activations(batch: batch, patches: patches, shapes: shapes, mask: mask, embeddings: nil,
                                                   layers: layers, last: hidden, head: head.activations) : nil)
    }

    /// Adds the gradient of every vision-tower parameter to `gradients`, from the pooled output's.
    func backward(_ pooledGradient: Tensor, through activations: Activations, weights value: (String) -> Tensor,
                  into gradients: inout [String: Tensor]) {
        let (batch, d) = (activations.batch, hiddenSize)
        let tokensPerImage = patchesPerImage + (classToken ? 1 : 0)
        let postNorm = "vision_model.post_layernorm."
        var lastGradient: Tensor
        if classToken {
            let norm = layerNormBackward(pooledGradient, input: activations.last, weight: value(postNorm + "weight"), eps: eps)
            (gradients[postNorm + "weight"], gradients[postNorm + "bias"]) = (norm.weight, norm.bias)
            lastGradient = replacingRows(of: Tensor(zeros: [batch, tokensPerImage, d]), at: (0..<batch).map { $0 * tokensPerImage },
                                         with: norm.input)
        } else {
            let postNormedGradient = headBackward(pooledGradient, through: activations.head!, weights: value, into: &gradients)
            let norm = layerNormBackward(postNormedGradient, input: activations.last, weight: value(postNorm + "weight"), eps: eps)
            (gradients[postNorm + "weight"], gradients[postNorm + "bias"]) = (norm.weight, norm.bias)
            lastGradient = norm.input
        }
        var inputGradient = encoder.backward(lastGradient, through: activations.layers, weights: value, into: &gradients)
        if classToken, let embeddings = activations.embeddings {
            let norm = layerNormBackward(inputGradient, input: embeddings, weight: value("vision_model.pre_layrnorm.weight"), eps: eps)
            (gradients["vision_model.pre_layrnorm.weight"], gradients["vision_model.pre_layrnorm.bias"]) = (norm.weight, norm.bias)
            inputGradient = norm.input
        }
        let prefix = "vision_model.embeddings."
        if case .naflex(let side) = kind {
            naflexEmbeddingBackward(inputGradient, through: activations, side: side, into: &gradients)
            return
        }
        let positionGradient = embeddingBackward(inputGradient, ids: Array((0..<batch).map { _ in Array(0..<tokensPerImage) }.joined()),
                                                 rows: tokensPerImage)
        gradients[prefix + "position_embedding.weight"] = positionGradient
        // The class token sits at position 0 of every image: its gradient is the sum position 0's is.
        if classToken { gradients[prefix + "class_embedding"] = sequenceSlice(positionGradient.reshaped([1, tokensPerImage, d]), 0..<1).reshaped([d]) }
        let patchGradient = (classToken ? sequenceSlice(inputGradient, 1..<tokensPerImage) : inputGradient).reshaped([batch * patchesPerImage, d])
        gradients[prefix + "patch_embedding.weight"] = matmul(patchGradient, activations.patches, transposeA: true)
            .reshaped([d, channels, patchSize, patchSize])
        if !classToken { gradients[prefix + "patch_embedding.bias"] = columnSums(patchGradient) }
    }

    /// SigLIP 2's patch embedding's gradients and its position grid's, each image's positions' gradient (its padding
    /// rows' added to the first position's, which they copied) handed back through the resize.
    private func naflexEmbeddingBackward(_ inputGradient: Tensor, through activations: Activations, side: Int,
                                         into gradients: inout [String: Tensor]) {
        let (batch, d) = (activations.batch, hiddenSize)
        let length = inputGradient.shape[1]
        let prefix = "vision_model.embeddings."
        let rows = inputGradient.reshaped([batch * length, d])
        gradients[prefix + "patch_embedding.weight"] = matmul(rows, activations.patches, transposeA: true)
        gradients[prefix + "patch_embedding.bias"] = columnSums(rows)
        var gridGradient = Tensor(zeros: [1, d, side, side])
        for (item, shape) in activations.shapes!.enumerated() {
            let count = shape.height * shape.width
            let source = inputGradient.storage.pointer + item * length * d
            let positions = Tensor(uninitialized: [count, d])
            let destination = positions.storage.pointer
            destination.initialize(from: source, count: count * d)
            for row in count..<length {
                for i in 0..<d { destination[i] += source[row * d + i] }
            }
            let planes = channelsFirst(positions.reshaped([1, count, d])).reshaped([1, d, shape.height, shape.width])
            gridGradient = add(gridGradient, interpolateAntialiasedBackward(planes, height: side, width: side))
        }
        gradients[prefix + "position_embedding.weight"] = transposed(gridGradient.reshaped([d, side * side]))
    }

    // MARK: SigLIP's attention-pooling head

    /// `SiglipMultiheadAttentionPoolingHead`: the probe attends over the patches through `nn.MultiheadAttention` (its
    /// query, key and value projections rows of `in_proj_weight`), then a pre-norm MLP with its residual.
    private func head(_ postNormed: Tensor, mask: Tensor?, weights value: (String) -> Tensor) -> (pooled: Tensor, activations: HeadActivations) {
        let (batch, d) = (postNormed.shape[0], hiddenSize)
        let prefix = "vision_model.head."
        let (weight, bias) = (value(prefix + "attention.in_proj_weight"), value(prefix + "attention.in_proj_bias"))
        func projection(_ part: Int, _ input: Tensor) -> Tensor {
            let rows = (part * d)..<((part + 1) * d)
            return linear(input, weight: sequenceSlice(weight.reshaped([1, 3 * d, d]), rows).reshaped([d, d]),
                          bias: sequenceSlice(bias.reshaped([1, 3 * d]), rows).reshaped([d]))
        }
        let query = projection(0, value(prefix + "probe").reshaped([1, d]))
        let (key, values) = (projection(1, postNormed), projection(2, postNormed))
        let (context, probabilities) = probeAttention(query: query, key: key, value: values, mask: mask)
        let attended = linear(context, weight: value(prefix + "attention.out_proj.weight"), bias: value(prefix + "attention.out_proj.bias"))
        let normed = layerNorm(attended, weight: value(prefix + "layernorm.weight"), bias: value(prefix + "layernorm.bias"), eps: eps)
        let hidden = linear(normed, weight: value(prefix + "mlp.fc1.weight"), bias: value(prefix + "mlp.fc1.bias"))
        let activated = VLMTensor.activation(hidden, activation)
        let pooled = add(attended, linear(activated, weight: value(prefix + "mlp.fc2.weight"), bias: value(prefix + "mlp.fc2.bias")))
        precondition(pooled.shape == [batch, d])
        return (pooled, HeadActivations(postNormed: postNormed, query: query, key: key, value: values, probabilities: probabilities,
                                        context: context, attended: attended, normed: normed, hidden: hidden, activated: activated))
    }

    /// The gradient of the head's input (the post-layernormed patches) from its output's, adding the head's
    /// parameters' gradients to `gradients`.
    private func headBackward(_ outputGradient: Tensor, through head: HeadActivations, weights value: (String) -> Tensor,
                              into gradients: inout [String: Tensor]) -> Tensor {
        let d = hiddenSize
        let prefix = "vision_model.head."
        func linearGradient(_ name: String, _ dy: Tensor, input: Tensor) -> Tensor {
            let result = linearBackward(dy, input: input, weight: value(prefix + name + ".weight"))
            (gradients[prefix + name + ".weight"], gradients[prefix + name + ".bias"]) = (result.weight, result.bias)
            return result.input
        }
        let activatedGradient = linearGradient("mlp.fc2", outputGradient, input: head.activated)
        let normedGradient = linearGradient("mlp.fc1", activationBackward(activatedGradient, input: head.hidden, activation), input: head.normed)
        let norm = layerNormBackward(normedGradient, input: head.attended, weight: value(prefix + "layernorm.weight"), eps: eps)
        (gradients[prefix + "layernorm.weight"], gradients[prefix + "layernorm.bias"]) = (norm.weight, norm.bias)
        let contextGradient = linearGradient("attention.out_proj", add(outputGradient, norm.input), input: head.context)
        let attention = probeAttentionBackward(contextGradient, query: head.query, key: head.key, value: head.value,
                                               probabilities: head.probabilities)
        let weight = value(prefix + "attention.in_proj_weight").reshaped([1, 3 * d, d])
        func projectionWeight(_ part: Int) -> Tensor { sequenceSlice(weight, (part * d)..<((part + 1) * d)).reshaped([d, d]) }
        // The probe's query is one row shared by the batch: its gradient is the batch's sum.
        let probe = value(prefix + "probe").reshaped([1, d])
        let queryGradient = linearBackward(columnSums(attention.query).reshaped([1, d]), input: probe, weight: projectionWeight(0))
        let keyGradient = linearBackward(attention.key, input: head.postNormed, weight: projectionWeight(1))
        let valueGradient = linearBackward(attention.value, input: head.postNormed, weight: projectionWeight(2))
        gradients[prefix + "probe"] = queryGradient.input.reshaped([1, 1, d])
        gradients[prefix + "attention.in_proj_weight"] = concatenate([queryGradient.weight, keyGradient.weight, valueGradient.weight], axis: 0)
        gradients[prefix + "attention.in_proj_bias"] = concatenate([queryGradient.bias, keyGradient.bias, valueGradient.bias], axis: 0)
        return add(keyGradient.input, valueGradient.input)
    }

    private var heads: Int { encoder.heads }

    /// One query `[1, D]` (the probe's, every image's) attending over each image's keys and values `[B, T, D]`, where
    /// `mask` `[B, T]` (nil: everywhere) is 1: the context `[B, D]` and the probabilities `[B, heads, T]`.
    private func probeAttention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor?) -> (context: Tensor, probabilities: Tensor) {
        let (batch, length, d) = (key.shape[0], key.shape[1], key.shape[2])
        let headDim = d / heads
        let scale = 1 / Float(headDim).squareRoot()
        let context = Tensor(zeros: [batch, d])
        let probabilities = Tensor(uninitialized: [batch, heads, length])
        let (q, k, v) = (query.storage.pointer, key.storage.pointer, value.storage.pointer)
        let (c, p) = (context.storage.pointer, probabilities.storage.pointer)
        for item in 0..<batch {
            for head in 0..<heads {
                let row = p + (item * heads + head) * length
                var largest = -Float.infinity
                for t in 0..<length {
                    if let mask, mask.storage.pointer[item * length + t] == 0 {
                        row[t] = -.infinity
                        continue
                    }
                    let keyRow = k + (item * length + t) * d + head * headDim
                    var score: Float = 0
                    for i in 0..<headDim { score += q[head * headDim + i] * keyRow[i] }
                    row[t] = score * scale
                    largest = max(largest, row[t])
                }
                var sum: Float = 0
                for t in 0..<length {
                    row[t] = row[t] == -.infinity ? 0 : exp(row[t] - largest)
                    sum += row[t]
                }
                for t in 0..<length {
                    row[t] /= sum
                    let valueRow = v + (item * length + t) * d + head * headDim
                    for i in 0..<headDim { c[item * d + head * headDim + i] += row[t] * valueRow[i] }
                }
            }
        }
        return (context, probabilities)
    }

    /// The gradients of ``probeAttention(query:key:value:)``: per image and head `dV = p·dc`, `dp = dc·V`,
    /// `ds = p ⊙ (dp − Σ p·dp)`, the query's `ds·K·scale` (one row per image, `[B, D]`) and the keys' `ds·q·scale`.
    private func probeAttentionBackward(_ contextGradient: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                        probabilities: Tensor) -> (query: Tensor, key: Tensor, value: Tensor) {
        let (batch, length, d) = (key.shape[0], key.shape[1], key.shape[2])
        let headDim = d / heads
        let scale = 1 / Float(headDim).squareRoot()
        let (queryGradient, keyGradient, valueGradient) = (Tensor(zeros: [batch, d]), Tensor(zeros: key.shape), Tensor(zeros: value.shape))
        let (q, k, v, p, dc) = (query.storage.pointer, key.storage.pointer, value.storage.pointer, probabilities.storage.pointer,
                                contextGradient.storage.pointer)
        let (dq, dk, dv) = (queryGradient.storage.pointer, keyGradient.storage.pointer, valueGradient.storage.pointer)
        var scoreGradient = [Float](repeating: 0, count: length)
        for item in 0..<batch {
            for head in 0..<heads {
                let row = p + (item * heads + head) * length
                let contextRow = dc + item * d + head * headDim
                var weighted: Float = 0
                for t in 0..<length {
                    let offset = (item * length + t) * d + head * headDim
                    var dot: Float = 0
                    for i in 0..<headDim {
                        dot += contextRow[i] * v[offset + i]
                        dv[offset + i] = row[t] * contextRow[i]
                    }
                    scoreGradient[t] = dot
                    weighted += row[t] * dot
                }
                for t in 0..<length {
                    let ds = row[t] * (scoreGradient[t] - weighted) * scale
                    let offset = (item * length + t) * d + head * headDim
                    for i in 0..<headDim {
                        dq[item * d + head * headDim + i] += ds * k[offset + i]
                        dk[offset + i] = ds * q[head * headDim + i]
                    }
                }
            }
        }
        return (queryGradient, keyGradient, valueGradient)
    }
}
