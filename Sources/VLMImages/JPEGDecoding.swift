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
        guard header == 0 else { throw failure() }
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
        if status != 0 {
            // Pillow shrugs off libjpeg's warnings (stray bytes, odd markers) but refuses data that ends early.
            let message = String(cString: tjGetErrorStr2(handle))
            if tjGetErrorCode(handle) != TJERR_WARNING.rawValue || message.contains("Premature end") {
                throw failure()
            }
        }

        let rgb: [UInt8]
        switch channels {
        case 1: rgb = PixelConversion.greyToRGB(decoded)
        case 4: rgb = PixelConversion.invertedCMYKToRGB(decoded)
        default: rgb = decoded
        }
        return (RGBImage(width: Int(width), height: Int(height), pixels: rgb), orientation(in: data))
    }

    /// The orientation from the first EXIF APP1 segment, else from XMP, walking the markers before the scan.
    static func orientation(in data: [UInt8]) -> Int {
        var exif: ArraySlice<UInt8>?
        var xmp: ArraySlice<UInt8>?
        let xmpPrefix = Array("http://ns.adobe.com/xap/1.0/\0".utf8)
        var at = 2
        while at + 4 <= data.count, data[at] == 0xFF {
            let marker = data[at + 1]
            if marker == 0xFF { at += 1; continue }
            if marker == 0xDA || marker == 0xD9 { break }
            if (0xD0...0xD7).contains(marker) || marker == 0x01 { at += 2; continue }
            let length = Int(data[at + 2]) << 8 | Int(data[at + 3])
            guard length >= 2, at + 2 + length <= data.count else { break }
            let segment = data[(at + 4)..<(at + 2 + length)]
            if marker == 0xE1 {
                if segment.starts(with: Array("Exif\0\0".utf8)) {
                    if exif == nil { exif = segment }
                } else if segment.starts(with: xmpPrefix) {
                    xmp = segment.dropFirst(xmpPrefix.count)
                }
            }
            at += 2 + length
        }
        return exif.flatMap(Orientation.fromEXIF) ?? xmp.flatMap(Orientation.fromXMP) ?? 1
    }
}
