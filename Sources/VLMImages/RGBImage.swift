/// 8-bit RGB pixels, row-major, interleaved (what Pillow's `convert("RGB")` gives).
public struct RGBImage: Sendable, Equatable {
    public let width: Int
    public let height: Int
    /// `width * height * 3` bytes: R, G, B for each pixel, rows top to bottom.
    public var pixels: [UInt8]

    /// Wraps pixel bytes; `pixels.count` must be `width * height * 3`.
    public init(width: Int, height: Int, pixels: [UInt8]) {
        precondition(width >= 0 && height >= 0 && pixels.count == width * height * 3,
                     "\(pixels.count) bytes do not make a \(width)x\(height) RGB image")
        self.width = width
        self.height = height
        self.pixels = pixels
    }
}

/// Why an image could not be read. Every case names the file.
public enum ImageError: Error, CustomStringConvertible {
    case unreadable(file: String, reason: String)
    case unknownFormat(file: String)
    case corrupt(file: String, format: String, reason: String)
    case tooLarge(file: String, width: Int, height: Int, limit: Int)
    case unsupported(file: String, reason: String)
    /// An image could not be encoded or written.
    case unwritable(file: String, reason: String)

    public var description: String {
        switch self {
        case .unreadable(let file, let reason): "\(file): cannot read: \(reason)"
        case .unknownFormat(let file): "\(file): not a JPEG, PNG, WebP, GIF, BMP or TIFF image"
        case .corrupt(let file, let format, let reason): "\(file): corrupt or truncated \(format): \(reason)"
        case .tooLarge(let file, let width, let height, let limit):
            "\(file): \(width)x\(height) image exceeds \(limit) pixels (a decompression bomb?)"
        case .unsupported(let file, let reason): "\(file): unsupported image: \(reason)"
        case .unwritable(let file, let reason): "\(file): cannot write: \(reason)"
        }
    }
}
