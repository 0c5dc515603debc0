import Foundation
import Testing
@testable import VLMImages

/// Small odd and hostile files of each class Pillow and SwiftVLM once disagreed on (PNG transparency, EXIF in PNG,
/// animated WebP, JPEG junk and broken segments, PNGs Pillow refuses), and GIF, BMP, DIB and TIFF files, with
/// transformers' `load_image` verdict on each from oracle/odd_images.py: the RGB pixels, or a refusal.
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
                                        "idat-bad-crc.png", "unknown-critical-chunk.png", "two-palettes.png",
                                        "rgb-lzw.tif", "mono-g4.tif", "palette.tif", "orientation6.tif", "two-pages.tif"]))
        #expect(refused.isSuperset(of: ["truncated-text-after-idat.png", "ztxt-method1.png", "ztxt-too-large.png",
                                        "apng-first-sequence-5.png", "exif-garbage.png", "bad-exif-jfif-dpi.jpg",
                                        "truncated.gif", "truncated.bmp", "idat-bad-adler32.png", "junk-then-truncated.jpg", "truncated.tif"]))
    }

    /// A little-endian TIFF of one 1x1 strip holding the 32-bit float 1.0, with this PhotometricInterpretation.
    static func floatTIFF(photometric: UInt32) -> [UInt8] {
        func entry(_ tag: UInt16, _ type: UInt16, _ value: UInt32) -> [UInt8] {
            withUnsafeBytes(of: tag.littleEndian, Array.init) + withUnsafeBytes(of: type.littleEndian, Array.init)
                + withUnsafeBytes(of: UInt32(1).littleEndian, Array.init) + withUnsafeBytes(of: value.littleEndian, Array.init)
        }
        let entries = [entry(256, 4, 1), entry(257, 4, 1), entry(258, 3, 32), entry(259, 3, 1), entry(262, 3, photometric),
                       entry(273, 4, 8 + 2 + 9 * 12 + 4), entry(277, 3, 1), entry(279, 4, 4), entry(339, 3, 3)]
        return [0x49, 0x49, 0x2A, 0, 8, 0, 0, 0, UInt8(entries.count), 0] + entries.flatMap { $0 } + [0, 0, 0, 0, 0, 0, 0x80, 0x3F]
    }

    /// 32-bit float grey is read as Pillow opens it (mode F) and converts it to RGB: truncated, so 1.0 is 1.
    @Test func readsFloatGreyAsPillowConvertsIt() throws {
        let image = try ImageDecoder.decode(Self.floatTIFF(photometric: 1), name: "x.tif")
        #expect(image.width == 1 && image.height == 1 && image.pixels == [1, 1, 1])
    }

    /// TIFF kinds not read (here float samples in CIELab, which Pillow has no entry for) are refused with a line
    /// naming the kind.
    @Test func namesTIFFKindsItDoesNotRead() throws {
        let error = #expect(throws: ImageError.self) { try ImageDecoder.decode(Self.floatTIFF(photometric: 8), name: "x.tif") }
        #expect(error?.description == "x.tif: unsupported image: TIFF of photometric interpretation 8, 1×32-bit samples of sample format 3, extra samples [] is not read")
    }

    /// Formats Pillow reads and SwiftVLM does not are refused with a line naming the format.
    @Test func namesFormatsItDoesNotRead() {
        let cases: [(String, [UInt8])] = [
            ("JPEG 2000", [0xFF, 0x4F, 0xFF, 0x51, 0, 0]),
            ("QOI", Array("qoif".utf8) + [UInt8](repeating: 0, count: 10)),
        ]
        for (format, bytes) in cases {
            let error = #expect(throws: ImageError.self) { try ImageDecoder.decode(bytes, name: "x") }
            #expect(error?.description == "x: unsupported image: \(format) images are not read (JPEG, PNG, WebP, GIF, BMP and TIFF are)")
        }
    }
}
