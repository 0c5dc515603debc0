import Foundation
import Testing
import VLMPipelines
import VLMTemplates
import VLMTraining

@Suite struct SupervisedFineTuningPipelineTests {
    /// oracle/sft.py's record: its settings, conversations and what each step gave.
    struct Record: Decodable {
        let settings: RecordedTrainingSettings
        let conversations: [[[String: String]]]
        let losses: [Float]
        let gradient_norms: [Float]
        let final_loss: Float
        let every_token_losses: [Float]
        let every_token_gradient_norms: [Float]
        let every_token_final_loss: Float
    }

    static let fixtures = CaptionedPhotoDataset.fixtures

    /// The record's conversations as a JSON-lines file in a fresh directory.
    static func dataset(_ record: Record) throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sft-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let lines = try record.conversations.map {
            String(decoding: try JSONSerialization.data(withJSONObject: ["messages": $0]), as: UTF8.self)
        }
        try lines.joined(separator: "\n").write(to: directory.appendingPathComponent("train.jsonl"), atomically: true, encoding: .utf8)
        return directory
    }

    /// From a JSON-lines file of chat-format conversations: each rendered through the checkpoint's template and
    /// tokenized as `tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)` does, the marked replies
    /// scored; every step's loss and norm, and the saved checkpoint's loss, are the oracle's.
    @Test func fineTunesAndSavesAsTransformersDoes() throws {
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: Self.fixtures.appendingPathComponent("sft/qwen2-chatml.json")))
        let directory = try Self.dataset(record)
        defer { try? FileManager.default.removeItem(at: directory) }
        let dataset = try ConversationDataset(file: directory.appendingPathComponent("train.jsonl"))
        let pipeline = try SupervisedFineTuningPipeline(directory: Self.fixtures.appendingPathComponent("sft/qwen2-chatml"))
        let run = try pipeline.train(dataset, settings: record.settings.inOrder(batchSize: record.conversations.count))
        #expect(run.history.count == record.settings.steps)
        for (entry, (loss, norm)) in zip(run.history, zip(record.losses, record.gradient_norms)) {
            #expect(abs(entry.loss - loss) < 1e-4, "step \(entry.step): loss \(entry.loss) against \(loss)")
            #expect(abs(entry.gradientNorm - norm) < 1e-4 * max(1, norm), "step \(entry.step): norm \(entry.gradientNorm) against \(norm)")
        }
        let output = directory.appendingPathComponent("tuned")
        try pipeline.save(to: output)
        let loss = try SupervisedFineTuningPipeline(directory: output).loss(on: dataset, batchSize: 2)
        #expect(abs(loss - record.final_loss) < 1e-4, "saved checkpoint's loss \(loss) against \(record.final_loss)")
        #expect(FileManager.default.fileExists(atPath: output.appendingPathComponent("chat_template.jinja").path))
    }

    /// Every token scored but the padding, as TRL scores by default (`assistant_only_loss=False`): the oracle's
    /// losses and norms from the same conversations, and its loss after the last step.
    @Test func fineTunesOnEveryTokenAsTRLDoesByDefault() throws {
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: Self.fixtures.appendingPathComponent("sft/qwen2-chatml.json")))
        let directory = try Self.dataset(record)
        defer { try? FileManager.default.removeItem(at: directory) }
        let dataset = try ConversationDataset(file: directory.appendingPathComponent("train.jsonl"))
        let pipeline = try SupervisedFineTuningPipeline(directory: Self.fixtures.appendingPathComponent("sft/qwen2-chatml"))
        let run = try pipeline.train(dataset, assistantOnly: false, settings: record.settings.inOrder(batchSize: record.conversations.count))
        #expect(run.history.count == record.every_token_losses.count)
        for (entry, (loss, norm)) in zip(run.history, zip(record.every_token_losses, record.every_token_gradient_norms)) {
            #expect(abs(entry.loss - loss) < 1e-4, "step \(entry.step): loss \(entry.loss) against \(loss)")
            #expect(abs(entry.gradientNorm - norm) < 1e-4 * max(1, norm), "step \(entry.step): norm \(entry.gradientNorm) against \(norm)")
        }
        let loss = try pipeline.loss(on: dataset, assistantOnly: false, batchSize: 2)
        #expect(abs(loss - record.every_token_final_loss) < 1e-4, "loss after training \(loss) against \(record.every_token_final_loss)")
    }

    /// Text conversations for a language model: an image part, a missing file, a directory and an empty file are one
    /// line naming the path (and a file where an image dataset's directory belongs).
    @Test func badConversationFilesAreOneLineNamingTheFile() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sft-bad-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("train.jsonl")
        try #"{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}, {"role": "assistant", "content": "A cat."}]}"#
            .write(to: file, atomically: true, encoding: .utf8)
        let image = try #require(throws: DatasetError.self) { try ConversationDataset(file: file) }
        #expect(image.description == "\(file.path): line 1: the messages hold 1 image parts, and a language model reads no images")
        let missing = try #require(throws: DatasetError.self) { try ConversationDataset(file: directory.appendingPathComponent("none.jsonl")) }
        #expect(missing.description == "\(directory.appendingPathComponent("none.jsonl").path): no such file (a conversation dataset is a JSON-lines file)")
        let folder = try #require(throws: DatasetError.self) { try ConversationDataset(file: directory) }
        #expect(folder.description == "\(directory.path): a directory, not the JSON-lines file of conversations a language model trains on")
        let notFolder = try #require(throws: DatasetError.self) { try ImageConversationDataset(directory: file) }
        #expect(notFolder.description == "\(file.path): a file, not a directory of images and their metadata (an imagefolder dataset)")
        try "\n".write(to: file, atomically: true, encoding: .utf8)
        let empty = try #require(throws: DatasetError.self) { try ConversationDataset(file: file) }
        #expect(empty.description == "\(file.path): no rows")
    }
}
