import Foundation

/// Decodes JPEG, PNG and WebP files to RGB exactly as transformers' `load_image` does with Pillow:
/// `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`.
public enum ImageDecoder {
    /// Pillow's `Image.MAX_IMAGE_PIXELS`; larger images are refused before any pixel buffer is allocated.
    public static let maxPixels = 89_478_485

    /// Larger files are refused before they are read.
    static let maximumFileSize = 1 << 30

    /// JPEG (libturbojpeg), PNG (libspng), WebP (libwebp), sniffed by magic bytes, converted to RGB like Pillow's
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
        } else {
            throw ImageError.unknownFormat(file: name)
        }
        return decoded.image.transposed(exifOrientation: decoded.orientation)
    }

    /// Refuses empty images and decompression bombs from their header dimensions.
    static func checkDimensions(width: Int, height: Int, name: String, format: String) throws {
        if width <= 0 || height <= 0 {
            throw ImageError.corrupt(file: name, format: format, reason: "image is \(width)x\(height)")
        }
        if width > maxPixels || height > maxPixels || width * height > maxPixels {
            throw ImageError.tooLarge(file: name, width: width, height: height)
        }
    }
}
