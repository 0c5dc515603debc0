import ArgumentParser
import Foundation
import SwiftVLM

struct Train: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Train a checkpoint with one of transformers' training recipes.",
        subcommands: [ContrastiveTrainingCommand.self, LockedImageTextTuningCommand.self, ProjectorAlignmentCommand.self, InstructionTuningCommand.self])
}

/// What every training command takes: the data, where the result goes, and transformers' TrainingArguments for the
/// optimizer, schedule and loop, with its defaults.
struct TrainingOptions: ParsableArguments {
    @Option(help: "The dataset: an imagefolder directory (images and a metadata.jsonl or metadata.csv), or for a language model's sft a JSON-lines file.")
    var data: String

    @Option(help: "A dataset (the same layout) whose loss is reported after training, as Trainer's evaluate reports eval_loss.")
    var evalData: String?

    @Option(help: "Where to write the trained checkpoint (a directory).")
    var out: String

    @Flag(help: "Write into --out even if it holds a checkpoint already.")
    var force = false

    @Option(help: "Examples per step.")
    var batchSize = 8

    @Option(help: "Batches whose gradients each optimizer step sums (the effective batch is this times --batch-size).")
    var gradientAccumulationSteps = 1

    @Option(help: "Passes over the data.")
    var epochs = 3

    @Option(help: "Steps to take, whatever --epochs says.")
    var maxSteps: Int?

    @Option(help: "The peak learning rate.")
    var learningRate: Float = 5e-5

    @Option(help: "AdamW's decoupled weight decay.")
    var weightDecay: Float = 0

    @Option(help: "Steps over which the learning rate rises from 0.")
    var warmupSteps = 0

    @Option(help: "Also write a checkpoint every this many steps, and after the last, to --out/checkpoint-STEP: the model, the learning parameters with AdamW's moments (training_state.safetensors) and trainer_state.json.")
    var saveSteps: Int?

    @Option(help: "Continue the run that wrote this checkpoint-STEP directory (--save-steps), with the same data and settings: its steps are skipped, its parameters and optimizer state taken up.")
    var resumeFromCheckpoint: String?

    @Option(help: "Clip the gradients' global norm to this (0: no clipping).")
    var maxGradNorm: Float = 1

    @Option(help: "The seed of each epoch's order of the examples (and of LoRA's initial updates).")
    var seed: UInt64 = 42

    @Flag(help: "Keep the examples in the dataset's order.")
    var noShuffle = false

    @Flag(help: "Print the log and the run's times as JSON at the end instead of a line per step.")
    var json = false

    func validate() throws {
        guard batchSize > 0 else { throw ValidationError("--batch-size must be positive") }
        guard gradientAccumulationSteps > 0 else { throw ValidationError("--gradient-accumulation-steps must be positive") }
        guard epochs > 0 else { throw ValidationError("--epochs must be positive") }
        if let maxSteps, maxSteps <= 0 { throw ValidationError("--max-steps must be positive") }
        if let saveSteps, saveSteps <= 0 { throw ValidationError("--save-steps must be positive") }
        guard learningRate >= 0, weightDecay >= 0, maxGradNorm >= 0, warmupSteps >= 0 else {
            throw ValidationError("--learning-rate, --weight-decay, --max-grad-norm and --warmup-steps must not be negative")
        }
    }

    var settings: TrainingSettings {
        var settings = TrainingSettings()
        settings.batchSize = batchSize
        settings.gradientAccumulationSteps = gradientAccumulationSteps
        settings.epochs = epochs
        settings.maxSteps = maxSteps
        settings.learningRate = learningRate
        settings.weightDecay = weightDecay
        settings.warmupSteps = warmupSteps
        settings.maxGradientNorm = maxGradNorm > 0 ? maxGradNorm : nil
        settings.shuffleSeed = noShuffle ? nil : seed
        return settings
    }

    /// The training dataset and the evaluation one (nil without --eval-data), each read by `read`, after refusing an
    /// --out that holds a checkpoint unless --force: every input checked before a model is loaded.
    func datasets<Dataset>(_ read: (URL) throws -> Dataset) throws -> (training: Dataset, evaluation: Dataset?) {
        let existing = URL(fileURLWithPath: out).appendingPathComponent("config.json")
        if !force, FileManager.default.fileExists(atPath: existing.path) {
            throw TrainError.exists(existing.path)
        }
        return (try read(URL(fileURLWithPath: data)), try evalData.map { try read(URL(fileURLWithPath: $0)) })
    }

    /// Runs `train` over `examples` examples with a line per step (unless --json) and the checkpoints --save-steps
    /// and --resume-from-checkpoint ask for, saves with `save`, reports `evaluate`'s loss when there is an evaluation
    /// dataset, then prints the run.
    func run(examples: Int, _ train: (TrainingCheckpoints, (TrainingLogEntry) throws -> Void) throws -> TrainingRun,
             save: @escaping (URL) throws -> Void, evaluate: (() throws -> Float)?) throws {
        let totalSteps = settings.totalSteps(examples: examples)
        let checkpoints = TrainingCheckpoints(directory: URL(fileURLWithPath: out), saveSteps: saveSteps,
                                              resumeFrom: resumeFromCheckpoint.map { URL(fileURLWithPath: $0) }, saveModel: save)
        let run = try train(checkpoints) { entry in
            guard !json else { return }
            print("step \(entry.step)/\(totalSteps)  epoch \(String(format: "%.2f", entry.epoch))  loss \(formatted(entry.loss))  grad_norm \(formatted(entry.gradientNorm))  learning_rate \(String(format: "%.3g", Double(entry.learningRate)))")
        }
        try save(URL(fileURLWithPath: out))
        let evaluationLoss = try evaluate?()
        if json {
            try printJSON(Summary(
                log_history: run.history,
                train_runtime: run.runtime, train_samples_per_second: run.samplesPerSecond,
                train_steps_per_second: run.stepsPerSecond, image_encoding_runtime: run.imageEncodingTime,
                eval_loss: evaluationLoss))
        } else {
            if let evaluationLoss { print("eval_loss \(formatted(evaluationLoss))") }
            let images = run.imageEncodingTime > 0 ? "; images encoded in \(String(format: "%.3f", run.imageEncodingTime)) s" : ""
            print("train_runtime \(String(format: "%.3f", run.runtime)) s (\(String(format: "%.2f", run.stepsPerSecond)) steps/s, \(String(format: "%.1f", run.samplesPerSecond)) samples/s)\(images)")
            print("wrote \(out)")
        }
    }

    /// Trainer's `log_history` and closing metrics.
    private struct Summary: Encodable {
        let log_history: [TrainingLogEntry]
        let train_runtime: Double
        let train_samples_per_second: Double
        let train_steps_per_second: Double
        let image_encoding_runtime: Double
        let eval_loss: Float?
    }
}

struct ContrastiveTrainingCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "clip",
        abstract: "Contrastive training of a CLIP, SigLIP or SigLIP 2 checkpoint on image-text pairs: both towers, their projections and the temperature learn.",
        discussion: """
            As transformers' run_clip.py example trains a dual encoder. The data is an imagefolder directory as for \
            `vlm train lit`. Each batch's images go through the checkpoint's image processor and image tower, its \
            captions through the tokenizer (padded as the model's processor pads them) and text tower, and the \
            model's contrastive loss (CLIP's softmax loss, SigLIP's sigmoid loss) trains every weight by AdamW as \
            transformers' Trainer steps it; the defaults are TrainingArguments'. --freeze-vision-model or \
            --freeze-text-model leave that tower as it is (its projection still learns), as run_clip.py's flags do. \
            The trained checkpoint (config, fp32 weights, tokenizer and \
            preprocessor files) is written to --out.
            """)

    @OptionGroup var options: ModelOption
    @OptionGroup var training: TrainingOptions

    @Option(help: "The metadata column holding each image's caption.")
    var textColumn = "text"

    @Flag(help: "Leave the image tower (vision_model) as it is: each image is encoded once.")
    var freezeVisionModel = false

    @Flag(help: "Leave the text tower (text_model) as it is.")
    var freezeTextModel = false

    func run() async throws {
        let frozen = Set<ImageTextContrastiveTraining.Module>((freezeVisionModel ? [.visionModel] : []) + (freezeTextModel ? [.textModel] : []))
        try await training.runContrastive(model: options, textColumn: textColumn, frozen: frozen)
    }
}

extension TrainingOptions {
    /// `vlm train clip` and `vlm train lit`: contrastive training on an imagefolder dataset, `frozen` left as they are.
    func runContrastive(model: ModelOption, textColumn: String, frozen: Set<ImageTextContrastiveTraining.Module>) async throws {
        let datasets = try datasets { try ImageTextDataset(directory: $0, textColumn: textColumn) }
        let pipeline = try ContrastiveTrainingPipeline(directory: try await model.trainableCheckpoint(), frozen: frozen)
        try run(examples: datasets.training.pairs.count,
                { try pipeline.train(datasets.training, settings: settings, checkpoints: $0, log: $1) }, save: pipeline.save,
                evaluate: datasets.evaluation.map { evaluation in { try pipeline.loss(on: evaluation, batchSize: batchSize) } })
    }
}

struct LockedImageTextTuningCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lit",
        abstract: "Locked-image text tuning: train a CLIP, SigLIP or SigLIP 2 checkpoint's text side on image-text pairs, its image tower frozen.",
        discussion: """
            The data is a directory laid out as datasets' imagefolder: the images and a metadata.jsonl (or \
            metadata.csv) whose file_name column names each image and whose text column holds its caption. The \
            text transformer, its projection and the logit scale (and SigLIP's logit bias) are trained by the model's \
            contrastive loss (CLIP's softmax loss, SigLIP's sigmoid loss) with AdamW as \
            transformers' Trainer does it (weight decay on all but biases and LayerNorm parameters, gradients clipped \
            to --max-grad-norm, linear schedule after --warmup-steps); the defaults are TrainingArguments'. The tuned \
            checkpoint (config, fp32 weights, tokenizer and preprocessor files) is written to --out.
            """)

    @OptionGroup var options: ModelOption
    @OptionGroup var training: TrainingOptions

    @Option(help: "The metadata column holding each image's caption.")
    var textColumn = "text"

    func run() async throws {
        try await training.runContrastive(model: options, textColumn: textColumn, frozen: ImageTextContrastiveTraining.lockedImage)
    }
}

struct ProjectorAlignmentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "projector",
        abstract: "Projector alignment: train a LLaVA checkpoint's multimodal projector on image-caption pairs, the vision tower and language model frozen.",
        discussion: """
            LLaVA's first training stage. The data is an imagefolder directory as for `vlm train lit`. Each pair \
            becomes a conversation rendered through the checkpoint's chat template (a user turn holding the image, \
            and --instruction when given; the caption as the assistant's reply), tokenized as transformers' \
            processor does, and only the reply's tokens are scored by the language model. Only the projector learns, \
            by AdamW as transformers' Trainer steps it; the defaults are TrainingArguments'. The aligned checkpoint \
            (config, fp32 weights, processor, tokenizer and chat template files) is written to --out.
            """)

    @OptionGroup var options: ModelOption
    @OptionGroup var training: TrainingOptions

    @Option(help: "The metadata column holding each image's caption.")
    var textColumn = "text"

    @Option(help: "The user turn's text beside the image (none by default: the image alone).")
    var instruction: String?

    func run() async throws {
        let datasets = try training.datasets { try ImageTextDataset(directory: $0, textColumn: textColumn) }
        let pipeline = try LlavaTrainingPipeline(directory: try await options.trainableCheckpoint(), stage: .projectorAlignment)
        try training.run(examples: datasets.training.pairs.count,
                         { try pipeline.train(.captions(datasets.training, instruction: instruction), settings: training.settings, checkpoints: $0, log: $1) },
                         save: { try pipeline.save(to: $0) },
                         evaluate: datasets.evaluation.map { evaluation in
                             { try pipeline.loss(on: .captions(evaluation, instruction: instruction), batchSize: training.batchSize) }
                         })
    }
}

struct InstructionTuningCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sft",
        abstract: "Supervised fine-tuning on conversations, the loss on the assistant's replies: a LLaVA checkpoint's projector and language model on image conversations, or a chat language model on text ones.",
        discussion: """
            As TRL's SFTTrainer runs it with assistant_only_loss. For a LLaVA checkpoint (its second training stage, \
            visual instruction tuning) the data is an imagefolder directory whose metadata.jsonl gives each row a \
            file_name and a messages column: a conversation in the chat format ({"role": "user", "content": \
            [{"type": "image"}, {"type": "text", "text": "..."}]}, then the assistant's reply, and so on), with one \
            image part for the row's image; the multimodal projector and every language-model weight learn, the \
            vision tower stays frozen. For a Llama, Mistral, Qwen2, Qwen3 or SmolLM3 checkpoint the data is a JSON-lines file whose \
            messages column holds text conversations; every weight learns. Each conversation is rendered through the \
            checkpoint's chat template and tokenized as transformers does; the loss scores the tokens the template's \
            {% generation %} blocks mark (the assistant's replies), or with --all-tokens every token but the padding \
            and the image tokens (TRL's default, for templates without generation blocks). AdamW steps as \
            transformers' Trainer steps it (the defaults are TrainingArguments'). The tuned checkpoint (config, fp32 \
            weights, processor, tokenizer and chat template files) is written to --out. With --lora-rank only LoRA's \
            updates of the language model learn, as PEFT's get_peft_model sets them up (and for LLaVA the projector), \
            and --out gets the adapter as PEFT saves it, or with --merge-lora the model with the updates merged in.
            """)

    @OptionGroup var options: ModelOption
    @OptionGroup var training: TrainingOptions

    @Option(help: "The column holding each row's conversation.")
    var messagesColumn = "messages"

    @Flag(help: "Score every token but the padding (and image tokens), as TRL does by default, instead of the replies the template's generation blocks mark.")
    var allTokens = false

    @Option(help: "Train LoRA updates of the language model of this rank instead of its weights, writing a PEFT adapter.")
    var loraRank: Int?

    @Option(help: "LoRA's alpha: the updates are scaled by alpha / rank.")
    var loraAlpha: Float = 8

    @Option(help: "The projections that get LoRA updates (of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).")
    var loraTargetModules = "q_proj,v_proj"

    @Flag(help: "Write the model with the LoRA updates merged into its weights instead of the adapter.")
    var mergeLora = false

    func validate() throws {
        if let loraRank, loraRank <= 0 { throw ValidationError("--lora-rank must be positive") }
        guard loraAlpha > 0 else { throw ValidationError("--lora-alpha must be positive") }
        if mergeLora && loraRank == nil { throw ValidationError("--merge-lora goes with --lora-rank") }
        let modules = loraTargetModules.split(separator: ",").map(String.init)
        guard !modules.isEmpty, modules.allSatisfy(LoraSettings.modules.contains) else {
            throw ValidationError("--lora-target-modules takes names among \(LoraSettings.modules.joined(separator: ", ")), got \(loraTargetModules)")
        }
    }

    func run() async throws {
        let directory = try await options.trainableCheckpoint()
        let type = try ModelDirectory(url: directory).modelType
        var lora: LoraSettings?
        if let loraRank {
            var settings = LoraSettings()
            (settings.rank, settings.alpha) = (loraRank, loraAlpha)
            settings.targetModules = loraTargetModules.split(separator: ",").map(String.init)
            settings.seed = training.seed
            lora = settings
        }
        if LlavaVisionEncoder.modelTypes.contains(type) {
            let datasets = try training.datasets { try ImageConversationDataset(directory: $0, messagesColumn: messagesColumn) }
            let pipeline = try LlavaTrainingPipeline(directory: directory, stage: .instructionTuning, lora: lora)
            try training.run(examples: datasets.training.conversations.count,
                             { try pipeline.train(.conversations(datasets.training, assistantOnly: !allTokens), settings: training.settings, checkpoints: $0, log: $1) },
                             save: { try pipeline.save(to: $0, mergingLora: mergeLora) },
                             evaluate: datasets.evaluation.map { evaluation in
                                 { try pipeline.loss(on: .conversations(evaluation, assistantOnly: !allTokens), batchSize: training.batchSize) }
                             })
        } else if LlamaConfig.supportedModelTypes.contains(type) {
            let datasets = try training.datasets { try ConversationDataset(file: $0, messagesColumn: messagesColumn) }
            let pipeline = try SupervisedFineTuningPipeline(directory: directory, lora: lora)
            try training.run(examples: datasets.training.conversations.count,
                             { try pipeline.train(datasets.training, assistantOnly: !allTokens, settings: training.settings, checkpoints: $0, log: $1) },
                             save: { try pipeline.save(to: $0, mergingLora: mergeLora) },
                             evaluate: datasets.evaluation.map { evaluation in
                                 { try pipeline.loss(on: evaluation, assistantOnly: !allTokens, batchSize: training.batchSize) }
                             })
        } else {
            throw ModelError.unsupportedModelType(type, supported: LlavaVisionEncoder.modelTypes + LlamaConfig.supportedModelTypes,
                                                  file: directory.appendingPathComponent("config.json").path)
        }
    }
}

extension ModelOption {
    /// The checkpoint directory a training command reads; a GGUF file (quantized, for inference) is refused by name.
    func trainableCheckpoint() async throws -> URL {
        let url = try await directory()
        guard url.pathExtension.lowercased() != "gguf" else { throw TrainError.gguf(url.path) }
        return url
    }
}

enum TrainError: Error, CustomStringConvertible {
    case exists(String)
    case gguf(String)

    var description: String {
        switch self {
        case .exists(let path): "\(path) exists; pass --force to overwrite the checkpoint there"
        case .gguf(let path): "\(path): a GGUF file, which serves inference; training reads a checkpoint directory (config.json and safetensors weights)"
        }
    }
}
