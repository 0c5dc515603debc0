import CTIFF
import Foundation

/// TIFF through libtiff, first page, to the pixels Pillow gives: the kinds Pillow's TiffImagePlugin lists in its
/// OPEN_INFO table that it opens as bilevel, grey (1-, 2-, 4- and 8-bit; 12- and 16-bit; signed 16- and 32-bit
/// integers; 32-bit floats), palette (1- to 8-bit, with or without alpha), RGB (8- or 16-bit, with unassociated,
/// premultiplied or unused extra samples), CMYK, YCbCr or CIELab, interleaved or planar, in either fill order; each
/// sample unpacked as that table's raw mode unpacks it and converted to RGB as `convert("RGB")` converts the mode.
/// Other kinds are refused with a line naming them. Orientation comes from the first page's Orientation tag, else its
/// XMP, as Pillow's `getexif` finds them.
enum TIFFDecoding {
    struct Refusal: Error {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }

    /// What Pillow opens a kind of TIFF as, and how its raw mode reads the samples.
    private enum Kind {
        /// "1" and "L" (1-, 2-, 4- or 8-bit, scaled to 8 bits; `inverted` for WhiteIsZero).
        case grey(inverted: Bool)
        /// "I;16" from 12- or 16-bit samples: clipped at 255.
        case grey16
        /// "I" from signed 16-bit or 32-bit samples: clipped to 0 ... 255.
        case integer(signed: Bool)
        /// "F": truncated toward zero and clipped (NaN is 0).
        case float
        /// "P" and "PA": the colour map's entries, alpha dropped.
        case palette
        /// RGB from the first three samples; with `premultiplied`, divided by the fourth (Pillow's "RGBa" raw modes).
        case rgb(premultiplied: Bool)
        /// CMYK, converted as Pillow's cmyk2rgb.
        case cmyk
        /// "LAB" (CIELab, 8-bit), converted through LittleCMS as Pillow converts it (`CIELab`).
        case lab
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

    /// The kind OPEN_INFO gives (byte order, photometric interpretation, sample format, fill order, bits per sample,
    /// extra samples), or nil where Pillow has no entry and refuses the file. Fill order 2 has entries for a few
    /// kinds only; Pillow looks compressed files up as fill order 1, since libtiff reverses their bits itself.
    private static func kind(bigEndian: Bool, photometric: Int, format: Int, fillOrder: Int, bits: Int, samples: Int,
                             extras: [UInt16]) -> Kind? {
        let reversed = fillOrder == 2
        switch (photometric, format, bits, samples, extras) {
        case (0, 1, 1, 1, []), (0, 1, 2, 1, []), (0, 1, 4, 1, []), (0, 1, 8, 1, []): return .grey(inverted: true)
        case (1, 1, 1, 1, []), (1, 1, 2, 1, []), (1, 1, 4, 1, []), (1, 1, 8, 1, []): return .grey(inverted: false)
        case (1, 1, 8, 2, [0]), (1, 1, 8, 2, [2]): return reversed ? nil : .grey(inverted: false)
        case (1, 2, 8, 1, []), (6, 1, 8, 1, []): return reversed ? nil : .grey(inverted: false)
        case (1, 1, 12, 1, []), (0, 1, 16, 1, []): return reversed || bigEndian ? nil : .grey16
        case (1, 1, 16, 1, []): return reversed && bigEndian ? nil : .grey16
        case (1, 2, 16, 1, []): return reversed ? nil : .integer(signed: true)
        case (1, 1, 32, 1, []): return reversed || bigEndian ? nil : .integer(signed: false)
        case (1, 2, 32, 1, []): return reversed ? nil : .integer(signed: true)
        case (0, 3, 32, 1, []), (1, 3, 32, 1, []): return reversed ? nil : .float
        case (3, 1, 1, 1, []), (3, 1, 2, 1, []), (3, 1, 4, 1, []), (3, 1, 8, 1, []): return .palette
        case (3, 1, 8, 2, [0]), (3, 1, 8, 2, [2]): return reversed ? nil : .palette
        case (2, 1, 8, 3, []): return .rgb(premultiplied: false)
        case (6, 1, 8, 3, []): return reversed ? nil : .rgb(premultiplied: false)
        case (2, 1, 8, 4, []), (2, 1, 8, 4, [0]), (2, 1, 8, 4, [2]), (2, 1, 8, 4, [999]),
             (2, 1, 8, 5, [0, 0]), (2, 1, 8, 5, [2, 0]), (2, 1, 8, 6, [0, 0, 0]), (2, 1, 8, 6, [2, 0, 0]),
             (2, 1, 16, 3, []), (2, 1, 16, 4, []), (2, 1, 16, 4, [0]), (2, 1, 16, 4, [2]):
            return reversed ? nil : .rgb(premultiplied: false)
        case (2, 1, 8, 4, [1]), (2, 1, 8, 5, [1, 0]), (2, 1, 8, 6, [1, 0, 0]), (2, 1, 16, 4, [1]):
            return reversed ? nil : .rgb(premultiplied: true)
        case (5, 1, 8, 4, []), (5, 1, 8, 5, [0]), (5, 1, 8, 6, [0, 0]), (5, 1, 16, 4, []):
            return reversed ? nil : .cmyk
        case (8, 1, 8, 3, []): return reversed ? nil : .lab
        default: return nil
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

        func field<T>(_ tag: Int32, _ fallback: T) -> T { TIFFDecoding.field(tiff, tag, fallback) }
        let width = Int(field(TIFFTAG_IMAGEWIDTH, UInt32(0))), height = Int(field(TIFFTAG_IMAGELENGTH, UInt32(0)))
        let bits = Int(field(TIFFTAG_BITSPERSAMPLE, UInt16(1)))
        // Pillow reads a missing PhotometricInterpretation as 0.
        let photometric = Int(field(TIFFTAG_PHOTOMETRIC, UInt16(0)))
        let compression = Int(field(TIFFTAG_COMPRESSION, UInt16(1)))
        // A missing SamplesPerPixel is 3 for old-style JPEG in RGB or YCbCr to Pillow, else 1.
        var samples = Int(field(TIFFTAG_SAMPLESPERPIXEL, UInt16(0)))
        if samples == 0 { samples = compression == COMPRESSION_OJPEG && (photometric == 2 || photometric == 6) ? 3 : 1 }
        let planar = Int(field(TIFFTAG_PLANARCONFIG, UInt16(1))), fillOrder = Int(field(TIFFTAG_FILLORDER, UInt16(1)))
        let format = Int(field(TIFFTAG_SAMPLEFORMAT, UInt16(1)))
        var extraCount: UInt16 = 0
        var extraValues: UnsafeMutablePointer<UInt16>?
        let hasExtra = withUnsafeMutablePointer(to: &extraCount) { count in
            withUnsafeMutablePointer(to: &extraValues) { values in
                withVaList([count, values]) { TIFFVGetField(tiff, UInt32(TIFFTAG_EXTRASAMPLES), $0) }
            }
        } == 1
        var extras = hasExtra && extraValues != nil ? Array(UnsafeBufferPointer(start: extraValues, count: Int(extraCount))) : []
        if planar == 2 && !extras.isEmpty && extras.max() == 0 && extras.count < samples {
            // Pillow drops unspecified extra samples stored as planes of their own, and reads the planes before them.
            samples -= extras.count
            extras = []
        }
        let uncompressed = compression == COMPRESSION_NONE
        let bigEndian = TIFFIsBigEndian(tiff) != 0
        // Planes of whole bytes: Pillow has no sub-byte planar kind either.
        let planes = planar == 2 && samples > 1 ? samples : 1
        guard fillOrder == 1 || fillOrder == 2, planar == 1 || planar == 2, planes == 1 || bits % 8 == 0,
              let kind = kind(bigEndian: bigEndian, photometric: photometric, format: format,
                              fillOrder: uncompressed ? fillOrder : 1, bits: bits, samples: samples, extras: extras) else {
            let details = (format != 1 ? " of sample format \(format)" : "") + ", extra samples \(extras)"
                + (fillOrder != 1 ? ", fill order \(fillOrder)" : "") + (planar != 1 ? ", planar configuration \(planar)" : "")
            throw ImageError.unsupported(file: name, reason: "TIFF of photometric interpretation \(photometric), \(samples)×\(bits)-bit samples\(details) is not read")
        }
        // Pillow's own libtiff is built without WebP: it refuses such files.
        guard compression != COMPRESSION_WEBP else {
            throw ImageError.unsupported(file: name, reason: "WebP-compressed TIFF is not read (Pillow's libtiff has no WebP)")
        }
        try ImageDecoder.checkDimensions(width: width, height: height, name: name, format: "TIFF")

        if photometric == 6 {
            // Pillow reads a PlanarConfiguration stored as bytes rather than a number (any integer type) as neither 1
            // nor 2; libtiff reads it as 1. A YCbCr JPEG file with one goes to Pillow's RGBA reading, which refuses it
            // (a crafted file in Pillow's tests reads out of bounds that way): refused here too.
            if let type = storedEntry(of: TIFFTAG_PLANARCONFIG, tiff, data)?.type, ![3, 4, 8, 9, 16].contains(type) {
                throw Refusal("YCbCr with a PlanarConfiguration stored as type \(type)")
            }
            if compression == COMPRESSION_JPEG && planar == 1 {
                // As Pillow's libtiff decoder: libjpeg turns the YCbCr into RGB, read like any RGB file after that.
                _ = withVaList([Int32(JPEGCOLORMODE_RGB)]) { TIFFVSetField(tiff, UInt32(TIFFTAG_JPEGCOLORMODE), $0) }
            } else {
                // Other YCbCr (old-style JPEG, uncompressed, planar): Pillow has libtiff's RGBA interface convert it.
                var raster = [UInt32](repeating: 0, count: width * height)
                let read = raster.withUnsafeMutableBufferPointer {
                    TIFFReadRGBAImageOriented(tiff, UInt32(width), UInt32(height), $0.baseAddress, ORIENTATION_TOPLEFT, 0)
                }
                guard read == 1 else { throw Refusal("its YCbCr data does not decode") }
                var rgb = [UInt8](repeating: 0, count: width * height * 3)
                for (index, pixel) in raster.enumerated() {
                    (rgb[index * 3], rgb[index * 3 + 1], rgb[index * 3 + 2]) = (UInt8(pixel & 0xFF), UInt8(pixel >> 8 & 0xFF), UInt8(pixel >> 16 & 0xFF))
                }
                return (RGBImage(width: width, height: height, pixels: rgb), orientation(tiff))
            }
        }
        // Each plane's rows as the file stores them (uncompressed: in its byte order; decoded by libtiff: in this
        // machine's, with the bits of fill order 2 already reversed).
        let planeBits = bits * samples / planes, planeRowBytes = (width * planeBits + 7) / 8
        var planeRows = [[UInt8]](repeating: [UInt8](repeating: 0, count: planeRowBytes * height), count: planes)
        if uncompressed {
            try readUncompressed(tiff, data, into: &planeRows, width: width, height: height, bitsPerPixel: planeBits,
                                 planar: planar == 2)
            if fillOrder == 2 {
                for plane in planeRows.indices {
                    for index in planeRows[plane].indices { planeRows[plane][index] = reversedBits[Int(planeRows[plane][index])] }
                }
            }
        } else if TIFFIsTiled(tiff) != 0 {
            let tileWidth = Int(field(TIFFTAG_TILEWIDTH, UInt32(0))), tileHeight = Int(field(TIFFTAG_TILELENGTH, UInt32(0)))
            // Tiles come in multiples of 16 pixels, commonly up to 256 or 512 on a side, whatever the image's size;
            // far larger ones than the image would be allocations, not pictures.
            guard tileWidth > 0, tileHeight > 0, planeBits % 8 == 0,
                  tileWidth * tileHeight <= max((width + 16) * (height + 16), 1024 * 1024) else {
                throw Refusal("tiles of \(tileWidth)x\(tileHeight)")
            }
            let pixelBytes = planeBits / 8
            let tileRow = tileWidth * pixelBytes
            guard Int(TIFFTileSize64(tiff)) == tileRow * tileHeight else { throw Refusal("tile size") }
            var tile = [UInt8](repeating: 0, count: tileRow * tileHeight)
            for plane in 0..<planes {
                for y0 in stride(from: 0, to: height, by: tileHeight) {
                    for x0 in stride(from: 0, to: width, by: tileWidth) {
                        let read = tile.withUnsafeMutableBytes {
                            TIFFReadTile(tiff, $0.baseAddress, UInt32(x0), UInt32(y0), 0, UInt16(plane))
                        }
                        guard read >= 0 else { throw Refusal("tile at \(x0),\(y0) does not decode") }
                        for y in y0..<min(y0 + tileHeight, height) {
                            let columns = (min(x0 + tileWidth, width) - x0) * pixelBytes
                            let from = (y - y0) * tileRow, to = y * planeRowBytes + x0 * pixelBytes
                            planeRows[plane].replaceSubrange(to..<(to + columns), with: tile[from..<(from + columns)])
                        }
                    }
                }
            }
        } else {
            guard Int(TIFFScanlineSize64(tiff)) == planeRowBytes else { throw Refusal("scanline size") }
            for plane in 0..<planes {
                try planeRows[plane].withUnsafeMutableBytes { buffer in
                    for y in 0..<height
                    where TIFFReadScanline(tiff, buffer.baseAddress! + y * planeRowBytes, UInt32(y), UInt16(plane)) < 0 {
                        throw Refusal("row \(y) does not decode")
                    }
                }
            }
        }
        let rowBytes = (width * bits * samples + 7) / 8
        var rows = planeRows[0]
        if planes > 1 {
            // Interleaved as a chunky file would store them.
            let sampleBytes = bits / 8
            rows = [UInt8](repeating: 0, count: rowBytes * height)
            for plane in 0..<planes {
                for pixel in 0..<(width * height) {
                    for byte in 0..<sampleBytes {
                        rows[(pixel * samples + plane) * sampleBytes + byte] = planeRows[plane][pixel * sampleBytes + byte]
                    }
                }
            }
        }
        planeRows = []

        var palette = [UInt8](repeating: 0, count: 256 * 3)
        if case .palette = kind {
            // Pillow keeps the high byte of each 16-bit colour map entry; the map has 2^bits of them.
            var red: UnsafeMutablePointer<UInt16>?, green: UnsafeMutablePointer<UInt16>?, blue: UnsafeMutablePointer<UInt16>?
            let found = withUnsafeMutablePointer(to: &red) { r in
                withUnsafeMutablePointer(to: &green) { g in
                    withUnsafeMutablePointer(to: &blue) { b in
                        withVaList([r, g, b]) { TIFFVGetField(tiff, UInt32(TIFFTAG_COLORMAP), $0) }
                    }
                }
            }
            guard found == 1, let red, let green, let blue else { throw Refusal("palette image without a colour map") }
            for i in 0..<(1 << bits) {
                (palette[i * 3], palette[i * 3 + 1], palette[i * 3 + 2]) = (UInt8(red[i] >> 8), UInt8(green[i] >> 8), UInt8(blue[i] >> 8))
            }
        }
        // Samples as Pillow's raw modes read them: 16- and 32-bit ones in the order of the file's raw mode, which for
        // 16-bit grey and colour Pillow switches to this machine's order where libtiff decoded them (not for the
        // signed and float ones); colour samples of 16 bits by their high byte.
        let sixteenBig = uncompressed && bigEndian
        let highByte = sixteenBig ? 0 : 1
        func sample(_ line: Int, _ x: Int, _ index: Int) -> Int {
            switch bits {
            case 8: return Int(rows[line + x * samples + index])
            case 16: return Int(rows[line + (x * samples + index) * 2 + highByte])
            case 12:
                let at = line + x * 3 / 2
                return x % 2 == 0 ? Int(rows[at]) << 4 | Int(rows[at + 1]) >> 4 : Int(rows[at] & 0x0F) << 8 | Int(rows[at + 1])
            default:
                // 1, 2 or 4 bits, most significant first.
                let perByte = 8 / bits
                return Int(rows[line + x / perByte]) >> (8 - bits * (x % perByte + 1)) & ((1 << bits) - 1)
            }
        }
        func word(_ at: Int, big: Bool, bytes: Int) -> UInt32 {
            var value: UInt32 = 0
            for byte in 0..<bytes { value |= UInt32(rows[at + (big ? bytes - 1 - byte : byte)]) << (8 * byte) }
            return value
        }
        var rgb = [UInt8](repeating: 0, count: width * height * 3)
        for y in 0..<height {
            let line = y * rowBytes
            for x in 0..<width {
                let out = (y * width + x) * 3
                let (r, g, b): (UInt8, UInt8, UInt8)
                switch kind {
                case .grey(let inverted):
                    // 1-, 2- and 4-bit samples scaled to 8 bits as Pillow's "1", L;2 and L;4 unpackers scale them.
                    let raw = sample(line, x, 0)
                    let scaled = bits == 8 ? raw : raw * 255 / ((1 << bits) - 1)
                    let v = UInt8(inverted ? 255 - scaled : scaled)
                    (r, g, b) = (v, v, v)
                case .grey16:
                    let value = bits == 12 ? sample(line, x, 0) : Int(word(line + x * 2, big: sixteenBig, bytes: 2))
                    let v = UInt8(min(value, 255))
                    (r, g, b) = (v, v, v)
                case .integer(let signed):
                    let raw = word(line + x * bits / 8, big: bigEndian, bytes: bits / 8)
                    let value = bits == 16 ? (signed ? Int(Int16(truncatingIfNeeded: raw)) : Int(raw))
                        : (signed ? Int(Int32(bitPattern: raw)) : Int(raw))
                    let v = UInt8(min(max(value, 0), 255))
                    (r, g, b) = (v, v, v)
                case .float:
                    let value = Float(bitPattern: word(line + x * 4, big: bigEndian, bytes: 4))
                    let v: UInt8 = !(value > 0) ? 0 : value >= 255 ? 255 : UInt8(value.rounded(.towardZero))
                    (r, g, b) = (v, v, v)
                case .palette:
                    let i = sample(line, x, 0) * 3
                    (r, g, b) = (palette[i], palette[i + 1], palette[i + 2])
                case .rgb(let premultiplied):
                    var channels = (sample(line, x, 0), sample(line, x, 1), sample(line, x, 2))
                    if premultiplied {
                        // Pillow's "RGBa" unpackers: each colour times 255 over alpha, truncated and clipped.
                        let alpha = sample(line, x, 3)
                        func divided(_ c: Int) -> Int { alpha == 0 ? 0 : alpha == 255 ? c : min(255, c * 255 / alpha) }
                        channels = (divided(channels.0), divided(channels.1), divided(channels.2))
                    }
                    (r, g, b) = (UInt8(channels.0), UInt8(channels.1), UInt8(channels.2))
                case .lab:
                    // a* and b* are signed in the file. Pillow's LAB unpacker offsets them by 128; the planes of a
                    // planar file are copied as they are, by the band unpackers both its planar readers use. The Lab
                    // triples are converted to RGB after this loop, all at once.
                    let offset: UInt8 = planes == 1 ? 128 : 0
                    (r, g, b) = (UInt8(sample(line, x, 0)), UInt8(sample(line, x, 1)) ^ offset, UInt8(sample(line, x, 2)) ^ offset)
                case .cmyk:
                    // Pillow's cmyk2rgb: each of 255 - k, less its product with the ink (MULDIV255's rounding).
                    let remaining = 255 - sample(line, x, 3)
                    func channel(_ ink: Int) -> UInt8 {
                        let product = ink * remaining + 128
                        return UInt8(max(0, remaining - ((product >> 8) + product) >> 8))
                    }
                    (r, g, b) = (channel(sample(line, x, 0)), channel(sample(line, x, 1)), channel(sample(line, x, 2)))
                }
                (rgb[out], rgb[out + 1], rgb[out + 2]) = (r, g, b)
            }
        }
        if case .lab = kind {
            guard let converted = CIELab.rgb(fromLab: rgb) else { throw Refusal("LittleCMS cannot build the Lab to sRGB transform") }
            rgb = converted
        }

        return (RGBImage(width: width, height: height, pixels: rgb), orientation(tiff))
    }

    /// A single-valued field of the current directory as `T`, or `fallback` where it is not set.
    private static func field<T>(_ tiff: OpaquePointer, _ tag: Int32, _ fallback: T) -> T {
        var value = fallback
        let found = withUnsafeMutablePointer(to: &value) { pointer in
            withVaList([pointer]) { TIFFVGetField(tiff, UInt32(tag), $0) }
        }
        return found == 1 ? value : fallback
    }

    /// The first page's Orientation tag, else the orientation in its XMP, as Pillow's `getexif` finds them.
    private static func orientation(_ tiff: OpaquePointer) -> Int {
        let tagged = field(tiff, TIFFTAG_ORIENTATION, UInt16(0))
        if tagged != 0 { return Int(tagged) }
        var count: UInt32 = 0
        var bytes: UnsafeMutableRawPointer?
        let found = withUnsafeMutablePointer(to: &count) { c in
            withUnsafeMutablePointer(to: &bytes) { b in withVaList([c, b]) { TIFFVGetField(tiff, UInt32(TIFFTAG_XMLPACKET), $0) } }
        }
        guard found == 1, let bytes else { return 1 }
        return Orientation.fromXMP(ArraySlice(UnsafeRawBufferPointer(start: bytes, count: Int(count)).bindMemory(to: UInt8.self))) ?? 1
    }
    /// Uncompressed data as Pillow reads it, with its own raw decoder rather than libtiff: each strip or tile from its
    /// offset, the byte counts not consulted, a file too short for the rows refused as truncated; a single strip or
    /// tile covering a chunky image is read from the last offset; a planar image's offsets fill one plane after the
    /// other, and offsets past the last plane make Pillow refuse the file.
    private static func readUncompressed(_ tiff: OpaquePointer, _ data: [UInt8], into planes: inout [[UInt8]],
                                         width: Int, height: Int, bitsPerPixel: Int, planar: Bool) throws {
        let tiled = TIFFIsTiled(tiff) != 0
        var offsets: UnsafeMutablePointer<UInt64>?
        let found = withUnsafeMutablePointer(to: &offsets) { pointer in
            withVaList([pointer]) { TIFFVGetField(tiff, UInt32(tiled ? TIFFTAG_TILEOFFSETS : TIFFTAG_STRIPOFFSETS), $0) }
        }
        let count = Int(tiled ? TIFFNumberOfTiles(tiff) : TIFFNumberOfStrips(tiff))
        guard found == 1, let offsets, count > 0 else { throw Refusal("no strip or tile offsets") }
        func value(_ tag: Int32) -> Int { Int(field(tiff, tag, UInt32(0))) }
        let w = tiled ? value(TIFFTAG_TILEWIDTH) : width
        let h = tiled ? value(TIFFTAG_TILELENGTH) : min(value(TIFFTAG_ROWSPERSTRIP).nonZero ?? height, Int(Int32.max))
        guard w > 0, h > 0 else { throw Refusal("invalid tile dimensions") }
        let rowBytes = (width * bitsPerPixel + 7) / 8
        var list = Array(UnsafeBufferPointer(start: offsets, count: count))
        if w == width && h == height && !planar { list = [list[list.count - 1]] }
        // libtiff keeps as many offsets as the rows per strip call for; Pillow goes over all the tag holds, and a
        // planar file's surplus makes it refuse the file.
        if planar, let stored = storedEntry(of: tiled ? TIFFTAG_TILEOFFSETS : TIFFTAG_STRIPOFFSETS, tiff, data)?.count,
           stored > count {
            throw Refusal("\(stored) strip or tile offsets for \(count)")
        }
        var x = 0, y = 0, plane = 0
        for offset in list {
            if plane == planes.count {
                // Pillow goes over a chunky image's surplus offsets (refilling it from the top) without reading new
                // rows here; a planar one's name a plane it does not have.
                if planar { throw Refusal("more strips or tiles than its \(planes.count) planes hold") }
                break
            }
            let x1 = min(x + w, width), y1 = min(y + h, height)
            let lineBytes = ((x1 - x) * bitsPerPixel + 7) / 8
            let stride = x + w > width ? w * bitsPerPixel / 8 : lineBytes
            let needed = (y1 - y - 1) * stride + lineBytes
            guard offset <= UInt64(data.count), Int(offset) + needed <= data.count else { throw Refusal("image file is truncated") }
            guard bitsPerPixel % 8 == 0 || x == 0 else { throw Refusal("bilevel tiles") }
            for row in y..<y1 {
                let from = Int(offset) + (row - y) * stride, to = row * rowBytes + x * bitsPerPixel / 8
                planes[plane].replaceSubrange(to..<(to + lineBytes), with: data[from..<(from + lineBytes)])
            }
            x += w
            if x >= width { (x, y) = (0, y + h) }
            if y >= height { (y, plane) = (0, plane + 1) }
        }
    }

    /// The field type and value count the current directory's entry for `tag` declares, read from the file itself.
    private static func storedEntry(of tag: Int32, _ tiff: OpaquePointer, _ data: [UInt8]) -> (type: Int, count: Int)? {
        let big = TIFFIsBigEndian(tiff) != 0, bigTIFF = TIFFIsBigTIFF(tiff) != 0
        func number(_ at: Int, _ bytes: Int) -> Int? {
            guard at >= 0, at + bytes <= data.count else { return nil }
            var value = 0
            for byte in 0..<bytes { value |= Int(data[at + (big ? bytes - 1 - byte : byte)]) << (8 * byte) }
            return value
        }
        let directory = Int(clamping: TIFFCurrentDirOffset(tiff))
        let (countBytes, entryBytes, valueCountBytes) = bigTIFF ? (8, 20, 8) : (2, 12, 4)
        guard let entries = number(directory, countBytes), entries < 1 << 16 else { return nil }
        for entry in 0..<entries {
            let at = directory + countBytes + entry * entryBytes
            if number(at, 2) == Int(tag), let type = number(at + 2, 2), let count = number(at + 4, valueCountBytes) {
                return (type, count)
            }
        }
        return nil
    }

    /// Each byte with its bits in the opposite order (fill order 2).
    private static let reversedBits: [UInt8] = (0..<256).map { byte in
        (0..<8).reduce(UInt8(0)) { reversed, bit in reversed | UInt8((byte >> bit) & 1) << (7 - bit) }
    }
}

private extension Int {
    var nonZero: Int? { self == 0 ? nil : self }
}
