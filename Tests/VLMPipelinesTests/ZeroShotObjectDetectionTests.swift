import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMPipelines
import VLMTensor

/// End to end from files (oracle/owlvit.py): photos → decoder (EXIF applied) → OWL-ViT image processor, labels → the
/// real CLIP tokenizer padded to 16 tokens, through OWL-ViT and OWLv2 (its square padding and scipy resize, its boxes
/// scaled by the longer side), to the zero-shot-object-detection pipeline's results.
@Suite struct ZeroShotObjectDetectionTests {
    struct Expected: Decodable {
        struct Result: Decodable {
            let label: String
            let score: Float
            let box: DetectionBox
        }
        struct Photo: Decodable {
            let file: String, width: Int, height: Int
            let low: [Result]
            let low_unrounded: [[Float]]
            let `default`: [Result]
        }
        struct Guided: Decodable {
            let target: String, query: String
            let threshold: Float
            let scores: [Float]
            let boxes: [[Float]]
        }
        let labels: [String]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let photos: [String: Photo]
        let low_threshold: Float
        let guided: Guided
    }

    static let checkpoints = ["tiny-patch16-fp16", "tiny-patch32-bf16", "v2-patch16-fp16", "v2-patch32-bf16"]
    static let photos = ["landscape", "portrait", "small"]
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    /// Each checkpoint's fixture, loaded once for all tests (reading the CLIP tokenizer is the slow part).
    static let loaded = Dictionary(uniqueKeysWithValues: checkpoints.map { name in (name, Result { try Fixture(name) }) })

    static func fixture(_ checkpoint: String) throws -> Fixture { try loaded[checkpoint]!.get() }

    struct Fixture: Sendable {
        let expected: Expected
        let tensors: SafetensorsFile
        let pipeline: ZeroShotObjectDetectionPipeline

        init(_ checkpoint: String) throws {
            let directory = ZeroShotObjectDetectionTests.fixtures.appendingPathComponent("owlvit/\(checkpoint)")
            expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
            tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
            pipeline = try ZeroShotObjectDetectionPipeline(directory: directory)
        }

        func photo(_ key: String) throws -> RGBImage {
            try ImageDecoder.decode(contentsOf: ZeroShotObjectDetectionTests.fixtures.appendingPathComponent(expected.photos[key]!.file))
        }
    }

    /// Whether `actual` is the pipeline's `expected` result: same label, score within 1e-4, same integer box, except
    /// that a corner within 1e-3 of an integer (`unrounded`, before truncation) may land on either side of it.
    static func matches(_ actual: DetectedObject, _ expected: Expected.Result, unrounded: [Float]?) -> Bool {
        guard actual.label == expected.label, abs(actual.score - expected.score) < 1e-4 else { return false }
        let mine = [actual.box.xmin, actual.box.ymin, actual.box.xmax, actual.box.ymax]
        let theirs = [expected.box.xmin, expected.box.ymin, expected.box.xmax, expected.box.ymax]
        return zip(mine.indices, zip(mine, theirs)).allSatisfy { index, pair in
            pair.0 == pair.1 || (unrounded.map { abs($0[index] - $0[index].rounded()) < 1e-3 } ?? false && abs(pair.0 - pair.1) == 1)
        }
    }

    @Test(arguments: checkpoints)
    func processorOutputsAreTransformers(_ checkpoint: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let text = try fixture.pipeline.processor.textInputs(fixture.expected.labels)
        #expect(text.ids == fixture.expected.input_ids)
        #expect(text.attentionMask == fixture.expected.attention_mask)
        #expect(text.ids.allSatisfy { $0.count == 16 })
        for key in Self.photos {
            let photo = try fixture.photo(key)
            #expect(photo.width == fixture.expected.photos[key]!.width && photo.height == fixture.expected.photos[key]!.height)
            let pixels = try fixture.pipeline.processor.pixelValues([photo])
            let expected = try fixture.tensors.tensor("\(key).pixel_values")
            #expect(pixels.shape == expected.shape)
            let worst = zip(pixels.scalars, expected.scalars).reduce(Float(0)) { max($0, abs($1.0 - $1.1)) }
            #expect(worst < 1e-6, "\(checkpoint) \(key)")
        }
    }

    /// A threshold low enough that most boxes pass, and the pipeline's default 0.1.
    @Test(arguments: checkpoints, photos)
    func detectionsMatchThePipeline(_ checkpoint: String, photo key: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let photo = try fixture.photo(key)
        let expected = fixture.expected.photos[key]!
        let low = try fixture.pipeline(photo, labels: fixture.expected.labels, threshold: fixture.expected.low_threshold)
        #expect(low.count == expected.low.count, "\(checkpoint) \(key)")
        for (index, (mine, theirs)) in zip(low, expected.low).enumerated() {
            #expect(Self.matches(mine, theirs, unrounded: expected.low_unrounded[index]), "\(checkpoint) \(key) #\(index): \(mine) vs \(theirs)")
        }
        let standard = try fixture.pipeline(photo, labels: fixture.expected.labels)
        #expect(standard.count == expected.default.count, "\(checkpoint) \(key)")
        #expect(zip(standard, low).allSatisfy { $0 == $1 })
        for (mine, theirs) in zip(standard, expected.default) {
            let unrounded = expected.low.firstIndex { $0.box == theirs.box && $0.label == theirs.label }.map { expected.low_unrounded[$0] }
            #expect(Self.matches(mine, theirs, unrounded: unrounded))
        }
        let top = try fixture.pipeline(photo, labels: fixture.expected.labels, threshold: fixture.expected.low_threshold, topK: 3)
        #expect(top == Array(low.prefix(3)))
    }

    /// `image_guided_detection` and `post_process_image_guided_detection` (scores are its display alphas), sorted.
    @Test(arguments: checkpoints)
    func imageGuidedDetectionMatchesTransformers(_ checkpoint: String) throws {
        let fixture = try Self.fixture(checkpoint)
        let guided = fixture.expected.guided
        let found = try fixture.pipeline(fixture.photo(guided.target), query: fixture.photo(guided.query), label: "query",
                                         threshold: guided.threshold)
        let order = guided.scores.indices.sorted { guided.scores[$0] > guided.scores[$1] }
        #expect(found.count == guided.scores.count)
        for (mine, index) in zip(found, order) {
            let box = guided.boxes[index]
            #expect(mine.label == "query")
            #expect(abs(mine.score - guided.scores[index]) < 1e-4)
            let corners = [mine.box.xmin, mine.box.ymin, mine.box.xmax, mine.box.ymax]
            #expect(zip(corners, box).allSatisfy { $0 == Int($1) || abs($1 - $1.rounded()) < 1e-3 }, "\(corners) vs \(box)")
        }
    }

    @Test func badInputIsRefused() throws {
        let fixture = try Self.fixture(Self.checkpoints[0])
        let photo = try fixture.photo("small")
        let empty = try #require(throws: PipelineError.self) { try fixture.pipeline(photo, labels: ["cat", " "]) }
        #expect(empty.description == "label 2 is empty")
        let tooLong = try #require(throws: PipelineError.self) {
            try fixture.pipeline(photo, labels: ["a photo of a very small cat sitting on a big red sofa in the sun"])
        }
        #expect(tooLong.description.contains("tokens long, more than the 16 the text model takes"))
        #expect(throws: PipelineError.self) { try fixture.pipeline(photo, labels: []) }
        #expect(throws: PipelineError.self) { try fixture.pipeline(photo, labels: ["cat"], topK: 0) }
    }

    @Test func anotherFamilysCheckpointIsRefused() throws {
        let clipseg = Self.fixtures.appendingPathComponent("clipseg/tiny-fp16")
        let error = try #require(throws: (any Error).self) { try ZeroShotObjectDetectionPipeline(directory: clipseg) }
        #expect("\(error)".contains("cannot run `vlm detect`"))
    }
}
