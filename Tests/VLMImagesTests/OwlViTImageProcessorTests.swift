import Foundation
import Testing
@testable import VLMImages

/// OwlViTImageProcessorPil's and Owlv2ImageProcessorPil's configs as the registry reads them (their pixel values are
/// checked against transformers end to end in ZeroShotObjectDetectionTests).
@Suite struct OwlViTImageProcessorTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/owlvit")

    @Test func defaultsAreTransformers() throws {
        let config = try StandardImageProcessorConfig.owlViT(json: Data("{}".utf8), file: "preprocessor_config.json")
        #expect(config.size == .exact(height: 768, width: 768))
        #expect(config.resample == .bicubic)
        #expect(!config.doCenterCrop && config.cropHeight == 768 && config.cropWidth == 768)
        #expect(config.imageMean == StandardImageProcessorConfig.clip.imageMean)
        #expect(config.imageStd == StandardImageProcessorConfig.clip.imageStd)
    }

    /// The google/owlvit form: an int size read as a square, a centre crop, the legacy feature extractor name.
    @Test func legacyConfigLoadsFromTheRegistry() throws {
        let processor = try ImageProcessorRegistry.load(directory: Self.fixtures.appendingPathComponent("tiny-patch32-bf16"))
        let config = try #require(processor as? StandardImageProcessor).config
        #expect(config.size == .exact(height: 112, width: 112))
        #expect(config.doCenterCrop && config.cropHeight == 96 && config.cropWidth == 96)
        let current = try ImageProcessorRegistry.load(directory: Self.fixtures.appendingPathComponent("tiny-patch16-fp16"))
        #expect(try #require(current as? StandardImageProcessor).config.size == .exact(height: 64, width: 64))
    }

    /// The early configs' `rescale` flag wins over `do_rescale`, as OwlViTImageProcessorPil.__init__ reads it.
    @Test func legacyRescaleFlag() throws {
        let off = try StandardImageProcessorConfig.owlViT(json: Data(#"{"rescale": false, "do_rescale": true}"#.utf8), file: "p.json")
        #expect(!off.doRescale)
        #expect(try StandardImageProcessorConfig.owlViT(json: Data(#"{"do_rescale": true}"#.utf8), file: "p.json").doRescale)
        #expect(throws: ImageProcessorError.self) {
            try StandardImageProcessorConfig.owlViT(json: Data(#"{"rescale": "yes"}"#.utf8), file: "p.json")
        }
    }

    @Test func owlv2DefaultsAreTransformers() throws {
        let processor = try Owlv2ImageProcessor(json: Data("{}".utf8))
        #expect(processor.config.size == .exact(height: 960, width: 960))
        #expect(processor.doPad && processor.antiAliasing && !processor.config.doCenterCrop)
        #expect(processor.config.imageMean == StandardImageProcessorConfig.clip.imageMean)
        let loaded = try ImageProcessorRegistry.load(directory: Self.fixtures.appendingPathComponent("v2-patch32-bf16"))
        #expect(try #require(loaded as? Owlv2ImageProcessor).config.size == .exact(height: 96, width: 96))
    }

    /// transformers hands `resample` to `resize` where it takes `anti_aliasing`: nearest (0) or null turns it off.
    @Test func owlv2ResampleDecidesAntiAliasing() throws {
        #expect(try !Owlv2ImageProcessor(json: Data(#"{"resample": 0}"#.utf8)).antiAliasing)
        #expect(try !Owlv2ImageProcessor(json: Data(#"{"resample": null}"#.utf8)).antiAliasing)
        #expect(try Owlv2ImageProcessor(json: Data(#"{"resample": 3}"#.utf8)).antiAliasing)
        #expect(try !Owlv2ImageProcessor(json: Data(#"{"do_pad": false}"#.utf8)).doPad)
        #expect(throws: ImageProcessorError.self) { try Owlv2ImageProcessor(json: Data(#"{"size": {"shortest_edge": 960}}"#.utf8)) }
    }

    /// A 2x1 image padded to 2x2 with zeros below, then kept at 2x2 (zoom 1, no filter): the padding is black.
    @Test func owlv2PadsWithZerosAtTheBottom() throws {
        let processor = try Owlv2ImageProcessor(json: Data(#"{"size": 2, "do_normalize": false}"#.utf8))
        let image = RGBImage(width: 2, height: 1, pixels: [255, 0, 0, 0, 255, 0])
        let pixels = try processor.preprocess([image]).pixelValues
        #expect(pixels.shape == [1, 3, 2, 2])
        #expect(pixels.scalars == [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0])
    }
}
