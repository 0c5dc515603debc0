import Foundation
import Testing

@Suite struct TrainCLITests {
    struct Record: Decodable {
        struct Settings: Decodable { let learning_rate, weight_decay, max_grad_norm: Float; let warmup_steps, steps: Int }
        let settings: Settings
        let losses: [Float]
        let gradient_norms: [Float]
        let final_loss: Float
    }

    let model = CLI.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
    let work = FileManager.default.temporaryDirectory.appendingPathComponent("train-cli-\(UUID().uuidString)")

    /// The CLIP fixture's four photos captioned as oracle/contrastive_training.py captioned them, as an imagefolder dataset.
    func dataset() throws -> URL {
        struct Fixture: Decodable { let photos: [String]; let labels: [String]; let template: String }
        let fixture = try JSONDecoder().decode(Fixture.self, from: Data(contentsOf: model.appendingPathComponent("expected.json")))
        let data = work.appendingPathComponent("data")
        try FileManager.default.createDirectory(at: data, withIntermediateDirectories: true)
        var lines: [String] = []
        for (photo, label) in zip(fixture.photos, fixture.labels) {
            try FileManager.default.copyItem(at: CLI.fixtures.appendingPathComponent("photos/\(photo)"), to: data.appendingPathComponent(photo))
            let caption = fixture.template.replacingOccurrences(of: "{}", with: label)
            lines.append(String(decoding: try JSONSerialization.data(withJSONObject: ["file_name": photo, "text": caption]), as: UTF8.self))
        }
        try lines.joined(separator: "\n").write(to: data.appendingPathComponent("metadata.jsonl"), atomically: true, encoding: .utf8)
        return data
    }

    /// LiT, run_clip.py's whole model, and with its --freeze_text_model.
    @Test(arguments: [(["lit"], "lit/clip-tiny-quickgelu-argmax"), (["clip"], "contrastive-training/clip-tiny-quickgelu-argmax"),
                      (["clip", "--freeze-text-model"], "contrastive-training/clip-tiny-quickgelu-argmax-frozen-text_model")])
    func contrastiveTrainingLogsTrainersLossesAndWritesACheckpoint(command: [String], run: String) throws {
        defer { try? FileManager.default.removeItem(at: work) }
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent(run + ".json")))
        let out = work.appendingPathComponent("tuned").path
        let arguments = ["train"] + command + ["--model", model.path, "--data", try dataset().path, "--out", out,
                         "--batch-size", "4", "--max-steps", "\(record.settings.steps)", "--no-shuffle",
                         "--learning-rate", "\(record.settings.learning_rate)", "--weight-decay", "\(record.settings.weight_decay)",
                         "--warmup-steps", "\(record.settings.warmup_steps)", "--max-grad-norm", "\(record.settings.max_grad_norm)"]
        // Evaluated on its own pairs after training: the loss transformers gave after the last step.
        let run = try CLI.run(arguments + ["--json", "--eval-data", arguments[arguments.firstIndex(of: "--data")! + 1]])
        #expect(run.status == 0, "\(run.stderr)")
        let summary = try #require(try CLI.json(run) as? [String: Any])
        let evaluationLoss = try #require(summary["eval_loss"] as? Double)
        #expect(abs(evaluationLoss - Double(record.final_loss)) < 1e-4, "eval_loss \(evaluationLoss) against \(record.final_loss)")
        let log = try #require(summary["log_history"] as? [[String: Any]])
        #expect((summary["train_runtime"] as? Double ?? 0) > 0)
        #expect((summary["train_samples_per_second"] as? Double ?? 0) > 0)
        #expect(log.compactMap { $0["step"] as? Int } == Array(1...record.settings.steps))
        for (entry, (loss, norm)) in zip(log, zip(record.losses, record.gradient_norms)) {
            let logged = try #require(entry["loss"] as? Double), loggedNorm = try #require(entry["grad_norm"] as? Double)
            #expect(abs(logged - Double(loss)) < 1e-4, "\(entry)")
            #expect(abs(loggedNorm - Double(norm)) < 1e-4 * max(1, Double(norm)), "\(entry)")
        }
        #expect(FileManager.default.fileExists(atPath: out + "/model.safetensors"))

        // The checkpoint it wrote classifies, and is not overwritten without --force.
        let classify = try CLI.run(["classify", CLI.fixtures.appendingPathComponent("photos/chelsea.png").path, "--model", out,
                                    "--labels", "cat,rocket", "--json"])
        #expect(classify.status == 0, "\(classify.stderr)")
        let again = try CLI.run(arguments)
        #expect(again.status == 1)
        #expect(again.stderr.contains("\(out)/config.json exists; pass --force"), "\(again.stderr)")
        #expect(again.stderr.split(separator: "\n").count == 1)
        let forced = try CLI.run(arguments + ["--force"])
        #expect(forced.status == 0, "\(forced.stderr)")
        #expect(forced.stdout.hasPrefix("step 1/\(record.settings.steps)  epoch 1.00  loss "), "\(forced.stdout)")
    }

    /// --gradient-accumulation-steps as transformers' Trainer runs it (oracle/gradient_accumulation.py): three batches
    /// asked for a step, two in each epoch, so each step averages two.
    @Test func gradientAccumulationLogsTrainersSteps() throws {
        defer { try? FileManager.default.removeItem(at: work) }
        struct Record: Decodable {
            struct Settings: Decodable { let learning_rate, weight_decay: Float; let warmup_steps, batch_size, gradient_accumulation_steps, epochs: Int }
            struct Step: Decodable { let step: Int; let epoch: Double; let loss, grad_norm: Float }
            let settings: Settings
            let log_history: [Step]
        }
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent(
            "gradient-accumulation/clip-tiny-quickgelu-argmax.json")))
        let s = record.settings
        let data = try dataset().path
        let run = try CLI.run(["train", "clip", "--model", model.path, "--data", data, "--out", work.appendingPathComponent("out").path,
                               "--batch-size", "\(s.batch_size)", "--gradient-accumulation-steps", "\(s.gradient_accumulation_steps)",
                               "--epochs", "\(s.epochs)", "--no-shuffle", "--learning-rate", "\(s.learning_rate)",
                               "--weight-decay", "\(s.weight_decay)", "--warmup-steps", "\(s.warmup_steps)", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let log = try #require((try CLI.json(run) as? [String: Any])?["log_history"] as? [[String: Any]])
        #expect(log.count == record.log_history.count)
        for (entry, expected) in zip(log, record.log_history) {
            #expect(entry["epoch"] as? Double == expected.epoch, "\(entry)")
            #expect(abs((entry["loss"] as? Double ?? 0) - Double(expected.loss)) < 1e-4, "\(entry)")
            #expect(abs((entry["grad_norm"] as? Double ?? 0) - Double(expected.grad_norm)) < 1e-4 * Double(max(1, expected.grad_norm)), "\(entry)")
        }
        let zero = try CLI.run(["train", "clip", "--model", model.path, "--data", data, "--out", work.path,
                                "--gradient-accumulation-steps", "0"])
        #expect(zero.status != 0 && zero.stderr.contains("--gradient-accumulation-steps must be positive"), "\(zero.stderr)")
    }

    /// --save-steps writes the model as it stands after every second step and the last, as Trainer's save_steps
    /// does: the checkpoint after step 4, trained on, gives the loss the oracle logged at step 5; a run resumed from
    /// the one after step 2 finishes as the first did.
    @Test func saveStepsWritesCheckpointsAlongTheWay() throws {
        defer { try? FileManager.default.removeItem(at: work) }
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("lit/clip-tiny-quickgelu-argmax.json")))
        let data = try dataset().path
        let out = work.appendingPathComponent("tuned")
        func arguments(model: String, out: URL, steps: Int, learningRate: Float, warmup: Int) -> [String] {
            ["train", "lit", "--model", model, "--data", data, "--out", out.path, "--batch-size", "4", "--max-steps", "\(steps)",
             "--no-shuffle", "--learning-rate", "\(learningRate)", "--weight-decay", "\(record.settings.weight_decay)",
             "--warmup-steps", "\(warmup)", "--max-grad-norm", "\(record.settings.max_grad_norm)", "--json"]
        }
        let run = try CLI.run(arguments(model: model.path, out: out, steps: record.settings.steps, learningRate: record.settings.learning_rate,
                                        warmup: record.settings.warmup_steps) + ["--save-steps", "2"])
        #expect(run.status == 0, "\(run.stderr)")
        let saved = try FileManager.default.contentsOfDirectory(atPath: out.path).filter { $0.hasPrefix("checkpoint-") }.sorted()
        #expect(saved == ["checkpoint-2", "checkpoint-4", "checkpoint-5"])
        #expect(FileManager.default.contents(atPath: out.appendingPathComponent("checkpoint-5/model.safetensors").path)
                == FileManager.default.contents(atPath: out.appendingPathComponent("model.safetensors").path))
        let resumed = try CLI.run(arguments(model: out.appendingPathComponent("checkpoint-4").path, out: work.appendingPathComponent("again"),
                                            steps: 1, learningRate: 0, warmup: 0))
        #expect(resumed.status == 0, "\(resumed.stderr)")
        let loss = try #require(((try CLI.json(resumed) as? [String: Any])?["log_history"] as? [[String: Any]])?.first?["loss"] as? Double)
        #expect(abs(loss - Double(record.losses[4])) < 1e-4, "checkpoint-4's loss \(loss) against the oracle's step 5 \(record.losses[4])")

        // --resume-from-checkpoint continues the run from checkpoint-2: the oracle's five losses in its log (the first
        // two from trainer_state.json), and the model the uninterrupted run wrote, byte for byte.
        let state = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: out.appendingPathComponent("checkpoint-2/trainer_state.json"))) as? [String: Any])
        #expect(state["global_step"] as? Int == 2 && (state["log_history"] as? [Any])?.count == 2, "\(state)")
        let continued = work.appendingPathComponent("continued")
        let resumedRun = try CLI.run(arguments(model: model.path, out: continued, steps: record.settings.steps, learningRate: record.settings.learning_rate,
                                               warmup: record.settings.warmup_steps) + ["--resume-from-checkpoint", out.appendingPathComponent("checkpoint-2").path])
        #expect(resumedRun.status == 0, "\(resumedRun.stderr)")
        let losses = try #require(((try CLI.json(resumedRun) as? [String: Any])?["log_history"] as? [[String: Any]])?.compactMap { $0["loss"] as? Double })
        #expect(losses.count == record.losses.count)
        for (loss, expected) in zip(losses, record.losses) { #expect(abs(loss - Double(expected)) < 1e-4, "\(losses)") }
        #expect(FileManager.default.contents(atPath: continued.appendingPathComponent("model.safetensors").path)
                == FileManager.default.contents(atPath: out.appendingPathComponent("model.safetensors").path))
        let missing = try CLI.run(arguments(model: model.path, out: continued, steps: 5, learningRate: 0, warmup: 0)
                                  + ["--force", "--resume-from-checkpoint", work.path])
        #expect(missing.status == 1 && missing.stderr.split(separator: "\n").count == 1, "\(missing.stderr)")
        #expect(missing.stderr.contains(work.appendingPathComponent("trainer_state.json").path), "\(missing.stderr)")
    }

    @Test func badInputIsOneLine() throws {
        defer { try? FileManager.default.removeItem(at: work) }
        let photos = CLI.fixtures.appendingPathComponent("photos").path
        let noMetadata = try CLI.run(["train", "lit", "--model", model.path, "--data", photos, "--out", work.path])
        #expect(noMetadata.status == 1)
        #expect(noMetadata.stderr.contains("\(photos): neither metadata.jsonl nor metadata.csv"), "\(noMetadata.stderr)")
        let data = try dataset().path
        let missing = work.appendingPathComponent("missing").path
        let noEvaluationData = try CLI.run(["train", "lit", "--model", model.path, "--data", data, "--out", work.path + "/out",
                                            "--eval-data", missing])
        #expect(noEvaluationData.status == 1)
        #expect(noEvaluationData.stderr.contains("\(missing): no such directory"), "\(noEvaluationData.stderr)")
        let owlvit = CLI.fixtures.appendingPathComponent("owlvit/tiny-patch32-bf16").path
        let notCLIP = try CLI.run(["train", "lit", "--model", owlvit, "--data", data, "--out", work.path + "/out"])
        #expect(notCLIP.status == 1)
        #expect(notCLIP.stderr.contains("model_type \"owlvit\" is not supported here (supported: clip, siglip, siglip2)"), "\(notCLIP.stderr)")
        #expect(notCLIP.stderr.split(separator: "\n").count == 1)
    }

    /// LLaVA's projector alignment, and LLaVA-OneVision's (its tile grids shrunk under anyres_max_4).
    @Test(arguments: ["image-chat/llava-1.5", "llava-onevision/qwen2-layers-chat"])
    func projectorLogsTrainersLossesAndWritesACheckpointThatChats(checkpoint: String) throws {
        defer { try? FileManager.default.removeItem(at: work) }
        struct Record: Decodable {
            struct Settings: Decodable { let learning_rate, weight_decay: Float; let warmup_steps, steps: Int }
            let settings: Settings
            let photos: [String]
            let instruction: String
            let captions: [String]
            let losses: [Float]
        }
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("projector-alignment/\(checkpoint.replacingOccurrences(of: "/", with: "-")).json")))
        let data = work.appendingPathComponent("captions")
        try FileManager.default.createDirectory(at: data, withIntermediateDirectories: true)
        var rows: [String] = []
        for (photo, caption) in zip(record.photos, record.captions) {
            let name = (photo as NSString).lastPathComponent
            try FileManager.default.copyItem(at: CLI.fixtures.appendingPathComponent(photo), to: data.appendingPathComponent(name))
            rows.append(String(decoding: try JSONSerialization.data(withJSONObject: ["file_name": name, "text": caption]), as: UTF8.self))
        }
        try rows.joined(separator: "\n").write(to: data.appendingPathComponent("metadata.jsonl"), atomically: true, encoding: .utf8)
        let out = work.appendingPathComponent("aligned").path
        let run = try CLI.run(["train", "projector", "--model", CLI.fixtures.appendingPathComponent(checkpoint).path,
                               "--data", data.path, "--out", out, "--instruction", record.instruction, "--batch-size", "2",
                               "--max-steps", "\(record.settings.steps)", "--learning-rate", "\(record.settings.learning_rate)",
                               "--weight-decay", "\(record.settings.weight_decay)", "--warmup-steps", "\(record.settings.warmup_steps)",
                               "--no-shuffle", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let summary = try #require(try CLI.json(run) as? [String: Any])
        let losses = try #require((summary["log_history"] as? [[String: Any]])?.compactMap { $0["loss"] as? Double })
        #expect(losses.count == record.losses.count)
        for (loss, expected) in zip(losses, record.losses) { #expect(abs(loss - Double(expected)) < 1e-4) }

        // The aligned checkpoint answers through its chat template.
        let chat = try CLI.run(["generate", "--model", out, "--image", data.appendingPathComponent("chelsea.png").path,
                                "--prompt", "What is this?", "--max-new-tokens", "3", "--temperature", "0", "--json"])
        #expect(chat.status == 0, "\(chat.stderr)")
        let notLlava = try CLI.run(["train", "projector", "--model", model.path, "--data", data.path, "--out", work.path + "/x"])
        #expect(notLlava.status == 1)
        #expect(notLlava.stderr.contains("model_type \"clip\" is not supported here (supported: llava, llava_next, llava_onevision)"), "\(notLlava.stderr)")
    }

    /// Visual instruction tuning of LLaVA and of LLaVA-NeXT (its images tiled and packed, `image_newline` learning).
    @Test(arguments: ["image-chat/chatml", "llava-next/mistral-chat"])
    func sftLogsTrainersLossesAndWritesACheckpointThatChats(checkpoint name: String) throws {
        defer { try? FileManager.default.removeItem(at: work) }
        struct Record: Decodable {
            let settings: SFTSettings
            let photos: [String]
            let exchanges: [[[String]]]
            let losses: [Float]
            let final_loss: Float
        }
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("instruction-tuning/\(name.replacingOccurrences(of: "/", with: "-")).json")))
        let data = work.appendingPathComponent("conversations")
        try FileManager.default.createDirectory(at: data, withIntermediateDirectories: true)
        var rows: [String] = []
        for (photo, exchanges) in zip(record.photos, record.exchanges) {
            let name = (photo as NSString).lastPathComponent
            try FileManager.default.copyItem(at: CLI.fixtures.appendingPathComponent(photo), to: data.appendingPathComponent(name))
            let messages = exchanges.enumerated().flatMap { index, exchange -> [[String: Any]] in
                let question: [[String: Any]] = (index == 0 ? [["type": "image"]] : []) + [["type": "text", "text": exchange[0]]]
                return [["role": "user", "content": question], ["role": "assistant", "content": [["type": "text", "text": exchange[1]]]]]
            }
            rows.append(String(decoding: try JSONSerialization.data(withJSONObject: ["file_name": name, "messages": messages]), as: UTF8.self))
        }
        try rows.joined(separator: "\n").write(to: data.appendingPathComponent("metadata.jsonl"), atomically: true, encoding: .utf8)
        let out = work.appendingPathComponent("tuned").path
        let checkpoint = CLI.fixtures.appendingPathComponent(name).path
        try expectSFTAsRecorded(checkpoint: checkpoint, data: data, out: out, settings: record.settings, losses: record.losses,
                                finalLoss: record.final_loss)

        // The tuned checkpoint answers through its chat template.
        let chat = try CLI.run(["generate", "--model", out, "--image", data.appendingPathComponent("chelsea.png").path,
                                "--prompt", "What is this?", "--max-new-tokens", "3", "--temperature", "0", "--json"])
        #expect(chat.status == 0, "\(chat.stderr)")
        // A caption dataset is not a conversation dataset: one line naming its metadata.
        try #"{"file_name": "chelsea.png", "text": "A cat."}"#.write(to: data.appendingPathComponent("metadata.jsonl"), atomically: true, encoding: .utf8)
        let captions = try CLI.run(["train", "sft", "--model", checkpoint, "--data", data.path, "--out", work.path + "/x"])
        #expect(captions.status == 1)
        #expect(captions.stderr == "Error: \(data.appendingPathComponent("metadata.jsonl").path): line 1: no messages (choose the conversation column with --messages-column)\n",
                "\(captions.stderr)")
    }

    @Test func sftFineTunesAChatLanguageModelOnTextConversations() throws {
        defer { try? FileManager.default.removeItem(at: work) }
        struct Record: Decodable {
            let settings: SFTSettings
            let conversations: [[[String: String]]]
            let losses: [Float]
            let final_loss: Float
            let every_token_losses: [Float]
        }
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("sft/qwen2-chatml.json")))
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        let data = work.appendingPathComponent("train.jsonl")
        try record.conversations.map { String(decoding: try JSONSerialization.data(withJSONObject: ["messages": $0]), as: UTF8.self) }
            .joined(separator: "\n").write(to: data, atomically: true, encoding: .utf8)
        let out = work.appendingPathComponent("tuned").path
        let checkpoint = CLI.fixtures.appendingPathComponent("sft/qwen2-chatml").path
        try expectSFTAsRecorded(checkpoint: checkpoint, data: data, out: out, settings: record.settings, losses: record.losses,
                                finalLoss: record.final_loss)

        // Every token scored, as TRL does by default.
        let everyToken = try CLI.run(["train", "sft", "--model", checkpoint, "--data", data.path, "--out", out, "--force", "--all-tokens",
                                      "--batch-size", "2", "--max-steps", "\(record.settings.steps)", "--learning-rate", "\(record.settings.learning_rate)",
                                      "--weight-decay", "\(record.settings.weight_decay)", "--warmup-steps", "\(record.settings.warmup_steps)",
                                      "--no-shuffle", "--json"])
        let everyTokenLosses = try #require((try CLI.json(everyToken) as? [String: Any])?["log_history"] as? [[String: Any]]).compactMap { $0["loss"] as? Double }
        #expect(everyTokenLosses.count == record.every_token_losses.count)
        for (loss, expected) in zip(everyTokenLosses, record.every_token_losses) { #expect(abs(loss - Double(expected)) < 1e-4) }

        // The tuned model chats.
        let chat = try CLI.run(["generate", "--model", out, "--prompt", "Name a colour.", "--max-new-tokens", "3", "--temperature", "0", "--json"])
        #expect(chat.status == 0, "\(chat.stderr)")
        // A family sft does not train: one line naming its config.
        let clip = try CLI.run(["train", "sft", "--model", model.path, "--data", data.path, "--out", work.path + "/x"])
        #expect(clip.status == 1)
        #expect(clip.stderr.contains("model_type \"clip\" is not supported here (supported: llava, llava_next, llava_onevision, llama, mistral, qwen2, qwen3, smollm3)"), "\(clip.stderr)")
        #expect(clip.stderr.split(separator: "\n").count == 1)
        // A GGUF file is quantized for inference: refused by name.
        let gguf = CLI.fixtures.appendingPathComponent("llama/qwen2-tiny.gguf").path
        let quantized = try CLI.run(["train", "sft", "--model", gguf, "--data", data.path, "--out", work.path + "/x"])
        #expect(quantized.status == 1)
        #expect(quantized.stderr == "Error: \(gguf): a GGUF file, which serves inference; training reads a checkpoint directory (config.json and safetensors weights)\n", "\(quantized.stderr)")
    }

    /// LoRA through the CLI: an adapter as PEFT saves one, or with --merge-lora a checkpoint that chats; a target that
    /// is not a decoder layer's projection refused in one line.
    @Test func sftWithLoraWritesAnAdapterOrAMergedModel() throws {
        defer { try? FileManager.default.removeItem(at: work) }
        struct Record: Decodable { let conversations: [[[String: String]]] }
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: CLI.fixtures.appendingPathComponent("sft/qwen2-chatml.json")))
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        let data = work.appendingPathComponent("train.jsonl")
        try record.conversations.map { String(decoding: try JSONSerialization.data(withJSONObject: ["messages": $0]), as: UTF8.self) }
            .joined(separator: "\n").write(to: data, atomically: true, encoding: .utf8)
        let checkpoint = CLI.fixtures.appendingPathComponent("sft/qwen2-chatml").path
        let options = ["--data", data.path, "--batch-size", "2", "--max-steps", "3", "--learning-rate", "0.05", "--no-shuffle",
                       "--lora-rank", "2", "--lora-alpha", "4", "--lora-target-modules", "q_proj,v_proj,down_proj"]
        let adapter = work.appendingPathComponent("adapter")
        let run = try CLI.run(["train", "sft", "--model", checkpoint, "--out", adapter.path, "--json"] + options)
        #expect(run.status == 0, "\(run.stderr)")
        let files = Set(try FileManager.default.contentsOfDirectory(atPath: adapter.path))
        #expect(files.isSuperset(of: ["adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "chat_template.jinja"]) && !files.contains("config.json"), "\(files)")
        let config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: adapter.appendingPathComponent("adapter_config.json"))) as? [String: Any])
        #expect(config["peft_type"] as? String == "LORA" && config["r"] as? Int == 2 && config["lora_alpha"] as? Int == 4)
        #expect(config["target_modules"] as? [String] == ["q_proj", "v_proj", "down_proj"])

        let merged = work.appendingPathComponent("merged")
        let mergedRun = try CLI.run(["train", "sft", "--model", checkpoint, "--out", merged.path, "--merge-lora", "--json"] + options)
        #expect(mergedRun.status == 0, "\(mergedRun.stderr)")
        // The same seed draws the same updates: the same run either way.
        let losses = { (output: CLI.Run) throws -> [Double] in
            try #require((try CLI.json(output) as? [String: Any])?["log_history"] as? [[String: Any]]).compactMap { $0["loss"] as? Double }
        }
        #expect(try losses(run) == losses(mergedRun))
        let chat = try CLI.run(["generate", "--model", merged.path, "--prompt", "Name a colour.", "--max-new-tokens", "3", "--temperature", "0"])
        #expect(chat.status == 0, "\(chat.stderr)")

        let bad = try CLI.run(["train", "sft", "--model", checkpoint, "--out", work.appendingPathComponent("x").path, "--data", data.path,
                               "--lora-rank", "2", "--lora-target-modules", "q_proj,lm_head"])
        #expect(bad.status != 0 && bad.stderr.contains("--lora-target-modules takes names among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, got q_proj,lm_head"), "\(bad.stderr)")
    }

    /// The oracles' training settings that `vlm train sft` takes as options.
    struct SFTSettings: Decodable { let learning_rate, weight_decay: Float; let warmup_steps, steps: Int }

    /// Runs `vlm train sft` on `data` (evaluated on it too) with the oracle's settings and expects its losses, and on
    /// its own conversations after training the loss transformers gave after the last step as eval_loss.
    func expectSFTAsRecorded(checkpoint: String, data: URL, out: String, settings: SFTSettings, losses expected: [Float],
                             finalLoss: Float) throws {
        let run = try CLI.run(["train", "sft", "--model", checkpoint, "--data", data.path, "--eval-data", data.path, "--out", out,
                               "--batch-size", "2", "--max-steps", "\(settings.steps)", "--learning-rate", "\(settings.learning_rate)",
                               "--weight-decay", "\(settings.weight_decay)", "--warmup-steps", "\(settings.warmup_steps)",
                               "--no-shuffle", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let summary = try #require(try CLI.json(run) as? [String: Any])
        let losses = try #require((summary["log_history"] as? [[String: Any]])?.compactMap { $0["loss"] as? Double })
        #expect(losses.count == expected.count)
        for (loss, expected) in zip(losses, expected) { #expect(abs(loss - Double(expected)) < 1e-4) }
        let evaluation = try #require(summary["eval_loss"] as? Double)
        #expect(abs(evaluation - Double(finalLoss)) < 1e-4, "eval_loss \(evaluation) against \(finalLoss)")
    }
}
