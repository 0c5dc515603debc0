import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// SigLIP 2 end to end from files (oracle/siglip2.py): photos through the NaFlex processor, texts through the Gemma-style
/// tokenizer.json read as transformers' Siglip2Tokenizer reads it (lowercased, `<eos>` appended, padded to 64), scores
/// as transformers' zero-shot-image-classification pipeline gives them (each label's sigmoid).
/// Some checkpoints are stored in bf16, which runs in bf16 unless asked otherwise; transformers ran them in fp32, so
/// every pipeline here asks for fp32.
@Suite struct Siglip2PipelineTests {
    struct Expected: Decodable {
        struct Classified: Decodable { let image: String; let scores: [Score] }
        struct Score: Decodable { let label: String; let score: Float }
        let photos: [String]
        let texts: [String]
        let input_ids: [[Int]]
        let labels: [String]
        let template: String
        let prompt_ids: [[Int]]
        let left_padded_ids: [[Int]]
        let too_long_label: String
        let too_long_tokens: Int
        let zero_shot: [Classified]
        let tokenizer_strings: [[Int]]?
    }

    static let checkpoints = ["tiny-naflex-fp16", "tiny-naflex-bf16"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    struct Fixture {
        let directory: URL
        let expected: Expected
        let tensors: SafetensorsFile
        let photos: [RGBImage]

        init(_ checkpoint: String) throws {
            directory = Siglip2PipelineTests.fixtures.appendingPathComponent("siglip2/\(checkpoint)")
            expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
            tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
            photos = try expected.photos.map { try ImageDecoder.decode(contentsOf: Siglip2PipelineTests.fixtures.appendingPathComponent($0)) }
        }
    }

    static func maxAbsDifference(_ a: Tensor, _ b: Tensor) -> Float {
        #expect(a.shape == b.shape)
        return zip(a.scalars, b.scalars).reduce(0) { max($0, abs($1.0 - $1.1)) }
    }

    @Test(arguments: checkpoints)
    func patchesAndImageEmbeddingsFromPhotoFiles(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, precision: .float32)
        let processed = try pipeline.imageProcessor.preprocess(test.photos)
        #expect(Self.maxAbsDifference(processed.pixelValues, try test.tensors.tensor("pixel_values")) <= 1e-6)
        #expect(Self.maxAbsDifference(try pipeline.imageEmbeddings(test.photos), try test.tensors.tensor("image_embeds")) < 1e-4)
    }

    /// Image–text retrieval's scores: transformers' `logits_per_image` for the templated labels padded to 64, as
    /// `vlm match` pads SigLIP 2's texts, and cosines that the logits scale and shift.
    @Test(arguments: checkpoints)
    func similaritiesAreTheModelsLogitsPerImage(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, task: .match, precision: .float32)
        try TemplatedSimilarities.expect(pipeline, photos: test.photos, labels: test.expected.labels,
                                         template: test.expected.template,
                                         logitsPerImage: test.tensors.tensor("logits_per_image")) {
            let model = try #require($0 as? Siglip2Model)
            return (model.logitScale, model.logitBias)
        }
    }

    /// Siglip2Tokenizer's ids: the file's vocabulary and merges under the class's own lowercasing pipeline, whatever
    /// the file's normalizer and pre-tokenizer say, `<eos>` from add_eos_token or the file's post-processor.
    @Test(arguments: checkpoints)
    func tokenIdsAreSiglip2Tokenizers(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let tokenizer = try DualEncoderPipeline(directory: test.directory, precision: .float32).tokenizer
        let padded = tokenizer.encode(test.expected.texts, padding: .maxLength, maxLength: 64)
        #expect(padded.map(\.ids) == test.expected.input_ids)
        let prompts = test.expected.labels.map { test.expected.template.replacingOccurrences(of: "{}", with: $0) }
        #expect(tokenizer.encode(prompts, padding: .maxLength, maxLength: 64).map(\.ids) == test.expected.prompt_ids)
        if let strings = test.expected.tokenizer_strings {
            let shared = try JSONDecoder().decode([String].self, from: Data(contentsOf: Self.fixtures.appendingPathComponent("tokenizers/real/strings.json")))
            let mismatches = zip(shared, strings).filter { tokenizer.encode($0.0).ids != $0.1 }
            #expect(mismatches.isEmpty, "\(mismatches.count) of \(strings.count) differ, first: \(mismatches.first.map { $0.0 } ?? "")")
        }
    }

    /// Siglip2Tokenizer's class pads on the left where tokenizer_config.json names no padding_side (the published
    /// ones say "right").
    @Test func withoutAPaddingSideTheTokenizerPadsOnTheLeft() throws {
        let test = try Fixture("tiny-naflex-bf16")
        let copy = FileManager.default.temporaryDirectory.appendingPathComponent("siglip2-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: copy, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: copy) }
        for file in ["config.json", "tokenizer.json"] {
            try FileManager.default.copyItem(at: test.directory.appendingPathComponent(file), to: copy.appendingPathComponent(file))
        }
        let configURL = test.directory.appendingPathComponent("tokenizer_config.json")
        var config = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: configURL)) as? [String: Any])
        #expect(config.removeValue(forKey: "padding_side") as? String == "right")
        try JSONSerialization.data(withJSONObject: config).write(to: copy.appendingPathComponent("tokenizer_config.json"))
        let tokenizer = try loadTokenizer(path: copy).tokenizer
        let texts = Array(test.expected.texts.prefix(test.expected.left_padded_ids.count))
        #expect(tokenizer.encode(texts, padding: .maxLength, maxLength: 16).map(\.ids) == test.expected.left_padded_ids)
    }

    /// Siglip2Processor's text defaults: `padding="max_length", max_length=64`, whatever model_max_length says.
    @Test(arguments: checkpoints)
    func textEmbeddingsArePaddedTo64(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, precision: .float32)
        #expect(pipeline.model.textPadding == .fixed(length: 64))
        #expect(Self.maxAbsDifference(try pipeline.textEmbeddings(test.expected.texts), try test.tensors.tensor("text_embeds")) < 1e-4)
    }

    @Test(arguments: checkpoints)
    func scoresAreThePipelinesSigmoids(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try ZeroShotImageClassificationPipeline(directory: test.directory, precision: .float32)
        let results = try pipeline(test.photos, candidateLabels: test.expected.labels, hypothesisTemplate: test.expected.template)
        try #require(results.count == test.expected.zero_shot.count)
        for (result, expected) in zip(results, test.expected.zero_shot) {
            #expect(result.map(\.label) == expected.scores.map(\.label), "\(expected.image)")
            for (got, want) in zip(result, expected.scores) { #expect(abs(got.score - want.score) < 1e-4) }
        }
    }

    /// transformers' pipeline would truncate this prompt to 64 tokens and score the truncated text.
    @Test func aLabelTooLongForTheTextTowerIsRefused() throws {
        let test = try Fixture(Self.checkpoints[0])
        let pipeline = try ZeroShotImageClassificationPipeline(directory: test.directory, precision: .float32)
        let error = try #require(throws: PipelineError.self) {
            try pipeline(test.photos, candidateLabels: ["cat", test.expected.too_long_label], hypothesisTemplate: test.expected.template)
        }
        #expect(error.description.contains("\(test.expected.too_long_tokens) tokens") && error.description.contains("64"))
        #expect(!error.description.contains("\n"))
    }
}
