/// BMP (and DIB, a BMP without its 14-byte file header) read by hand as Pillow's BmpImagePlugin reads it: the same
/// headers, bit depths, bitfield layouts and RLE decoding, the same refusals, then `convert("RGB")`.
enum BMPDecoding {
    struct Refusal: Error {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }

    /// The 32-bit bitfield masks Pillow reads (red, green, blue, alpha) and the byte layouts they name.
    static let masks32: [[UInt32]: String] = [
        [0xFF0000, 0xFF00, 0xFF, 0]: "BGRX", [0xFF00_0000, 0xFF0000, 0xFF00, 0]: "XBGR",
        [0xFF00_0000, 0xFF00, 0xFF, 0]: "BGXR", [0xFF00_0000, 0xFF0000, 0xFF00, 0xFF]: "ABGR",
        [0xFF, 0xFF00, 0xFF0000, 0xFF00_0000]: "RGBA", [0xFF0000, 0xFF00, 0xFF, 0xFF00_0000]: "BGRA",
        [0xFF00_0000, 0xFF00, 0xFF, 0xFF0000]: "BGAR", [0, 0, 0, 0]: "BGRA",
    ]

    static func decode(_ data: [UInt8], name: String, fileHeader: Bool) throws -> (image: RGBImage, orientation: Int) {
        do {
            return (try image(data, name: name, fileHeader: fileHeader), 1)
        } catch let error as Refusal {
            throw ImageError.corrupt(file: name, format: fileHeader ? "BMP" : "DIB", reason: error.reason)
        }
    }

    private static func image(_ data: [UInt8], name: String, fileHeader: Bool) throws -> RGBImage {
        func u16(_ at: Int) throws(Refusal) -> Int {
            guard at >= 0, at + 2 <= data.count else { throw Refusal("header runs past the end of the file") }
            return Int(data[at]) | Int(data[at + 1]) << 8
        }
        func u32(_ at: Int) throws(Refusal) -> Int {
            try u16(at) | u16(at + 2) << 16
        }
        var offset = fileHeader ? try u32(10) : 0
        let start = fileHeader ? 14 : 0
        let headerSize = try u32(start)
        var position = start + 4 + max(headerSize - 4, 0)
        guard position <= data.count else { throw Refusal("truncated header") }
        let h = start + 4  // the header after its size
        var width: Int, height: Int, bits: Int, compression = 0, colors = 0, padding: Int, topDown = false
        var masks: [UInt32] = []
        switch headerSize {
        case 12:
            (width, height, bits, padding) = (try u16(h), try u16(h + 2), try u16(h + 6), 3)
        case 40, 52, 56, 64, 108, 124:
            topDown = data[h + 7] == 0xFF
            width = try u32(h)
            height = topDown ? (1 << 32) - (try u32(h + 4)) : try u32(h + 4)
            bits = try u16(h + 10)
            compression = try u32(h + 12)
            colors = try u32(h + 28)
            padding = 4
            if compression == 3 {
                // Headers of 52 bytes and more hold the masks; a 40-byte one is followed by three.
                if headerSize >= 52 {
                    masks = try (0..<(headerSize >= 56 ? 4 : 3)).map { (i) throws(Refusal) in UInt32(try u32(h + 36 + i * 4)) }
                } else {
                    masks = try (0..<3).map { (i) throws(Refusal) in UInt32(try u32(position + i * 4)) }
                    position += 12
                }
                if masks.count == 3 { masks.append(0) }
            }
        default:
            throw Refusal("unsupported BMP header type (\(headerSize))")
        }
        if colors == 0 { colors = bits <= 16 ? 1 << bits : Int.max }
        if fileHeader, offset == 14 + headerSize, bits <= 8 { offset += padding * colors }

        var raw: String
        switch bits {
        case 1: raw = "P;1"
        case 4: raw = "P;4"
        case 8: raw = "P"
        case 16: raw = "BGR;15"
        case 24: raw = "BGR"
        case 32: raw = "BGRX"
        default: throw Refusal("unsupported BMP pixel depth (\(bits))")
        }
        var mode = bits <= 8 ? "P" : "RGB"
        var rle = false
        switch compression {
        case 3:
            if bits == 32, let layout = masks32[masks] {
                raw = layout
            } else if bits == 24, masks.prefix(3).elementsEqual([0xFF0000, 0xFF00, 0xFF]) {
                raw = "BGR"
            } else if bits == 16, masks.prefix(3).elementsEqual([0xF800, 0x7E0, 0x1F]) {
                raw = "BGR;16"
            } else if bits == 16, masks.prefix(3).elementsEqual([0x7C00, 0x3E0, 0x1F]) {
                raw = "BGR;15"
            } else {
                throw Refusal("unsupported BMP bitfields layout")
            }
        case 0: break
        case 1, 2:
            rle = true
            guard bits <= 8 else { throw Refusal("RLE at \(bits) bits per pixel") }
        default: throw Refusal("unsupported BMP compression (\(compression))")
        }

        // The palette, as 256 RGB entries (those the file does not define stay black).
        var palette = [UInt8](repeating: 0, count: 256 * 3)
        if mode == "P" {
            guard colors > 0 && colors <= 65536 else { throw Refusal("unsupported BMP palette size (\(colors))") }
            let stored = data[min(position, data.count)..<min(position + padding * colors, data.count)]
            var grey = true
            let expected = colors == 2 ? [0, 255] : Array(0..<colors)
            for (index, value) in expected.enumerated() {
                let at = stored.startIndex + index * padding
                let v = UInt8(value & 255)
                if at + 3 > stored.endIndex || stored[at] != v || stored[at + 1] != v || stored[at + 2] != v {
                    grey = false
                }
            }
            if grey {
                // Pillow drops an all-grey palette and reads the pixels as they are in that mode.
                mode = colors <= 2 ? "1" : "L"
                raw = mode
            } else {
                let entries = stored.count / padding
                guard entries <= 256 else { throw Refusal("invalid palette size") }
                for i in 0..<entries {
                    let at = stored.startIndex + i * padding
                    (palette[i * 3], palette[i * 3 + 1], palette[i * 3 + 2]) = (stored[at + 2], stored[at + 1], stored[at])
                }
            }
        }
        try ImageDecoder.checkDimensions(width: width, height: height, name: name, format: fileHeader ? "BMP" : "DIB")
        // Without an offset the pixels follow what was read: the header, the masks, the palette.
        if offset == 0 { offset = min(position + (bits <= 8 ? padding * colors : 0), data.count) }

        // One byte (or unpacked sample group) per pixel, rows top to bottom.
        var rows: [UInt8]
        let unpackBits: Int
        if rle {
            rows = try decodeRLE(data, from: offset, width: width, height: height, rle4: compression == 2)
            if mode == "1" { rows = rows.map { $0 > 0 ? 255 : 0 } }
            raw = mode == "P" ? "P" : "L"
            unpackBits = 8
            if !topDown { rows = flipped(rows, rowBytes: width, height: height) }
        } else {
            unpackBits = switch raw {
            case "1", "P;1": 1
            case "P;4": 4
            case "P", "L": 8
            case "BGR;15", "BGR;16": 16
            case "BGR": 24
            default: 32
            }
            let stride = ((width * bits + 31) >> 3) & ~3
            let lineBytes = (width * unpackBits + 7) / 8
            guard lineBytes <= stride else { throw Refusal("decoder error") }
            // Pillow's raw decoder reads the last row without its padding.
            let needed = (height - 1) * stride + lineBytes
            guard offset >= 0, offset + needed <= data.count else { throw Refusal("image file is truncated") }
            rows = [UInt8](repeating: 0, count: height * lineBytes)
            for y in 0..<height {
                let source = offset + y * stride, target = (topDown ? y : height - 1 - y) * lineBytes
                for i in 0..<lineBytes { rows[target + i] = data[source + i] }
            }
        }
        let lineBytes = (width * unpackBits + 7) / 8
        var rgb = [UInt8](repeating: 0, count: width * height * 3)
        for y in 0..<height {
            let line = y * lineBytes
            for x in 0..<width {
                let out = (y * width + x) * 3
                func put(_ r: UInt8, _ g: UInt8, _ b: UInt8) { (rgb[out], rgb[out + 1], rgb[out + 2]) = (r, g, b) }
                func index(_ bitsPerPixel: Int) -> Int {
                    let byte = Int(rows[line + x * bitsPerPixel / 8])
                    let shift = 8 - bitsPerPixel * (x % (8 / bitsPerPixel) + 1)
                    return (byte >> shift) & ((1 << bitsPerPixel) - 1)
                }
                switch raw {
                case "1": let v: UInt8 = index(1) != 0 ? 255 : 0; put(v, v, v)
                case "L": let v = rows[line + x]; put(v, v, v)
                case "P;1", "P;4", "P":
                    let i = raw == "P" ? Int(rows[line + x]) : index(raw == "P;1" ? 1 : 4)
                    put(palette[i * 3], palette[i * 3 + 1], palette[i * 3 + 2])
                case "BGR;15", "BGR;16":
                    let v = Int(rows[line + x * 2]) | Int(rows[line + x * 2 + 1]) << 8
                    let green = raw == "BGR;15" ? (v >> 5 & 31) * 255 / 31 : (v >> 5 & 63) * 255 / 63
                    let red = raw == "BGR;15" ? (v >> 10 & 31) * 255 / 31 : (v >> 11 & 31) * 255 / 31
                    put(UInt8(red), UInt8(green), UInt8((v & 31) * 255 / 31))
                case "BGR": let at = line + x * 3; put(rows[at + 2], rows[at + 1], rows[at])
                default:
                    // Four bytes a pixel; where each of R, G and B sits in them.
                    let at = line + x * 4
                    let (r, g, b): (Int, Int, Int) = switch raw {
                    case "XBGR", "ABGR": (3, 2, 1)
                    case "BGXR", "BGAR": (3, 1, 0)
                    case "RGBA": (0, 1, 2)
                    default: (2, 1, 0)  // BGRX, BGRA
                    }
                    put(rows[at + r], rows[at + g], rows[at + b])
                }
            }
        }
        return RGBImage(width: width, height: height, pixels: rgb)
    }

    private static func flipped(_ rows: [UInt8], rowBytes: Int, height: Int) -> [UInt8] {
        var out = rows
        for y in 0..<height {
            out.replaceSubrange((y * rowBytes)..<((y + 1) * rowBytes), with: rows[((height - 1 - y) * rowBytes)..<((height - y) * rowBytes)])
        }
        return out
    }

    /// BmpRleDecoder: one byte per pixel, rows in file order; too little data for the image is "not enough image
    /// data", as Pillow's set_as_raw finds.
    private static func decodeRLE(_ file: [UInt8], from offset: Int, width: Int, height: Int, rle4: Bool) throws(Refusal) -> [UInt8] {
        let total = width * height
        var out: [UInt8] = []
        out.reserveCapacity(total)
        var at = offset, x = 0
        func read(_ count: Int) -> ArraySlice<UInt8> {
            let start = min(max(at, 0), file.count), end = min(start + max(count, 0), file.count)
            at = end
            return file[start..<end]
        }
        while out.count < total {
            let pair = read(2)
            guard pair.count == 2 else { break }
            var count = Int(pair[pair.startIndex])
            let byte = pair[pair.startIndex + 1]
            if count > 0 {
                if x + count > width { count = max(0, width - x) }
                for i in 0..<count { out.append(rle4 ? (i % 2 == 0 ? byte >> 4 : byte & 0x0F) : byte) }
                x += count
            } else if byte == 0 {
                while out.count % width != 0 { out.append(0) }
                x = 0
            } else if byte == 1 {
                break
            } else if byte == 2 {
                let delta = read(2)
                guard delta.count == 2 else { break }
                let skip = Int(delta[delta.startIndex]) + Int(delta[delta.startIndex + 1]) * width
                out.append(contentsOf: repeatElement(0, count: min(total - out.count, skip)))
                x = out.count % width
            } else {
                let wanted = min(total - out.count, Int(byte))
                let byteCount = rle4 ? (wanted + 1) / 2 : wanted
                let literal = read(byteCount)
                if rle4 {
                    for (i, value) in literal.enumerated() {
                        out.append(value >> 4)
                        if i * 2 + 1 < wanted { out.append(value & 0x0F) }
                    }
                } else {
                    out.append(contentsOf: literal)
                }
                if literal.count < byteCount || out.count == total { break }
                x += Int(byte)
                if at % 2 != 0 { at += 1 }  // literal runs end on a 16-bit boundary of the file
            }
        }
        guard out.count >= total else { throw Refusal("not enough image data") }
        return Array(out.prefix(total))
    }
}
