import CSPNG
import Foundation

/// How the 8-bit samples given to ``PNGEncoding`` are laid out per pixel.
public enum PNGColorType: Sendable {
    /// One grey sample (a mask or probability map).
    case gray
    /// Red, green, blue.
    case rgb
    /// Red, green, blue, alpha (straight, not premultiplied).
    case rgba

    var channels: Int {
        switch self {
        case .gray: 1
        case .rgb: 3
        case .rgba: 4
        }
    }

    var spng: spng_color_type {
        switch self {
        case .gray: SPNG_COLOR_TYPE_GRAYSCALE
        case .rgb: SPNG_COLOR_TYPE_TRUECOLOR
        case .rgba: SPNG_COLOR_TYPE_TRUECOLOR_ALPHA
        }
    }
}

/// PNG writing through libspng: 8-bit grey, RGB and RGBA, rows top to bottom, zlib's default compression and
/// libspng's per-row filter choice.
public enum PNGEncoding {
    /// A PNG file of `width`×`height` pixels given as interleaved 8-bit samples; `name` identifies the image in errors.
    ///
    /// - Throws: ``ImageError/unwritable(file:reason:)`` naming `name` when the sizes do not match the samples, or
    ///   libspng refuses the image (PNG holds at most 2³¹ − 1 pixels a side).
    public static func encode(_ samples: [UInt8], width: Int, height: Int, color: PNGColorType,
                              name: String = "PNG image") throws -> [UInt8] {
        guard width > 0, height > 0, width <= Int(Int32.max), height <= Int(Int32.max),
              samples.count == width * height * color.channels else {
            throw ImageError.unwritable(file: name, reason: "\(samples.count) samples do not make a \(width)x\(height) image of \(color.channels) channel(s)")
        }
        guard let context = spng_ctx_new(Int32(SPNG_CTX_ENCODER.rawValue)) else {
            throw ImageError.unwritable(file: name, reason: "libspng failed to start")
        }
        defer { spng_ctx_free(context) }
        func check(_ status: Int32) throws {
            if status != 0 { throw ImageError.unwritable(file: name, reason: String(cString: spng_strerror(status))) }
        }
        try check(spng_set_option(context, SPNG_ENCODE_TO_BUFFER, 1))
        var header = spng_ihdr(width: UInt32(width), height: UInt32(height), bit_depth: 8,
                               color_type: UInt8(color.spng.rawValue), compression_method: 0, filter_method: 0,
                               interlace_method: 0)
        try check(spng_set_ihdr(context, &header))
        try samples.withUnsafeBytes { bytes in
            try check(spng_encode_image(context, bytes.baseAddress, bytes.count, Int32(SPNG_FMT_PNG.rawValue),
                                        Int32(SPNG_ENCODE_FINALIZE.rawValue)))
        }
        var length = 0
        var status: Int32 = 0
        guard let buffer = spng_get_png_buffer(context, &length, &status) else {
            try check(status)
            throw ImageError.unwritable(file: name, reason: "libspng returned no PNG")
        }
        defer { free(buffer) }
        return Array(UnsafeRawBufferPointer(start: buffer, count: length))
    }

    /// Encodes the samples and writes them to `url`, replacing any file there.
    ///
    /// - Throws: ``ImageError/unwritable(file:reason:)`` naming the path.
    public static func write(_ samples: [UInt8], width: Int, height: Int, color: PNGColorType, to url: URL) throws {
        let bytes = try encode(samples, width: width, height: height, color: color, name: url.path)
        do {
            try Data(bytes).write(to: url, options: .atomic)
        } catch {
            throw ImageError.unwritable(file: url.path, reason: (error as NSError).localizedFailureReason ?? error.localizedDescription)
        }
    }
}

extension RGBImage {
    /// The image as an 8-bit RGB PNG file.
    public func pngBytes() throws -> [UInt8] {
        try PNGEncoding.encode(pixels, width: width, height: height, color: .rgb)
    }

    /// Writes the image to `url` as an 8-bit RGB PNG, replacing any file there.
    ///
    /// - Throws: ``ImageError/unwritable(file:reason:)`` naming the path.
    public func writePNG(to url: URL) throws {
        try PNGEncoding.write(pixels, width: width, height: height, color: .rgb, to: url)
    }
}
