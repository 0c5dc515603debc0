import Foundation
import VLMTensor

/// transformers' `ViltImageProcessorPil`: each image resized so its short side is `size["shortest_edge"]` and its long
/// side at most 1333/800 of that, both rounded down to a multiple of `size_divisor`; rescaled and normalized; then
/// the batch zero-padded at the bottom and right to its largest height and width, with a pixel mask of the valid
/// pixels.
public struct ViltImageProcessor: ImageProcessor {
    /// Resampling, rescaling and normalization (`size` is always a shortest edge here; no centre crop).
    public let config: StandardImageProcessorConfig
    public let shortestEdge: Int
    public let sizeDivisor: Int
    public let doPad: Bool

    /// `ViltImageProcessorPil`'s class defaults: shortest edge 384, divisor 32, bicubic, ImageNet-standard mean/std.
    public static let defaults: StandardImageProcessorConfig = {
        var config = StandardImageProcessorConfig.vit
        config.size = .shortestEdge(384)
        config.resample = .bicubic
        config.defaultToSquare = false
        return config
    }()

    /// Reads a ViLT image processor config (the `image_processor` object or preprocessor_config.json); `file` is
    /// what errors name.
    public init(json data: Data, file: String) throws {
        config = try StandardImageProcessorConfig(json: data, defaults: Self.defaults, file: file)
        guard case .shortestEdge(let edge) = config.size else {
            throw ImageProcessorError.invalidConfig(file: file, reason: "ViltImageProcessor's size must be {\"shortest_edge\": N}")
        }
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
        shortestEdge = edge
        sizeDivisor = object["size_divisor"] as? Int ?? 32
        doPad = object["do_pad"] as? Bool ?? true
        guard sizeDivisor > 0 else { throw ImageProcessorError.invalidConfig(file: file, reason: "size_divisor must be positive") }
    }

    /// The (height, width) an image of this size is resized to (`get_resize_output_image_size`).
    public func outputSize(height: Int, width: Int) -> (height: Int, width: Int) {
        guard config.doResize else { return (height, width) }
        let shorter = Double(shortestEdge), longer = Double(Int(1333.0 / 800.0 * shorter))
        let scale = shorter / Double(min(height, width))
        var (newHeight, newWidth) = height < width ? (shorter, scale * Double(width)) : (scale * Double(height), shorter)
        if max(newHeight, newWidth) > longer {
            let bound = longer / max(newHeight, newWidth)
            (newHeight, newWidth) = (bound * newHeight, bound * newWidth)
        }
        let rounded = (Int(newHeight + 0.5), Int(newWidth + 0.5))
        return (rounded.0 / sizeDivisor * sizeDivisor, rounded.1 / sizeDivisor * sizeDivisor)
    }

    /// pixel_values `[N, 3, H, W]` (padded to the batch's largest image) and pixel_mask `[N, H, W]`, exactly as
    /// `ViltImageProcessorPil(images, return_tensors="pt")`.
    ///
    /// - Throws: `ImageProcessorError.invalidConfig` when an image would resize to nothing, and
    ///   `ImageProcessorError.unequalSizes` for differently sized images without `do_pad`.
    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages {
        let sizes = images.map { ImageSize(height: $0.height, width: $0.width) }
        let processed = try images.map { image -> Tensor in
            let (height, width) = outputSize(height: image.height, width: image.width)
            guard height > 0, width > 0 else {
                throw ImageProcessorError.invalidConfig(file: "ViltImageProcessor", reason: "a \(image.width)×\(image.height) image resizes to nothing at shortest edge \(shortestEdge) and size divisor \(sizeDivisor)")
            }
            var exact = config
            exact.size = .exact(height: height, width: width)
            return try StandardImageProcessor(config: exact).preprocess([image]).pixelValues
        }
        let height = processed.map { $0.shape[2] }.max() ?? 0, width = processed.map { $0.shape[3] }.max() ?? 0
        guard doPad else {
            guard processed.allSatisfy({ $0.shape[2] == height && $0.shape[3] == width }) else {
                throw ImageProcessorError.unequalSizes(processed.map { ImageSize(height: $0.shape[2], width: $0.shape[3]) })
            }
            return ProcessedImages(pixelValues: processed.isEmpty ? Tensor(zeros: [0, 3, 0, 0]) : concatenate(processed, axis: 0),
                                   imageSizes: sizes)
        }
        let pixels = Tensor(zeros: [processed.count, 3, height, width])
        let mask = Tensor(zeros: [processed.count, height, width])
        for (n, image) in processed.enumerated() {
            let (h, w) = (image.shape[2], image.shape[3])
            for c in 0..<3 {
                for y in 0..<h {
                    (pixels.storage.pointer + ((n * 3 + c) * height + y) * width)
                        .update(from: image.storage.pointer + (c * h + y) * w, count: w)
                }
            }
            for y in 0..<h { (mask.storage.pointer + (n * height + y) * width).update(repeating: 1, count: w) }
        }
        return ProcessedImages(pixelValues: pixels, imageSizes: sizes, pixelMask: mask)
    }
}
