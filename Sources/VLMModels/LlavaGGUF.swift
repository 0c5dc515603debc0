import Foundation
import VLMCheckpoint
import VLMImages
import VLMTensor

// LLaVA-1.5 and LLaVA-NeXT from llama.cpp's pair of GGUF files, as `llama-mtmd-cli -m LM.gguf --mmproj MMPROJ.gguf`
// runs them: the CLIP tower and the projector from the mmproj (`general.architecture` "clip", its `clip.*` metadata and
// `v.*`/`mm.*` tensors, as tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py writes them), the language model
// from the other file as LlamaGGUF.swift reads it. Both are read into the classes of Llava.swift and LlavaNext.swift under
// Hugging Face's names; nothing here computes anything of its own.

/// What a llama.cpp mmproj file says about LLaVA-1.5's or LLaVA-NeXT's image side: the CLIP tower's shape, which of
/// its hidden states the projector reads, the image normalization, the projector's widths and NeXT's tile grids.
public struct LlavaMMProjConfig: Sendable {
    /// The tower as transformers would configure it, with only the layers the file holds (the converter drops those
    /// past the deepest feature layer).
    public var visionConfig: CLIPVisionConfig
    /// `hidden_states` indices the projector reads (`clip.vision.feature_layer`). Without it, the last layer the file
    /// holds: the converter has dropped the source tower's last layer, so this is LLaVA's `vision_feature_layer` -2.
    /// (llama.cpp's graph, tools/mtmd/models/llava.cpp, stops one layer earlier there, at `block_count - 1`; this
    /// follows the source model.)
    public var featureLayers: [Int]
    public var imageMean: [Double]
    public var imageStd: [Double]
    /// The projector's output width, which must be the language model's hidden size.
    public var projectorWidth: Int
    /// Whether the projector's linear layers have biases.
    public var projectorBias: Bool
    /// LLaVA-NeXT's tile resolutions (`clip.vision.image_grid_pinpoints`, (height, width) pairs as the source
    /// config's `image_grid_pinpoints`); nil for LLaVA-1.5.
    public var imageGridPinpoints: [ImageSize]?

    /// Reads the `clip.*` metadata of `file`.
    ///
    /// - Throws: `CheckpointError.invalidGGUF` naming the file when it is not a LLaVA mmproj (another architecture, no
    ///   LLaVA projector, a projector type other than "mlp"), when a required key is missing or malformed, for
    ///   LLaVA-NeXT pinpoints without `spatial_unpad` merging or `model.image_newline`, or for the Yi-style (normed)
    ///   projector, which is not supported here.
    public init(_ file: GGUFFile) throws {
        let mmproj = try MMProjMetadata(file)
        let metadata = file.metadata
        guard metadata["clip.has_llava_projector"] == .bool(true) || metadata["clip.projector_type"] != nil else {
            throw mmproj.invalid("clip.has_llava_projector is not true: a CLIP model without a LLaVA projector")
        }
        let projectorType = metadata["clip.projector_type"]?.string ?? "mlp"
        guard projectorType == "mlp" else {
            throw mmproj.invalid("clip.projector_type is \"\(projectorType)\"; supported: mlp (LLaVA-1.5, LLaVA-NeXT), gemma3 (Gemma 3)")
        }
        guard file.info("mm.3.weight") == nil else {
            throw mmproj.invalid("mm.3.weight: the normed (Yi-style) LLaVA projector is not supported")
        }
        let vision = try mmproj.tower(JSONDecoder().decode(CLIPVisionConfig.self, from: Data("{}".utf8)), epsilon: 1e-5, gelu: "gelu")
        visionConfig = vision
        if let layers = metadata["clip.vision.feature_layer"] {
            guard let values = layers.array?.compactMap(\.integer), !values.isEmpty else {
                throw mmproj.invalid("clip.vision.feature_layer is \(layers), expected hidden-state indices")
            }
            featureLayers = values
        } else {
            featureLayers = [vision.numHiddenLayers]
        }
        // Without them, OpenAI CLIP's mean and std, the converter's defaults.
        imageMean = try mmproj.channels("image_mean", default: [0.48145466, 0.4578275, 0.40821073])
        imageStd = try mmproj.channels("image_std", default: [0.26862954, 0.26130258, 0.27577711])
        guard let first = file.info("mm.0.weight"), let second = file.info("mm.2.weight"), first.shape.count == 2,
              second.shape.count == 2 else {
            throw mmproj.invalid("mm.0.weight and mm.2.weight (the LLaVA projector's two linear layers) are missing or not matrices")
        }
        projectorWidth = second.shape[0]
        projectorBias = file.info("mm.0.bias") != nil
        if let pinpoints = metadata["clip.vision.image_grid_pinpoints"] {
            let values = pinpoints.array?.compactMap(\.integer) ?? []
            guard !values.isEmpty, values.count == pinpoints.array?.count, values.count % 2 == 0, values.allSatisfy({ $0 > 0 }) else {
                throw mmproj.invalid("clip.vision.image_grid_pinpoints is \(pinpoints), expected positive height, width pairs")
            }
            let mergeType = metadata["clip.vision.mm_patch_merge_type"]?.string ?? "flat"
            guard mergeType == "spatial_unpad" else {
                throw mmproj.invalid("clip.vision.mm_patch_merge_type is \"\(mergeType)\"; LLaVA-NeXT (anyres) is supported with spatial_unpad")
            }
            guard file.info("model.image_newline") != nil else { throw mmproj.invalid("model.image_newline (LLaVA-NeXT's row separator) is missing") }
            imageGridPinpoints = stride(from: 0, to: values.count, by: 2).map { ImageSize(height: values[$0], width: values[$0 + 1]) }
        }
    }

    /// Hugging Face name (as `LlavaForConditionalGeneration`'s published layout has it) → the mmproj's tensor, for the
    /// tower under `vision_tower.` and the projector under `multi_modal_projector.`. The file has no
    /// `post_layernorm` (LLaVA never reads it); an identity stands in. Its `ffn_down` is CLIP's `fc1` when its rows
    /// are as long as the hidden size (the legacy converter's swapped names, which llama.cpp swaps back the same way).
    func tensorNames(_ file: GGUFFile) -> [String: WeightStore.GGUFSource] {
        let d = visionConfig.hiddenSize
        var names: [String: WeightStore.GGUFSource] = [
            "vision_tower.embeddings.patch_embedding.weight": .tensor("v.patch_embd.weight"),
            "vision_tower.embeddings.class_embedding": .tensor("v.class_embd"),
            "vision_tower.embeddings.position_embedding.weight": .tensor("v.position_embd.weight"),
            "vision_tower.pre_layrnorm.weight": .tensor("v.pre_ln.weight"),
            "vision_tower.pre_layrnorm.bias": .tensor("v.pre_ln.bias"),
            "vision_tower.post_layernorm.weight": .value(Tensor(shape: [d], scalars: Array(repeating: 1, count: d))),
            "vision_tower.post_layernorm.bias": .value(Tensor(zeros: [d])),
        ]
        if imageGridPinpoints != nil { names["image_newline"] = .tensor("model.image_newline") }
        for (hf, gguf) in [("linear_1", "mm.0"), ("linear_2", "mm.2")] {
            for kind in ["weight", "bias"] { names["multi_modal_projector.\(hf).\(kind)"] = .tensor("\(gguf).\(kind)") }
        }
        for layer in 0..<visionConfig.numHiddenLayers {
            let hf = "vision_tower.encoder.layers.\(layer)", gguf = "v.blk.\(layer)"
            let swapped = file.info("\(gguf).ffn_down.weight")?.dimensions.first == d
            let modules = ["self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                           "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
                           "mlp.fc1": swapped ? "ffn_down" : "ffn_up", "mlp.fc2": swapped ? "ffn_up" : "ffn_down"]
            for (module, stored) in modules {
                for kind in ["weight", "bias"] { names["\(hf).\(module).\(kind)"] = .tensor("\(gguf).\(stored).\(kind)") }
            }
        }
        return names
    }
}

/// The parts a GGUF pair gives both LLaVA classes: the LLaVA config, the image encoder, the language model, and the
/// mmproj's weights under Hugging Face names.
private func llavaParts(languageModel: GGUFFile, mmproj: GGUFFile, projection: LlavaMMProjConfig) throws
    -> (config: LlavaConfig, encoder: LlavaImageEncoder, decoder: LlamaForCausalLM, weights: Weights) {
    let decoder = try LlamaForCausalLM(gguf: languageModel)
    guard projection.projectorWidth == decoder.config.hiddenSize else {
        throw CheckpointError.invalidGGUF(file: mmproj.url.path, tensor: "mm.2.weight",
                                          reason: "the projector's width \(projection.projectorWidth) is not the hidden size \(decoder.config.hiddenSize) of \(languageModel.url.lastPathComponent): not a pair")
    }
    guard let imageToken = languageModel.metadata["tokenizer.ggml.tokens"]?.array?.firstIndex(of: .string("<image>")) else {
        throw CheckpointError.invalidGGUF(file: languageModel.url.path, tensor: nil,
                                          reason: "tokenizer.ggml.tokens has no <image> token to stand for the image's features")
    }
    var config = try JSONDecoder().decode(LlavaConfig.self, from: Data("{}".utf8))
    config.visionConfig = projection.visionConfig
    config.textConfig = decoder.config
    config.imageTokenIndex = imageToken
    config.projectorHiddenAct = "gelu"
    config.visionFeatureLayers = projection.featureLayers
    config.visionFeatureSelectStrategy = "default"
    config.multimodalProjectorBias = projection.projectorBias
    let weights = Weights(WeightStore(gguf: mmproj, tensors: projection.tensorNames(mmproj)))
    let encoder = try LlavaImageEncoder(config: config, weights: weights, file: mmproj.url.path)
    return (config, encoder, decoder, weights)
}

extension LlavaForConditionalGeneration {
    /// LLaVA-1.5 from llama.cpp's GGUF pair: the language model from `languageModel` (``LlamaForCausalLM/init(gguf:)-(GGUFFile)``,
    /// quantized matrices kept as stored), the CLIP tower and projector from `mmproj` (see ``LlavaMMProjConfig``),
    /// read at its feature layers with the class token dropped, as llama.cpp's LLaVA projector does. The projector's
    /// activation is transformers' GELU (erf), LLaVA-1.5's `projector_hidden_act`, which the mmproj does not record
    /// (llama.cpp computes the tanh approximation). The image token is the language model's `<image>` token, as
    /// llava-hf's vocabularies have it.
    ///
    /// - Throws: `CheckpointError.invalidGGUF` naming the file for a non-mmproj file, missing metadata, a pair whose
    ///   projector width is not the language model's hidden size, a vocabulary without `<image>`, or a LLaVA-NeXT
    ///   mmproj (load that as ``LlavaNextForConditionalGeneration``).
    public convenience init(gguf languageModel: GGUFFile, mmproj: GGUFFile) throws {
        let projection = try LlavaMMProjConfig(mmproj)
        guard projection.imageGridPinpoints == nil else {
            throw CheckpointError.invalidGGUF(file: mmproj.url.path, tensor: nil,
                                              reason: "clip.vision.image_grid_pinpoints: a LLaVA-NeXT (anyres) mmproj, not LLaVA-1.5's")
        }
        let parts = try llavaParts(languageModel: languageModel, mmproj: mmproj, projection: projection)
        self.init(config: parts.config, encoder: parts.encoder, languageModel: parts.decoder)
    }
}

extension LlavaNextForConditionalGeneration {
    /// LLaVA-NeXT (1.6) from llama.cpp's GGUF pair: as ``LlavaForConditionalGeneration/init(gguf:mmproj:)``, with the
    /// mmproj's `clip.vision.image_grid_pinpoints` as `image_grid_pinpoints` and its `model.image_newline`.
    ///
    /// - Throws: as LLaVA-1.5's loader, and `CheckpointError.invalidGGUF` for an mmproj without pinpoints.
    public convenience init(gguf languageModel: GGUFFile, mmproj: GGUFFile) throws {
        let projection = try LlavaMMProjConfig(mmproj)
        guard let pinpoints = projection.imageGridPinpoints else {
            throw CheckpointError.invalidGGUF(file: mmproj.url.path, tensor: nil,
                                              reason: "clip.vision.image_grid_pinpoints is missing: a LLaVA-1.5 mmproj, not LLaVA-NeXT's")
        }
        let parts = try llavaParts(languageModel: languageModel, mmproj: mmproj, projection: projection)
        let tile = projection.visionConfig.imageSize
        guard pinpoints.allSatisfy({ $0.height % tile == 0 && $0.width % tile == 0 }) else {
            throw CheckpointError.invalidGGUF(file: mmproj.url.path, tensor: nil,
                                              reason: "clip.vision.image_grid_pinpoints must be multiples of clip.vision.image_size \(tile)")
        }
        var config = try JSONDecoder().decode(LlavaNextConfig.self, from: Data("{}".utf8))
        config.llava = parts.config
        config.imageGridPinpoints = pinpoints
        config.tieWordEmbeddings = parts.decoder.config.tieWordEmbeddings
        let newline = try parts.weights("image_newline", shape: [parts.decoder.config.hiddenSize])
        self.init(config: config, encoder: parts.encoder, imageNewline: newline, languageModel: parts.decoder)
    }
}
