import Foundation
import Testing
@testable import VLMImages

/// Small odd and hostile files of each class Pillow and SwiftVLM once disagreed on (PNG transparency, EXIF in PNG,
/// animated WebP, JPEG junk and broken segments, PNGs Pillow refuses), and GIF, BMP and DIB files, with transformers'
/// `load_image` verdict on each from oracle/odd_images.py: the RGB pixels, or a refusal.
enum OddImages {
    static let directory = Fixtures.directory.deletingLastPathComponent().appendingPathComponent("odd-images")

    struct Case: Decodable, Sendable, CustomStringConvertible {
        let file: String
        let width: Int?, height: Int?, sha256: String?, refused: String?
        var description: String { file }
    }

    static let cases: [Case] = {
        let url = directory.appendingPathComponent("manifest.json")
        do {
            return try JSONDecoder().decode([Case].self, from: Data(contentsOf: url))
        } catch {
            fatalError("cannot read \(url.path): \(error)")
        }
    }()
}

@Suite struct OddImageTests {
    @Test(arguments: OddImages.cases)
    func agreesWithLoadImage(_ expected: OddImages.Case) throws {
        let url = OddImages.directory.appendingPathComponent(expected.file)
        if let sha256 = expected.sha256 {
            let image = try ImageDecoder.decode(contentsOf: url)
            #expect(image.width == expected.width && image.height == expected.height)
            #expect(sha256Hex(image.pixels) == sha256)
        } else {
            let error = #expect(throws: ImageError.self, "Pillow refuses it: \(expected.refused ?? "")") {
                try ImageDecoder.decode(contentsOf: url)
            }
            #expect(error.map { !$0.description.contains("\n") && $0.description.hasPrefix(url.path + ": ") } == true)
        }
    }

    /// Every class the fixtures stand for is there, decoded and refused.
    @Test func coversEachClass() {
        let decoded = Set(OddImages.cases.filter { $0.sha256 != nil }.map(\.file))
        let refused = Set(OddImages.cases.filter { $0.refused != nil }.map(\.file))
        #expect(decoded.isSuperset(of: ["palette-alpha.png", "rgb-trns.png", "exif8-after-idat.png", "exif3-imagemagick.png",
                                        "animated.webp", "junk-before-marker.jpg", "ff00-before-marker.jpg", "bad-exif.jpg",
                                        "animated.gif", "frame-in-screen.gif", "interlaced.gif", "rle8.bmp", "rgb24.dib",
                                        "idat-bad-crc.png", "unknown-critical-chunk.png", "two-palettes.png"]))
        #expect(refused.isSuperset(of: ["truncated-text-after-idat.png", "ztxt-method1.png", "ztxt-too-large.png",
                                        "apng-first-sequence-5.png", "exif-garbage.png", "bad-exif-jfif-dpi.jpg",
                                        "truncated.gif", "truncated.bmp", "idat-bad-adler32.png", "junk-then-truncated.jpg"]))
    }

    /// Formats Pillow reads and SwiftVLM does not are refused with a line naming the format.
    @Test func namesFormatsItDoesNotRead() {
        let cases: [(String, [UInt8])] = [
            ("TIFF", [0x49, 0x49, 0x2A, 0x00, 8, 0, 0, 0]),
            ("QOI", Array("qoif".utf8) + [UInt8](repeating: 0, count: 10)),
        ]
        for (format, bytes) in cases {
            let error = #expect(throws: ImageError.self) { try ImageDecoder.decode(bytes, name: "x") }
            #expect(error?.description == "x: unsupported image: \(format) images are not read (JPEG, PNG, WebP, GIF and BMP are)")
        }
    }
}
