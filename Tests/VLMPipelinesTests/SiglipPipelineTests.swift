import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// SigLIP end to end from files (oracle/siglip.py): photos through SiglipImageProcessor, texts through the converted
/// SentencePiece tokenizer padded to 64, scores as transformers' zero-shot-image-classification pipeline gives them
/// for SigLIP (each label's sigmoid).
/// Some checkpoints are stored in bf16, which runs in bf16 unless asked otherwise; transformers ran them in fp32, so
/// every pipeline here asks for fp32.
@Suite struct SiglipPipelineTests {
    struct Expected: Decodable {
        struct Classified: Decodable { let image: String; let scores: [Score] }
        struct Score: Decodable { let label: String; let score: Float }
        let photos: [String]
        let texts: [String]
        let labels: [String]
        let template: String
        let too_long_label: String
        let too_long_tokens: Int
        let zero_shot: [Classified]
    }

    static let checkpoints = ["tiny-tanh-fp16", "tiny-gelu-bf16"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    struct Fixture {
        let directory: URL
        let expected: Expected
        let tensors: SafetensorsFile
        let photos: [RGBImage]

        init(_ checkpoint: String) throws {
            directory = SiglipPipelineTests.fixtures.appendingPathComponent("siglip/\(checkpoint)")
            expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
            tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
            photos = try expected.photos.map { try ImageDecoder.decode(contentsOf: SiglipPipelineTests.fixtures.appendingPathComponent("photos/\($0)")) }
        }
    }

    static func maxAbsDifference(_ a: Tensor, _ b: Tensor) -> Float {
        #expect(a.shape == b.shape)
        return zip(a.scalars, b.scalars).reduce(0) { max($0, abs($1.0 - $1.1)) }
    }

    @Test(arguments: checkpoints)
    func pixelValuesAndImageEmbeddingsFromPhotoFiles(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, precision: .float32)
        #expect(Self.maxAbsDifference(try pipeline.imageProcessor.preprocess(test.photos).pixelValues, try test.tensors.tensor("pixel_values")) < 1e-6)
        #expect(Self.maxAbsDifference(try pipeline.imageEmbeddings(test.photos), try test.tensors.tensor("image_embeds")) < 1e-4)
    }

    /// `get_text_features` on `tokenizer(texts, padding="max_length")`: 64 tokens for "tiny-tanh-fp16", the 48 of its
    /// tokenizer's model_max_length for "tiny-gelu-bf16" (whose zero-shot prompts are still padded to 64).
    @Test(arguments: checkpoints)
    func textEmbeddingsArePaddedToModelMaxLength(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, precision: .float32)
        #expect(pipeline.model.textPadding == .maxLength(zeroShotLength: 64))
        #expect(Self.maxAbsDifference(try pipeline.textEmbeddings(test.expected.texts), try test.tensors.tensor("text_embeds")) < 1e-4)
    }

    /// Image–text retrieval's scores: transformers' `logits_per_image` for the templated labels padded to 64, which
    /// is also what `vlm match` pads to for "tiny-tanh-fp16" (its model_max_length), and cosines that the logits
    /// scale and shift.
    @Test func similaritiesAreTheModelsLogitsPerImage() throws {
        let test = try Fixture("tiny-tanh-fp16")
        let pipeline = try DualEncoderPipeline(directory: test.directory, task: .match, precision: .float32)
        try TemplatedSimilarities.expect(pipeline, photos: test.photos, labels: test.expected.labels,
                                         template: test.expected.template,
                                         logitsPerImage: test.tensors.tensor("logits_per_image")) {
            let model = try #require($0 as? SiglipModel)
            return (model.logitScale, model.logitBias)
        }
    }

    @Test(arguments: checkpoints)
    func scoresAreThePipelinesSigmoids(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try ZeroShotImageClassificationPipeline(directory: test.directory, precision: .float32)
        let results = try pipeline(test.photos, candidateLabels: test.expected.labels, hypothesisTemplate: test.expected.template)
        try #require(results.count == test.expected.zero_shot.count)
        for (result, expected) in zip(results, test.expected.zero_shot) {
            #expect(result.map(\.label) == expected.scores.map(\.label))
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
        #expect(error.description.contains(test.expected.too_long_label))
        #expect(error.description.contains("\(test.expected.too_long_tokens) tokens") && error.description.contains("64"))
        #expect(!error.description.contains("\n"))
    }
}
