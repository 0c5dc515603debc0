import CSPNG

/// PNG through libspng in the file's own sample format, then converted the way Pillow converts the mode its
/// PngImagePlugin opens the file in (`_MODES`): 16-bit colour keeps the high byte ("RGB;16B"), 16-bit grey opens as
/// I;16 and clips to 255, 2- and 4-bit grey scale up, palettes look up colours, tRNS and alpha are dropped.
enum PNGDecoding {
    /// Ancillary chunks (text, ICC, EXIF) above these sizes are errors rather than allocations.
    static let chunkLimit = 64 << 20
    /// The largest ratio of inflated to deflated bytes zlib's format allows (258-byte matches at one bit each).
    static let maximumDeflateRatio = 1032

    static func decode(_ data: [UInt8], name: String) throws -> (image: RGBImage, orientation: Int) {
        func check(_ status: Int32) throws {
            if status != 0 {
                throw ImageError.corrupt(file: name, format: "PNG", reason: String(cString: spng_strerror(status)))
            }
        }

        // The header, read by libspng from the file, is judged before anything else.
        guard let header = spng_ctx_new(0) else {
            throw ImageError.unsupported(file: name, reason: "libspng failed to start")
        }
        defer { spng_ctx_free(header) }
        try check(spng_set_chunk_limits(header, chunkLimit, chunkLimit))
        var ihdr = spng_ihdr()
        let chunks: PNGChunks = try data.withUnsafeBufferPointer { buffer in
            try check(spng_set_png_buffer(header, buffer.baseAddress, buffer.count))
            try check(spng_get_ihdr(header, &ihdr))
            try ImageDecoder.checkDimensions(width: Int(ihdr.width), height: Int(ihdr.height), name: name, format: "PNG")
            var size = 0
            try check(spng_decoded_image_size(header, Int32(SPNG_FMT_RAW.rawValue), &size))
            // Deflate never packs more than 1032 bytes into one, so a file this short cannot hold the image its header
            // declares: it is truncated, as Pillow would find after allocating the image. Refused before that.
            guard size / maximumDeflateRatio <= buffer.count else {
                throw ImageError.corrupt(file: name, format: "PNG", reason: "truncated: \(buffer.count) bytes cannot hold the \(ihdr.width)x\(ihdr.height) image the header declares")
            }
            // The header's size is judged first, so that a decompression bomb is called one whatever follows it.
            do throws(PNGChunks.Refusal) {
                return try PNGChunks(data)
            } catch {
                throw ImageError.corrupt(file: name, format: "PNG", reason: error.reason)
            }
        }
        let plain = chunks.plain

        // The pixels, from the plain PNG of what Pillow reads (zlib's own checksum is checked, as Pillow's inflate does).
        guard let context = spng_ctx_new(0) else {
            throw ImageError.unsupported(file: name, reason: "libspng failed to start")
        }
        defer { spng_ctx_free(context) }
        var size = 0
        let decoded: [UInt8] = try plain.withUnsafeBufferPointer { buffer in
            try check(spng_set_png_buffer(context, buffer.baseAddress, buffer.count))
            try check(spng_decoded_image_size(context, Int32(SPNG_FMT_RAW.rawValue), &size))
            var out = [UInt8](repeating: 0, count: size)
            try out.withUnsafeMutableBytes {
                try check(spng_decode_image(context, $0.baseAddress, size, Int32(SPNG_FMT_RAW.rawValue), 0))
            }
            return out
        }

        let width = Int(ihdr.width), height = Int(ihdr.height), depth = Int(ihdr.bit_depth)
        let rowBytes = decoded.count / height
        var rgb = [UInt8](repeating: 0, count: width * height * 3)
        // Reads sample `index` of a row, unpacking sub-byte depths (most significant bits first) and keeping the
        // high byte of 16-bit samples.
        func sample(_ row: Int, _ index: Int) -> Int {
            let base = row * rowBytes
            switch depth {
            case 16: return Int(decoded[base + index * 2])
            case 8: return Int(decoded[base + index])
            default:
                let perByte = 8 / depth
                let byte = Int(decoded[base + index / perByte])
                let shift = 8 - depth * (index % perByte + 1)
                return (byte >> shift) & ((1 << depth) - 1)
            }
        }

        switch Int(ihdr.color_type) {
        case Int(SPNG_COLOR_TYPE_GRAYSCALE.rawValue):
            for y in 0..<height {
                for x in 0..<width {
                    let value: Int
                    switch depth {
                    case 16:  // I;16 → RGB clips: any value with a non-zero high byte becomes 255.
                        let high = Int(decoded[y * rowBytes + x * 2]), low = Int(decoded[y * rowBytes + x * 2 + 1])
                        value = high == 0 ? low : 255
                    case 8: value = sample(y, x)
                    default: value = sample(y, x) * 255 / ((1 << depth) - 1)
                    }
                    let at = (y * width + x) * 3
                    rgb[at] = UInt8(value); rgb[at + 1] = UInt8(value); rgb[at + 2] = UInt8(value)
                }
            }
        case Int(SPNG_COLOR_TYPE_GRAYSCALE_ALPHA.rawValue):
            for y in 0..<height {
                for x in 0..<width {
                    let value = UInt8(sample(y, x * 2))
                    let at = (y * width + x) * 3
                    rgb[at] = value; rgb[at + 1] = value; rgb[at + 2] = value
                }
            }
        case Int(SPNG_COLOR_TYPE_TRUECOLOR.rawValue), Int(SPNG_COLOR_TYPE_TRUECOLOR_ALPHA.rawValue):
            let channels = Int(ihdr.color_type) == Int(SPNG_COLOR_TYPE_TRUECOLOR.rawValue) ? 3 : 4
            for y in 0..<height {
                for x in 0..<width {
                    for c in 0..<3 { rgb[(y * width + x) * 3 + c] = UInt8(sample(y, x * channels + c)) }
                }
            }
        case Int(SPNG_COLOR_TYPE_INDEXED.rawValue):
            var plte = spng_plte()
            try check(spng_get_plte(context, &plte))
            // Pillow's palette has 256 entries; those the file does not define are black.
            var palette = [UInt8](repeating: 0, count: 256 * 3)
            withUnsafeBytes(of: plte.entries) { entries in
                for i in 0..<min(Int(plte.n_entries), 256) {
                    for c in 0..<3 { palette[i * 3 + c] = entries[i * MemoryLayout<spng_plte_entry>.stride + c] }
                }
            }
            for y in 0..<height {
                for x in 0..<width {
                    let index = sample(y, x)
                    for c in 0..<3 { rgb[(y * width + x) * 3 + c] = palette[index * 3 + c] }
                }
            }
        default:
            throw ImageError.corrupt(file: name, format: "PNG", reason: "colour type \(ihdr.color_type)")
        }
        return (RGBImage(width: width, height: height, pixels: rgb), chunks.orientation)
    }
}
