import CWebP

/// WebP through libwebp's animation decoder, as Pillow reads every WebP file, still or animated: the first frame
/// composed on the canvas (transparent black where it does not reach), decoded as RGBA with alpha then dropped like
/// Pillow's RGBA → RGB. Orientation comes from the first EXIF chunk, else the first XMP chunk, as libwebp's demuxer
/// hands them to Pillow.
enum WebPDecoding {
    static func decode(_ data: [UInt8], name: String) throws -> (image: RGBImage, orientation: Int) {
        var features = WebPBitstreamFeatures()
        let status = data.withUnsafeBufferPointer { WebPGetFeatures($0.baseAddress, $0.count, &features) }
        guard status == VP8_STATUS_OK else {
            throw ImageError.corrupt(file: name, format: "WebP", reason: "bitstream status \(status.rawValue)")
        }
        // The canvas size, checked before the decoder allocates the canvas.
        try ImageDecoder.checkDimensions(width: Int(features.width), height: Int(features.height), name: name, format: "WebP")

        return try data.withUnsafeBufferPointer { source in
            var webp = WebPData(bytes: source.baseAddress, size: source.count)
            guard let decoder = WebPAnimDecoderNew(&webp, nil) else {
                throw ImageError.corrupt(file: name, format: "WebP", reason: "libwebp cannot read its structure")
            }
            defer { WebPAnimDecoderDelete(decoder) }
            var info = WebPAnimInfo()
            guard WebPAnimDecoderGetInfo(decoder, &info) != 0 else {
                throw ImageError.corrupt(file: name, format: "WebP", reason: "libwebp cannot read its structure")
            }
            let width = Int(info.canvas_width), height = Int(info.canvas_height)
            try ImageDecoder.checkDimensions(width: width, height: height, name: name, format: "WebP")
            var canvas: UnsafeMutablePointer<UInt8>?
            var timestamp: Int32 = 0
            guard WebPAnimDecoderGetNext(decoder, &canvas, &timestamp) != 0, let canvas else {
                throw ImageError.corrupt(file: name, format: "WebP", reason: "the first frame does not decode")
            }
            let rgba = [UInt8](UnsafeBufferPointer(start: canvas, count: width * height * 4))
            let image = RGBImage(width: width, height: height, pixels: PixelConversion.firstThree(rgba, channels: 4))

            let demuxer = WebPAnimDecoderGetDemuxer(decoder)
            func chunk(_ fourCC: String) -> ArraySlice<UInt8>? {
                var iterator = WebPChunkIterator()
                defer { WebPDemuxReleaseChunkIterator(&iterator) }
                guard WebPDemuxGetChunk(demuxer, fourCC, 1, &iterator) != 0, iterator.chunk.size > 0,
                      let bytes = iterator.chunk.bytes else { return nil }
                return ArraySlice(UnsafeBufferPointer(start: bytes, count: iterator.chunk.size))
            }
            let orientation: Int
            do throws(Orientation.UnreadableEXIF) {
                orientation = try chunk("EXIF").flatMap(Orientation.fromEXIF) ?? chunk("XMP ").flatMap(Orientation.fromXMP) ?? 1
            } catch {
                throw ImageError.corrupt(file: name, format: "WebP", reason: error.reason)
            }
            return (image, orientation)
        }
    }
}
