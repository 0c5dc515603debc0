import CJPEGProbe
import CTurboJPEG

/// JPEG through libturbojpeg with libjpeg's defaults (accurate integer IDCT, fancy upsampling), as Pillow decodes.
enum JPEGDecoding {
    static func decode(_ data: [UInt8], name: String) throws -> (image: RGBImage, orientation: Int) {
        guard let handle = tjInitDecompress() else {
            throw ImageError.unsupported(file: name, reason: "libturbojpeg failed to start")
        }
        defer { tjDestroy(handle) }
        func failure() -> ImageError {
            .corrupt(file: name, format: "JPEG", reason: String(cString: tjGetErrorStr2(handle)))
        }

        var width: Int32 = 0, height: Int32 = 0, subsampling: Int32 = 0, colorspace: Int32 = 0
        let header = data.withUnsafeBufferPointer {
            tjDecompressHeader3(handle, $0.baseAddress, UInt(data.count), &width, &height, &subsampling, &colorspace)
        }
        // libjpeg only warns about stray bytes before a marker; Pillow reads on, and so does this.
        guard header == 0 || isWarning(handle) else { throw failure() }
        let orientation: Int, scan: Int?
        do throws(Orientation.UnreadableEXIF) {
            (orientation, scan) = try Self.markers(in: data)
        } catch {
            throw ImageError.corrupt(file: name, format: "JPEG", reason: error.reason)
        }
        try ImageDecoder.checkDimensions(width: Int(width), height: Int(height), name: name, format: "JPEG")

        // Pillow opens 1-component JPEGs as L, 4-component ones as CMYK (Adobe-inverted), the rest as RGB.
        let channels: Int, format: TJPF
        switch Int(colorspace) {
        case Int(TJCS_GRAY.rawValue): (channels, format) = (1, TJPF_GRAY)
        case Int(TJCS_CMYK.rawValue), Int(TJCS_YCCK.rawValue): (channels, format) = (4, TJPF_CMYK)
        default: (channels, format) = (3, TJPF_RGB)
        }
        let pixelCount = Int(width) * Int(height)
        var decoded = [UInt8](repeating: 0, count: pixelCount * channels)
        let status = data.withUnsafeBufferPointer { source in
            decoded.withUnsafeMutableBufferPointer { target in
                tjDecompress2(handle, source.baseAddress, UInt(data.count), target.baseAddress, width, 0, height,
                              format.rawValue, 0)
            }
        }
        // libjpeg reads to the end-of-image marker and warns where the data ends before it. libturbojpeg keeps only
        // its first warning's message, so an earlier warning would hide that one: look for the marker.
        let complete = scan.map { scan in
            data[scan...].indices.contains { $0 + 1 < data.count && data[$0] == 0xFF && data[$0 + 1] == 0xD9 }
        } ?? false
        let endsEarly = String(cString: tjGetErrorStr2(handle)).hasPrefix("Premature end of JPEG file")
        // Pillow shrugs off libjpeg's warnings (stray bytes, odd markers) but refuses data that ends early.
        if status != 0 && !isWarning(handle) && !(endsEarly && !complete) { throw failure() }
        // Without the marker, Pillow still reads a file whose scanlines all arrive (it stops at the last one), and
        // refuses one that ends before: libjpeg's own API, reading as Pillow's decoder reads, tells which.
        if !complete {
            let scanlines = data.withUnsafeBufferPointer { vlm_jpeg_scanlines_complete($0.baseAddress, $0.count) }
            guard scan != nil, scanlines == 1 else {
                throw ImageError.corrupt(file: name, format: "JPEG", reason: "Premature end of JPEG file")
            }
        }

        let rgb: [UInt8]
        switch channels {
        case 1: rgb = PixelConversion.greyToRGB(decoded)
        case 4: rgb = PixelConversion.invertedCMYKToRGB(decoded)
        default: rgb = decoded
        }
        return (RGBImage(width: Int(width), height: Int(height), pixels: rgb), orientation)
    }

    /// libjpeg's warnings (its JWRN_ messages) other than "Premature end of JPEG file". libturbojpeg's error code cannot
    /// tell: once a warning was seen it reports TJERR_WARNING even for a fatal error after it. Its message is that of
    /// the last event, and a fatal error ends decoding, so a warning's message means no fatal error followed.
    static func isWarning(_ handle: tjhandle) -> Bool {
        let message = String(cString: tjGetErrorStr2(handle))
        return ["Corrupt JPEG data", "Unknown Adobe color transform", "Inconsistent progression sequence",
                "Warning: unknown JFIF revision", "Invalid SOS parameters for sequential JPEG",
                "Application transferred too many scanlines"].contains { message.hasPrefix($0) }
    }

    /// JpegImagePlugin's walk over the markers before the scan: junk bytes between markers are skipped, a marker it
    /// does not know or a segment running past the end makes Pillow refuse the file. The orientation comes from the
    /// first EXIF APP1 segment (later ones are appended to it), else from the last XMP one. Also where the first scan's
    /// data starts, nil without one.
    static func markers(in data: [UInt8]) throws(Orientation.UnreadableEXIF) -> (orientation: Int, scan: Int?) {
        var exif: ArraySlice<UInt8>?
        var xmp: ArraySlice<UInt8>?
        let xmpPrefix = Array("http://ns.adobe.com/xap/1.0/\0".utf8)
        var jfifDPI = false
        var scan: Int?
        var at = 3  // after FF D8 FF, whose last byte starts the first marker
        var pending = true  // an FF read and not yet paired with the byte after it
        markers: while true {
            if !pending {
                guard at < data.count else { break markers }
                if data[at] != 0xFF { at += 1; continue }  // junk
                at += 1
            }
            pending = false
            guard at < data.count else { break markers }
            let marker = data[at]
            at += 1
            switch marker {
            case 0x00: continue  // FF00: escaped data
            case 0xFF: pending = true  // fill byte: this FF starts the marker
            case 0xC8, 0xD0...0xD9, 0xF0...0xFD: continue  // no segment
            case 0xC0...0xCF, 0xDA...0xEF, 0xFE:
                guard at + 2 <= data.count else { throw .init(reason: "segment length past the end") }
                let length = (Int(data[at]) << 8 | Int(data[at + 1])) - 2
                at += 2
                let end = at + max(length, 0)
                guard end <= data.count else { throw .init(reason: "marker segment runs past the end of the file") }
                let segment = data[at..<end]
                at = end
                switch marker {
                case 0xC0...0xC3, 0xC5...0xC7, 0xC9...0xCB, 0xCD...0xCF, 0xDE:
                    guard segment.count >= 6 else { throw .init(reason: "truncated frame header") }
                    guard segment[segment.startIndex] == 8 else { throw .init(reason: "\(segment[segment.startIndex])-bit samples") }
                    guard [1, 3, 4].contains(segment[segment.startIndex + 5]) else {
                        throw .init(reason: "\(segment[segment.startIndex + 5]) components")
                    }
                case 0xDB:
                    var table = segment
                    while let first = table.first {
                        let size = first >> 4 == 0 ? 65 : 129
                        guard table.count >= size else { throw .init(reason: "bad quantization table marker") }
                        table = table.dropFirst(size)
                    }
                case 0xE1 where segment.starts(with: Array("Exif\0\0".utf8)):
                    exif = exif.map { $0 + segment.dropFirst(6) } ?? segment
                case 0xE1 where segment.starts(with: xmpPrefix):
                    xmp = segment.dropFirst(xmpPrefix.count)
                case 0xE0 where segment.starts(with: Array("JFIF".utf8)):
                    guard segment.count >= 7 else { throw .init(reason: "truncated JFIF segment") }
                    if segment.count >= 12, [1, 2].contains(segment[segment.startIndex + 7]) { jfifDPI = true }
                case 0xEE where segment.starts(with: Array("Adobe".utf8)) && segment.count < 7:
                    throw .init(reason: "truncated Adobe segment")
                default: break
                }
                if marker == 0xDA {
                    scan = at
                    break markers
                }
            default:
                throw .init(reason: "no marker found (FF\(String(marker, radix: 16, uppercase: true)))")
            }
        }
        do throws(Orientation.UnreadableEXIF) {
            return (try exif.flatMap(Orientation.fromEXIF) ?? xmp.flatMap(Orientation.fromXMP) ?? 1, scan)
        } catch where !jfifDPI {
            // Without a JFIF resolution, Pillow's _open reads the EXIF for one and swallows its failure; getexif then
            // returns the empty EXIF it kept, with no XMP fallback.
            return (1, scan)
        }
    }
}
