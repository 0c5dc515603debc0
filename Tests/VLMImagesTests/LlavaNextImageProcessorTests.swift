import Foundation
import Testing
@testable import VLMImages

/// `LlavaNextImageProcessor` against `LlavaNextImageProcessorPil` (oracle/llava_next.py): real photos, square and very
/// wide or tall, so that different tile grids are chosen, in three configs, all photos in one padded batch.
@Suite struct LlavaNextImageProcessorTests {
    struct Case: Decodable {
        let name: String
        let images: [String]
        let shape: [Int]
        let image_sizes: [[Int]]
        let checksums: [[String]]
        let samples: [[Double]]
    }

    static let root = Fixtures.directory.deletingLastPathComponent()
    static let file = root.appendingPathComponent("llava-next/image_processor.json")

    /// A case and its processor config, as transformers saved it.
    static func load(_ name: String) throws -> (Case, Data) {
        let data = try Data(contentsOf: file)
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let raw = try #require((object["cases"] as? [[String: Any]])?.first { $0["name"] as? String == name })
        let config = try JSONSerialization.data(withJSONObject: try #require(raw["config"]))
        return (try JSONDecoder().decode(Case.self, from: JSONSerialization.data(withJSONObject: raw)), config)
    }

    static func photos(_ names: [String]) throws -> [RGBImage] {
        try names.map { try ImageDecoder.decode(contentsOf: root.appendingPathComponent($0)) }
    }

    /// The oracle's exact checksum of float32 values: two wrapping sums of their bit patterns, plain and weighted by
    /// position from 1, in hex.
    static func checksum(_ values: ArraySlice<Float>) -> [String] {
        var (plain, weighted) = (UInt64(0), UInt64(0))
        values.withUnsafeBufferPointer { buffer in
            for position in buffer.indices {
                let bits = UInt64(buffer[position].bitPattern)
                plain &+= bits
                weighted &+= bits &* UInt64(position + 1)
            }
        }
        return [plain, weighted].map { String(format: "%016lx", $0) }
    }

    @Test(arguments: ["llava-hf", "tiny", "exact-size-no-crop"])
    func pixelValuesMatchTransformers(_ name: String) throws {
        let (expected, config) = try Self.load(name)
        let processor = LlavaNextImageProcessor(config: try LlavaNextImageProcessorConfig(json: config))
        let processed = try processor.preprocess(Self.photos(expected.images))
        #expect(processed.pixelValues.shape == expected.shape)
        #expect(processed.imageSizes.map { [$0.height, $0.width] } == expected.image_sizes)
        let scalars = processed.pixelValues.scalars
        let perImage = scalars.count / expected.images.count
        for (index, checksum) in expected.checksums.enumerated() {
            #expect(Self.checksum(scalars[(index * perImage)..<((index + 1) * perImage)]) == checksum,
                    "\(name): \(expected.images[index])")
        }
        for sample in expected.samples {
            #expect(abs(Double(scalars[Int(sample[0])]) - sample[1]) <= 1e-6, "\(name): value \(Int(sample[0]))")
        }
    }

    /// The grids the photos get: 2×2 for the square one, 1×3 and 3×1 for the very wide and tall ones, 1×2 for 2:1.
    @Test func bestResolutionsDiffer() throws {
        let (expected, config) = try Self.load("tiny")
        let pinpoints = try LlavaNextImageProcessorConfig(json: config).imageGridPinpoints
        let chosen = expected.image_sizes.map {
            selectBestResolution(ImageSize(height: $0[0], width: $0[1]), among: pinpoints)
        }
        #expect(chosen.map { [$0.height / 28, $0.width / 28] } == [[2, 2], [2, 2], [1, 3], [3, 1], [1, 2]])
    }

    @Test func chosenForCheckpointsAndModelType() throws {
        let checkpoint = Self.root.appendingPathComponent("llava-next/llama-tied-fp16")
        #expect(try ImageProcessorRegistry.load(directory: checkpoint) is LlavaNextImageProcessor)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("llava-next-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(#"{"size": {"shortest_edge": 336}}"#.utf8).write(to: directory.appendingPathComponent("preprocessor_config.json"))
        #expect(try ImageProcessorRegistry.load(directory: directory, modelType: "llava_next") is LlavaNextImageProcessor)
    }

    @Test func configTakesTheClassDefaults() throws {
        let config = try LlavaNextImageProcessorConfig(json: Data("{}".utf8))
        #expect(config.standard == .clip && config.doPad)
        #expect(config.imageGridPinpoints == LlavaNextImageProcessorConfig.defaultPinpoints)
        #expect(config.baseSize == ImageSize(height: 224, width: 224) && config.tileSize == 224)
        for bad in [#"{"image_grid_pinpoints": []}"#, #"{"image_grid_pinpoints": [[336]]}"#,
                    #"{"image_grid_pinpoints": [[336, 0]]}"#, #"{"size": {"max_height": 3, "max_width": 4}}"#] {
            let error = try #require(throws: ImageProcessorError.self) { try LlavaNextImageProcessorConfig(json: Data(bad.utf8)) }
            #expect(!error.description.contains("\n"), "\(bad)")
        }
    }

    @Test func differentPatchCountsNeedPadding() throws {
        var config = try LlavaNextImageProcessorConfig(json: Data(#"{"size": {"shortest_edge": 28}, "crop_size": 28, "image_grid_pinpoints": [[28, 56], [56, 56]]}"#.utf8))
        let images = [RGBImage(width: 40, height: 20, pixels: Array(repeating: 7, count: 2400)),
                      RGBImage(width: 30, height: 30, pixels: Array(repeating: 9, count: 2700))]
        let padded = try LlavaNextImageProcessor(config: config).preprocess(images)
        #expect(padded.pixelValues.shape == [2, 5, 3, 28, 28])
        // The first image's padding patches are all zero.
        #expect(padded.pixelValues.scalars[(3 * 3 * 28 * 28)..<(5 * 3 * 28 * 28)].allSatisfy { $0 == 0 })
        config.doPad = false
        #expect(throws: ImageProcessorError.unequalPatchCounts([3, 5])) { try LlavaNextImageProcessor(config: config).preprocess(images) }
    }

    @Test func regionsPadAndCrop() {
        let image = RGBImage(width: 2, height: 2, pixels: [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4])
        #expect(image.region(left: -1, top: 0, width: 3, height: 1).pixels == [0, 0, 0, 1, 1, 1, 2, 2, 2])
        #expect(image.region(left: 1, top: 1, width: 2, height: 2).pixels == [4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        #expect(image.region(left: 5, top: 0, width: 1, height: 1).pixels == [0, 0, 0])
    }
}
