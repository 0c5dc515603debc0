import CWebP

/// WebP through libwebp's simple decoder (fancy upsampling, no dithering), the first and only frame of a still
/// image, as Pillow decodes; alpha is decoded and dropped like Pillow's RGBA → RGB.
enum WebPDecoding {
    static func decode(_ data: [UInt8], name: String) throws -> (image: RGBImage, orientation: Int) {
        var features = WebPBitstreamFeatures()
        let status = data.withUnsafeBufferPointer { WebPGetFeatures($0.baseAddress, $0.count, &features) }
        guard status == VP8_STATUS_OK else {
            throw ImageError.corrupt(file: name, format: "WebP", reason: "bitstream status \(status.rawValue)")
        }
        if features.has_animation != 0 {
            throw ImageError.unsupported(file: name, reason: "animated WebP")
        }
        let width = Int(features.width), height = Int(features.height)
        try ImageDecoder.checkDimensions(width: width, height: height, name: name, format: "WebP")

        let channels = features.has_alpha != 0 ? 4 : 3
        var decoded = [UInt8](repeating: 0, count: width * height * channels)
        let succeeded = data.withUnsafeBufferPointer { source in
            decoded.withUnsafeMutableBufferPointer { target in
                let stride = Int32(width * channels)
                return channels == 4
                    ? WebPDecodeRGBAInto(source.baseAddress, source.count, target.baseAddress, target.count, stride) != nil
                    : WebPDecodeRGBInto(source.baseAddress, source.count, target.baseAddress, target.count, stride) != nil
            }
        }
        guard succeeded else { throw ImageError.corrupt(file: name, format: "WebP", reason: "decoding failed") }
        let rgb = channels == 4 ? PixelConversion.firstThree(decoded, channels: 4) : decoded
        return (RGBImage(width: width, height: height, pixels: rgb), orientation(in: data))
    }

    /// From the RIFF container's EXIF chunk, else its XMP chunk.
    static func orientation(in data: [UInt8]) -> Int {
        var exif: ArraySlice<UInt8>?
        var xmp: ArraySlice<UInt8>?
        var at = 12
        while at + 8 <= data.count {
            let fourCC = String(decoding: data[at..<at + 4], as: UTF8.self)
            let size = Int(data[at + 4]) | Int(data[at + 5]) << 8 | Int(data[at + 6]) << 16 | Int(data[at + 7]) << 24
            guard size <= data.count - at - 8 else { break }
            let payload = data[(at + 8)..<(at + 8 + size)]
            if fourCC == "EXIF" { exif = payload } else if fourCC == "XMP " { xmp = payload }
            at += 8 + size + (size & 1)
        }
        return exif.flatMap(Orientation.fromEXIF) ?? xmp.flatMap(Orientation.fromXMP) ?? 1
    }
}
