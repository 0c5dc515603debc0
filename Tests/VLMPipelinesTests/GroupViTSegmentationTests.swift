import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// GroupViT end to end from files (oracle/groupvit.py): photos → decoder (EXIF applied) → CLIP's image processor
/// (resize, centre crop), labels → the real CLIP tokenizer padded to the longest, through GroupViT's segmentation
/// logits, the softmax over the labels, bilinear resizing onto the crop's share of the photo.
@Suite struct GroupViTSegmentationTests {
    struct Expected: Decodable {
        struct Region: Decodable { let top: Int, left: Int, height: Int, width: Int }
        struct Photo: Decodable {
            let file: String, width: Int, height: Int
            let region: Region
            let coverage: [Double]
            let ambiguous_pixels: [Int]
        }
        let labels: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let photos: [String: Photo]
        let sample_stride: Int
    }

    static let checkpoints = ["tiny-fp16", "tiny-legacy-bf16"]
    static let photos = ["landscape", "portrait", "small"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    /// Each checkpoint's fixture, loaded once for all tests (reading the CLIP tokenizer is the slow part).
    static let loaded = Dictionary(uniqueKeysWithValues: checkpoints.map { name in (name, Result { try Fixture(name) }) })

    static func fixture(_ checkpoint: String) throws -> Fixture { try loaded[checkpoint]!.get() }

    struct Fixture: Sendable {
        let expected: Expected
        let tensors: SafetensorsFile
        let pipeline: ZeroShotImageSegmentationPipeline

        init(_ checkpoint: String) throws {
            let directory = GroupViTSegmentationTests.fixtures.appendingPathComponent("groupvit/\(checkpoint)")
            expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
            tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
            pipeline = try ZeroShotImageSegmentationPipeline(directory: directory)
        }

        func photo(_ key: String) throws -> RGBImage {
            try ImageDecoder.decode(contentsOf: GroupViTSegmentationTests.fixtures.appendingPathComponent(expected.photos[key]!.file))
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
        #expect(fixture.pipeline.model is GroupViTModel)
        let text = try fixture.pipeline.processor.textInputs(fixture.expected.labels)
        #expect(text.ids == fixture.expected.input_ids)
        #expect(text.attentionMask == fixture.expected.attention_mask)
        for key in Self.photos {
            let photo = try fixture.photo(key)
            let expected = fixture.expected.photos[key]!
            #expect(photo.width == expected.width && photo.height == expected.height)
            let pixels = try fixture.pipeline.processor.pixelValues([photo])
            let expectedPixels = try fixture.tensors.tensor("\(key).pixel_values")
            #expect(pixels.shape == expectedPixels.shape)
            #expect(Self.worstError(pixels.scalars, expectedPixels.scalars) < 1e-6, "\(checkpoint) \(key)")
            let region = fixture.pipeline.processor.shownRegion(height: photo.height, width: photo.width)
            #expect(region == (expected.region.top, expected.region.left, expected.region.height, expected.region.width),
                    "\(checkpoint) \(key): \(region)")
        }
    }

    /// The segmentation logits, the probability maps (sampled every `sample_stride` pixels, 0 outside the crop's
    /// region) and coverage, which may differ only by the pixels the oracle found within float rounding of 0.5.
    @Test(arguments: checkpoints, photos)
    func masksMatchTransformers(_ checkpoint: String, photo key: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let photo = try fixture.photo(key)
        let masks = try fixture.pipeline(photo, labels: fixture.expected.labels)
        let logits = try fixture.tensors.tensor("\(key).segmentation_logits")
        let sampled = try fixture.tensors.tensor("\(key).probabilities_sampled")
        let expected = fixture.expected.photos[key]!
        let stride = fixture.expected.sample_stride
        let plane = logits.shape[2] * logits.shape[3], samples = sampled.shape[1] * sampled.shape[2]
        #expect(masks.map(\.label) == fixture.expected.labels)
        for (index, mask) in masks.enumerated() {
            #expect(mask.logits.shape == Array(logits.shape.dropFirst(2)))
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
        }
        // The labels share every pixel the model saw, and none outside it.
        let region = expected.region
        let sums = masks.dropFirst().reduce(masks[0].probabilities.scalars) { zip($0, $1.probabilities.scalars).map(+) }
        for y in [0, photo.height / 2, photo.height - 1] {
            for x in [0, photo.width / 2, photo.width - 1] {
                let inside = (region.top..<(region.top + region.height)).contains(y)
                    && (region.left..<(region.left + region.width)).contains(x)
                #expect(abs(sums[y * photo.width + x] - (inside ? 1 : 0)) < 1e-5, "\(checkpoint) \(key) at \(x),\(y)")
            }
        }
    }

    /// The softmax over one label is 1 wherever the model looked: the label covers exactly the crop's region.
    @Test(arguments: checkpoints)
    func oneLabelCoversTheCropsRegion(_ checkpoint: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let photo = try fixture.photo("landscape")
        let region = fixture.expected.photos["landscape"]!.region
        let masks = try fixture.pipeline(photo, labels: [fixture.expected.labels[0]])
        #expect(masks.count == 1)
        #expect(masks[0].coverage == Double(region.height * region.width) / Double(photo.height * photo.width))
    }

    @Test func imagePromptsAndBadLabelsAreRefused() throws {
        let fixture = try Self.fixture("tiny-fp16")
        let photo = try fixture.photo("small")
        let image = try #require(throws: ModelError.self) { try fixture.pipeline(photo, prompts: [.image(photo, label: "rocket")]) }
        #expect(image.description.contains("text labels only"))
        let empty = try #require(throws: PipelineError.self) { try fixture.pipeline(photo, labels: ["cat", "  "]) }
        #expect(empty.description == "label 2 is empty")
        let long = String(repeating: "a very long label ", count: 20)
        let tooLong = try #require(throws: PipelineError.self) { try fixture.pipeline(photo, labels: ["cat", long]) }
        #expect(tooLong.description.contains("tokens long, more than the 77 the text model takes"))
    }
}
