import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// End to end from files: photos → decoder → image processor, texts → tokenizer, through the model, against what
/// transformers' processor, tokenizer, model and pipeline gave (oracle/clip.py).
@Suite struct ZeroShotImageClassificationTests {
    struct Expected: Decodable {
        struct Classified: Decodable { let image: String; let scores: [Score] }
        struct Score: Decodable { let label: String; let score: Float }
        let photos: [String]
        let texts: [String]
        let input_ids: [[Int]]
        let labels: [String]
        let template: String
        let zero_shot: [Classified]
    }

    static let checkpoints = ["tiny-quickgelu-argmax", "tiny-gelu-eos-fp16", "tiny-sharded-bf16"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    struct Fixture {
        let directory: URL
        let expected: Expected
        let tensors: SafetensorsFile
        let photos: [RGBImage]

        init(_ checkpoint: String) throws {
            directory = ZeroShotImageClassificationTests.fixtures.appendingPathComponent("clip/\(checkpoint)")
            expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
            tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
            photos = try expected.photos.map { try ImageDecoder.decode(contentsOf: ZeroShotImageClassificationTests.fixtures.appendingPathComponent("photos/\($0)")) }
        }
    }

    static func maxAbsDifference(_ a: Tensor, _ b: Tensor) -> Float {
        #expect(a.shape == b.shape)
        return zip(a.scalars, b.scalars).reduce(0) { max($0, abs($1.0 - $1.1)) }
    }

    static func lowestCosine(_ a: Tensor, _ b: Tensor) -> Float {
        #expect(a.shape == b.shape && a.rank == 2)
        let width = a.shape[1]
        return (0..<a.shape[0]).map { row in
            let (x, y) = (a.scalars[(row * width)..<((row + 1) * width)], b.scalars[(row * width)..<((row + 1) * width)])
            let dot = zip(x, y).reduce(0) { $0 + $1.0 * $1.1 }
            return dot / (x.reduce(0) { $0 + $1 * $1 }.squareRoot() * y.reduce(0) { $0 + $1 * $1 }.squareRoot())
        }.min() ?? 0
    }

    // transformers ran in fp32 (the oracle loads every checkpoint with dtype=torch.float32), so the comparisons to
    // 1e-4 ask for fp32 layers; the checkpoint stored in bf16 would get bf16 layers by default.

    @Test(arguments: checkpoints)
    func imageEmbeddingsFromPhotoFiles(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, precision: .float32)
        #expect(Self.maxAbsDifference(try pipeline.imageProcessor.preprocess(test.photos).pixelValues, try test.tensors.tensor("pixel_values")) < 1e-5)
        #expect(Self.maxAbsDifference(try pipeline.imageEmbeddings(test.photos), try test.tensors.tensor("image_embeds")) < 1e-4)
    }

    @Test(arguments: checkpoints)
    func textEmbeddingsFromStrings(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, precision: .float32)
        let encodings = pipeline.tokenizer.encode(test.expected.texts, padding: .longest, truncation: true)
        #expect(encodings.map(\.ids) == test.expected.input_ids)
        #expect(Self.maxAbsDifference(try pipeline.textEmbeddings(test.expected.texts), try test.tensors.tensor("text_embeds")) < 1e-4)
    }

    @Test(arguments: checkpoints)
    func scoresMatchTheTransformersPipeline(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try ZeroShotImageClassificationPipeline(directory: test.directory, precision: .float32)
        let results = try pipeline(test.photos, candidateLabels: test.expected.labels, hypothesisTemplate: test.expected.template)
        for (result, expected) in zip(results, test.expected.zero_shot) {
            #expect(result.map(\.label) == expected.scores.map(\.label))
            for (got, want) in zip(result, expected.scores) { #expect(abs(got.score - want.score) < 1e-4) }
        }
    }

    /// bf16 and int8 layers: embeddings at cosine ≥ 0.9995 (bf16) and ≥ 0.995 (int8) to transformers' fp32 ones,
    /// and the same top label per photo that has a clear one.
    @Test(arguments: checkpoints, [(MatrixPrecision.bfloat16, Float(0.9995)), (.int8, 0.995)])
    func lowerPrecisionKeepsEmbeddingsAndTopLabels(_ checkpoint: String, _ precision: (MatrixPrecision, Float)) throws {
        let (precision, lowest) = precision
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, precision: precision)
        #expect(pipeline.precision == precision.available)
        #expect(Self.lowestCosine(try pipeline.imageEmbeddings(test.photos), try test.tensors.tensor("image_embeds")) >= lowest)
        #expect(Self.lowestCosine(try pipeline.textEmbeddings(test.expected.texts), try test.tensors.tensor("text_embeds")) >= lowest)
        let results = try ZeroShotImageClassificationPipeline(encoder: pipeline)(
            test.photos, candidateLabels: test.expected.labels, hypothesisTemplate: test.expected.template)
        // Random tiny models leave near-ties (0.3186 against 0.3171 for one photo) that any rounding may flip; where
        // transformers' top label leads by 0.01 or more, it must stay on top.
        let clear = zip(results, test.expected.zero_shot).filter { $1.scores[0].score - $1.scores[1].score >= 0.01 }
        #expect(clear.count >= 3)
        #expect(clear.map { $0.0.first?.label } == clear.map { $0.1.scores.first?.label })
    }

    /// Image–text retrieval's scores: transformers' `logits_per_image` for the templated labels, which the oracle
    /// tokenized as `vlm match` pads CLIP's texts (to the longest), and cosines that the logits scale.
    @Test(arguments: checkpoints)
    func similaritiesAreTheModelsLogitsPerImage(_ checkpoint: String) throws {
        let test = try Fixture(checkpoint)
        let pipeline = try DualEncoderPipeline(directory: test.directory, task: .match, precision: .float32)
        try TemplatedSimilarities.expect(pipeline, photos: test.photos, labels: test.expected.labels,
                                         template: test.expected.template,
                                         logitsPerImage: test.tensors.tensor("logits_per_image")) {
            let model = try #require($0 as? CLIPModel)
            return (model.logitScale, 0)
        }
    }

    @Test func precisionDefaultsToTheCheckpointsOwn() throws {
        for checkpoint in Self.checkpoints {
            let pipeline = try DualEncoderPipeline(directory: try Fixture(checkpoint).directory)
            let stored: MatrixPrecision = checkpoint.hasSuffix("bf16") ? .bfloat16 : .float32
            #expect(pipeline.precision == stored.available, "\(checkpoint)")
        }
    }

    @Test func emptyLabelListIsRefused() throws {
        let test = try Fixture(Self.checkpoints[0])
        let pipeline = try ZeroShotImageClassificationPipeline(directory: test.directory)
        #expect(throws: PipelineError.self) { try pipeline(test.photos, candidateLabels: []) }
    }
}
