import Foundation
import Testing
@testable import VLMImages

@Suite struct CLIPProcessorTests {
    @Test(arguments: Fixtures.manifest.clip)
    func matchesTransformers(_ expected: Fixtures.CLIPCase) throws {
        let processor = try CLIPImageProcessor(
            contentsOf: Fixtures.url(expected.config).appendingPathComponent("preprocessor_config.json"))
        let images = try expected.images.map { try ImageDecoder.decode(contentsOf: Fixtures.url($0)) }
        let pixelValues = processor(images)
        #expect(pixelValues.shape == expected.shape)
        let data = try Data(contentsOf: Fixtures.url(expected.pixel_values))
        let reference = data.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
        try #require(reference.count == pixelValues.count)
        let worst = zip(pixelValues.scalars, reference).map { abs($0 - $1) }.max() ?? 0
        #expect(worst <= 1e-6)
    }

    @Test func configForms() throws {
        func decode(_ json: String) throws -> CLIPImageProcessorConfig {
            try JSONDecoder().decode(CLIPImageProcessorConfig.self, from: Data(json.utf8))
        }
        let old = try decode(#"{"size": 224, "crop_size": 224, "resample": 3}"#)
        let new = try decode(#"{"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}"#)
        #expect(old == new)
        #expect(old == CLIPImageProcessorConfig())
        #expect(try decode(#"{"size": null, "crop_size": [10, 12]}"#).cropWidth == 12)
        #expect(try decode(#"{"size": 30, "default_to_square": true}"#).size == .exact(height: 30, width: 30))
        #expect(throws: DecodingError.self) { try decode(#"{"size": {"longest_edge": 224}}"#) }
        #expect(throws: DecodingError.self) { try decode(#"{"resample": 9}"#) }
        #expect(throws: DecodingError.self) { try decode(#"{"image_mean": [0.5, 0.5]}"#) }
    }

    @Test func shortestEdgeTruncates() {
        // 451x300 → 224 * 451 / 300 = 336.75, truncated as transformers' int() does.
        let size = ResizeTarget.shortestEdge(224).outputSize(height: 300, width: 451)
        #expect(size.height == 224 && size.width == 336)
        let tall = ResizeTarget.shortestEdge(224).outputSize(height: 640, width: 427)
        #expect(tall.height == 335 && tall.width == 224)
    }
}
