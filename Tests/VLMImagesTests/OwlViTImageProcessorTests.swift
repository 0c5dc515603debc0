import Foundation
import Testing
@testable import VLMImages

/// OwlViTImageProcessorPil's configs as the registry reads them (its pixel values are checked against transformers
/// end to end in ZeroShotObjectDetectionTests).
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
}
