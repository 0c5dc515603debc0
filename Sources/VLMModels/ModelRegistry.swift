import VLMCheckpoint
import VLMImages
import VLMTensor

/// A model with an image tower and a text tower embedding into one space (CLIP, SigLIP, SigLIP 2).
public protocol ImageTextDualEncoder: AnyObject, Sendable {
    /// Projected image embeddings [B, embeddingSize] for its image processor's output (pixel values [B, C, S, S];
    /// SigLIP 2: flattened patches with their mask and grids).
    func imageFeatures(_ images: ProcessedImages) throws -> Tensor
    /// Projected text embeddings [B, embeddingSize] for padded token ids and their attention mask.
    func textFeatures(inputIds: [[Int]], attentionMask: [[Int]]?) throws -> Tensor
    /// Image–text logits [images, texts], as the model's forward returns them in `logits_per_image`.
    func logitsPerImage(imageFeatures: Tensor, textFeatures: Tensor) -> Tensor
    /// The zero-shot-image-classification pipeline's scores for `logitsPerImage` [images, labels], each image's row
    /// over the candidate labels.
    func labelProbabilities(logitsPerImage: Tensor) -> Tensor
    /// The loss the model's forward returns with `return_loss=True` for `logitsPerImage` [N, N] of N pairs, image i
    /// described by text i: CLIP's symmetric cross-entropy, SigLIP's sigmoid loss.
    ///
    /// - Throws: `ModelError.invalidInput` unless the logits are square.
    func contrastiveLoss(logitsPerImage: Tensor) throws -> Float
    /// How the texts of a batch are padded for the text tower.
    var textPadding: DualEncoderTextPadding { get }
    var embeddingSize: Int { get }
}

/// How a dual encoder's texts are tokenized into a batch, as its processor and transformers' zero-shot pipeline do.
public enum DualEncoderTextPadding: Sendable, Equatable {
    /// To the longest text of the batch, longer texts truncated to the tokenizer's `model_max_length` (CLIP:
    /// `padding=True, truncation=True`); the pooled token's position comes from the ids.
    case longest
    /// Every text to the same length (SigLIP: `padding="max_length"`), since the model pools a fixed position: the
    /// tokenizer's `model_max_length` for embeddings, as the processor pads, and `zeroShotLength` in the zero-shot
    /// pipeline, which passes `max_length` itself. A longer text is refused: the processor passes it on (and the text
    /// tower fails) while the pipeline cuts it short, so either way it is not the text the caller asked about.
    case maxLength(zeroShotLength: Int)
    /// Every text to `length` tokens, embeddings and zero-shot prompts alike (SigLIP 2, whose processor passes
    /// `max_length=64` itself); a longer text is refused, as for `maxLength`.
    case fixed(length: Int)
}

/// What a model can be asked to do. Each task is what one or more `vlm` commands run.
public enum ModelTask: String, Sendable, CaseIterable {
    /// Zero-shot image classification.
    case classify
    /// Image and text embeddings.
    case embed
    /// Text generation from a prompt.
    case generate
    /// A multi-turn conversation (about an image, for image-to-text models).
    case chat
    /// Image captioning, with or without a prompt.
    case caption
    /// Visual question answering.
    case ask
    /// Image–text matching: how well each text describes each image.
    case match
    /// Zero-shot segmentation.
    case segment
    /// Open-vocabulary detection.
    case detect

    /// The `vlm` command that runs this task.
    public var command: String { rawValue }
}

/// How a registered family's model is built: the kind of model decides what can drive it.
public enum ModelBuilder: Sendable {
    case imageTextDualEncoder(@Sendable (ModelDirectory) throws -> any ImageTextDualEncoder)
    case causalLanguageModel(@Sendable (ModelDirectory) throws -> any CausalLanguageModel)
    case imageToText(@Sendable (ModelDirectory) throws -> any ImageToTextModel)
    case imageTextMatching(@Sendable (ModelDirectory) throws -> any ImageTextMatchingModel)
    case visualQuestionClassifier(@Sendable (ModelDirectory) throws -> any VisualQuestionClassifier)
    case zeroShotSegmentation(@Sendable (ModelDirectory) throws -> any ZeroShotSegmentationModel)
    case zeroShotObjectDetection(@Sendable (ModelDirectory) throws -> any ZeroShotObjectDetectionModel)
}

/// One model family as checkpoints name it: the config.json `model_type`s (and, where one type covers several
/// heads, the `architectures`) it loads, the tasks it serves, and how to build it.
public struct ModelFamily: Sendable {
    /// The family's name in messages, e.g. "CLIP".
    public let name: String
    public let modelTypes: [String]
    /// nil: any architecture of these model types; else only checkpoints whose `architectures[0]` is listed.
    public let architectures: [String]?
    public let tasks: [ModelTask]
    public let builder: ModelBuilder
    /// The image–text dual encoder inside a checkpoint built as another kind of model (CLIPSeg's CLIP), which
    /// transformers' zero-shot-image-classification pipeline and feature methods load from it.
    public let dualEncoder: (@Sendable (ModelDirectory) throws -> any ImageTextDualEncoder)?

    public init(_ name: String, modelTypes: [String], architectures: [String]? = nil, tasks: [ModelTask],
                builder: ModelBuilder, dualEncoder: (@Sendable (ModelDirectory) throws -> any ImageTextDualEncoder)? = nil) {
        self.name = name
        self.modelTypes = modelTypes
        self.architectures = architectures
        self.tasks = tasks
        self.builder = builder
        self.dualEncoder = dualEncoder
    }

    /// How the family's model for `task` is built: its dual encoder for classify, embed and match where it has one
    /// beside its own kind of model, else ``builder``.
    public func builder(for task: ModelTask) -> ModelBuilder {
        if let dualEncoder, [.classify, .embed, .match].contains(task) { return .imageTextDualEncoder(dualEncoder) }
        return builder
    }

    /// The `vlm` commands this family's tasks run.
    public var commands: [String] { tasks.map(\.command) }
}

/// The model families SwiftVLM loads, chosen from a checkpoint's config.json like transformers' `Auto*` classes.
/// A new family is one line here (and its model file).
public enum ModelRegistry {
    public static let families: [ModelFamily] = [
        ModelFamily("CLIP", modelTypes: ["clip"], tasks: [.classify, .embed, .match],
                    builder: .imageTextDualEncoder { try CLIPModel(directory: $0) }),
        ModelFamily("SigLIP", modelTypes: ["siglip"], tasks: [.classify, .embed, .match],
                    builder: .imageTextDualEncoder { try SiglipModel(directory: $0) }),
        ModelFamily("SigLIP 2", modelTypes: ["siglip2"], tasks: [.classify, .embed, .match],
                    builder: .imageTextDualEncoder { try Siglip2Model(directory: $0) }),
        ModelFamily("CLIPSeg", modelTypes: ["clipseg"], tasks: [.segment, .classify, .embed, .match],
                    builder: .zeroShotSegmentation { try CLIPSegForImageSegmentation(directory: $0) },
                    dualEncoder: { try CLIPSegForImageSegmentation.clipModel(directory: $0) }),
        ModelFamily("OWL-ViT", modelTypes: ["owlvit", "owlv2"], tasks: [.detect],
                    builder: .zeroShotObjectDetection { try OwlViTForObjectDetection(directory: $0) }),
        ModelFamily("GroupViT", modelTypes: ["groupvit"], tasks: [.segment],
                    builder: .zeroShotSegmentation { try GroupViTModel(directory: $0) }),
        ModelFamily("Llama", modelTypes: LlamaConfig.supportedModelTypes, tasks: [.generate, .chat],
                    builder: .causalLanguageModel { try LlamaForCausalLM(directory: $0) }),
        ModelFamily("Gemma 3", modelTypes: [Gemma3TextConfig.modelType], tasks: [.generate, .chat],
                    builder: .causalLanguageModel { try Gemma3ForCausalLM(directory: $0) }),
        ModelFamily("OPT", modelTypes: ["opt"], tasks: [.generate, .chat],
                    builder: .causalLanguageModel { try OPTForCausalLM(directory: $0) }),
        ModelFamily("GPT-2", modelTypes: ["gpt2"], tasks: [.generate, .chat],
                    builder: .causalLanguageModel { try GPT2LMHeadModel(directory: $0) }),
        ModelFamily("BLIP-2", modelTypes: ["blip-2"], architectures: ["Blip2ForConditionalGeneration"],
                    tasks: [.caption, .ask, .chat],
                    builder: .imageToText { try Blip2ForConditionalGeneration(directory: $0) }),
        // LLaVA chats through its chat template with image parts (`vlm generate --chat`, `vlm chat`).
        ModelFamily("LLaVA", modelTypes: ["llava"], tasks: [.caption, .ask, .generate, .chat],
                    builder: .imageToText { try LlavaForConditionalGeneration(directory: $0) }),
        ModelFamily("LLaVA-NeXT", modelTypes: ["llava_next"], tasks: [.caption, .ask, .generate, .chat],
                    builder: .imageToText { try LlavaNextForConditionalGeneration(directory: $0) }),
        ModelFamily("LLaVA-OneVision", modelTypes: ["llava_onevision"], tasks: [.caption, .ask, .generate, .chat],
                    builder: .imageToText { try LlavaOnevisionForConditionalGeneration(directory: $0) }),
        ModelFamily("Gemma 3 image chat", modelTypes: ["gemma3"], tasks: [.caption, .ask, .generate, .chat],
                    builder: .imageToText { try Gemma3ForConditionalGeneration(directory: $0) }),
        ModelFamily("BLIP captioning", modelTypes: ["blip"], architectures: ["BlipForConditionalGeneration"],
                    tasks: [.caption], builder: .imageToText { try BlipForConditionalGeneration(directory: $0) }),
        ModelFamily("BLIP question answering", modelTypes: ["blip"], architectures: ["BlipForQuestionAnswering"],
                    tasks: [.ask], builder: .imageToText { try BlipForQuestionAnswering(directory: $0) }),
        ModelFamily("ViLT", modelTypes: ["vilt"], tasks: [.ask],
                    builder: .visualQuestionClassifier { try ViltForQuestionAnswering(directory: $0) }),
        ModelFamily("BLIP retrieval", modelTypes: ["blip"], architectures: ["BlipForImageTextRetrieval"],
                    tasks: [.match], builder: .imageTextMatching { try BlipForImageTextRetrieval(directory: $0) }),
        ModelFamily("BLIP-2 retrieval", modelTypes: ["blip-2"], architectures: ["Blip2ForImageTextRetrieval"],
                    tasks: [.match], builder: .imageTextMatching { try Blip2ForImageTextRetrieval(directory: $0) }),
    ]

    /// The model types of the families that serve `task`, sorted.
    public static func modelTypes(serving task: ModelTask) -> [String] {
        families.filter { $0.tasks.contains(task) }.flatMap(\.modelTypes).sorted()
    }

    /// The family of a checkpoint: by config.json's `model_type`, then by `architectures[0]` where families share a
    /// model type.
    ///
    /// - Throws: `ModelError.unsupportedModelType` naming config.json and every supported type; the directory's
    ///   errors for a missing or broken config.json.
    public static func family(of directory: ModelDirectory) throws -> ModelFamily {
        let type = try directory.modelType
        let candidates = families.filter { $0.modelTypes.contains(type) }
        let configFile = directory.url.appendingPathComponent("config.json").path
        guard !candidates.isEmpty else {
            throw ModelError.unsupportedModelType(type, supported: families.flatMap(\.modelTypes).sorted(), file: configFile)
        }
        if candidates.count == 1 && candidates[0].architectures == nil { return candidates[0] }
        let architecture = (try directory.jsonObject("config.json")?["architectures"] as? [String])?.first
        if let match = candidates.first(where: { family in
            family.architectures.map { names in architecture.map(names.contains) ?? false } ?? true
        }) {
            return match
        }
        throw ModelError.invalidConfig(
            "architectures \(architecture.map { "\"\($0)\"" } ?? "(none)") of model_type \"\(type)\" is not supported here (supported: \(candidates.compactMap(\.architectures).joined().joined(separator: ", ")))",
            file: configFile)
    }

    /// The family of `directory` when it serves `task`.
    ///
    /// - Throws: `ModelError.unsupportedModelType` listing the model types that serve `task` when no family knows the
    ///   checkpoint; `ModelError.wrongTask` naming the commands the family does support when it does not serve `task`.
    public static func family(of directory: ModelDirectory, for task: ModelTask) throws -> ModelFamily {
        let family: ModelFamily
        do {
            family = try self.family(of: directory)
        } catch ModelError.unsupportedModelType(let type, _, let file) {
            throw ModelError.unsupportedModelType(type, supported: modelTypes(serving: task), file: file)
        }
        guard family.tasks.contains(task) else {
            throw ModelError.wrongTask(task, family: family.name, modelType: try directory.modelType,
                                       supportedCommands: family.commands,
                                       file: directory.url.appendingPathComponent("config.json").path)
        }
        return family
    }

    /// The image–text dual encoder in `directory`, for `task`; see ``family(of:for:)`` for the errors.
    public static func dualEncoder(_ directory: ModelDirectory, for task: ModelTask) throws -> any ImageTextDualEncoder {
        guard case .imageTextDualEncoder(let build) = try family(of: directory, for: task).builder(for: task) else {
            throw ModelError.invalidConfig("\(task.rawValue) needs an image–text model", file: directory.url.path)
        }
        return try loaded { try build(directory) }
    }

    /// The decoder-only language model in `directory` (a ``LlamaForCausalLM`` for llama, mistral, qwen2, qwen3 and smollm3, a ``Gemma3ForCausalLM`` for gemma3_text, an
    /// ``OPTForCausalLM`` for opt, a ``GPT2LMHeadModel`` for gpt2); see ``family(of:for:)`` for the errors.
    public static func causalLanguageModel(_ directory: ModelDirectory, for task: ModelTask = .generate) throws -> any CausalLanguageModel {
        guard case .causalLanguageModel(let build) = try family(of: directory, for: task).builder else {
            throw ModelError.invalidConfig("\(task.rawValue) needs a language model", file: directory.url.path)
        }
        return try loaded { try build(directory) }
    }

    /// The image–text matching model in `directory`; see ``family(of:for:)`` for the errors.
    public static func imageTextMatchingModel(_ directory: ModelDirectory) throws -> any ImageTextMatchingModel {
        guard case .imageTextMatching(let build) = try family(of: directory, for: .match).builder else {
            throw ModelError.invalidConfig("match needs an image–text matching model", file: directory.url.path)
        }
        return try loaded { try build(directory) }
    }

    /// The zero-shot segmentation model in `directory` (a ``CLIPSegForImageSegmentation`` for clipseg); see
    /// ``family(of:for:)`` for the errors.
    public static func zeroShotSegmentationModel(_ directory: ModelDirectory) throws -> any ZeroShotSegmentationModel {
        guard case .zeroShotSegmentation(let build) = try family(of: directory, for: .segment).builder else {
            throw ModelError.invalidConfig("segment needs a zero-shot segmentation model", file: directory.url.path)
        }
        return try loaded { try build(directory) }
    }

    /// The zero-shot object detection model in `directory` (an ``OwlViTForObjectDetection`` for owlvit and owlv2);
    /// see ``family(of:for:)`` for the errors.
    public static func zeroShotObjectDetectionModel(_ directory: ModelDirectory) throws -> any ZeroShotObjectDetectionModel {
        guard case .zeroShotObjectDetection(let build) = try family(of: directory, for: .detect).builder else {
            throw ModelError.invalidConfig("detect needs a zero-shot object detection model", file: directory.url.path)
        }
        return try loaded { try build(directory) }
    }

    /// The image-to-text model in `directory`, for `task` (caption, ask, chat); see ``family(of:for:)`` for the
    /// errors.
    public static func imageToTextModel(_ directory: ModelDirectory, for task: ModelTask) throws -> any ImageToTextModel {
        guard case .imageToText(let build) = try family(of: directory, for: task).builder else {
            throw ModelError.invalidConfig("\(task.rawValue) needs an image-to-text model", file: directory.url.path)
        }
        return try loaded { try build(directory) }
    }
}

extension ModelRegistry {
    /// `build()`, then the loading thread's OpenMP workers ended: loading packs weights on them, and the loading thread
    /// is seldom the one that runs the model, whose own workers its idle ones would slow (see releaseParallelWorkers).
    static func loaded<Model>(_ build: () throws -> Model) rethrows -> Model {
        defer { releaseParallelWorkers() }
        return try build()
    }
}

extension ModelRegistry {
    /// The `general.architecture`s of llama.cpp GGUF files whose language models load.
    public static let ggufLanguageModelArchitectures = LlamaConfig.ggufArchitectures + ["gemma3"]

    /// The language model a llama.cpp GGUF file holds, by its `general.architecture` (a ``Gemma3ForCausalLM`` for
    /// gemma3, a ``LlamaForCausalLM`` for the others), with the token ids generation starts and stops with (the latter as
    /// llama.cpp ends generation: ``GGUFFile/endOfGenerationIds(eos:)``).
    public static func causalLanguageModel(gguf file: GGUFFile) throws
        -> (model: any CausalLanguageModel, bosTokenId: Int?, eosTokenIds: [Int]) {
        if file.metadata["general.architecture"]?.string == "gemma3" {
            let model = try loaded { try Gemma3ForCausalLM(gguf: file) }
            return (model, model.config.bosTokenId, file.endOfGenerationIds(eos: model.config.eosTokenIds))
        }
        let model = try loaded { try LlamaForCausalLM(gguf: file) }
        return (model, model.config.bosTokenId, file.endOfGenerationIds(eos: model.config.eosTokenIds))
    }
}
