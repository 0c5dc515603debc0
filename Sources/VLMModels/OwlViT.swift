import Foundation
import VLMCheckpoint
import VLMTensor

// OWL-ViT (Minderer et al. 2022) and OWLv2 (Minderer et al. 2023) as transformers' models/owlvit/modeling_owlvit.py
// and models/owlv2/modeling_owlv2.py build them: CLIP's two towers, where every patch token of the image (scaled by
// the class token) becomes a candidate object with a box from a small MLP, biased to the patch's place on the grid,
// and a class embedding compared with the projected text queries. OWLv2 adds an objectness head, which also picks
// the query patch of image-guided detection.

/// transformers' `OwlViTConfig` / `Owlv2Config`: CLIP's towers with OWL's defaults (16 text positions, 768-pixel
/// images).
public struct OwlViTConfig: Decodable, Sendable {
    public var textConfig: CLIPTextConfig
    public var visionConfig: CLIPVisionConfig
    public var projectionDim: Int

    enum CodingKeys: String, CodingKey {
        case textConfig = "text_config", visionConfig = "vision_config", projectionDim = "projection_dim"
        case modelType = "model_type"
    }

    /// The one text field whose OWL default differs from CLIP's.
    private struct TextPositions: Decodable {
        var maxPositionEmbeddings: Int?
        enum CodingKeys: String, CodingKey { case maxPositionEmbeddings = "max_position_embeddings" }
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let empty = JSONDecoder()
        textConfig = try c.decodeIfPresent(CLIPTextConfig.self, forKey: .textConfig)
            ?? empty.decode(CLIPTextConfig.self, from: Data("{}".utf8))
        textConfig.maxPositionEmbeddings = try c.decodeIfPresent(TextPositions.self, forKey: .textConfig)?
            .maxPositionEmbeddings ?? 16
        // OWLv2's vision config defaults to patch 16, OWL-ViT's to 32.
        let patchSize = try c.decodeIfPresent(String.self, forKey: .modelType) == "owlv2" ? 16 : 32
        let defaults = CLIPVisionConfig.Defaults(imageSize: 768, patchSize: patchSize)
        if c.contains(.visionConfig), try !c.decodeNil(forKey: .visionConfig) {
            visionConfig = try CLIPVisionConfig(from: c.superDecoder(forKey: .visionConfig), defaults: defaults)
        } else {
            visionConfig = try CLIPVisionConfig(from: empty.decoder(for: Data("{}".utf8)), defaults: defaults)
        }
        projectionDim = try c.value(.projectionDim, default: 512)
    }
}

private extension JSONDecoder {
    /// A decoder positioned at the top of `data`, for the initializers that take one.
    func decoder(for data: Data) throws -> any Decoder { try decode(DecoderCapture.self, from: data).decoder }
}

private struct DecoderCapture: Decodable {
    let decoder: any Decoder
    init(from decoder: any Decoder) throws { self.decoder = decoder }
}

/// `OwlViTBoxPredictionHead`: dense0 → GELU → dense1 → GELU → dense2 (4 box numbers, or 1 objectness logit).
struct OwlViTBoxPredictionHead {
    let dense0: Linear
    let dense1: Linear
    let dense2: Linear

    init(_ weights: Weights, width: Int, outputs: Int) throws {
        dense0 = try Linear(weights.scoped("dense0"), inFeatures: width, outFeatures: width)
        dense1 = try Linear(weights.scoped("dense1"), inFeatures: width, outFeatures: width)
        dense2 = try Linear(weights.scoped("dense2"), inFeatures: width, outFeatures: outputs)
    }

    func callAsFunction(_ x: Tensor) -> Tensor {
        dense2(dense1(dense0(x, activation: .gelu), activation: .gelu))
    }
}

/// `OwlViTClassPredictionHead`: patch class embeddings (dense0), compared by cosine with the queries, then shifted
/// and scaled per patch: `(cos + logit_shift(x)) · (elu(logit_scale(x)) + 1)`.
struct OwlViTClassPredictionHead {
    let dense0: Linear
    let logitShift: Linear
    let logitScale: Linear

    init(_ weights: Weights, queryDim: Int, outputDim: Int) throws {
        dense0 = try Linear(weights.scoped("dense0"), inFeatures: queryDim, outFeatures: outputDim)
        logitShift = try Linear(weights.scoped("logit_shift"), inFeatures: queryDim, outFeatures: 1)
        logitScale = try Linear(weights.scoped("logit_scale"), inFeatures: queryDim, outFeatures: 1)
    }

    /// Patch features [B, P, D] against queries: one [Q, E] matrix per batch item (or one for all) → [B, P, Q].
    func logits(_ features: Tensor, queries: [Tensor]) -> Tensor {
        let (batch, patches) = (features.shape[0], features.shape[1])
        let classEmbeddings = l2Normalized(dense0(features), epsilon: 1e-6)
        let width = classEmbeddings.shape[2]
        let similarities = (0..<batch).map { item in
            let queries = l2Normalized(queries[queries.count == 1 ? 0 : item], epsilon: 1e-6)
            let patchRows = sequenceSlice(classEmbeddings.reshaped([1, batch, patches * width]), item..<(item + 1))
            return matmul(patchRows.reshaped([patches, width]), queries, transposeB: true)
                .reshaped([1, patches, queries.shape[0]])
        }
        let scale = add(activation(logitScale(features), .elu), Tensor(shape: [1], scalars: [1]))
        return shiftedAndScaled(concatenate(similarities, axis: 0), shift: logitShift(features), scale: scale)
    }
}

/// transformers' `OwlViTForObjectDetection` and `Owlv2ForObjectDetection` (the same model, plus OWLv2's objectness
/// head): text queries or an example image against every patch of an image at the vision tower's `image_size`.
public final class OwlViTForObjectDetection: ZeroShotObjectDetectionModel {
    /// The two published generations, which differ in the weights' prefix, OWLv2's objectness head and how
    /// image-guided detection picks the query image's patch.
    public enum Generation: Sendable {
        case owlViT, owlv2
    }

    public let config: OwlViTConfig
    public let generation: Generation
    let vision: CLIPVisionTransformer
    let text: CLIPTextTransformer
    let textProjection: Linear
    let layerNorm: LayerNorm
    let classHead: OwlViTClassPredictionHead
    let boxHead: OwlViTBoxPredictionHead
    let objectnessHead: OwlViTBoxPredictionHead?
    /// `box_bias` [patches, 4]: each patch's place on the grid and size, as logits, added before the box sigmoid.
    let boxBias: Tensor

    /// Loads config.json and the safetensors weights of a checkpoint directory (model_type "owlvit" or "owlv2").
    public convenience init(directory: ModelDirectory) throws {
        try self.init(config: directory.decode(OwlViTConfig.self),
                      generation: directory.modelType == "owlv2" ? .owlv2 : .owlViT,
                      weights: Weights(WeightStore(directory: directory.url)),
                      file: directory.url.appendingPathComponent("config.json").path)
    }

    public init(config: OwlViTConfig, generation: Generation = .owlViT, weights: Weights,
                file: String = "config.json") throws {
        guard config.projectionDim == config.textConfig.hiddenSize else {
            throw ModelError.invalidConfig("projection_dim \(config.projectionDim) must equal text_config.hidden_size \(config.textConfig.hiddenSize): the class head compares patch embeddings of that width with projected queries", file: file)
        }
        self.config = config
        self.generation = generation
        let model = weights.scoped(generation == .owlv2 ? "owlv2" : "owlvit")
        let (vision, text) = (config.visionConfig, config.textConfig)
        self.vision = try CLIPVisionTransformer(vision, weights: model.scoped("vision_model"), file: file,
                                                preLayerNormName: "pre_layernorm")
        self.text = try CLIPTextTransformer(text, weights: model.scoped("text_model"), file: file, poolsAtHighestId: true)
        textProjection = try Linear(model.scoped("text_projection"), inFeatures: text.hiddenSize,
                                    outFeatures: config.projectionDim, bias: false)
        layerNorm = try LayerNorm(weights.scoped("layer_norm"), size: vision.hiddenSize, eps: vision.layerNormEps)
        classHead = try OwlViTClassPredictionHead(weights.scoped("class_head"), queryDim: vision.hiddenSize,
                                                  outputDim: text.hiddenSize)
        boxHead = try OwlViTBoxPredictionHead(weights.scoped("box_head"), width: vision.hiddenSize, outputs: 4)
        objectnessHead = generation == .owlv2
            ? try OwlViTBoxPredictionHead(weights.scoped("objectness_head"), width: vision.hiddenSize, outputs: 1) : nil
        boxBias = Self.boxBias(side: vision.patchesPerSide)
    }

    public var maxTextLength: Int { config.textConfig.maxPositionEmbeddings }

    /// transformers' `compute_box_bias` for a square grid of `side`×`side` patches, in fp32 as torch computes it:
    /// the inverse sigmoid of each patch's bottom-right corner (centre bias) and of the patch's size (size bias).
    static func boxBias(side: Int) -> Tensor {
        func inverseSigmoid(_ x: Float) -> Float { log(x + 1e-4) - log1p(-x + 1e-4) }
        let sideLength = Float(side)
        let size = inverseSigmoid(1 / sideLength)
        var values: [Float] = []
        values.reserveCapacity(side * side * 4)
        for row in 0..<side {
            for column in 0..<side {
                let x: Float = inverseSigmoid(Float(column + 1) / sideLength)
                let y: Float = inverseSigmoid(Float(row + 1) / sideLength)
                values += [x, y, size, size]
            }
        }
        return Tensor(shape: [side * side, 4], scalars: values)
    }

    /// `image_embedder`: the vision tower's last hidden state, post-layernormed, patch tokens times the class
    /// token, layer-normed: [B, patches, D].
    func featureMap(_ pixelValues: Tensor) throws -> Tensor {
        guard let last = try vision.hiddenStates(pixelValues, at: [-1]).first else {
            throw ModelError.invalidInput("OWL-ViT vision model produced no hidden state")
        }
        let normed = vision.postLayerNorm(last)
        let batch = normed.shape[0], patches = normed.shape[1] - 1
        let classTokens = gatherTokens(normed, positions: Array(repeating: 0, count: batch))
        return layerNorm(multiplyingTokens(sequenceSlice(normed, 1..<(1 + patches)), by: classTokens))
    }

    /// `box_predictor`: (cx, cy, w, h) in [0, 1] per patch, [B, patches, 4].
    func boxes(_ features: Tensor) -> Tensor {
        activation(add(boxHead(features), boxBias), .sigmoid)
    }

    /// `objectness_predictor` (OWLv2): [B, patches]; nil for OWL-ViT.
    func objectness(_ features: Tensor) -> Tensor? {
        objectnessHead.map { $0(features).reshaped([features.shape[0], features.shape[1]]) }
    }

    /// The normalized projected text queries `text_embeds` [Q, projection_dim].
    ///
    /// - Throws: `ModelError.invalidInput` for a query whose first id is 0, which transformers takes for a padding
    ///   query and masks (this model is never given padding queries).
    public func textEmbeddings(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor {
        if let padding = inputIds.firstIndex(where: { $0.first == 0 }) {
            throw ModelError.invalidInput("text query \(padding + 1) starts with token id 0, which OWL-ViT reads as a padding query")
        }
        return l2Normalized(try textProjection(text.pooledOutput(inputIds: inputIds, attentionMask: attentionMask)))
    }

    /// transformers' forward: logits [B, patches, Q] of every text query in every image, boxes, objectness.
    public func detect(pixelValues: Tensor, inputIds: [[Int]], attentionMask: [[Int]]?) throws -> ObjectDetectionOutput {
        let queries = try textEmbeddings(inputIds: inputIds, attentionMask: attentionMask)
        let features = try featureMap(pixelValues)
        return ObjectDetectionOutput(logits: classHead.logits(features, queries: [queries]), predBoxes: boxes(features),
                                     objectnessLogits: objectness(features))
    }

    /// transformers' `image_guided_detection`: each query image's most telling patch embedding (`embed_image_query`)
    /// searched for in its target image.
    public func imageGuidedDetection(pixelValues: Tensor, queryPixelValues: Tensor) throws -> ImageGuidedDetectionOutput {
        guard queryPixelValues.rank == 4, pixelValues.rank == 4, queryPixelValues.shape[0] == pixelValues.shape[0] else {
            throw ModelError.invalidInput("image-guided detection needs one query image per target image, got \(queryPixelValues.shape) for \(pixelValues.shape)")
        }
        let queryFeatures = try featureMap(queryPixelValues)
        let features = try featureMap(pixelValues)
        let queryBoxes = boxes(queryFeatures)
        let classEmbeddings = classHead.dense0(queryFeatures)
        let (batch, patches, width) = (classEmbeddings.shape[0], classEmbeddings.shape[1], classEmbeddings.shape[2])
        let chosen: [Int]
        if let objectness = objectness(queryFeatures) {
            chosen = argmaxLastDimension(objectness)
        } else {
            chosen = try (0..<batch).map { item in
                try Self.queryPatch(boxes: Array(queryBoxes.scalars[(item * patches * 4)..<((item + 1) * patches * 4)]),
                                    classEmbeddings: Array(classEmbeddings.scalars[(item * patches * width)..<((item + 1) * patches * width)]),
                                    width: width)
            }
        }
        let queries = gatherTokens(classEmbeddings, positions: chosen)
        let perImage = (0..<batch).map { sequenceSlice(queries.reshaped([1, batch, width]), $0..<($0 + 1)).reshaped([1, width]) }
        return ImageGuidedDetectionOutput(logits: classHead.logits(features, queries: perImage),
                                          targetPredBoxes: boxes(features), queryPredBoxes: queryBoxes)
    }

    /// OWL-ViT's `embed_image_query` for one query image: among the patches whose boxes overlap the whole image at
    /// least 0.8 times as much as the best one does (IoU, or generalized IoU when no box overlaps it), the one whose
    /// class embedding is least like the mean of all patches'. Selection on P boxes, in fp32 as torch computes it.
    static func queryPatch(boxes: [Float], classEmbeddings: [Float], width: Int) throws -> Int {
        let patches = boxes.count / 4
        let corners = (0..<patches).map { patch -> (Float, Float, Float, Float) in
            let (cx, cy, w, h) = (boxes[patch * 4], boxes[patch * 4 + 1], boxes[patch * 4 + 2], boxes[patch * 4 + 3])
            return (cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h)
        }
        var overlaps = corners.map { box -> Float in
            let area = (box.2 - box.0) * (box.3 - box.1)
            let inter = max(min(1, box.2) - max(0, box.0), 0) * max(min(1, box.3) - max(0, box.1), 0)
            return inter / (1 + area - inter)
        }
        if overlaps.allSatisfy({ $0 == 0 }) {
            overlaps = zip(corners, overlaps).map { box, iou in
                let area = (box.2 - box.0) * (box.3 - box.1)
                let inter = max(min(1, box.2) - max(0, box.0), 0) * max(min(1, box.3) - max(0, box.1), 0)
                let union = 1 + area - inter
                let enclosing = max(max(1, box.2) - min(0, box.0), 0) * max(max(1, box.3) - min(0, box.1), 0)
                return iou - (enclosing - union) / enclosing
            }
        }
        guard let best = overlaps.max() else { throw ModelError.invalidInput("image-guided detection: the query image has no patches") }
        let selected = overlaps.indices.filter { overlaps[$0] >= best * 0.8 }
        guard !selected.isEmpty else {
            throw ModelError.invalidInput("image-guided detection: no box of the query image overlaps it (NaN boxes?)")
        }
        var mean = [Float](repeating: 0, count: width)
        for patch in 0..<patches {
            for feature in 0..<width { mean[feature] += classEmbeddings[patch * width + feature] }
        }
        mean = mean.map { $0 / Float(patches) }
        let similarities = selected.map { patch in
            (0..<width).reduce(Float(0)) { $0 + mean[$1] * classEmbeddings[patch * width + $1] }
        }
        let lowest = similarities.indices.min { similarities[$0] < similarities[$1] }!
        return selected[lowest]
    }
}
