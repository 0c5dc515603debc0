import Foundation
import Testing
@testable import VLMImages
import VLMTensor

/// Siglip2ImageProcessor against Siglip2ImageProcessorPil (oracle/siglip2.py): a landscape, a portrait JPEG turned
/// upright by its EXIF orientation, a 40×27 photo and a 5:1 one, in one batch: the size each is resized to, pixel
/// values of every patch (padding too), the patch mask and the patch grids.
@Suite struct Siglip2ImageProcessorTests {
    struct Expected: Decodable {
        let photos: [String]
        let image_sizes: [[Int]]
        let resized_sizes: [[Int]]
        let spatial_shapes: [[Int]]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    /// The float32 tensors of a safetensors file by name (this test target does not link the checkpoint reader).
    static func tensors(_ url: URL) throws -> [String: (shape: [Int], values: [Float])] {
        let data = try Data(contentsOf: url)
        let headerLength = data.prefix(8).enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
        let header = try #require(try JSONSerialization.jsonObject(with: data.subdata(in: 8..<(8 + headerLength))) as? [String: Any])
        var result: [String: (shape: [Int], values: [Float])] = [:]
        for (name, entry) in header where name != "__metadata__" {
            let entry = try #require(entry as? [String: Any])
            try #require(entry["dtype"] as? String == "F32")
            let offsets = try #require(entry["data_offsets"] as? [Int])
            let bytes = data.subdata(in: (8 + headerLength + offsets[0])..<(8 + headerLength + offsets[1]))
            let values = bytes.withUnsafeBytes { raw in
                (0..<(bytes.count / 4)).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) }
            }
            result[name] = (try #require(entry["shape"] as? [Int]), values)
        }
        return result
    }

    @Test(arguments: ["tiny-naflex-fp16", "tiny-naflex-bf16"])
    func patchesMatchThePilProcessor(_ name: String) throws {
        let directory = Self.fixtures.appendingPathComponent("siglip2/\(name)")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let processor = try #require(try ImageProcessorRegistry.load(directory: directory, modelType: "siglip2") as? Siglip2ImageProcessor)
        let photos = try expected.photos.map { try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0)) }
        #expect(photos.map { [$0.height, $0.width] } == expected.image_sizes)
        #expect(photos.map { processor.outputSize(height: $0.height, width: $0.width) }.map { [$0.height, $0.width] } == expected.resized_sizes)

        let processed = try processor.preprocess(photos)
        let reference = try Self.tensors(directory.appendingPathComponent("expected.safetensors"))
        let pixels = try #require(reference["pixel_values"]), mask = try #require(reference["pixel_attention_mask"])
        #expect(processed.pixelValues.shape == pixels.shape)
        #expect(zip(processed.pixelValues.scalars, pixels.values).allSatisfy { abs($0 - $1) <= 1e-6 })
        #expect(processed.pixelAttentionMask?.shape == mask.shape)
        #expect(processed.pixelAttentionMask?.scalars == mask.values)
        #expect(processed.spatialShapes?.map { [$0.height, $0.width] } == expected.spatial_shapes)
        #expect(processed.imageSizes.map { [$0.height, $0.width] } == expected.image_sizes)
    }

    /// get_image_size_for_max_num_patches' binary search, for shapes far from the photos': the result fits, and one
    /// more patch row or column along either side would not (unless that side is one patch).
    @Test func resizedSizesAreTheLargestThatFit() throws {
        let processor = try Siglip2ImageProcessor(json: Data(#"{"patch_size": 16, "max_num_patches": 256}"#.utf8), file: "test")
        for (height, width) in [(224, 224), (1, 5000), (3000, 17), (480, 640), (16, 16)] {
            let (h, w) = processor.outputSize(height: height, width: width)
            #expect(h % 16 == 0 && w % 16 == 0 && h >= 16 && w >= 16)
            #expect((h / 16) * (w / 16) <= 256, "\(height)×\(width) → \(h)×\(w)")
        }
        #expect(processor.outputSize(height: 224, width: 224) == (256, 256))
    }

    @Test func defaultsAreTheClassDefaults() throws {
        let processor = try Siglip2ImageProcessor(json: Data("{}".utf8), file: "test")
        #expect(processor.patchSize == 16 && processor.maxNumPatches == 256)
        #expect(processor.config.resample == .bilinear && processor.config.imageMean == [0.5, 0.5, 0.5])
        #expect(throws: ImageProcessorError.self) {
            try Siglip2ImageProcessor(json: Data(#"{"patch_size": 0}"#.utf8), file: "test")
        }
    }

    @Test func withoutResizeAnImageThatDoesNotCutIntoPatchesIsRefused() throws {
        let processor = try Siglip2ImageProcessor(json: Data(#"{"do_resize": false, "patch_size": 8, "max_num_patches": 4}"#.utf8), file: "test")
        let image = RGBImage(width: 20, height: 16, pixels: [UInt8](repeating: 128, count: 20 * 16 * 3))
        #expect(throws: ImageProcessorError.self) { try processor.preprocess([image]) }
        let fits = RGBImage(width: 16, height: 16, pixels: [UInt8](repeating: 128, count: 16 * 16 * 3))
        #expect(try processor.preprocess([fits]).spatialShapes == [ImageSize(height: 2, width: 2)])
    }
}
