import CZlib

/// Pillow's PngImagePlugin walk over a PNG's chunks: the header chunks up to the image data as `_open` reads them
/// (checksums verified), then the chunks after it as `load_end` reads them (checksums not verified), with every check
/// that makes Pillow refuse the file. libspng decodes the pixels; this decides whether Pillow would have, and finds the
/// orientation the way `ImageOps.exif_transpose` does (eXIf, a tEXt "exif", ImageMagick's "Raw profile type exif",
/// then XMP).
struct PNGChunks {
    /// Pillow's `MAX_TEXT_CHUNK` (`ImageFile.SAFEBLOCK`): the most a zTXt, iTXt or iCCP chunk may inflate to.
    static let maxTextChunk = 1 << 20
    /// Pillow's `MAX_TEXT_MEMORY`: the most text all text chunks together may hold.
    static let maxTextMemory = 64 * maxTextChunk

    private(set) var orientation = 1
    /// The image as Pillow decodes it, as a plain PNG for libspng: IHDR, the last PLTE before the image data, the
    /// image data Pillow reads (consecutive IDAT/fdAT chunks, their checksums unchecked, a last one cut short by the end
    /// of the file taken as far as it goes) in one IDAT chunk, IEND. Ancillary chunks, unknown critical ones and
    /// checksums, which libspng would refuse and Pillow ignores, are left behind.
    private(set) var plain: [UInt8] = []
    private var header: ArraySlice<UInt8> = []
    private var palette: ArraySlice<UInt8>?

    private let data: [UInt8]
    private var mode = ""
    private var width = 0, height = 0
    private var textMemory = 0
    private var sequence: Int?
    private var frames: Int?
    /// Whether an fcTL came before the image data, making it the animation's first frame rather than a default image.
    private var framed = false
    /// Pillow's `info` entries that `getexif` reads; later chunks replace earlier ones, as in Pillow's dictionary.
    private var exif: [UInt8]?
    /// A zTXt or iTXt "exif" leaves a string there, which `Exif.load` raises on.
    private var exifIsText = false
    private var rawProfileExif: String?
    private var xmpText: String?
    private var xmpBytes: [UInt8]?

    /// Walks `data` (a PNG, signature checked by the caller); throws the reason Pillow would refuse it.
    init(_ data: [UInt8]) throws(Refusal) {
        self.data = data
        var at = 8
        // Header chunks, up to the first image data chunk (IDAT, or an APNG fdAT).
        while true {
            guard at + 8 <= data.count else { throw Refusal("truncated chunk header") }
            let length = Int(be32(at)), kind = Array(data[(at + 4)..<(at + 8)])
            guard kind.allSatisfy(Self.isWordCharacter) else { throw Refusal("broken chunk name") }
            let body = at + 8
            if kind == Array("IDAT".utf8) {
                plain = imageData(from: at)
                at = body
                break
            }
            if kind == Array("IEND".utf8) { throw Refusal("no image data before IEND") }
            if kind == Array("fdAT".utf8) {
                try fdAT(body, length)
                plain = imageData(from: at)
                at = body
                break
            }
            let payload = try read(body, length)
            try chunk(kind, payload)
            guard body + length + 4 <= data.count else { throw Refusal("incomplete checksum in \(String(decoding: kind, as: UTF8.self))") }
            let checksum = UInt32(truncatingIfNeeded: data.withUnsafeBufferPointer { CZlib.crc32(0, $0.baseAddress! + at + 4, UInt32(4 + length)) })
            guard checksum == be32(body + length) else {
                throw Refusal("bad checksum in \(String(decoding: kind, as: UTF8.self))")
            }
            at = body + length + 4
        }
        // ImageFile's "not identified by this driver": no IHDR, a bit depth and colour type Pillow has no mode for.
        guard !mode.isEmpty, width > 0, height > 0 else { throw Refusal("no IHDR of a known bit depth and colour type") }

        // After the image data: `load_end` reads each chunk header (a broken one ends the walk quietly), stops at
        // IEND or, in an animation, at the next frame, and refuses truncated chunks and bad text.
        at += Int(be32(at - 8))
        // Pillow counts a default image (image data before any fcTL) as a frame of its own.
        let animated = frames.map { $0 > 1 || !framed } ?? false
        while true {
            at += 4  // the previous chunk's checksum, unchecked
            guard at + 8 <= data.count else { break }
            let length = Int(be32(at)), kind = Array(data[(at + 4)..<(at + 8)])
            guard kind.allSatisfy(Self.isWordCharacter) else { break }
            let body = at + 8
            if kind == Array("IEND".utf8) { break }
            if kind == Array("fcTL".utf8) && animated { break }
            if kind == Array("IDAT".utf8) {
                _ = try read(body, length)
            } else if kind == Array("fdAT".utf8) {
                try fdAT(body, length)
                _ = try read(body + 4, length - 4)
            } else {
                try chunk(kind, try read(body, length))
            }
            at = body + length
        }
        plain = rebuilt(imageData: plain)
        do throws(Orientation.UnreadableEXIF) {
            orientation = try exifOrientation() ?? xmpOrientation() ?? 1
        } catch {
            throw Refusal(error.reason)
        }
    }

    /// The data of the image data chunks from the one at `at` on, as PngImageFile.load_read gathers it.
    private func imageData(from start: Int) -> [UInt8] {
        var stream: [UInt8] = []
        var at = start
        while at + 8 <= data.count {
            let length = Int(be32(at)), kind = Array(data[(at + 4)..<(at + 8)])
            let skip = kind == Array("fdAT".utf8) ? 4 : 0
            guard kind == Array("IDAT".utf8) || kind == Array("DDAT".utf8) || skip == 4, length >= skip else { break }
            let begin = at + 8 + skip, end = at + 8 + length
            stream += data[min(begin, data.count)..<min(end, data.count)]
            at = end + 4
        }
        return stream
    }

    /// The plain PNG libspng decodes (see `plain`), made once the walk is done.
    private func rebuilt(imageData: [UInt8]) -> [UInt8] {
        func chunk(_ kind: String, _ body: some Collection<UInt8>) -> [UInt8] {
            let bytes = Array(kind.utf8) + body
            let crc = UInt32(truncatingIfNeeded: bytes.withUnsafeBufferPointer { CZlib.crc32(0, $0.baseAddress, UInt32($0.count)) })
            return Self.be32Bytes(UInt32(body.count)) + bytes + Self.be32Bytes(crc)
        }
        var png: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] + chunk("IHDR", header)
        // Pillow reads as many whole colours as the chunk holds, 256 at most.
        if header.count == 13, header[header.startIndex + 9] == 3, let palette {
            png += chunk("PLTE", palette.prefix(min(palette.count / 3, 256) * 3))
        }
        return png + chunk("IDAT", imageData) + chunk("IEND", [UInt8]())
    }

    private static func be32Bytes(_ v: UInt32) -> [UInt8] {
        [UInt8(v >> 24), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)]
    }

    /// Why Pillow refuses the file.
    struct Refusal: Error {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }

    private static func isWordCharacter(_ byte: UInt8) -> Bool {
        (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte) || byte == 0x5F
    }

    private func be32(_ at: Int) -> UInt32 {
        UInt32(data[at]) << 24 | UInt32(data[at + 1]) << 16 | UInt32(data[at + 2]) << 8 | UInt32(data[at + 3])
    }

    /// `ImageFile._safe_read`: a chunk running past the end of the file is "Truncated File Read".
    private func read(_ at: Int, _ length: Int) throws(Refusal) -> ArraySlice<UInt8> {
        guard length > 0 else { return [] }
        guard at + length <= data.count else { throw Refusal("truncated \(length)-byte chunk") }
        return data[at..<(at + length)]
    }

    /// fdAT's sequence number must follow the previous fcTL's or fdAT's.
    private mutating func fdAT(_ at: Int, _ length: Int) throws(Refusal) {
        guard length >= 4 else { throw Refusal("APNG contains truncated fdAT chunk") }
        let payload = try read(at, 4)
        let number = Int(UInt32(payload[at]) << 24 | UInt32(payload[at + 1]) << 16 | UInt32(payload[at + 2]) << 8 | UInt32(payload[at + 3]))
        guard let sequence, sequence == number - 1 else { throw Refusal("APNG contains frame sequence errors") }
        self.sequence = number
    }

    /// PngStream's chunk handlers: what they refuse, and the `info` entries orientation needs.
    private mutating func chunk(_ kind: [UInt8], _ s: ArraySlice<UInt8>) throws(Refusal) {
        let s = Array(s)
        func u32(_ at: Int) -> Int { Int(UInt32(s[at]) << 24 | UInt32(s[at + 1]) << 16 | UInt32(s[at + 2]) << 8 | UInt32(s[at + 3])) }
        switch String(decoding: kind, as: UTF8.self) {
        case "IHDR":
            guard s.count >= 13 else { throw Refusal("truncated IHDR chunk") }
            header = s.prefix(13)
            (width, height) = (u32(0), u32(4))
            if let mode = Self.modes[[s[8], s[9]]] { self.mode = mode }
            guard s[11] == 0 else { throw Refusal("unknown filter category") }
        case "PLTE":
            palette = s[...]
        case "tRNS":
            if ["1", "L", "I;16"].contains(mode) && s.count < 2 || mode == "RGB" && s.count < 6 {
                throw Refusal("truncated tRNS chunk")
            }
        case "gAMA" where s.count < 4: throw Refusal("truncated gAMA chunk")
        case "cHRM" where s.count < 32: throw Refusal("truncated cHRM chunk")
        case "sRGB" where s.count < 1: throw Refusal("truncated sRGB chunk")
        case "pHYs" where s.count < 9: throw Refusal("truncated pHYs chunk")
        case "iCCP":
            let nul = s.firstIndex(of: 0) ?? -1
            // Python's s[i + 1] with i = -1 (no separator) is s[0]; past the end, IndexError.
            guard nul + 1 < s.count else { throw Refusal("truncated iCCP chunk") }
            guard s[nul + 1] == 0 else { throw Refusal("unknown compression method \(s[nul + 1]) in iCCP chunk") }
            if case .tooLarge = Self.inflate(s[(nul + 2)...]) { throw Refusal("ICC profile inflates past 1 MiB") }
        case "tEXt":
            let (key, value) = Self.split(s)
            if !key.isEmpty { try text(key, value, raw: value) }
        case "zTXt":
            let (key, rest) = Self.split(s)
            if let method = rest.first, method != 0 { throw Refusal("unknown compression method \(method) in zTXt chunk") }
            let value: [UInt8]
            switch Self.inflate(rest.dropFirst()) {
            case .tooLarge: throw Refusal("zTXt chunk inflates past 1 MiB (Pillow's MAX_TEXT_CHUNK)")
            case .corrupt: value = []
            case .inflated(let bytes): value = bytes
            }
            if !key.isEmpty { try text(key, value[...], raw: nil) }
        case "iTXt":
            guard let nul = s.firstIndex(of: 0), s.count - nul - 1 >= 2 else { return }
            let key = s[..<nul], compressed = s[nul + 1], method = s[nul + 2]
            let rest = s[(nul + 3)...]
            guard let language = rest.firstIndex(of: 0), let translated = rest[(language + 1)...].firstIndex(of: 0) else { return }
            var value = Array(rest[(translated + 1)...])
            if compressed != 0 {
                guard method == 0 else { return }
                switch Self.inflate(value[...]) {
                case .tooLarge: throw Refusal("iTXt chunk inflates past 1 MiB (Pillow's MAX_TEXT_CHUNK)")
                case .corrupt: return
                case .inflated(let bytes): value = bytes
                }
            }
            if Array(key) == Array("XML:com.adobe.xmp".utf8) { xmpBytes = value }
            // Pillow keeps the text only when keyword, language, translated keyword and text are valid UTF-8.
            guard let text = String(validating: value, as: UTF8.self),
                  String(validating: rest[..<language], as: UTF8.self) != nil,
                  String(validating: rest[(language + 1)..<translated], as: UTF8.self) != nil
            else { return }
            try remember(Self.latin1(key), text, characters: text.count, raw: nil)
        case "eXIf":
            (exif, exifIsText) = (Array("Exif\0\0".utf8) + s, false)
        case "acTL":
            guard s.count >= 8 else { throw Refusal("APNG contains truncated acTL chunk") }
            if frames != nil {
                frames = nil  // a second acTL: Pillow falls back to the default image
            } else if u32(0) != 0 && u32(0) <= 0x8000_0000 {
                frames = u32(0)
            }
        case "fcTL":
            guard s.count >= 26 else { throw Refusal("APNG contains truncated fcTL chunk") }
            let number = u32(0)
            if sequence == nil ? number != 0 : sequence != number - 1 { throw Refusal("APNG contains frame sequence errors") }
            sequence = number
            guard u32(12) + u32(4) <= width, u32(16) + u32(8) <= height else { throw Refusal("APNG contains invalid frames") }
            framed = true
        default:
            break
        }
    }

    /// tEXt: latin-1 text, except that a keyword "exif" keeps its bytes as EXIF.
    private mutating func text(_ key: ArraySlice<UInt8>, _ value: ArraySlice<UInt8>, raw: ArraySlice<UInt8>?) throws(Refusal) {
        let keyword = Self.latin1(key)
        if keyword == "exif", let raw { (exif, exifIsText) = (Array(raw), false) }
        try remember(keyword, Self.latin1(value), characters: value.count, raw: raw)
    }

    private mutating func remember(_ keyword: String, _ text: String, characters: Int, raw: ArraySlice<UInt8>?) throws(Refusal) {
        switch keyword {
        case "Raw profile type exif": rawProfileExif = text
        case "XML:com.adobe.xmp": xmpText = text
        case "exif" where raw == nil: (exif, exifIsText) = ([], true)
        default: break
        }
        textMemory += characters
        guard textMemory <= Self.maxTextMemory else { throw Refusal("text chunks hold more than 64 MiB (Pillow's MAX_TEXT_MEMORY)") }
    }

    /// Image.getexif's sources in its order: info["exif"], else ImageMagick's hex "Raw profile type exif".
    private func exifOrientation() throws(Orientation.UnreadableEXIF) -> Int? {
        if exifIsText { throw Orientation.UnreadableEXIF(reason: "a text chunk \"exif\" holds the EXIF") }
        if let exif { return try Orientation.fromEXIF(exif[...]) }
        guard let profile = rawProfileExif else { return nil }
        // bytes.fromhex("".join(value.split("\n")[3:])): whitespace between hex pairs is allowed.
        let hex = profile.split(separator: "\n", omittingEmptySubsequences: false).dropFirst(3).joined()
        var bytes: [UInt8] = [], high: UInt8?
        for character in hex.utf8 {
            if character == 0x20 || (0x09...0x0D).contains(character), high == nil { continue }
            guard let digit = Self.hexDigit(character) else {
                throw Orientation.UnreadableEXIF(reason: "\"Raw profile type exif\" is not hexadecimal")
            }
            if let h = high { bytes.append(h << 4 | digit); high = nil } else { high = digit }
        }
        guard high == nil else { throw Orientation.UnreadableEXIF(reason: "\"Raw profile type exif\" has an odd number of digits") }
        return try Orientation.fromEXIF(bytes[...])
    }

    /// XMP's tiff:Orientation, from the iTXt text if it decoded, else from its bytes.
    private func xmpOrientation() -> Int? {
        if let xmpText, !xmpText.isEmpty { return Orientation.fromXMP(Array(xmpText.utf8)[...]) }
        if let xmpBytes, !xmpBytes.isEmpty { return Orientation.fromXMP(xmpBytes[...]) }
        return nil
    }

    private static func hexDigit(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x41...0x46: c - 0x41 + 10
        case 0x61...0x66: c - 0x61 + 10
        default: nil
        }
    }

    private static func split(_ s: [UInt8]) -> (ArraySlice<UInt8>, ArraySlice<UInt8>) {
        guard let nul = s.firstIndex(of: 0) else { return (s[...], []) }
        return (s[..<nul], s[(nul + 1)...])
    }

    private static func latin1(_ bytes: ArraySlice<UInt8>) -> String {
        String(String.UnicodeScalarView(bytes.map { Unicode.Scalar($0) }))
    }

    /// PngImagePlugin's `_MODES`: the bit depth and colour type pairs Pillow opens.
    static let modes: [[UInt8]: String] = [
        [1, 0]: "1", [2, 0]: "L", [4, 0]: "L", [8, 0]: "L", [16, 0]: "I;16", [8, 2]: "RGB", [16, 2]: "RGB",
        [1, 3]: "P", [2, 3]: "P", [4, 3]: "P", [8, 3]: "P", [8, 4]: "LA", [16, 4]: "RGBA", [8, 6]: "RGBA", [16, 6]: "RGBA",
    ]

    enum Inflation { case inflated([UInt8]), tooLarge, corrupt }

    /// `_safe_zlib_decompress`: a zlib stream inflated to at most `maxTextChunk` bytes. A stream that ends early gives
    /// what it held, as Python's decompressobj does; a corrupt one is zlib.error.
    static func inflate(_ input: ArraySlice<UInt8>) -> Inflation {
        var stream = z_stream()
        guard inflateInit_(&stream, zlibVersion(), Int32(MemoryLayout<z_stream>.size)) == Z_OK else { return .corrupt }
        defer { inflateEnd(&stream) }
        var output = [UInt8](repeating: 0, count: maxTextChunk + 1)
        let status: Int32 = Array(input).withUnsafeBufferPointer { source in
            output.withUnsafeMutableBufferPointer { target in
                stream.next_in = UnsafeMutablePointer(mutating: source.baseAddress)
                stream.avail_in = UInt32(source.count)
                stream.next_out = target.baseAddress
                stream.avail_out = UInt32(target.count)
                return CZlib.inflate(&stream, Z_FINISH)
            }
        }
        let produced = Int(stream.total_out)
        switch status {
        case Z_STREAM_END: return .inflated(Array(output[..<produced]))
        case Z_BUF_ERROR where produced > maxTextChunk: return .tooLarge
        case Z_BUF_ERROR: return .inflated(Array(output[..<produced]))
        default: return .corrupt
        }
    }
}
