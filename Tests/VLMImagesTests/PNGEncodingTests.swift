import Foundation
import Testing
import VLMImages

@Suite struct PNGEncodingTests {
    static let (width, height) = (29, 17)

    /// Sample `c` of pixel (x, y), as oracle/png_interop.py computes it.
    static func pattern(channels: Int) -> [UInt8] {
        var samples: [UInt8] = []
        for y in 0..<height {
            for x in 0..<width {
                for c in 0..<channels { samples.append(UInt8((x * 37 + y * 11 + c * 85 + (x * y) % 7) % 256)) }
            }
        }
        return samples
    }

    static let colors: [(name: String, color: PNGColorType, channels: Int)] = [("gray", .gray, 1), ("rgb", .rgb, 3), ("rgba", .rgba, 4)]

    /// Decoded as Pillow's convert("RGB") does: grey replicated, alpha dropped.
    @Test(arguments: colors.indices)
    func roundTripsThroughTheDecoder(index: Int) throws {
        let (name, color, channels) = Self.colors[index]
        let samples = Self.pattern(channels: channels)
        let png = try PNGEncoding.encode(samples, width: Self.width, height: Self.height, color: color)
        let image = try ImageDecoder.decode(png, name: name)
        #expect(image.width == Self.width && image.height == Self.height)
        let rgb = (0..<(Self.width * Self.height)).flatMap { pixel in
            (0..<3).map { c in samples[pixel * channels + (channels == 1 ? 0 : c)] }
        }
        #expect(image.pixels == rgb, "\(name)")
    }

    /// The committed files are what the encoder writes, and oracle/png_interop.py found that Pillow reads them as
    /// the pattern. `VLM_WRITE_PNG_FIXTURES=1` rewrites them (then run the oracle again).
    @Test(arguments: colors.indices)
    func pillowReadsWhatTheEncoderWrites(index: Int) throws {
        let (name, color, channels) = Self.colors[index]
        let samples = Self.pattern(channels: channels)
        let png = try PNGEncoding.encode(samples, width: Self.width, height: Self.height, color: color)
        let file = Fixtures.directory.appendingPathComponent("written/\(name).png")
        if ProcessInfo.processInfo.environment["VLM_WRITE_PNG_FIXTURES"] != nil {
            try PNGEncoding.write(samples, width: Self.width, height: Self.height, color: color, to: file)
        }
        #expect(try Fixtures.bytes("written/\(name).png") == png, "\(name).png is no longer what the encoder writes")
        struct Decoded: Decodable { let mode: String, width: Int, height: Int, sha256: String }
        let pillow = try JSONDecoder().decode([String: Decoded].self, from: Data(contentsOf: Fixtures.url("written/pillow.json")))
        let read = try #require(pillow[name])
        #expect(read.width == Self.width && read.height == Self.height)
        #expect(read.sha256 == sha256Hex(samples), "Pillow decoded \(name).png to other samples")
    }

    @Test func imagesWriteAsRGB() throws {
        let image = RGBImage(width: Self.width, height: Self.height, pixels: Self.pattern(channels: 3))
        #expect(try ImageDecoder.decode(image.pngBytes(), name: "image") == image)
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("png-\(UUID().uuidString).png")
        defer { try? FileManager.default.removeItem(at: url) }
        try image.writePNG(to: url)
        #expect(try ImageDecoder.decode(contentsOf: url) == image)
    }

    @Test func badInputIsOneLineNamingTheImage() throws {
        let mismatch = try #require(throws: ImageError.self) {
            try PNGEncoding.encode([1, 2, 3], width: 2, height: 2, color: .gray, name: "mask.png")
        }
        #expect(mismatch.description.hasPrefix("mask.png: cannot write:"))
        #expect(throws: ImageError.self) { try PNGEncoding.encode([], width: 0, height: 0, color: .rgb) }
        let path = "/nonexistent-\(UUID().uuidString)/mask.png"
        let unwritable = try #require(throws: ImageError.self) {
            try PNGEncoding.write([0, 0, 0, 0], width: 2, height: 2, color: .gray, to: URL(fileURLWithPath: path))
        }
        #expect(unwritable.description.hasPrefix("\(path): cannot write:"))
        #expect(!unwritable.description.contains("\n"))
    }
}
