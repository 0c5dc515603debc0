import Foundation

/// Decodes JPEG, PNG, WebP, GIF (first frame), BMP and TIFF (first page, common kinds) files to RGB exactly as transformers' `load_image` does with Pillow:
/// `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`.
public enum ImageDecoder {
    /// Pillow's `Image.MAX_IMAGE_PIXELS` (89,478,485 unless set): larger images are refused before any pixel buffer is
    /// allocated. Set for a scope, as a server does for its requests: `ImageDecoder.$maxPixels.withValue(n) { … }`
    /// (a task-local value, so concurrent work elsewhere keeps its own).
    @TaskLocal public static var maxPixels = 89_478_485

    /// Larger files are refused before they are read.
    static let maximumFileSize = 1 << 30

    /// JPEG (libturbojpeg), PNG (libspng), WebP (libwebp), TIFF (libtiff), GIF, BMP and DIB (read by hand), sniffed by magic bytes, converted to RGB like Pillow's
    /// `convert("RGB")` (alpha dropped, not composited), with EXIF orientation applied like transformers' `load_image`
    /// (`ImageOps.exif_transpose`).
    public static func decode(contentsOf url: URL) throws -> RGBImage {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) else {
            throw ImageError.unreadable(file: url.path, reason: "no such file")
        }
        guard !isDirectory.boolValue else { throw ImageError.unreadable(file: url.path, reason: "is a directory") }
        let attributes = try? FileManager.default.attributesOfItem(atPath: url.path)
        // A device or a pipe (/dev/zero, a FIFO) reports no size and may never end: only regular files are read.
        guard attributes?[.type] as? FileAttributeType == .typeRegular else {
            throw ImageError.unreadable(file: url.path, reason: "not a regular file")
        }
        // No image format Pillow opens under its pixel limit needs a gigabyte of compressed bytes; refuse before reading.
        let size = (attributes?[.size] as? NSNumber)?.intValue ?? 0
        guard size <= maximumFileSize else {
            throw ImageError.unreadable(file: url.path, reason: "\(size) bytes, larger than the \(maximumFileSize >> 20) MiB an image file may have")
        }
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw ImageError.unreadable(file: url.path, reason: error.localizedDescription)
        }
        return try decode([UInt8](data), name: url.path)
    }

    /// Decodes an image held in memory; `name` identifies it in errors.
    public static func decode(_ data: [UInt8], name: String) throws -> RGBImage {
        let decoded: (image: RGBImage, orientation: Int)
        if data.starts(with: [0xFF, 0xD8, 0xFF]) {
            decoded = try JPEGDecoding.decode(data, name: name)
        } else if data.starts(with: [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) {
            decoded = try PNGDecoding.decode(data, name: name)
        } else if data.count >= 12, data.starts(with: Array("RIFF".utf8)), Array(data[8..<12]) == Array("WEBP".utf8) {
            decoded = try WebPDecoding.decode(data, name: name)
        } else if [[0x49, 0x49, 0x2A, 0x00], [0x4D, 0x4D, 0x00, 0x2A], [0x49, 0x49, 0x2B, 0x00], [0x4D, 0x4D, 0x00, 0x2B]]
                    .contains(where: { data.starts(with: $0) }) {
            decoded = try TIFFDecoding.decode(data, name: name)
        } else if data.starts(with: Array("GIF87a".utf8)) || data.starts(with: Array("GIF89a".utf8)) {
            decoded = try GIFDecoding.decode(data, name: name)
        } else if data.starts(with: Array("BM".utf8)) {
            decoded = try BMPDecoding.decode(data, name: name, fileHeader: true)
        } else if data.count >= 4, [12, 40, 52, 56, 64, 108, 124].contains(Int(data[0]) | Int(data[1]) << 8 | Int(data[2]) << 16 | Int(data[3]) << 24) {
            // Pillow's DIB: a BMP info header without the file header (as on the Windows clipboard).
            decoded = try BMPDecoding.decode(data, name: name, fileHeader: false)
        } else if let format = otherFormat(data) {
            throw ImageError.unsupported(file: name, reason: "\(format) images are not read (JPEG, PNG, WebP, GIF, BMP and TIFF are)")
        } else {
            throw ImageError.unknownFormat(file: name)
        }
        return decoded.image.transposed(exifOrientation: decoded.orientation)
    }

    /// Formats Pillow also opens, named from their magic bytes so that a refusal says what the file is.
    static func otherFormat(_ data: [UInt8]) -> String? {
        func has(_ prefix: String, at offset: Int = 0) -> Bool {
            data.count >= offset + prefix.utf8.count && data[offset..<(offset + prefix.utf8.count)].elementsEqual(prefix.utf8)
        }
        if has("ftypavif", at: 4) || has("ftypavis", at: 4) { return "AVIF" }
        if has("ftyphei", at: 4) || has("ftypmif1", at: 4) { return "HEIF" }
        if has("\0\0\0\u{0C}jP  ") || data.starts(with: [0xFF, 0x4F, 0xFF, 0x51]) { return "JPEG 2000" }
        if data.starts(with: [0, 0, 1, 0]) { return "ICO" }
        if has("8BPS") { return "PSD" }
        if has("qoif") { return "QOI" }
        if data.count >= 2, data[0] == UInt8(ascii: "P"), (UInt8(ascii: "1")...UInt8(ascii: "7")).contains(data[1]) { return "PNM" }
        return nil
    }

    /// Refuses empty images and decompression bombs from their header dimensions.
    static func checkDimensions(width: Int, height: Int, name: String, format: String) throws {
        if width <= 0 || height <= 0 {
            throw ImageError.corrupt(file: name, format: format, reason: "image is \(width)x\(height)")
        }
        if width > maxPixels || height > maxPixels || width * height > maxPixels {
            throw ImageError.tooLarge(file: name, width: width, height: height, limit: maxPixels)
        }
    }
}
