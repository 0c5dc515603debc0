import Foundation
import VLMCheckpoint
import VLMTensor

// Gemma 3 image chat from llama.cpp's pair of GGUF files, as `llama-mtmd-cli -m LM.gguf --mmproj MMPROJ.gguf` runs
// them: the SigLIP tower and Gemma 3's projector from the mmproj (`clip.projector_type` "gemma3", as
// convert_hf_to_gguf.py --mmproj writes it), the text decoder from the other file as Gemma3.swift reads it. Both are
// read into the classes of Gemma3Multimodal.swift; nothing here computes anything of its own.

/// What a llama.cpp mmproj file says about Gemma 3's image side: the SigLIP tower's shape, the pooling to
/// `mm_tokens_per_image` rows, and the image normalization.
public struct Gemma3MMProjConfig: Sendable {
    /// The tower as transformers configures Gemma 3's (headless).
    public var visionConfig: SiglipVisionConfig
    /// Image rows per image: the patch grid pooled by `clip.vision.projector.scale_factor` (4, Gemma 3's, when absent).
    public var mmTokensPerImage: Int
    public var imageMean: [Double]
    public var imageStd: [Double]
    /// The projection's output width (`mm_input_projection_weight` is `[vision width, text width]`), which must be the
    /// text decoder's hidden size.
    public var projectorWidth: Int

    /// Whether `file` is an mmproj of Gemma 3's projector type (what ``init(_:)`` reads).
    public static func describes(_ file: GGUFFile) -> Bool {
        file.metadata["general.architecture"]?.string == "clip" && file.metadata["clip.projector_type"]?.string == "gemma3"
    }

    /// Reads the `clip.*` metadata of `file`.
    ///
    /// - Throws: `CheckpointError.invalidGGUF` naming the file when it is not a Gemma 3 mmproj, when a required key
    ///   is missing or malformed, or when the patch grid does not divide by the pooling factor.
    public init(_ file: GGUFFile) throws {
        let mmproj = try MMProjMetadata(file)
        guard let projectorType = file.metadata["clip.projector_type"]?.string else { throw mmproj.invalid("clip.projector_type is missing") }
        guard projectorType == "gemma3" else {
            throw mmproj.invalid("clip.projector_type is \"\(projectorType)\", not Gemma 3's \"gemma3\"")
        }
        // llama.cpp's ggml_gelu is the tanh approximation, SigLIP's gelu_pytorch_tanh.
        var vision = try mmproj.tower(JSONDecoder().decode(SiglipVisionConfig.self, from: Data("{}".utf8)), epsilon: 1e-6,
                                      gelu: "gelu_pytorch_tanh")
        vision.visionUseHead = false
        visionConfig = vision
        let kernel = file.metadata["clip.vision.projector.scale_factor"] == nil ? 4 : try mmproj.count("projector.scale_factor")
        let patches = vision.imageSize / vision.patchSize
        guard patches >= kernel, patches % kernel == 0 else {
            throw mmproj.invalid("clip.vision.projector.scale_factor \(kernel) does not divide the \(patches)×\(patches) patch grid")
        }
        mmTokensPerImage = (patches / kernel) * (patches / kernel)
        // Without them, SigLIP's 0.5, Gemma 3's image processor's.
        imageMean = try mmproj.channels("image_mean", default: [0.5, 0.5, 0.5])
        imageStd = try mmproj.channels("image_std", default: [0.5, 0.5, 0.5])
        guard let projection = file.info("mm.input_projection.weight"), projection.shape.count == 2 else {
            throw mmproj.invalid("mm.input_projection.weight (Gemma 3's projection) is missing or not a matrix")
        }
        projectorWidth = projection.shape[1]
    }

    /// Hugging Face name (as `Gemma3ForConditionalGeneration`'s modules have it) → the mmproj's tensor. The soft
    /// embedding norm is stored plus one (what Gemma's RMS norm multiplies by), and the one is taken off again, as
    /// transformers' GGUF loader does for the decoder's norms.
    func tensorNames(_ file: GGUFFile) throws -> [String: WeightStore.GGUFSource] {
        let tower = "model.vision_tower.vision_model"
        var names: [String: WeightStore.GGUFSource] = [
            "\(tower).embeddings.patch_embedding.weight": .tensor("v.patch_embd.weight"),
            "\(tower).embeddings.patch_embedding.bias": .tensor("v.patch_embd.bias"),
            "\(tower).embeddings.position_embedding.weight": .tensor("v.position_embd.weight"),
            "\(tower).post_layernorm.weight": .tensor("v.post_ln.weight"),
            "\(tower).post_layernorm.bias": .tensor("v.post_ln.bias"),
            "model.multi_modal_projector.mm_input_projection_weight": .tensor("mm.input_projection.weight"),
        ]
        let norm = try file.tensor("mm.soft_emb_norm.weight", shape: [visionConfig.hiddenSize])
        names["model.multi_modal_projector.mm_soft_emb_norm.weight"] = .value(
            Tensor(shape: norm.shape, scalars: norm.scalars.map { $0 - 1 }))
        let modules = ["self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                       "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
                       "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"]
        for layer in 0..<visionConfig.numHiddenLayers {
            for (module, stored) in modules {
                for kind in ["weight", "bias"] {
                    names["\(tower).encoder.layers.\(layer).\(module).\(kind)"] = .tensor("v.blk.\(layer).\(stored).\(kind)")
                }
            }
        }
        return names
    }
}

extension Gemma3ForConditionalGeneration {
    /// Gemma 3 image chat from llama.cpp's GGUF pair: the text decoder from `languageModel`
    /// (``Gemma3ForCausalLM/init(gguf:)``, quantized matrices kept as stored), the SigLIP tower and projector from
    /// `mmproj` (see ``Gemma3MMProjConfig``). The image markers are the language model's `<start_of_image>`,
    /// `<end_of_image>` and `<image_soft_token>` tokens, as Gemma 3's vocabularies have them.
    ///
    /// - Throws: `CheckpointError.invalidGGUF` naming the file for a non-Gemma 3 mmproj, missing metadata, a pair
    ///   whose projection width is not the decoder's hidden size, or a vocabulary without the image markers.
    public convenience init(gguf languageModel: GGUFFile, mmproj: GGUFFile) throws {
        let projection = try Gemma3MMProjConfig(mmproj)
        let decoder = try Gemma3ForCausalLM(gguf: languageModel)
        guard projection.projectorWidth == decoder.config.hiddenSize else {
            throw CheckpointError.invalidGGUF(file: mmproj.url.path, tensor: "mm.input_projection.weight",
                                              reason: "the projection's width \(projection.projectorWidth) is not the hidden size \(decoder.config.hiddenSize) of \(languageModel.url.lastPathComponent): not a pair")
        }
        let tokens = languageModel.metadata["tokenizer.ggml.tokens"]?.array ?? []
        func marker(_ text: String) throws -> Int {
            guard let id = tokens.firstIndex(of: .string(text)) else {
                throw CheckpointError.invalidGGUF(file: languageModel.url.path, tensor: nil,
                                                  reason: "tokenizer.ggml.tokens has no \(text) token, which Gemma 3's images need")
            }
            return id
        }
        var config = try JSONDecoder().decode(Gemma3Config.self, from: Data("{}".utf8))
        config.visionConfig = projection.visionConfig
        config.textConfig = decoder.config
        config.tieWordEmbeddings = decoder.config.tieWordEmbeddings
        config.mmTokensPerImage = projection.mmTokensPerImage
        (config.boiTokenIndex, config.eoiTokenIndex, config.imageTokenIndex) =
            (try marker("<start_of_image>"), try marker("<end_of_image>"), try marker("<image_soft_token>"))
        let weights = Weights(WeightStore(gguf: mmproj, tensors: try projection.tensorNames(mmproj)))
        try self.init(config: config, imageWeights: weights, languageModel: decoder, file: mmproj.url.path)
    }
}
