import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMPipelines
import VLMTensor

/// End to end from files (oracle/clipseg.py): photos → decoder (EXIF applied) → ViT image processor, labels → the
/// real CLIP tokenizer padded to max_length, through CLIPSeg, sigmoid, bilinear resizing to the photo.
@Suite struct ZeroShotImageSegmentationTests {
    struct Expected: Decodable {
        struct Photo: Decodable {
            let file: String, width: Int, height: Int
            let coverage: [Double]
            let ambiguous_pixels: [Int]
        }
        struct Prompt: Decodable { let photo: String; let query: String }
        let labels: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let photos: [String: Photo]
        let sample_stride: Int
        let prompt: Prompt
    }

    static let checkpoints = ["tiny-fp16", "tiny-refined-bf16"]
    static let photos = ["landscape", "portrait", "small"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    /// Each checkpoint's fixture, loaded once for all tests (reading the CLIP tokenizer is the slow part).
    static let loaded = Dictionary(uniqueKeysWithValues: checkpoints.map { name in (name, Result { try Fixture(name) }) })

    static func fixture(_ checkpoint: String) throws -> Fixture { try loaded[checkpoint]!.get() }

    struct Fixture: Sendable {
        let directory: URL
        let expected: Expected
        let tensors: SafetensorsFile
        let pipeline: ZeroShotImageSegmentationPipeline

        init(_ checkpoint: String) throws {
            directory = ZeroShotImageSegmentationTests.fixtures.appendingPathComponent("clipseg/\(checkpoint)")
            expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
            tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
            pipeline = try ZeroShotImageSegmentationPipeline(directory: directory)
        }

        func photo(_ key: String) throws -> RGBImage {
            try ImageDecoder.decode(contentsOf: ZeroShotImageSegmentationTests.fixtures.appendingPathComponent(expected.photos[key]!.file))
        }
    }

    /// Largest difference, relative to the expected value where that exceeds 1.
    static func worstError(_ actual: [Float], _ expected: [Float]) -> Float {
        precondition(actual.count == expected.count, "\(actual.count) values vs \(expected.count)")
        return zip(actual, expected).reduce(0) { max($0, abs($1.0 - $1.1) / max(1, abs($1.1))) }
    }

    @Test(arguments: checkpoints)
    func processorOutputsAreTransformers(_ checkpoint: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let text = try fixture.pipeline.processor.textInputs(fixture.expected.labels)
        #expect(text.ids == fixture.expected.input_ids)
        #expect(text.attentionMask == fixture.expected.attention_mask)
        for key in Self.photos {
            let photo = try fixture.photo(key)
            #expect(photo.width == fixture.expected.photos[key]!.width && photo.height == fixture.expected.photos[key]!.height)
            let pixels = try fixture.pipeline.processor.pixelValues([photo])
            let expected = try fixture.tensors.tensor("\(key).pixel_values")
            #expect(pixels.shape == expected.shape)
            #expect(Self.worstError(pixels.scalars, expected.scalars) < 1e-6, "\(checkpoint) \(key)")
        }
    }

    /// Logits, probability maps resized to the photo (sampled every `sample_stride` pixels) and coverage, which may
    /// differ only by the pixels the oracle found within float rounding of 0.5.
    @Test(arguments: checkpoints, photos)
    func masksMatchTransformers(_ checkpoint: String, photo key: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let photo = try fixture.photo(key)
        let masks = try fixture.pipeline(photo, labels: fixture.expected.labels)
        let logits = try fixture.tensors.tensor("\(key).logits")
        let sampled = try fixture.tensors.tensor("\(key).probabilities_sampled")
        let expected = fixture.expected.photos[key]!
        let stride = fixture.expected.sample_stride
        let plane = logits.shape[1] * logits.shape[2], samples = sampled.shape[1] * sampled.shape[2]
        #expect(masks.map(\.label) == fixture.expected.labels)
        for (index, mask) in masks.enumerated() {
            #expect(mask.logits.shape == Array(logits.shape.dropFirst()))
            #expect(Self.worstError(mask.logits.scalars, Array(logits.scalars[(index * plane)..<((index + 1) * plane)])) < 1e-4)
            #expect(mask.probabilities.shape == [photo.height, photo.width])
            let probabilities = mask.probabilities.scalars
            let mine = Swift.stride(from: 0, to: photo.height, by: stride).flatMap { y in
                Swift.stride(from: 0, to: photo.width, by: stride).map { x in probabilities[y * photo.width + x] }
            }
            let theirs = Array(sampled.scalars[(index * samples)..<((index + 1) * samples)])
            #expect(Self.worstError(mine, theirs) < 1e-4, "\(checkpoint) \(key) \(mask.label)")
            let pixels = Double(photo.width * photo.height)
            #expect(abs(mask.coverage - expected.coverage[index]) * pixels <= Double(expected.ambiguous_pixels[index]) + 0.5,
                    "\(checkpoint) \(key) \(mask.label): coverage \(mask.coverage) vs \(expected.coverage[index])")
            let grey = mask.grayscale
            #expect(grey.count == photo.width * photo.height)
            let greySampled = Swift.stride(from: 0, to: photo.height, by: stride).flatMap { y in
                Swift.stride(from: 0, to: photo.width, by: stride).map { x in grey[y * photo.width + x] }
            }
            #expect(zip(greySampled, theirs).allSatisfy { abs(Float($0) - $1 * 255) <= 0.55 })
        }
    }

    /// An example image as the prompt (CLIPSegProcessor's visual_prompt), mixed with a text prompt.
    @Test(arguments: checkpoints)
    func imagePromptsMatchTransformers(_ checkpoint: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let example = try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent(fixture.expected.prompt.photo))
        let query = try fixture.photo(fixture.expected.prompt.query)
        let label = fixture.expected.labels[1]
        let masks = try fixture.pipeline(query, prompts: [.image(example, label: "camera"), .text(label)])
        #expect(masks.map(\.label) == ["camera", label])
        #expect(Self.worstError(masks[0].logits.scalars, try fixture.tensors.tensor("prompt.logits").scalars) < 1e-4)
        let logits = try fixture.tensors.tensor("\(fixture.expected.prompt.query).logits")
        let plane = logits.shape[1] * logits.shape[2]
        #expect(Self.worstError(masks[1].logits.scalars, Array(logits.scalars[plane..<(2 * plane)])) < 1e-4)
    }

    @Test func badPromptsAreRefused() throws {
        let fixture = try Self.fixture("tiny-fp16")
        let photo = try fixture.photo("small")
        let empty = try #require(throws: PipelineError.self) { try fixture.pipeline(photo, labels: ["cat", "  "]) }
        #expect(empty.description == "label 2 is empty")
        let long = String(repeating: "a very long label ", count: 20)
        let tooLong = try #require(throws: PipelineError.self) { try fixture.pipeline(photo, labels: ["cat", long]) }
        #expect(tooLong.description.contains("tokens long, more than the 77 the text model takes"))
        #expect(throws: PipelineError.self) { try fixture.pipeline(photo, labels: []) }
        #expect(throws: PipelineError.self) { try fixture.pipeline(photo, prompts: [.image(photo, label: "")]) }
    }

    @Test func anotherFamilysCheckpointIsRefused() throws {
        let clip = Self.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
        #expect(throws: (any Error).self) { try ZeroShotImageSegmentationPipeline(directory: clip) }
    }
}
