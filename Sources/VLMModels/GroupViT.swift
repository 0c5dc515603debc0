import Foundation
import VLMCheckpoint
import VLMTensor

// GroupViT (Xu et al. 2022) as transformers' models/groupvit/modeling_groupvit.py builds it: a ViT whose stages end in
// grouping blocks that merge the image tokens into fewer and fewer learned groups, trained against CLIP's text
// transformer with text supervision only. Segmentation reads which pixels each final group gathered (the grouping
// blocks' soft assignments multiplied through the stages) and how well each group matches each text.

/// transformers' `GroupViTVisionConfig`, with its defaults.
public struct GroupViTVisionConfig: Decodable, Sendable {
    public var hiddenSize: Int
    public var intermediateSize: Int
    /// Encoder layers per stage.
    public var depths: [Int]
    /// Group tokens each stage appends to the image tokens (0: the stage does not group).
    public var numGroupTokens: [Int]
    /// Groups each stage's grouping block assigns the tokens to.
    public var numOutputGroups: [Int]
    public var numAttentionHeads: Int
    public var imageSize: Int
    public var patchSize: Int
    public var numChannels: Int
    public var hiddenAct: String
    public var layerNormEps: Float
    /// Added to each group's token count before its assigned tokens are averaged.
    public var assignEps: Float
    /// The widths of a grouping block's token-mixing and channel MLPs, as multiples of `hidden_size`.
    public var assignMlpRatio: [Double]

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", intermediateSize = "intermediate_size", depths
        case numGroupTokens = "num_group_tokens", numOutputGroups = "num_output_groups"
        case numAttentionHeads = "num_attention_heads", imageSize = "image_size", patchSize = "patch_size"
        case numChannels = "num_channels", hiddenAct = "hidden_act", layerNormEps = "layer_norm_eps"
        case assignEps = "assign_eps", assignMlpRatio = "assign_mlp_ratio"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        hiddenSize = try c.value(.hiddenSize, default: 384)
        intermediateSize = try c.value(.intermediateSize, default: 1536)
        depths = try c.value(.depths, default: [6, 3, 3])
        numGroupTokens = try c.value(.numGroupTokens, default: [64, 8, 0])
        numOutputGroups = try c.value(.numOutputGroups, default: [64, 8, 8])
        numAttentionHeads = try c.value(.numAttentionHeads, default: 6)
        imageSize = try c.value(.imageSize, default: 224)
        patchSize = try c.value(.patchSize, default: 16)
        numChannels = try c.value(.numChannels, default: 3)
        hiddenAct = try c.value(.hiddenAct, default: "gelu")
        layerNormEps = try c.value(.layerNormEps, default: 1e-5)
        assignEps = try c.value(.assignEps, default: 1)
        // One number means the same ratio for both MLPs.
        if let ratio = try? c.decodeIfPresent(Double.self, forKey: .assignMlpRatio) {
            assignMlpRatio = [ratio, ratio]
        } else {
            assignMlpRatio = try c.value(.assignMlpRatio, default: [0.5, 4])
        }
    }
}

/// transformers' `GroupViTConfig`: the vision tower's stages, CLIP's text transformer with GroupViT's defaults, and
/// the two-layer projection heads.
public struct GroupViTConfig: Decodable, Sendable {
    public var textConfig: CLIPTextConfig
    public var visionConfig: GroupViTVisionConfig
    public var projectionDim: Int
    public var projectionIntermediateDim: Int

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config"
        case textConfigDict = "text_config_dict", visionConfigDict = "vision_config_dict"
        case projectionDim = "projection_dim", projectionIntermediateDim = "projection_intermediate_dim"
    }

    /// `CLIPTextConfig` with `GroupViTTextConfig`'s defaults.
    private struct TextConfig: Decodable {
        let config: CLIPTextConfig
        init(from decoder: any Decoder) throws { config = try CLIPTextConfig(from: decoder, defaults: .groupViT) }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = Data("{}".utf8)
        // As for CLIPSeg: the 2022 checkpoints' `*_config_dict` win over `*_config`; absent both, all defaults.
        textConfig = try (c.decodeIfPresent(TextConfig.self, forKey: .textConfigDict)
            ?? c.decodeIfPresent(TextConfig.self, forKey: .textConfig)
            ?? JSONDecoder().decode(TextConfig.self, from: defaults)).config
        visionConfig = try c.decodeIfPresent(GroupViTVisionConfig.self, forKey: .visionConfigDict)
            ?? c.decodeIfPresent(GroupViTVisionConfig.self, forKey: .visionConfig)
            ?? JSONDecoder().decode(GroupViTVisionConfig.self, from: defaults)
        projectionDim = try c.value(.projectionDim, default: 256)
        projectionIntermediateDim = try c.value(.projectionIntermediateDim, default: 4096)
    }
}

/// `GroupViTMLP` (fc1, activation, fc2, of any widths) and, applied across tokens, `GroupViTMixerMLP`.
struct GroupViTMLP {
    let fc1: Linear
    let fc2: Linear
    let activation: Activation

    init(_ weights: Weights, input: Int, hidden: Int, output: Int, activation: Activation) throws {
        fc1 = try Linear(weights.scoped("fc1"), inFeatures: input, outFeatures: hidden)
        fc2 = try Linear(weights.scoped("fc2"), inFeatures: hidden, outFeatures: output)
        self.activation = activation
    }

    func callAsFunction(_ x: Tensor, residual: Tensor? = nil) -> Tensor {
        fc2(fc1(x, activation: activation), residual: residual)
    }

    /// The mixer: the MLP over the token axis of `x [B, T, D]`, mapping T tokens to `output` tokens, `[B, output, D]`.
    func mixingTokens(_ x: Tensor) -> Tensor { channelsFirst(self(channelsFirst(x))) }
}

/// `GroupViTCrossAttentionLayer`: the output groups attend to the image tokens (no norm before the attention), then
/// an MLP block and a final norm.
struct GroupViTCrossAttentionLayer {
    let query: Linear, key: Linear, value: Linear, output: Linear
    let heads: Int
    let norm2: LayerNorm
    let mlp: GroupViTMLP
    let normPost: LayerNorm

    init(_ weights: Weights, config: GroupViTVisionConfig, activation: Activation) throws {
        let d = config.hiddenSize, attention = weights.scoped("attn")
        query = try Linear(attention.scoped("q_proj"), inFeatures: d, outFeatures: d)
        key = try Linear(attention.scoped("k_proj"), inFeatures: d, outFeatures: d)
        value = try Linear(attention.scoped("v_proj"), inFeatures: d, outFeatures: d)
        output = try Linear(attention.scoped("out_proj"), inFeatures: d, outFeatures: d)
        heads = config.numAttentionHeads
        norm2 = try LayerNorm(weights.scoped("norm2"), size: d, eps: config.layerNormEps)
        mlp = try GroupViTMLP(weights.scoped("mlp"), input: d, hidden: config.intermediateSize, output: d,
                              activation: activation)
        normPost = try LayerNorm(weights.scoped("norm_post"), size: d, eps: config.layerNormEps)
    }

    func callAsFunction(_ groups: Tensor, attendingTo tokens: Tensor) -> Tensor {
        let context = attention(query: query(groups), key: key(tokens), value: value(tokens), heads: heads)
        let attended = output(context, residual: groups)
        return normPost(mlp(norm2(attended), residual: attended))
    }
}

/// `GroupViTTokenAssign`: a stage's group tokens, mixed into its output groups, gather the image tokens assigned to
/// them (hard assignment, as in eval mode). Returns the new tokens, one per output group, and the soft assignment
/// `[B, groups, tokens]` segmentation reads.
struct GroupViTTokenAssign {
    let normTokens: LayerNorm
    let mlpInter: GroupViTMLP
    let normPostTokens: LayerNorm
    let normX: LayerNorm
    let preAssignAttention: GroupViTCrossAttentionLayer
    let assignQuery: Linear, assignKey: Linear, assignValue: Linear, assignProjection: Linear
    let assignScale: Float
    let assignEps: Float
    let normNewX: LayerNorm
    let mlpChannels: GroupViTMLP

    init(_ weights: Weights, config: GroupViTVisionConfig, groupTokens: Int, outputGroups: Int,
         activation: Activation) throws {
        let d = config.hiddenSize, eps = config.layerNormEps
        let (tokensWidth, channelsWidth) = (Int(config.assignMlpRatio[0] * Double(d)), Int(config.assignMlpRatio[1] * Double(d)))
        normTokens = try LayerNorm(weights.scoped("norm_tokens"), size: d, eps: eps)
        mlpInter = try GroupViTMLP(weights.scoped("mlp_inter"), input: groupTokens, hidden: tokensWidth,
                                   output: outputGroups, activation: activation)
        normPostTokens = try LayerNorm(weights.scoped("norm_post_tokens"), size: d, eps: eps)
        normX = try LayerNorm(weights.scoped("norm_x"), size: d, eps: eps)
        preAssignAttention = try GroupViTCrossAttentionLayer(weights.scoped("pre_assign_attn"), config: config,
                                                             activation: activation)
        let assign = weights.scoped("assign")
        assignQuery = try Linear(assign.scoped("q_proj"), inFeatures: d, outFeatures: d)
        assignKey = try Linear(assign.scoped("k_proj"), inFeatures: d, outFeatures: d)
        assignValue = try Linear(assign.scoped("v_proj"), inFeatures: d, outFeatures: d)
        assignProjection = try Linear(assign.scoped("proj"), inFeatures: d, outFeatures: d)
        assignScale = Float(pow(Double(d), -0.5))
        assignEps = config.assignEps
        normNewX = try LayerNorm(weights.scoped("norm_new_x"), size: d, eps: eps)
        mlpChannels = try GroupViTMLP(weights.scoped("mlp_channels"), input: d, hidden: channelsWidth, output: d,
                                      activation: activation)
    }

    func callAsFunction(_ tokens: Tensor, groups: Tensor) -> (tokens: Tensor, assignment: Tensor) {
        let tokens = normX(tokens)
        var projected = normPostTokens(mlpInter.mixingTokens(normTokens(groups)))
        projected = preAssignAttention(projected, attendingTo: tokens)
        // GroupViTAssignAttention: one head over the full width.
        let logits = scaled(batchedMatmul(assignQuery(projected), assignKey(tokens), transposeB: true), by: assignScale)
        let (assignment, soft) = hardAssignment(logits, eps: assignEps)
        let gathered = assignProjection(batchedMatmul(assignment, assignValue(tokens)), residual: projected)
        return (mlpChannels(normNewX(gathered), residual: gathered), soft)
    }
}

/// `GroupViTStage`: group tokens (their own, plus a mix of the previous stage's) appended to the tokens, encoder
/// layers over both, then the grouping block, when the stage has group tokens.
struct GroupViTStage {
    let groupToken: Tensor?
    let layers: [PreNormEncoderLayer]
    let downsample: GroupViTTokenAssign?
    /// `group_projector`: a LayerNorm and a token mixer from the previous stage's group tokens to this stage's.
    let groupProjector: (norm: LayerNorm, mixer: GroupViTMLP)?

    init(_ weights: Weights, config: GroupViTVisionConfig, index: Int, activation: Activation) throws {
        let d = config.hiddenSize
        let groupTokens = config.numGroupTokens[index]
        let previousGroups = index > 0 ? config.numOutputGroups[index - 1] : 0
        groupToken = groupTokens > 0 ? try weights("group_token", shape: [1, groupTokens, d]).reshaped([groupTokens, d]) : nil
        layers = try (0..<config.depths[index]).map { i in
            try PreNormEncoderLayer(weights.scoped("layers.\(i)"), hiddenSize: d, intermediateSize: config.intermediateSize,
                                    heads: config.numAttentionHeads, activation: activation, eps: config.layerNormEps)
        }
        downsample = groupTokens > 0
            ? try GroupViTTokenAssign(weights.scoped("downsample"), config: config, groupTokens: groupTokens,
                                      outputGroups: config.numOutputGroups[index], activation: activation)
            : nil
        if previousGroups > 0 && groupTokens > 0 {
            let projector = weights.scoped("group_projector")
            groupProjector = (try LayerNorm(projector.scoped("0"), size: d, eps: config.layerNormEps),
                              try GroupViTMLP(projector.scoped("1"), input: previousGroups, hidden: d / 2,
                                              output: groupTokens, activation: activation))
        } else {
            groupProjector = nil
        }
    }

    /// `tokens [B, T, D]` and the previous stage's group tokens → the next tokens, this stage's group tokens (after
    /// its layers) and its soft assignment, when it groups.
    func callAsFunction(_ tokens: Tensor, previousGroups: Tensor?) throws
        -> (tokens: Tensor, groups: Tensor?, assignment: Tensor?) {
        let batch = tokens.shape[0], count = tokens.shape[1]
        var groups: Tensor?
        if let groupToken {
            if let groupProjector {
                guard let previousGroups, previousGroups.shape[1] == groupProjector.mixer.fc1.inFeatures else {
                    throw ModelError.invalidInput("GroupViT stage expects \(groupProjector.mixer.fc1.inFeatures) group tokens from the stage before, got \(previousGroups?.shape[1] ?? 0) (num_group_tokens and num_output_groups of that stage differ)")
                }
                groups = add(groupProjector.mixer.mixingTokens(groupProjector.norm(previousGroups)), groupToken)
            } else {
                groups = concatenate(Array(repeating: groupToken.reshaped([1] + groupToken.shape), count: batch), axis: 0)
            }
        }
        var hidden = groups.map { concatenate([tokens, $0], axis: 1) } ?? tokens
        for layer in layers { hidden = layer(hidden) }
        guard groups != nil, let downsample else { return (hidden, nil, nil) }
        let (image, ownGroups) = (sequenceSlice(hidden, 0..<count), sequenceSlice(hidden, count..<hidden.shape[1]))
        let (grouped, assignment) = downsample(image, groups: ownGroups)
        return (grouped, ownGroups, assignment)
    }
}

/// `GroupViTVisionTransformer`: patch embedding (no class token), its norm, learned positions, the stages, the final
/// norm; the pooled output is the mean of the final groups.
final class GroupViTVisionTransformer: Sendable {
    let config: GroupViTVisionConfig
    let patchEmbedding: Conv2d
    let embeddingNorm: LayerNorm
    let positionEmbedding: Tensor
    let stages: [GroupViTStage]
    let layerNorm: LayerNorm

    init(_ config: GroupViTVisionConfig, weights: Weights, file: String) throws {
        let stageCount = config.depths.count
        guard config.patchSize > 0, config.imageSize % config.patchSize == 0, config.numAttentionHeads > 0,
              config.hiddenSize % config.numAttentionHeads == 0 else {
            throw ModelError.invalidConfig("vision_config: image_size \(config.imageSize) must be a multiple of patch_size \(config.patchSize), hidden_size \(config.hiddenSize) of num_attention_heads \(config.numAttentionHeads)", file: file)
        }
        guard stageCount > 0, config.numGroupTokens.count == stageCount, config.numOutputGroups.count == stageCount,
              config.assignMlpRatio.count == 2 else {
            throw ModelError.invalidConfig("vision_config: depths \(config.depths), num_group_tokens \(config.numGroupTokens) and num_output_groups \(config.numOutputGroups) must name the same stages, assign_mlp_ratio two ratios", file: file)
        }
        self.config = config
        let d = config.hiddenSize, side = config.imageSize / config.patchSize
        let embeddings = weights.scoped("embeddings")
        let projection = embeddings.scoped("patch_embeddings.projection")
        patchEmbedding = try Conv2d(weight: projection("weight", shape: [d, config.numChannels, config.patchSize, config.patchSize]),
                                    bias: projection("bias", shape: [d]), stride: config.patchSize, padding: 0)
        embeddingNorm = try LayerNorm(embeddings.scoped("layernorm"), size: d, eps: config.layerNormEps)
        positionEmbedding = try embeddings("position_embeddings", shape: [1, side * side, d]).reshaped([side * side, d])
        let activation = try Activation(huggingFaceName: config.hiddenAct, file: file)
        stages = try (0..<stageCount).map { i in
            try GroupViTStage(weights.scoped("encoder.stages.\(i)"), config: config, index: i, activation: activation)
        }
        layerNorm = try LayerNorm(weights.scoped("layernorm"), size: d, eps: config.layerNormEps)
    }

    /// pixel_values `[B, C, S, S]` → the normed final groups `[B, groups, D]` (last_hidden_state) and each grouping
    /// stage's soft assignment `[B, groups, tokens]` (transformers' vision `attentions`).
    func callAsFunction(_ pixelValues: Tensor) throws -> (groups: Tensor, assignments: [Tensor]) {
        let (channels, side) = (config.numChannels, config.imageSize)
        guard pixelValues.rank == 4, pixelValues.shape[1] == channels, pixelValues.shape[2] == side,
              pixelValues.shape[3] == side else {
            throw ModelError.invalidInput("GroupViT vision model expects pixel values [batch, \(channels), \(side), \(side)], got \(pixelValues.shape)")
        }
        let batch = pixelValues.shape[0]
        var tokens = add(embeddingNorm(patchEmbedding(pixelValues, channelsLast: true).reshaped([batch, -1, config.hiddenSize])),
                         positionEmbedding)
        var groups: Tensor?, assignments: [Tensor] = []
        for stage in stages {
            let output = try stage(tokens, previousGroups: groups)
            tokens = output.tokens
            groups = output.groups
            if let assignment = output.assignment { assignments.append(assignment) }
        }
        return (layerNorm(tokens), assignments)
    }
}

/// The projection heads: `nn.Sequential(Linear, BatchNorm1d, ReLU, Linear)`, the batch norm with its running
/// statistics (eval mode).
struct GroupViTProjection {
    let first: Linear
    let mean: Tensor, variance: Tensor, weight: Tensor, bias: Tensor
    let second: Linear

    init(_ weights: Weights, input: Int, intermediate: Int, output: Int) throws {
        first = try Linear(weights.scoped("0"), inFeatures: input, outFeatures: intermediate)
        let norm = weights.scoped("1")
        mean = try norm("running_mean", shape: [intermediate])
        variance = try norm("running_var", shape: [intermediate])
        weight = try norm("weight", shape: [intermediate])
        bias = try norm("bias", shape: [intermediate])
        second = try Linear(weights.scoped("3"), inFeatures: intermediate, outFeatures: output)
    }

    func callAsFunction(_ x: Tensor) -> Tensor {
        let normed = batchNormalized(first(x), mean: mean, variance: variance, weight: weight, bias: bias, eps: 1e-5)
        return second(activation(normed, .relu))
    }
}

/// transformers' `GroupViTModel`: the grouping vision tower, CLIP's text transformer, both projection heads and the
/// learned temperature; segmentation as `forward(..., output_segmentation=True)` computes `segmentation_logits`.
public final class GroupViTModel: ZeroShotSegmentationModel {
    public let config: GroupViTConfig
    let vision: GroupViTVisionTransformer
    let text: CLIPTextTransformer
    let visualProjection: GroupViTProjection
    let textProjection: GroupViTProjection
    public let logitScale: Float

    /// Loads config.json and the safetensors weights of a checkpoint directory.
    public convenience init(directory: ModelDirectory) throws {
        try self.init(config: directory.decode(GroupViTConfig.self), weights: Weights(WeightStore(directory: directory.url)),
                      file: directory.url.appendingPathComponent("config.json").path)
    }

    public init(config: GroupViTConfig, weights: Weights, file: String = "config.json") throws {
        self.config = config
        vision = try GroupViTVisionTransformer(config.visionConfig, weights: weights.scoped("vision_model"), file: file)
        text = try CLIPTextTransformer(config.textConfig, weights: weights.scoped("text_model"), file: file)
        visualProjection = try GroupViTProjection(weights.scoped("visual_projection"), input: config.visionConfig.hiddenSize,
                                                  intermediate: config.projectionIntermediateDim, output: config.projectionDim)
        textProjection = try GroupViTProjection(weights.scoped("text_projection"), input: config.textConfig.hiddenSize,
                                                intermediate: config.projectionIntermediateDim, output: config.projectionDim)
        logitScale = try weights("logit_scale").scalars.first ?? 0
    }

    public var maxTextLength: Int { config.textConfig.maxPositionEmbeddings }
    public var probabilities: SegmentationProbabilities { .softmaxOverPrompts }
    public var textPadding: SegmentationTextPadding { .longest }

    /// `get_image_features`: the projected mean of the final groups (not normalized), [B, projection_dim].
    public func imageFeatures(pixelValues: Tensor) throws -> Tensor {
        try visualProjection(tokenMean(vision(pixelValues).groups))
    }

    /// `get_text_features`: projected (not normalized) text embeddings [texts, projection_dim].
    public func textFeatures(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        try textProjection(text.pooledOutput(inputIds: inputIds, attentionMask: attentionMask))
    }

    /// `logits_per_image`: exp(logit_scale) × cosine similarity, [images, texts].
    public func logitsPerImage(imageFeatures: Tensor, textFeatures: Tensor) -> Tensor {
        scaled(matmul(l2Normalized(imageFeatures), l2Normalized(textFeatures), transposeB: true), by: Float(exp(Double(logitScale))))
    }

    /// The text features: GroupViT segments by text labels.
    public func conditionalEmbeddings(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        try textFeatures(inputIds: inputIds, attentionMask: attentionMask)
    }

    /// GroupViT has no image-prompted segmentation: its masks come from how each group matches each text.
    public func conditionalEmbeddings(pixelValues: Tensor) throws -> Tensor {
        throw ModelError.invalidInput("GroupViT segments by text labels only; it takes no example-image prompts")
    }

    /// transformers' `segmentation_logits` for one image `[1, C, S, S]` and text features `[T, projection_dim]`:
    /// `[T, S, S]`, or with one image per text (`[T, C, S, S]`) each image under its own text.
    ///
    /// Each grouping stage's soft assignment (tokens to groups) is multiplied through the stages, so every patch
    /// gets a weight per final group, resized bilinearly to the pixels (`get_grouping_from_attentions`); each final
    /// group's projected embedding meets each text's as `exp(logit_scale)` × cosine; a pixel's logit for a text is the
    /// sum over groups of the two, scaled by `exp(logit_scale)` again, as transformers does.
    public func segmentationLogits(pixelValues: Tensor, conditionalEmbeddings: Tensor) throws -> Tensor {
        let texts = conditionalEmbeddings.shape.first ?? 0
        guard conditionalEmbeddings.rank == 2, conditionalEmbeddings.shape[1] == config.projectionDim, texts > 0 else {
            throw ModelError.invalidInput("GroupViT text features must be [texts, \(config.projectionDim)], got \(conditionalEmbeddings.shape)")
        }
        guard pixelValues.rank == 4, pixelValues.shape[0] == 1 || pixelValues.shape[0] == texts else {
            throw ModelError.invalidInput("GroupViT segments one image, or one per text (\(texts)), got pixel values \(pixelValues.shape)")
        }
        let (height, width) = (pixelValues.shape[2], pixelValues.shape[3])
        let (groups, assignments) = try vision(pixelValues)
        guard !assignments.isEmpty else {
            throw ModelError.invalidInput("GroupViT vision model has no grouping stage (num_group_tokens all 0), so no segmentation")
        }
        let scale = Float(exp(Double(logitScale)))
        let textEmbeddings = l2Normalized(conditionalEmbeddings)
        let maps = (0..<pixelValues.shape[0]).map { item -> Tensor in
            let groupEmbeddings = l2Normalized(visualProjection(batchItem(groups, item)))
            let texts = pixelValues.shape[0] == 1 ? textEmbeddings : batchItem(textEmbeddings, item).reshaped([1, -1])
            let groupLogits = scaled(matmul(texts, groupEmbeddings, transposeB: true), by: scale)  // [T, groups]
            let grouping = self.grouping(assignments.map { batchItem($0, item) }, height: height, width: width)
            return scaled(matmul(groupLogits, grouping), by: scale).reshaped([texts.shape[0], height, width])
        }
        return maps.count == 1 ? maps[0] : concatenate(maps, axis: 0)
    }

    /// `get_grouping_from_attentions` for one image: the stages' soft assignments `[groups_i, tokens_i]` chained from
    /// patches to final groups, each group's patch map resized bilinearly to `height`×`width` as
    /// `resize_attention_map` does: `[groups, height · width]`.
    private func grouping(_ assignments: [Tensor], height: Int, width: Int) -> Tensor {
        var chained = assignments[0]  // [groups, patches]
        for assignment in assignments.dropFirst() { chained = matmul(assignment, chained) }
        let (groups, patches) = (chained.shape[0], chained.shape[1])
        // The patch grid from its size and the image's aspect, as transformers recovers it (np.round: half to even).
        let scale = Double(height * width / patches).squareRoot()
        let rows: Int, columns: Int
        if height > width {
            columns = Int((Double(width) / scale).rounded(.toNearestOrEven))
            rows = patches / columns
        } else {
            rows = Int((Double(height) / scale).rounded(.toNearestOrEven))
            columns = patches / rows
        }
        return interpolate(chained.reshaped([groups, rows, columns]), height: height, width: width, mode: .bilinear)
            .reshaped([groups, height * width])
    }
}
