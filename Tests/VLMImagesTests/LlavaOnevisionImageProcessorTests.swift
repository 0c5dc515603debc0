import Foundation
import Testing
@testable import VLMImages

/// `LlavaOnevisionImageProcessor` against `LlavaOnevisionImageProcessorPil` (oracle/llava_onevision.py): real photos,
/// square and very wide or tall, in the class's default config and the tiny checkpoints', each photo tiled as its
/// prompt's only image, and all of them as one conversation's images (padded to squares, not tiled).
@Suite struct LlavaOnevisionImageProcessorTests {
    struct Case: Decodable {
        let name: String
        let layout: String
        let images: [String]
        let shape: [Int]
        let image_sizes: [[Int]]
        let batch_num_images: [Int]
        let checksums: [[String]]
        let samples: [[Double]]
    }

    static let root = Fixtures.directory.deletingLastPathComponent()
    static let file = root.appendingPathComponent("llava-onevision/image_processor.json")

    /// A case and its processor config, as transformers saved it.
    static func load(_ name: String, _ layout: String) throws -> (Case, Data) {
        let data = try Data(contentsOf: file)
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let raw = try #require((object["cases"] as? [[String: Any]])?.first {
            $0["name"] as? String == name && $0["layout"] as? String == layout
        })
        let config = try JSONSerialization.data(withJSONObject: try #require(raw["config"]))
        return (try JSONDecoder().decode(Case.self, from: JSONSerialization.data(withJSONObject: raw)), config)
    }

    @Test(arguments: ["defaults", "tiny"], ["single", "conversation"])
    func pixelValuesMatchTransformers(_ name: String, _ layout: String) throws {
        let (expected, config) = try Self.load(name, layout)
        let processor = try LlavaOnevisionImageProcessor(json: config)
        let photos = try LlavaNextImageProcessorTests.photos(expected.images)
        let processed = try layout == "single" ? processor.preprocess(photos) : processor.preprocess(conversation: photos)
        #expect(processed.pixelValues.shape == expected.shape)
        #expect(processed.imageSizes.map { [$0.height, $0.width] } == expected.image_sizes)
        #expect(processed.tiled == Array(repeating: expected.batch_num_images == [1, 1, 1, 1, 1], count: photos.count))
        let scalars = processed.pixelValues.scalars
        let perImage = scalars.count / expected.images.count
        for (index, checksum) in expected.checksums.enumerated() {
            #expect(LlavaNextImageProcessorTests.checksum(scalars[(index * perImage)..<((index + 1) * perImage)]) == checksum,
                    "\(name) \(layout): \(expected.images[index])")
        }
        for sample in expected.samples {
            #expect(abs(Double(scalars[Int(sample[0])]) - sample[1]) <= 1e-6, "\(name) \(layout): value \(Int(sample[0]))")
        }
    }

    /// An empty config is the class's defaults, which the "defaults" case saved in full.
    @Test func configTakesTheClassDefaults() throws {
        let (_, saved) = try Self.load("defaults", "single")
        let empty = try LlavaOnevisionImageProcessor(json: Data("{}".utf8)).config
        #expect(empty == (try LlavaOnevisionImageProcessor(json: saved).config))
        #expect(empty.standard == .llavaOnevision && empty.tileSize == 384 && empty.baseSize == ImageSize(height: 384, width: 384))
        #expect(empty.imageGridPinpoints.count == 36 && empty.imageGridPinpoints.last == ImageSize(height: 2304, width: 2304))
        // A config that names a crop size tiles at it.
        let cropped = try LlavaOnevisionImageProcessor(json: Data(#"{"crop_size": {"height": 336, "width": 336}}"#.utf8)).config
        #expect(cropped.tileSize == 336)
        let error = try #require(throws: ImageProcessorError.self) {
            try LlavaOnevisionImageProcessor(json: Data(#"{"image_grid_pinpoints": [[384]]}"#.utf8))
        }
        #expect(!error.description.contains("\n"))
    }

    @Test func chosenForCheckpointsAndModelType() throws {
        let checkpoint = Self.root.appendingPathComponent("llava-onevision/qwen2-layers-fp16")
        #expect(try ImageProcessorRegistry.load(directory: checkpoint) is LlavaOnevisionImageProcessor)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("llava-onevision-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data("{}".utf8).write(to: directory.appendingPathComponent("preprocessor_config.json"))
        #expect(try ImageProcessorRegistry.load(directory: directory, modelType: "llava_onevision") is LlavaOnevisionImageProcessor)
    }

    @Test func paddingToASquareCentresTheImage() {
        let wide = RGBImage(width: 3, height: 1, pixels: [1, 1, 1, 2, 2, 2, 3, 3, 3])
        let background: [UInt8] = [9, 8, 7]
        #expect(wide.paddedToSquare(background: background).pixels
                == [9, 8, 7, 9, 8, 7, 9, 8, 7, 1, 1, 1, 2, 2, 2, 3, 3, 3, 9, 8, 7, 9, 8, 7, 9, 8, 7])
        let tall = RGBImage(width: 2, height: 4, pixels: Array(1...24))
        let padded = tall.paddedToSquare(background: background)
        #expect(padded.width == 4 && padded.height == 4)
        #expect(Array(padded.pixels[0..<12]) == [9, 8, 7, 1, 2, 3, 4, 5, 6, 9, 8, 7])
    }
}
