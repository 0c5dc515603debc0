import Foundation
import Testing
@testable import VLMImages

@Suite struct DecodingTests {
    @Test func knownDigest() {
        // FIPS 180-4's "abc" example, so the digest comparisons below mean something.
        #expect(sha256Hex(Array("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test(arguments: Fixtures.manifest.decode)
    func decodesLikePillow(_ expected: Fixtures.DecodeCase) throws {
        let image = try ImageDecoder.decode(contentsOf: Fixtures.url(expected.file))
        #expect(image.width == expected.width)
        #expect(image.height == expected.height)
        #expect(sha256Hex(image.pixels) == expected.sha256)
    }

    @Test func coversEveryMode() {
        let modes = Set(Fixtures.manifest.decode.map(\.pillow_mode))
        #expect(modes == ["1", "L", "LA", "I;16", "P", "RGB", "RGBA", "CMYK"])
    }

    static func pngHeader(width: UInt32, height: UInt32) -> [UInt8] {
        func be32(_ v: UInt32) -> [UInt8] { [UInt8(v >> 24), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)] }
        let ihdr = Array("IHDR".utf8) + be32(width) + be32(height) + [8, 2, 0, 0, 0]
        return [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + be32(13) + ihdr + be32(crc32(ihdr))
    }

    @Test func refusesBadInput() throws {
        let jpeg = try Fixtures.bytes("rocket.jpg"), png = try Fixtures.bytes("chelsea.png")
        let webp = try Fixtures.bytes("lossy.webp")
        var generator = SystemRandomNumberGenerator()
        let cases: [(String, [UInt8])] = [
            ("truncated.jpg", Array(jpeg.prefix(jpeg.count / 2))),
            ("headeronly.jpg", Array(jpeg.prefix(600))),
            ("truncated.png", Array(png.prefix(png.count / 2))),
            ("truncated.webp", Array(webp.prefix(webp.count / 2))),
            ("random.bin", (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }),
            ("empty.png", []),
            ("huge.png", Self.pngHeader(width: 100_000, height: 100_000)),
            ("wide.png", Self.pngHeader(width: 89_478_486, height: 1)),
            ("zero.png", Self.pngHeader(width: 0, height: 10)),
            ("magic.jpg", [0xFF, 0xD8, 0xFF]),
            ("riff.webp", Array("RIFF\u{0}\u{0}\u{0}\u{0}WEBPVP8 ".utf8)),
        ]
        for (name, data) in cases {
            #expect(throws: ImageError.self, "\(name)") { try ImageDecoder.decode(data, name: name) }
        }
        let error = #expect(throws: ImageError.self) { try ImageDecoder.decode(Self.pngHeader(width: 100_000, height: 100_000), name: "huge.png") }
        #expect(error?.description.hasPrefix("huge.png: 100000x100000") == true)
        // Under the pixel limit, but 240 MB from a 33-byte header: refused before the image is allocated.
        let short = #expect(throws: ImageError.self) { try ImageDecoder.decode(Self.pngHeader(width: 9_000, height: 9_000), name: "short.png") }
        #expect(short?.description == "short.png: corrupt or truncated PNG: truncated: 33 bytes cannot hold the 9000x9000 image the header declares")
        #expect(throws: ImageError.self) { try ImageDecoder.decode(contentsOf: Fixtures.url("missing.png")) }
    }

    /// /dev/zero reports no size and never ends: read, it would fill memory. Devices and pipes are refused unread.
    @Test func refusesFilesThatAreNotRegular() throws {
        let error = #expect(throws: ImageError.self) { try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: "/dev/zero")) }
        #expect(error?.description == "/dev/zero: cannot read: not a regular file")
    }
}
