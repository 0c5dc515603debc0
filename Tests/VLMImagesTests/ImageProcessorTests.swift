import Foundation
import Testing
@testable import VLMImages

@Suite struct ImageProcessorTests {
    static func pixels(_ url: URL) throws -> [Float] {
        try Data(contentsOf: url).withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
    }

    static func worstDifference(_ tensor: [Float], _ reference: [Float]) -> Float {
        zip(tensor, reference).map { abs($0 - $1) }.max() ?? 0
    }

    @Test(arguments: Fixtures.manifest.clip)
    func clipMatchesTransformers(_ expected: Fixtures.CLIPCase) throws {
        let config = try Data(contentsOf: Fixtures.url(expected.config).appendingPathComponent("preprocessor_config.json"))
        let processor = StandardImageProcessor(config: try StandardImageProcessorConfig(json: config, defaults: .clip))
        let images = try expected.images.map { try ImageDecoder.decode(contentsOf: Fixtures.url($0)) }
        let pixelValues = try processor.preprocess(images).pixelValues
        #expect(pixelValues.shape == expected.shape)
        let reference = try Self.pixels(Fixtures.url(expected.pixel_values))
        try #require(reference.count == pixelValues.count)
        #expect(Self.worstDifference(pixelValues.scalars, reference) <= 1e-6)
    }

    /// The processor transformers' AutoImageProcessor picks for a directory, picked here too: the same pixels.
    @Test(arguments: Fixtures.manifest.processors)
    func chosenLikeAutoImageProcessor(_ expected: Fixtures.ProcessorCase) throws {
        let directory = Fixtures.url(expected.directory)
        let modelType = (try? JSONSerialization.jsonObject(with: Data(contentsOf: directory.appendingPathComponent("config.json"))))
            .flatMap { ($0 as? [String: Any])?["model_type"] as? String }
        let processor = try ImageProcessorRegistry.load(directory: directory, modelType: modelType)
        let images = try expected.images.map { try ImageDecoder.decode(contentsOf: Fixtures.url($0)) }
        let processed = try processor.preprocess(images)
        #expect(processed.pixelValues.shape == expected.shape)
        #expect(processed.imageSizes == images.map { ImageSize(height: $0.height, width: $0.width) })
        let reference = try Self.pixels(directory.appendingPathComponent("pixel_values.f32"))
        try #require(reference.count == processed.pixelValues.count)
        #expect(Self.worstDifference(processed.pixelValues.scalars, reference) <= 1e-6)
        #expect(ImageProcessorRegistry.supportedTypes.contains(ImageProcessorRegistry.baseClassName(expected.class)))
    }

    @Test func classNamesAsTransformersReadsThem() {
        #expect(ImageProcessorRegistry.baseClassName("CLIPImageProcessorFast") == "CLIPImageProcessor")
        #expect(ImageProcessorRegistry.baseClassName("BlipImageProcessorPil") == "BlipImageProcessor")
        #expect(ImageProcessorRegistry.baseClassName("CLIPFeatureExtractor") == "CLIPImageProcessor")
        #expect(ImageProcessorRegistry.baseClassName("SiglipImageProcessor") == "SiglipImageProcessor")
    }

    @Test func unknownOrMissingProcessorsAreOneLineErrors() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("processor-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let missing = try #require(throws: ImageProcessorError.self) { try ImageProcessorRegistry.load(directory: directory) }
        #expect(missing.description.contains(directory.path))

        let file = directory.appendingPathComponent("preprocessor_config.json")
        try Data(#"{"image_processor_type": "Idefics3ImageProcessorFast"}"#.utf8).write(to: file)
        let unknown = try #require(throws: ImageProcessorError.self) { try ImageProcessorRegistry.load(directory: directory) }
        #expect(unknown.description.contains(file.path) && unknown.description.contains("Idefics3ImageProcessorFast")
                && unknown.description.contains("BlipImageProcessor, CLIPImageProcessor, LlavaNextImageProcessor, Siglip2ImageProcessor, SiglipImageProcessor, ViTImageProcessor"))
        #expect(!unknown.description.contains("\n"))

        try Data(#"{"size": 30}"#.utf8).write(to: file)
        let unnamed = try #require(throws: ImageProcessorError.self) {
            try ImageProcessorRegistry.load(directory: directory, modelType: "bert")
        }
        #expect(unnamed.description.contains("\"bert\""))
        #expect(try ImageProcessorRegistry.load(directory: directory, modelType: "clip") is StandardImageProcessor)

        try Data(#"{"image_processor_type": "CLIPImageProcessor", "size": {"longest_edge": 3}}"#.utf8).write(to: file)
        let invalid = try #require(throws: ImageProcessorError.self) { try ImageProcessorRegistry.load(directory: directory) }
        #expect(invalid.description.contains(file.path) && invalid.description.contains("size"))
    }

    @Test func imagesOfDifferentSizesWithoutACropAreRefused() throws {
        var config = StandardImageProcessorConfig.clip
        config.doCenterCrop = false
        let images = [RGBImage(width: 4, height: 2, pixels: Array(repeating: 9, count: 24)),
                      RGBImage(width: 2, height: 4, pixels: Array(repeating: 9, count: 24))]
        #expect(throws: ImageProcessorError.self) { try StandardImageProcessor(config: config).preprocess(images) }
    }

    @Test func configForms() throws {
        func decode(_ json: String, defaults: StandardImageProcessorConfig = .clip) throws -> StandardImageProcessorConfig {
            try StandardImageProcessorConfig(json: Data(json.utf8), defaults: defaults)
        }
        let old = try decode(#"{"size": 224, "crop_size": 224, "resample": 3}"#)
        let new = try decode(#"{"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}"#)
        #expect(old == new)
        #expect(old == StandardImageProcessorConfig.clip)
        #expect(try decode(#"{"size": null, "crop_size": [10, 12]}"#).cropWidth == 12)
        #expect(try decode(#"{"size": 30, "default_to_square": true}"#).size == .exact(height: 30, width: 30))
        #expect(try decode(#"{"size": 30}"#, defaults: .blip).size == .exact(height: 30, width: 30))
        #expect(try decode("{}", defaults: .blip) == StandardImageProcessorConfig.blip)
        #expect(throws: ImageProcessorError.self) { try decode(#"{"size": {"longest_edge": 224}}"#) }
        #expect(throws: ImageProcessorError.self) { try decode(#"{"resample": 9}"#) }
        #expect(throws: ImageProcessorError.self) { try decode(#"{"image_mean": [0.5, 0.5]}"#) }
    }

    @Test func shortestEdgeTruncates() {
        // 451x300 → 224 * 451 / 300 = 336.75, truncated as transformers' int() does.
        let size = ResizeTarget.shortestEdge(224).outputSize(height: 300, width: 451)
        #expect(size.height == 224 && size.width == 336)
        let tall = ResizeTarget.shortestEdge(224).outputSize(height: 640, width: 427)
        #expect(tall.height == 335 && tall.width == 224)
    }
}
