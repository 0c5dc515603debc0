/// EXIF orientation, found the way Pillow's `Image.getexif()` finds it.
enum Orientation {
    /// The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block (with or without the "Exif\0\0" prefix
    /// JPEG puts in front); nil when absent or unreadable, as Pillow then leaves the image as it is.
    static func fromEXIF(_ bytes: ArraySlice<UInt8>) -> Int? {
        var exif = Array(bytes)
        if exif.starts(with: Array("Exif\0\0".utf8)) { exif.removeFirst(6) }
        guard exif.count >= 8 else { return nil }
        let littleEndian: Bool
        if exif[0] == 0x49, exif[1] == 0x49 { littleEndian = true } else if exif[0] == 0x4D, exif[1] == 0x4D {
            littleEndian = false
        } else { return nil }
        func u16(_ at: Int) -> Int? {
            guard at >= 0, at + 2 <= exif.count else { return nil }
            return littleEndian ? Int(exif[at]) | Int(exif[at + 1]) << 8 : Int(exif[at]) << 8 | Int(exif[at + 1])
        }
        func u32(_ at: Int) -> Int? {
            guard let low = u16(littleEndian ? at : at + 2), let high = u16(littleEndian ? at + 2 : at) else { return nil }
            return high << 16 | low
        }
        guard let ifd = u32(4), let count = u16(ifd) else { return nil }
        for entry in 0..<count {
            let at = ifd + 2 + entry * 12
            guard let tag = u16(at), let type = u16(at + 2) else { return nil }
            guard tag == 0x0112 else { continue }
            switch type {
            case 3: return u16(at + 8)
            case 4: return u32(at + 8)
            default: return nil
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
