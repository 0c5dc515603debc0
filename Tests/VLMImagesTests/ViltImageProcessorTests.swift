import Foundation
import Testing
@testable import VLMImages

/// ViltImageProcessor against ViltImageProcessorPil (oracle/vilt.py): pixel values of a landscape, a square greyscale
/// and a portrait photo, and a padded batch with its pixel mask.
@Suite struct ViltImageProcessorTests {
    struct Expected: Decodable {
        struct Pixels: Decodable { let shape: [Int]; let file: String }
        struct Batch: Decodable { let photos: [String]; let shape: [Int]; let file: String; let pixel_mask: [[[Int]]] }
        let images: [String: Pixels]
        let batch: Batch
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    /// The photos the oracle used, by its names ("coffee.png transposed": EXIF orientation 5's view of coffee.png).
    static func photo(_ name: String) throws -> RGBImage {
        let file = name.components(separatedBy: " ")[0]
        let image = try ImageDecoder.decode(contentsOf: fixtures.appendingPathComponent("photos/\(file)"))
        return name.hasSuffix(" transposed") ? image.transposed(exifOrientation: 5) : image
    }

    static func floats(_ url: URL) throws -> [Float] {
        let data = try Data(contentsOf: url)
        return data.withUnsafeBytes { raw in (0..<(data.count / 4)).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) } }
    }

    @Test(arguments: ["b16-gelu", "b32-noqkvbias"])
    func pixelsMatchThePilProcessor(_ name: String) throws {
        let directory = Self.fixtures.appendingPathComponent("vilt/\(name)")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let processor = try #require(try ImageProcessorRegistry.load(directory: directory, modelType: "vilt") as? ViltImageProcessor)
        for (photo, reference) in expected.images {
            let processed = try processor.preprocess([Self.photo(photo)])
            #expect(processed.pixelValues.shape == reference.shape, "\(photo)")
            let values = try Self.floats(directory.appendingPathComponent(reference.file))
            #expect(zip(processed.pixelValues.scalars, values).allSatisfy { abs($0 - $1) <= 1e-6 }, "\(photo)")
            #expect(processed.pixelMask?.scalars.allSatisfy { $0 == 1 } == true)
        }
        let batch = try processor.preprocess(expected.batch.photos.map(Self.photo))
        #expect(batch.pixelValues.shape == expected.batch.shape)
        let values = try Self.floats(directory.appendingPathComponent(expected.batch.file))
        #expect(zip(batch.pixelValues.scalars, values).allSatisfy { abs($0 - $1) <= 1e-6 })
        #expect(batch.pixelMask?.scalars.map(Int.init) == expected.batch.pixel_mask.flatMap { $0.flatMap { $0 } })
    }
}
