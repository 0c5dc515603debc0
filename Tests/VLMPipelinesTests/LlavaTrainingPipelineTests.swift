import Foundation
import Testing
import VLMPipelines
import VLMTemplates
import VLMTraining

@Suite struct LlavaTrainingPipelineTests {
    /// What both oracles record of a run beside what each stage's data holds.
    struct Record: Decodable {
        let settings: RecordedTrainingSettings
        let photos: [String]
        let losses: [Float]
        let gradient_norms: [Float]
        let final_loss: Float
        /// oracle/projector_alignment.py's.
        let instruction: String?
        let captions: [String]?
        /// oracle/instruction_tuning.py's: per conversation, its (question, answer) exchanges.
        let exchanges: [[[String]]]?
        let input_ids: [[Int]]
        let labels: [[Int]]
    }

    /// LLaVA's, LLaVA-NeXT's and LLaVA-OneVision's fixtures with chat templates (VLMTrainingTests' LlavaTrainingTests).
    static let checkpoints = ["image-chat/llava-1.5", "image-chat/chatml", "llava-next/mistral-chat",
                              "llava-onevision/qwen2-smollm2-bf16", "llava-onevision/qwen2-layers-chat"]

    /// Projector alignment from photo files and captions (tiled and packed as each family's processor and model
    /// do): each pair rendered through the checkpoint's chat template
    /// as transformers' processor renders the conversation, the replies scored, the batch right-padded; every step's
    /// loss and norm are the oracle's, and the written checkpoint (its files copied as files, not links) has the
    /// oracle's final loss.
    @Test(arguments: checkpoints)
    func alignsAndSavesAsTransformersDoes(checkpoint: String) throws {
        let record = try Self.record("projector-alignment", checkpoint)
        let data = try Self.dataset(record) { name, index in ["file_name": name, "text": record.captions![index]] }
        defer { try? FileManager.default.removeItem(at: data) }
        let dataset = try ImageTextDataset(directory: data)
        try trainAndSave(checkpoint: checkpoint, stage: .projectorAlignment, record: record, data: .captions(dataset, instruction: record.instruction))
    }

    /// Instruction tuning from photo files and conversations in the chat format (metadata.jsonl's messages): the
    /// template's generation blocks give the scored tokens exactly as transformers' processor's assistant masks
    /// give them, the images' markers expanded before them; every step's loss and norm, and the saved checkpoint's
    /// loss, are the oracle's.
    @Test(arguments: checkpoints)
    func instructionTunesAndSavesAsTransformersDoes(checkpoint: String) throws {
        let record = try Self.record("instruction-tuning", checkpoint)
        let data = try Self.dataset(record) { name, index in ["file_name": name, "messages": Self.messages(record.exchanges![index])] }
        defer { try? FileManager.default.removeItem(at: data) }
        let dataset = try ImageConversationDataset(directory: data)
        try trainAndSave(checkpoint: checkpoint, stage: .instructionTuning, record: record, data: .conversations(dataset))
    }

    private func trainAndSave(checkpoint: String, stage: LlavaTraining.Stage, record: Record, data: LlavaTrainingData) throws {
        let pipeline = try LlavaTrainingPipeline(directory: CaptionedPhotoDataset.fixtures.appendingPathComponent(checkpoint), stage: stage)
        let run = try pipeline.train(data, settings: record.settings.inOrder(batchSize: record.photos.count))
        for (entry, (loss, norm)) in zip(run.history, zip(record.losses, record.gradient_norms)) {
            #expect(abs(entry.loss - loss) < 1e-4, "step \(entry.step): loss \(entry.loss) against \(loss)")
            #expect(abs(entry.gradientNorm - norm) < 1e-4 * max(1, norm), "step \(entry.step): norm \(entry.gradientNorm) against \(norm)")
        }
        #expect(run.history.count == record.settings.steps)

        let output = FileManager.default.temporaryDirectory.appendingPathComponent("llava-trained-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: output) }
        try pipeline.save(to: output)
        let loss = try LlavaTrainingPipeline(directory: output, stage: stage).loss(on: data, batchSize: 2)
        #expect(abs(loss - record.final_loss) < 1e-4, "saved checkpoint's loss \(loss) against \(record.final_loss)")
        for file in try FileManager.default.contentsOfDirectory(atPath: output.path) {
            let type = try FileManager.default.attributesOfItem(atPath: output.appendingPathComponent(file).path)[.type] as? FileAttributeType
            #expect(type == .typeRegular, "\(file) is \(String(describing: type))")
        }
        #expect(FileManager.default.fileExists(atPath: output.appendingPathComponent("chat_template.jinja").path))
    }

    /// A conversation dataset whose rows break the chat format: one line naming the file, the line and what is wrong.
    @Test(arguments: [
        (#"{"file_name": "chelsea.png", "text": "A cat."}"#, "line 1: no messages (choose the conversation column with --messages-column)"),
        (#"{"file_name": "chelsea.png", "messages": "hello"}"#, "line 1: messages is not a list of messages"),
        (#"{"file_name": "chelsea.png", "messages": []}"#, "line 1: messages is not a list of messages"),
        (#"{"file_name": "chelsea.png", "messages": [{"content": "hi"}]}"#, "line 1: message 0 has no string role"),
        (#"{"file_name": "chelsea.png", "messages": [{"role": "user", "content": 3}]}"#, "line 1: message 0's content is neither a string nor a list of parts"),
        (#"{"file_name": "chelsea.png", "messages": [{"role": "user", "content": [{"text": "hi"}]}]}"#, "line 1: message 0 has a content part without a type"),
        (#"{"file_name": "chelsea.png", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "A cat."}]}"#,
         "line 1: the messages hold 0 image parts for the row's one image"),
        (#"{"file_name": "chelsea.png", "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}, {"role": "assistant", "content": "A cat."}]}"#,
         "line 1: the messages hold 2 image parts for the row's one image"),
        (#"{"file_name": "chelsea.png", "messages": [{"role": "user", "content": [{"type": "image"}]}]}"#, "line 1: no assistant message to learn from"),
    ])
    func badConversationsAreOneLineNamingTheFile(line: String, message: String) throws {
        let data = try CaptionedPhotoDataset.oneImage(metadata: "metadata.jsonl", contents: line)
        defer { try? FileManager.default.removeItem(at: data) }
        let error = try #require(throws: DatasetError.self) { try ImageConversationDataset(directory: data) }
        #expect(error.description == "\(data.appendingPathComponent("metadata.jsonl").path): \(message)")
    }

    /// A template without generation blocks marks no reply, so instruction tuning has nothing to score: refused,
    /// naming the checkpoint, before any step; scoring every token instead (TRL's default) trains.
    @Test func aTemplateWithoutGenerationBlocksIsRefused() throws {
        let fixtures = CaptionedPhotoDataset.fixtures
        let model = FileManager.default.temporaryDirectory.appendingPathComponent("llava-plain-template-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: model) }
        try FileManager.default.createDirectory(at: model, withIntermediateDirectories: true)
        let source = fixtures.appendingPathComponent("image-chat/llava-1.5")
        for file in try FileManager.default.contentsOfDirectory(atPath: source.path) where file != "chat_template.jinja" {
            try FileManager.default.copyItem(at: source.appendingPathComponent(file).resolvingSymlinksInPath(), to: model.appendingPathComponent(file))
        }
        try "{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n{% endfor %}"
            .write(to: model.appendingPathComponent("chat_template.jinja"), atomically: true, encoding: .utf8)
        let record = try Self.record("instruction-tuning", "image-chat/llava-1.5")
        let data = try Self.dataset(record) { name, index in ["file_name": name, "messages": Self.messages(record.exchanges![index])] }
        defer { try? FileManager.default.removeItem(at: data) }
        let pipeline = try LlavaTrainingPipeline(directory: model, stage: .instructionTuning)
        let error = try #require(throws: PipelineError.self) {
            try pipeline.train(.conversations(try ImageConversationDataset(directory: data)), settings: TrainingSettings())
        }
        #expect(error.description == "\(model.path): the chat template marks no assistant tokens in conversation 1 (instruction tuning scores the replies its {% generation %} blocks mark; --all-tokens scores every token)")
        var settings = TrainingSettings()
        settings.maxSteps = 1
        let run = try pipeline.train(.conversations(try ImageConversationDataset(directory: data), assistantOnly: false), settings: settings)
        #expect(run.history.count == 1 && run.history[0].loss.isFinite && run.history[0].loss > 0)
    }

    static func record(_ folder: String, _ checkpoint: String) throws -> Record {
        try JSONDecoder().decode(Record.self, from: Data(contentsOf: CaptionedPhotoDataset.fixtures.appendingPathComponent(
            "\(folder)/\(checkpoint.replacingOccurrences(of: "/", with: "-")).json")))
    }

    /// A dataset directory holding the record's photos and a metadata.jsonl with `row(file name, index)` per photo.
    static func dataset(_ record: Record, row: (String, Int) -> [String: Any]) throws -> URL {
        let data = FileManager.default.temporaryDirectory.appendingPathComponent("llava-data-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: data, withIntermediateDirectories: true)
        var rows: [String] = []
        for (index, photo) in record.photos.enumerated() {
            let name = (photo as NSString).lastPathComponent
            try FileManager.default.copyItem(at: CaptionedPhotoDataset.fixtures.appendingPathComponent(photo), to: data.appendingPathComponent(name))
            rows.append(String(decoding: try JSONSerialization.data(withJSONObject: row(name, index)), as: UTF8.self))
        }
        try rows.joined(separator: "\n").write(to: data.appendingPathComponent("metadata.jsonl"), atomically: true, encoding: .utf8)
        return data
    }

    /// The oracle's conversation in the chat format: the image in the first user turn.
    static func messages(_ exchanges: [[String]]) -> [[String: Any]] {
        exchanges.enumerated().flatMap { index, exchange -> [[String: Any]] in
            var question: [[String: Any]] = [["type": "text", "text": exchange[0]]]
            if index == 0 { question.insert(["type": "image"], at: 0) }
            return [["role": "user", "content": question], ["role": "assistant", "content": [["type": "text", "text": exchange[1]]]]]
        }
    }
}

/// The oracles' Trainer settings.
struct RecordedTrainingSettings: Decodable {
    let learning_rate, weight_decay, max_grad_norm: Float
    let warmup_steps, steps: Int

    /// As the oracle stepped: its steps over batches of `batchSize`, the examples in order.
    func inOrder(batchSize: Int) -> TrainingSettings {
        var settings = TrainingSettings()
        settings.batchSize = batchSize
        settings.maxSteps = steps
        settings.learningRate = learning_rate
        settings.weightDecay = weight_decay
        settings.maxGradientNorm = max_grad_norm
        settings.warmupSteps = warmup_steps
        settings.shuffleSeed = nil
        return settings
    }
}
