import Foundation
import Testing
@testable import VLMImages

@Suite struct ResizeTests {
    static let filters: [String: ResampleFilter] = [
        "nearest": .nearest, "lanczos": .lanczos, "bilinear": .bilinear, "bicubic": .bicubic, "box": .box,
        "hamming": .hamming,
    ]

    @Test(arguments: Fixtures.manifest.resize)
    func matchesPillow(_ expected: Fixtures.ResizeCase) throws {
        let source = try ImageDecoder.decode(contentsOf: Fixtures.url(expected.source))
        let filter = try #require(Self.filters[expected.filter])
        let resized = source.resized(width: expected.width, height: expected.height, filter: filter)
        #expect(resized.width == expected.width && resized.height == expected.height)
        #expect(sha256Hex(resized.pixels) == expected.sha256)
    }

    @Test func centerCropMatchesSlicing() throws {
        let image = try ImageDecoder.decode(contentsOf: Fixtures.url("rgb8.png"))  // 61x47
        let crop = image.centerCropped(width: 20, height: 10)
        // transformers: top = (47 - 10) // 2 = 18, left = (61 - 20) // 2 = 20.
        #expect(Array(crop.pixels[0..<3]) == Array(image.pixels[(18 * 61 + 20) * 3..<(18 * 61 + 20) * 3 + 3]))
        let padded = image.centerCropped(width: 64, height: 50)
        // Padding ceil(3 / 2) = 2 columns left, ceil(3 / 2) = 2 rows on top.
        #expect(padded.pixels[0..<(2 * 64 * 3)].allSatisfy { $0 == 0 })
        #expect(Array(padded.pixels[(2 * 64 + 2) * 3..<(2 * 64 + 2) * 3 + 3]) == Array(image.pixels[0..<3]))
        #expect(padded.pixels[((2 * 64) + 63) * 3] == 0)
    }
}
