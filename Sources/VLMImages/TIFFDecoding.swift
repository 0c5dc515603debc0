import CTIFF
import Foundation

/// TIFF through libtiff, first page, for the kinds whose samples Pillow's TiffImagePlugin unpacks as they are:
/// 2-, 4- and 8-bit grey (black or white is zero), 16-bit grey (black is zero), bilevel, 8-bit palette, 8-bit RGB with
/// or without unassociated alpha or an unused fourth sample, interleaved, fill order 1, unsigned. Other kinds (16-bit
/// colour, float and signed samples, CMYK, CIELab, YCbCr, planar, premultiplied alpha) are refused with a line
/// naming them. Orientation comes from the first page's
/// Orientation tag, else its XMP, as Pillow's `getexif` finds them.
enum TIFFDecoding {
    struct Refusal: Error {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }

    /// The bytes libtiff reads through its client callbacks.
    private final class Source {
        let data: [UInt8]
        var position = 0
        init(_ data: [UInt8]) { self.data = data }
    }

    /// libtiff reports through process-wide handlers; a refusal carries libtiff's reason in one line instead.
    private static let silenced: Void = {
        TIFFSetErrorHandler(nil)
        TIFFSetWarningHandler(nil)
    }()

    static func decode(_ data: [UInt8], name: String) throws -> (image: RGBImage, orientation: Int) {
        do {
            return try read(data, name: name)
        } catch let error as Refusal {
            throw ImageError.corrupt(file: name, format: "TIFF", reason: error.reason)
        }
    }

    private static func read(_ data: [UInt8], name: String) throws -> (image: RGBImage, orientation: Int) {
        _ = silenced
        let source = Source(data)
        let handle = Unmanaged.passRetained(source)
        defer { handle.release() }
        guard let tiff = TIFFClientOpen(name, "rm", handle.toOpaque(), { context, buffer, size in
            let source = Unmanaged<Source>.fromOpaque(context!).takeUnretainedValue()
            let count = max(0, min(Int(size), source.data.count - source.position))
            source.data.withUnsafeBytes { buffer!.copyMemory(from: $0.baseAddress! + source.position, byteCount: count) }
            source.position += count
            return tmsize_t(count)
        }, { _, _, _ in 0 }, { context, offset, whence in
            let source = Unmanaged<Source>.fromOpaque(context!).takeUnretainedValue()
            let base = whence == SEEK_CUR ? source.position : whence == SEEK_END ? source.data.count : 0
            let target = base + Int(Int64(bitPattern: offset))
            guard target >= 0 else { return toff_t.max }
            source.position = target
            return toff_t(target)
        }, { _ in 0 }, { context in
            toff_t(Unmanaged<Source>.fromOpaque(context!).takeUnretainedValue().data.count)
        }, { _, _, _ in 0 }, { _, _, _ in }) else {
            throw Refusal("libtiff cannot read its header or first directory")
        }
        defer { TIFFClose(tiff) }

        func field<T>(_ tag: Int32, _ fallback: T) -> T {
            var value = fallback
            let found = withUnsafeMutablePointer(to: &value) { pointer in
                withVaList([pointer]) { TIFFVGetField(tiff, UInt32(tag), $0) }
            }
            return found == 1 ? value : fallback
        }
        let width = Int(field(TIFFTAG_IMAGEWIDTH, UInt32(0))), height = Int(field(TIFFTAG_IMAGELENGTH, UInt32(0)))
        let bits = Int(field(TIFFTAG_BITSPERSAMPLE, UInt16(1))), samples = Int(field(TIFFTAG_SAMPLESPERPIXEL, UInt16(1)))
        let photometric = Int(field(TIFFTAG_PHOTOMETRIC, UInt16.max))
        let planar = Int(field(TIFFTAG_PLANARCONFIG, UInt16(1))), fillOrder = Int(field(TIFFTAG_FILLORDER, UInt16(1)))
        let format = Int(field(TIFFTAG_SAMPLEFORMAT, UInt16(1)))
        var extraCount: UInt16 = 0
        var extraValues: UnsafeMutablePointer<UInt16>?
        let hasExtra = withUnsafeMutablePointer(to: &extraCount) { count in
            withUnsafeMutablePointer(to: &extraValues) { values in
                withVaList([count, values]) { TIFFVGetField(tiff, UInt32(TIFFTAG_EXTRASAMPLES), $0) }
            }
        } == 1
        let extras = hasExtra && extraValues != nil ? Array(UnsafeBufferPointer(start: extraValues, count: Int(extraCount))) : []

        // The kinds read here: (photometric, bits, samples, extra samples) as Pillow's OPEN_INFO names them.
        let kind: String
        switch (photometric, bits, samples, extras) {
        case (0, 1, 1, []), (1, 1, 1, []): kind = "1"
        case (0, 8, 1, []), (1, 8, 1, []): kind = "L"
        case (0, 2, 1, []), (1, 2, 1, []), (0, 4, 1, []), (1, 4, 1, []): kind = "L;\(bits)"
        case (1, 16, 1, []): kind = "I;16"
        case (3, 8, 1, []): kind = "P"
        case (2, 8, 3, []): kind = "RGB"
        case (2, 8, 4, []), (2, 8, 4, [2]): kind = "RGBA"
        case (2, 8, 4, [0]): kind = "RGBX"
        default:
            throw ImageError.unsupported(file: name, reason: "TIFF of photometric interpretation \(photometric), \(samples)×\(bits)-bit samples, extra samples \(extras) is not read")
        }
        // Pillow's own libtiff is built without WebP: it refuses such files.
        guard field(TIFFTAG_COMPRESSION, UInt16(1)) != COMPRESSION_WEBP else {
            throw ImageError.unsupported(file: name, reason: "WebP-compressed TIFF is not read (Pillow's libtiff has no WebP)")
        }
        guard format == 1, planar == 1, fillOrder == 1 else {
            throw ImageError.unsupported(file: name, reason: "TIFF of sample format \(format), planar configuration \(planar), fill order \(fillOrder) is not read")
        }
        try ImageDecoder.checkDimensions(width: width, height: height, name: name, format: "TIFF")

        let rowBytes = (width * bits * samples + 7) / 8
        var rows = [UInt8](repeating: 0, count: rowBytes * height)
        // Uncompressed 16-bit samples stay in the file's byte order; libtiff hands decoded ones over in this machine's.
        let uncompressed = field(TIFFTAG_COMPRESSION, UInt16(1)) == COMPRESSION_NONE
        let bigEndian = uncompressed && TIFFIsBigEndian(tiff) != 0
        if uncompressed {
            try readUncompressed(tiff, data, into: &rows, width: width, height: height, bitsPerPixel: bits * samples)
        } else if TIFFIsTiled(tiff) != 0 {
            let tileWidth = Int(field(TIFFTAG_TILEWIDTH, UInt32(0))), tileHeight = Int(field(TIFFTAG_TILELENGTH, UInt32(0)))
            // Tiles come in multiples of 16 pixels; larger ones than the image would be allocations, not pictures.
            guard tileWidth > 0, tileHeight > 0, bits % 8 == 0, tileWidth <= width + 16, tileHeight <= height + 16 else {
                throw Refusal("tiles of \(tileWidth)x\(tileHeight)")
            }
            let pixelBytes = samples * bits / 8
            let tileRow = tileWidth * pixelBytes
            guard Int(TIFFTileSize64(tiff)) == tileRow * tileHeight else { throw Refusal("tile size") }
            var tile = [UInt8](repeating: 0, count: tileRow * tileHeight)
            for y0 in stride(from: 0, to: height, by: tileHeight) {
                for x0 in stride(from: 0, to: width, by: tileWidth) {
                    let read = tile.withUnsafeMutableBytes { TIFFReadTile(tiff, $0.baseAddress, UInt32(x0), UInt32(y0), 0, 0) }
                    guard read >= 0 else { throw Refusal("tile at \(x0),\(y0) does not decode") }
                    for y in y0..<min(y0 + tileHeight, height) {
                        let columns = (min(x0 + tileWidth, width) - x0) * pixelBytes
                        let from = (y - y0) * tileRow, to = y * rowBytes + x0 * pixelBytes
                        rows.replaceSubrange(to..<(to + columns), with: tile[from..<(from + columns)])
                    }
                }
            }
        } else {
            guard Int(TIFFScanlineSize64(tiff)) == rowBytes else { throw Refusal("scanline size") }
            try rows.withUnsafeMutableBytes { buffer in
                for y in 0..<height where TIFFReadScanline(tiff, buffer.baseAddress! + y * rowBytes, UInt32(y), 0) < 0 {
                    throw Refusal("row \(y) does not decode")
                }
            }
        }

        var palette = [UInt8](repeating: 0, count: 256 * 3)
        if kind == "P" {
            // Pillow keeps the high byte of each 16-bit colour map entry.
            var red: UnsafeMutablePointer<UInt16>?, green: UnsafeMutablePointer<UInt16>?, blue: UnsafeMutablePointer<UInt16>?
            let found = withUnsafeMutablePointer(to: &red) { r in
                withUnsafeMutablePointer(to: &green) { g in
                    withUnsafeMutablePointer(to: &blue) { b in
                        withVaList([r, g, b]) { TIFFVGetField(tiff, UInt32(TIFFTAG_COLORMAP), $0) }
                    }
                }
            }
            guard found == 1, let red, let green, let blue else { throw Refusal("palette image without a colour map") }
            for i in 0..<256 {
                (palette[i * 3], palette[i * 3 + 1], palette[i * 3 + 2]) = (UInt8(red[i] >> 8), UInt8(green[i] >> 8), UInt8(blue[i] >> 8))
            }
        }
        let inverted = photometric == 0
        var rgb = [UInt8](repeating: 0, count: width * height * 3)
        for y in 0..<height {
            let line = y * rowBytes
            for x in 0..<width {
                let out = (y * width + x) * 3
                switch kind {
                case "1":
                    let bit = rows[line + x / 8] >> (7 - x % 8) & 1
                    let v: UInt8 = (bit == 1) != inverted ? 255 : 0
                    (rgb[out], rgb[out + 1], rgb[out + 2]) = (v, v, v)
                case "L":
                    let v = inverted ? 255 - rows[line + x] : rows[line + x]
                    (rgb[out], rgb[out + 1], rgb[out + 2]) = (v, v, v)
                case "L;2", "L;4":
                    // Pillow's L;2 and L;4 unpackers scale by 0x55 and 0x11 (inverted: from 0xFF down).
                    let perByte = 8 / bits
                    let sample = Int(rows[line + x / perByte]) >> (8 - bits * (x % perByte + 1)) & ((1 << bits) - 1)
                    let scaled = UInt8(sample * (bits == 2 ? 0x55 : 0x11))
                    let v = inverted ? 255 - scaled : scaled
                    (rgb[out], rgb[out + 1], rgb[out + 2]) = (v, v, v)
                case "I;16":
                    // I;16 → RGB clips at 255.
                    let (a, b) = (Int(rows[line + x * 2]), Int(rows[line + x * 2 + 1]))
                    let value = bigEndian ? a << 8 | b : b << 8 | a
                    let v = UInt8(min(value, 255))
                    (rgb[out], rgb[out + 1], rgb[out + 2]) = (v, v, v)
                case "P":
                    let i = Int(rows[line + x]) * 3
                    (rgb[out], rgb[out + 1], rgb[out + 2]) = (palette[i], palette[i + 1], palette[i + 2])
                default:
                    let at = line + x * samples
                    (rgb[out], rgb[out + 1], rgb[out + 2]) = (rows[at], rows[at + 1], rows[at + 2])
                }
            }
        }

        var orientation = Int(field(TIFFTAG_ORIENTATION, UInt16(0)))
        if orientation == 0 {
            var count: UInt32 = 0
            var bytes: UnsafeMutableRawPointer?
            let found = withUnsafeMutablePointer(to: &count) { c in
                withUnsafeMutablePointer(to: &bytes) { b in withVaList([c, b]) { TIFFVGetField(tiff, UInt32(TIFFTAG_XMLPACKET), $0) } }
            }
            if found == 1, let bytes {
                orientation = Orientation.fromXMP(ArraySlice(UnsafeRawBufferPointer(start: bytes, count: Int(count)).bindMemory(to: UInt8.self))) ?? 1
            }
        }
        return (RGBImage(width: width, height: height, pixels: rgb), orientation)
    }
    /// Uncompressed data as Pillow reads it, with its own raw decoder rather than libtiff: each strip or tile from its
    /// offset, the byte counts not consulted, a file too short for the rows refused as truncated; a single strip or
    /// tile covering the image is read from the last offset.
    private static func readUncompressed(_ tiff: OpaquePointer, _ data: [UInt8], into rows: inout [UInt8], width: Int,
                                         height: Int, bitsPerPixel: Int) throws {
        let tiled = TIFFIsTiled(tiff) != 0
        var offsets: UnsafeMutablePointer<UInt64>?
        let found = withUnsafeMutablePointer(to: &offsets) { pointer in
            withVaList([pointer]) { TIFFVGetField(tiff, UInt32(tiled ? TIFFTAG_TILEOFFSETS : TIFFTAG_STRIPOFFSETS), $0) }
        }
        let count = Int(tiled ? TIFFNumberOfTiles(tiff) : TIFFNumberOfStrips(tiff))
        guard found == 1, let offsets, count > 0 else { throw Refusal("no strip or tile offsets") }
        func value(_ tag: Int32) -> Int {
            var v: UInt32 = 0
            let ok = withUnsafeMutablePointer(to: &v) { pointer in withVaList([pointer]) { TIFFVGetField(tiff, UInt32(tag), $0) } }
            return ok == 1 ? Int(v) : 0
        }
        let w = tiled ? value(TIFFTAG_TILEWIDTH) : width
        let h = tiled ? value(TIFFTAG_TILELENGTH) : min(value(TIFFTAG_ROWSPERSTRIP).nonZero ?? height, Int(Int32.max))
        guard w > 0, h > 0 else { throw Refusal("invalid tile dimensions") }
        let rowBytes = (width * bitsPerPixel + 7) / 8
        var list = Array(UnsafeBufferPointer(start: offsets, count: count))
        if w == width && h == height { list = [list[list.count - 1]] }
        var x = 0, y = 0
        for offset in list {
            guard y < height else { break }  // Pillow's further layers belong to planar files, not read here
            let x1 = min(x + w, width), y1 = min(y + h, height)
            let lineBytes = ((x1 - x) * bitsPerPixel + 7) / 8
            let stride = x + w > width ? w * bitsPerPixel / 8 : lineBytes
            let needed = (y1 - y - 1) * stride + lineBytes
            guard offset <= UInt64(data.count), Int(offset) + needed <= data.count else { throw Refusal("image file is truncated") }
            guard bitsPerPixel % 8 == 0 || x == 0 else { throw Refusal("bilevel tiles") }
            for row in y..<y1 {
                let from = Int(offset) + (row - y) * stride, to = row * rowBytes + x * bitsPerPixel / 8
                rows.replaceSubrange(to..<(to + lineBytes), with: data[from..<(from + lineBytes)])
            }
            x += w
            if x >= width { (x, y) = (0, y + h) }
        }
    }
}

private extension Int {
    var nonZero: Int? { self == 0 ? nil : self }
}
