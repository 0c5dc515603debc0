import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMPipelines
import VLMTensor
import VLMTraining

/// An imagefolder dataset of a CLIP or SigLIP fixture's four photos captioned with its templated labels (what
/// oracle/contrastive_training.py trained on), in a temporary directory removed with it.
final class CaptionedPhotoDataset {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    struct Fixture: Decodable {
        let photos: [String]
        let labels: [String]
        let template: String
    }

    /// A fresh dataset directory holding chelsea.png and a metadata file `metadata` with `contents`.
    static func oneImage(metadata: String, contents: String) throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dataset-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try FileManager.default.copyItem(at: fixtures.appendingPathComponent("photos/chelsea.png"), to: directory.appendingPathComponent("chelsea.png"))
        try contents.write(to: directory.appendingPathComponent(metadata), atomically: true, encoding: .utf8)
        return directory
    }

    let url = FileManager.default.temporaryDirectory.appendingPathComponent("lit-\(UUID().uuidString)")
    let captions: [String]
    let photos: [String]

    /// - Parameters:
    ///   - checkpoint: the fixture under Tests/Fixtures, e.g. "clip/tiny-quickgelu-argmax".
    ///   - metadata: writes each pair's row given its file name and caption; nil writes metadata.jsonl.
    init(checkpoint: String, metadata: ((String, String) -> String)? = nil, metadataFile: String = "metadata.jsonl",
         header: String? = nil) throws {
        let fixture = try JSONDecoder().decode(Fixture.self, from: Data(contentsOf: Self.fixtures
            .appendingPathComponent("\(checkpoint)/expected.json")))
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        // Photos named by file are in Tests/Fixtures/photos, the others by their path under Tests/Fixtures.
        for photo in fixture.photos {
            try FileManager.default.copyItem(at: Self.fixtures.appendingPathComponent(photo.contains("/") ? photo : "photos/\(photo)"),
                                             to: url.appendingPathComponent((photo as NSString).lastPathComponent))
        }
        photos = fixture.photos.map { ($0 as NSString).lastPathComponent }
        captions = fixture.labels.map { fixture.template.replacingOccurrences(of: "{}", with: $0) }
        let row = metadata ?? { name, caption in
            String(decoding: try! JSONSerialization.data(withJSONObject: ["file_name": name, "text": caption]), as: UTF8.self)
        }
        let rows = zip(photos, captions).map(row)
        try ((header.map { [$0] } ?? []) + rows).joined(separator: "\n").write(to: url.appendingPathComponent(metadataFile),
                                                                               atomically: true, encoding: .utf8)
    }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// oracle/contrastive_training.py's record of a run: its settings, frozen modules and what each step gave.
struct ContrastiveTrainingRecord: Decodable {
    let settings: RecordedTrainingSettings
    let captions: [String]
    let losses: [Float]
    let gradient_norms: [Float]
    let final_loss: Float
    let frozen: [String]

    /// - Parameter run: e.g. "lit/clip-tiny-quickgelu-argmax".
    init(_ run: String) throws {
        self = try JSONDecoder().decode(Self.self, from: Data(contentsOf: CaptionedPhotoDataset.fixtures
            .appendingPathComponent(run + ".json")))
    }

    var frozenModules: Set<ImageTextContrastiveTraining.Module> {
        Set(frozen.map { ImageTextContrastiveTraining.Module(rawValue: $0)! })
    }
}

@Suite struct ContrastiveTrainingPipelineTests {
    /// From the photo files and captions to the saved checkpoint: the processor's pixels and the tokenizer's ids give
    /// each step the loss transformers' Trainer computed (oracle/contrastive_training.py), and the checkpoint written
    /// loads as a model of its family whose loss on the pairs is the oracle's after its last step.
    @Test(arguments: [("clip/tiny-quickgelu-argmax", "lit/clip-tiny-quickgelu-argmax"), ("clip/tiny-gelu-eos-fp16", "lit/clip-tiny-gelu-eos-fp16"),
                      ("siglip/tiny-tanh-fp16", "lit/siglip-tiny-tanh-fp16"), ("siglip/tiny-gelu-bf16", "lit/siglip-tiny-gelu-bf16"),
                      ("siglip2/tiny-naflex-fp16", "lit/siglip2-tiny-naflex-fp16"),
                      ("clip/tiny-gelu-eos-fp16", "contrastive-training/clip-tiny-gelu-eos-fp16"),
                      ("siglip/tiny-tanh-fp16", "contrastive-training/siglip-tiny-tanh-fp16"),
                      ("siglip2/tiny-naflex-fp16", "contrastive-training/siglip2-tiny-naflex-fp16"),
                      ("clip/tiny-quickgelu-argmax", "contrastive-training/clip-tiny-quickgelu-argmax-frozen-vision_model")])
    func trainsAndSavesAsTransformersDoes(checkpoint: String, run: String) throws {
        let data = try CaptionedPhotoDataset(checkpoint: checkpoint)
        let record = try ContrastiveTrainingRecord(run)
        let model = CaptionedPhotoDataset.fixtures.appendingPathComponent(checkpoint)
        let pipeline = try ContrastiveTrainingPipeline(directory: model, frozen: record.frozenModules)
        let settings = record.settings.inOrder(batchSize: 4)
        var logged: [TrainingLogEntry] = []
        let run = try pipeline.train(ImageTextDataset(directory: data.url), settings: settings) { logged.append($0) }
        let history = run.history
        #expect(run.runtime > 0 && run.samplesPerSecond == Double(4 * record.settings.steps) / run.runtime)
        #expect(history == logged)
        #expect(history.map(\.step) == Array(1...record.settings.steps))
        #expect(history.map(\.epoch) == (1...record.settings.steps).map(Double.init))
        #expect(history.first?.learningRate == 0)  // the first of one warmup step
        #expect(data.captions == record.captions)
        for (entry, (loss, norm)) in zip(history, zip(record.losses, record.gradient_norms)) {
            #expect(abs(entry.loss - loss) < 1e-4, "step \(entry.step): loss \(entry.loss) against \(loss)")
            #expect(abs(entry.gradientNorm - norm) < 1e-4 * max(1, norm), "step \(entry.step): norm \(entry.gradientNorm) against \(norm)")
        }

        let output = data.url.appendingPathComponent("tuned")
        try pipeline.save(to: output)
        // The saved checkpoint through the same processor: its loss on the pairs.
        let loss = try ContrastiveTrainingPipeline(directory: output, frozen: record.frozenModules).loss(on: ImageTextDataset(directory: data.url), batchSize: 4)
        #expect(abs(loss - record.final_loss) < 1e-4, "saved checkpoint's loss \(loss) against \(record.final_loss)")
        let config = try String(contentsOf: output.appendingPathComponent("config.json"), encoding: .utf8)
        #expect(config.contains("\"dtype\": \"float32\""))
        #expect(!config.contains("float16"))
        for file in ["tokenizer.json", "tokenizer_config.json", "spiece.model", "vocab.json", "merges.txt", "preprocessor_config.json"] {
            #expect(FileManager.default.fileExists(atPath: output.appendingPathComponent(file).path)
                    == FileManager.default.fileExists(atPath: model.appendingPathComponent(file).path), "\(file)")
        }
    }

    /// Each epoch visits every pair once, in an order drawn from the seed: the same seed, the same losses.
    @Test func shuffledEpochsVisitEveryPairOnce() throws {
        let data = try CaptionedPhotoDataset(checkpoint: "clip/tiny-quickgelu-argmax")
        let model = CaptionedPhotoDataset.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
        var settings = TrainingSettings()
        settings.batchSize = 3
        settings.epochs = 2
        settings.learningRate = 0
        let dataset = try ImageTextDataset(directory: data.url)
        let first = try ContrastiveTrainingPipeline(directory: model, frozen: ImageTextContrastiveTraining.lockedImage).train(dataset, settings: settings).history
        let second = try ContrastiveTrainingPipeline(directory: model, frozen: ImageTextContrastiveTraining.lockedImage).train(dataset, settings: settings).history
        #expect(first.map(\.step) == [1, 2, 3, 4])  // 4 pairs in batches of 3: a short batch ends each epoch
        #expect(first.map(\.epoch) == [0.5, 1, 1.5, 2])
        #expect(first == second)
        settings.shuffleSeed = nil
        let ordered = try ContrastiveTrainingPipeline(directory: model, frozen: ImageTextContrastiveTraining.lockedImage).train(dataset, settings: settings).history
        #expect(ordered.map(\.loss) != first.map(\.loss))
    }
}

@Suite struct ImageTextDatasetTests {
    @Test func csvMetadataReadsAsTheJSONLines() throws {
        let jsonl = try CaptionedPhotoDataset(checkpoint: "clip/tiny-quickgelu-argmax")
        let csv = try CaptionedPhotoDataset(checkpoint: "clip/tiny-quickgelu-argmax", metadata: { name, caption in
            "\(name),\"\(caption.replacingOccurrences(of: "\"", with: "\"\""))\""
        }, metadataFile: "metadata.csv", header: "file_name,text")
        let fromJSON = try ImageTextDataset(directory: jsonl.url), fromCSV = try ImageTextDataset(directory: csv.url)
        #expect(fromJSON.pairs.map(\.text) == jsonl.captions)
        #expect(fromCSV.pairs.map(\.text) == fromJSON.pairs.map(\.text))
        #expect(fromCSV.pairs.map(\.image.lastPathComponent) == jsonl.photos)
    }

    @Test func quotedCSVFieldsHoldCommasQuotesAndLineBreaks() throws {
        let data = try CaptionedPhotoDataset(checkpoint: "clip/tiny-quickgelu-argmax", metadata: { name, _ in
            "\"\(name)\",\"a \"\"cat\"\", or two,\nsleeping\",x"
        }, metadataFile: "metadata.csv", header: "file_name,caption,other\r")
        let dataset = try ImageTextDataset(directory: data.url, textColumn: "caption")
        #expect(dataset.pairs.count == 4)
        #expect(dataset.pairs.allSatisfy { $0.text == "a \"cat\", or two,\nsleeping" })
    }

    @Test(arguments: [
        ("metadata.jsonl", #"{"file_name": "chelsea.png"}"#, "line 1 has no text"),
        ("metadata.jsonl", #"{"text": "a cat"}"#, "line 1 has no file_name"),
        ("metadata.jsonl", #"{"file_name": "../chelsea.png", "text": "a cat"}"#, "line 1: ../chelsea.png is outside the dataset's directory"),
        ("metadata.jsonl", #"{"file_name": "dog.png", "text": "a dog"}"#, "line 1: no image file dog.png"),
        ("metadata.jsonl", "{\"file_name\": \"chelsea.png\", \"text\": \"a cat\"}\n[1, 2]", "line 2 is not a JSON object"),
        ("metadata.jsonl", "\n  \n", "no rows"),
        ("metadata.csv", "file_name,text\nchelsea.png,\"a cat", "line 2: a quoted field does not end"),
        ("metadata.csv", "file_name,text\nchelsea.png,a,cat", "line 2 has 3 fields, the header 2"),
    ])
    func badMetadataIsOneLineNamingTheFile(file: String, contents: String, message: String) throws {
        let directory = try CaptionedPhotoDataset.oneImage(metadata: file, contents: contents)
        defer { try? FileManager.default.removeItem(at: directory) }
        let error = try #require(throws: DatasetError.self) { try ImageTextDataset(directory: directory) }
        #expect(error.file == directory.appendingPathComponent(file).path)
        #expect(error.reason.hasPrefix(message), "\(error)")
    }

    @Test func aMissingDirectoryIsRefused() throws {
        let directory = CaptionedPhotoDataset.fixtures.appendingPathComponent("no-such-dataset")
        let error = try #require(throws: DatasetError.self) { try ImageTextDataset(directory: directory) }
        #expect(error.description == "\(directory.path): no such directory (a dataset is a directory of images and their metadata)")
    }

    @Test func aDirectoryWithoutMetadataIsRefused() throws {
        let directory = CaptionedPhotoDataset.fixtures.appendingPathComponent("photos")
        let error = try #require(throws: DatasetError.self) { try ImageTextDataset(directory: directory) }
        #expect(error.description == "\(directory.path): neither metadata.jsonl nor metadata.csv (an imagefolder dataset's metadata)")
    }
}
