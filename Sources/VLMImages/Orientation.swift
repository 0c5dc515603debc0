/// EXIF orientation, found the way Pillow's `Image.getexif()` finds it.
enum Orientation {
    /// EXIF that Pillow's `Exif.load` raises on, so that `load_image` fails: not TIFF-structured, or BigTIFF (whose
    /// 16-byte header Pillow reads 8 bytes of).
    struct UnreadableEXIF: Error {
        let reason: String
    }

    /// The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block (after up to two "Exif\0\0" prefixes, as
    /// Pillow strips them). nil when the block is empty or has no usable tag, as Pillow then consults XMP; 0 when the
    /// tag is there but holds no single number, as Pillow then leaves the image as it is and does not look further.
    static func fromEXIF(_ bytes: ArraySlice<UInt8>) throws(UnreadableEXIF) -> Int? {
        var exif = Array(bytes)
        let prefix = Array("Exif\0\0".utf8)
        for _ in 0..<2 where exif.starts(with: prefix) { exif.removeFirst(prefix.count) }
        guard !exif.isEmpty else { return nil }
        let header = Array(exif.prefix(4))
        let littleEndian: Bool
        switch header {
        case [0x49, 0x49, 0x2A, 0x00], [0x49, 0x49, 0x00, 0x2A]: littleEndian = true
        case [0x4D, 0x4D, 0x00, 0x2A], [0x4D, 0x4D, 0x2A, 0x00]: littleEndian = false
        case [0x49, 0x49, 0x2B, 0x00], [0x4D, 0x4D, 0x00, 0x2B]: throw UnreadableEXIF(reason: "BigTIFF EXIF")
        default: throw UnreadableEXIF(reason: "EXIF is not TIFF-structured")
        }
        guard exif.count >= 8 else { throw UnreadableEXIF(reason: "EXIF header shorter than 8 bytes") }
        func unsigned(_ at: Int, _ size: Int) -> UInt64? {
            guard at >= 0, at + size <= exif.count else { return nil }
            var value: UInt64 = 0
            for i in 0..<size { value = value << 8 | UInt64(exif[littleEndian ? at + size - 1 - i : at + i]) }
            return value
        }
        guard let ifd = unsigned(4, 4).map(Int.init), let count = unsigned(ifd, 2) else { return nil }
        // ImageFileDirectory_v2.load: the first entry of a tag with data wins; a read past the end stops the walk.
        for entry in 0..<Int(count) {
            let at = ifd + 2 + entry * 12
            guard let tag = unsigned(at, 2), let type = unsigned(at + 2, 2), let n = unsigned(at + 4, 4) else { return nil }
            guard tag == 0x0112 else { continue }
            let unit: Int
            switch type {
            case 1, 2, 6, 7: unit = 1
            case 3, 8: unit = 2
            case 4, 9, 11, 13: unit = 4
            case 5, 10, 12: unit = 8
            default: continue  // a type Pillow does not load
            }
            if n == 0 { continue }
            guard n == 1 else { return 0 }  // a tuple: no transposition
            let place = unit > 4 ? unsigned(at + 8, 4).map(Int.init) ?? -1 : at + 8
            guard let raw = unsigned(place, unit) else { continue }  // data past the end: Pillow skips the tag
            switch type {
            case 1, 3, 4, 13: return Int(raw)
            case 6: return Int(Int8(truncatingIfNeeded: raw))
            case 8: return Int(Int16(truncatingIfNeeded: raw))
            case 9: return Int(Int32(truncatingIfNeeded: raw))
            case 5, 10:
                // IFDRational compares equal to the integer it reduces to.
                guard let top = unsigned(place, 4), let bottom = unsigned(place + 4, 4) else { continue }
                let numerator = type == 10 ? Int(Int32(truncatingIfNeeded: top)) : Int(top)
                let denominator = type == 10 ? Int(Int32(truncatingIfNeeded: bottom)) : Int(bottom)
                return denominator != 0 && numerator % denominator == 0 ? numerator / denominator : 0
            case 11:
                let value = Float(bitPattern: UInt32(raw))
                return value.rounded() == value && abs(value) < 16 ? Int(value) : 0
            case 12:
                let value = Double(bitPattern: raw)
                return value.rounded() == value && abs(value) < 16 ? Int(value) : 0
            default: return 0  // text or bytes
            }
        }
        return nil
    }

    /// Pillow's fallback when EXIF has no orientation: `tiff:Orientation="N"` or `<tiff:Orientation>N` in XMP.
    static func fromXMP(_ xmp: ArraySlice<UInt8>) -> Int? {
        let key = Array("tiff:Orientation".utf8)
        let bytes = Array(xmp)
        guard bytes.count > key.count + 2 else { return nil }
        var index = 0
        while index + key.count + 2 < bytes.count {
            if bytes[index] == key[0], Array(bytes[index..<index + key.count]) == key {
                var next = index + key.count
                if bytes[next] == UInt8(ascii: "=") && bytes[next + 1] == UInt8(ascii: "\"") {
                    next += 2
                } else if bytes[next] == UInt8(ascii: ">") {
                    next += 1
                } else {
                    index += 1
                    continue
                }
                if next < bytes.count, bytes[next] >= UInt8(ascii: "0"), bytes[next] <= UInt8(ascii: "9") {
                    return Int(bytes[next] - UInt8(ascii: "0"))
                }
            }
            index += 1
        }
        return nil
    }
}

extension RGBImage {
    /// The image turned upright as `ImageOps.exif_transpose` does; orientations other than 2...8 leave it as it is.
    public func transposed(exifOrientation orientation: Int) -> RGBImage {
        guard (2...8).contains(orientation) else { return self }
        let swapsAxes = orientation >= 5
        let outWidth = swapsAxes ? height : width
        let outHeight = swapsAxes ? width : height
        var out = [UInt8](repeating: 0, count: pixels.count)
        let w = width, h = height
        pixels.withUnsafeBufferPointer { source in
            out.withUnsafeMutableBufferPointer { target in
                for y in 0..<outHeight {
                    for x in 0..<outWidth {
                        // Source pixel for each of Pillow's Transpose methods.
                        let (sx, sy): (Int, Int) = switch orientation {
                        case 2: (w - 1 - x, y)  // FLIP_LEFT_RIGHT
                        case 3: (w - 1 - x, h - 1 - y)  // ROTATE_180
                        case 4: (x, h - 1 - y)  // FLIP_TOP_BOTTOM
                        case 5: (y, x)  // TRANSPOSE
                        case 6: (y, h - 1 - x)  // ROTATE_270
                        case 7: (w - 1 - y, h - 1 - x)  // TRANSVERSE
                        default: (w - 1 - y, x)  // 8: ROTATE_90
                        }
                        let from = (sy * w + sx) * 3, to = (y * outWidth + x) * 3
                        target[to] = source[from]
                        target[to + 1] = source[from + 1]
                        target[to + 2] = source[from + 2]
                    }
                }
            }
        }
        return RGBImage(width: outWidth, height: outHeight, pixels: out)
    }
}
