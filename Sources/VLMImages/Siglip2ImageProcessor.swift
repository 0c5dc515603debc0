import Foundation
import VLMTensor

/// transformers' `Siglip2ImageProcessorPil` (NaFlex): each image resized, keeping its aspect ratio, to the largest
/// size whose sides are multiples of `patch_size` and whose patch count fits `max_num_patches`; rescaled and
/// normalized; cut into patches flattened row by row (each patch's pixels row-major, channels innermost) and padded
/// with zero patches to `max_num_patches`, with the mask of the real ones and each image's patch grid.
public struct Siglip2ImageProcessor: ImageProcessor {
    /// Resampling, rescaling and normalization (`size` and the centre crop are not used).
    public let config: StandardImageProcessorConfig
    public let patchSize: Int
    public let maxNumPatches: Int

    /// `Siglip2ImageProcessorPil`'s class defaults: bilinear, mean and std 0.5.
    public static let defaults: StandardImageProcessorConfig = {
        var config = StandardImageProcessorConfig.vit
        config.resample = .bilinear
        return config
    }()

    /// Reads a SigLIP 2 image processor config (the `image_processor` object or preprocessor_config.json); `file` is
    /// what errors name.
    public init(json data: Data, file: String) throws {
        config = try StandardImageProcessorConfig(json: data, defaults: Self.defaults, file: file)
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
        patchSize = object["patch_size"] as? Int ?? 16
        maxNumPatches = object["max_num_patches"] as? Int ?? 256
        guard patchSize > 0, maxNumPatches > 0 else {
            throw ImageProcessorError.invalidConfig(file: file, reason: "patch_size and max_num_patches must be positive")
        }
    }

    /// transformers' `get_image_size_for_max_num_patches`: a binary search, in float64 as Python runs it, for the
    /// largest scale whose size (each side scaled, rounded up to a multiple of the patch size, at least one patch)
    /// has at most `maxNumPatches` patches.
    public func outputSize(height: Int, width: Int) -> (height: Int, width: Int) {
        guard config.doResize else { return (height, width) }
        let patch = Double(patchSize)
        func scaled(_ size: Int, _ scale: Double) -> Int {
            Int(max(patch, ((Double(size) * scale) / patch).rounded(.up) * patch))
        }
        let eps = 1e-5
        var (low, high) = (eps / 10, 100.0)
        while high - low >= eps {
            let scale = (low + high) / 2
            let patches = (Double(scaled(height, scale)) / patch) * (Double(scaled(width, scale)) / patch)
            if patches <= Double(maxNumPatches) { low = scale } else { high = scale }
        }
        return (scaled(height, low), scaled(width, low))
    }

    /// pixel_values `[N, max_num_patches, p·p·3]`, pixel_attention_mask `[N, max_num_patches]` and spatial_shapes,
    /// exactly as `Siglip2ImageProcessorPil(images, return_tensors="pt")`.
    ///
    /// - Throws: `ImageProcessorError.invalidConfig` when, without `do_resize`, an image's sides are not multiples of
    ///   the patch size or it holds more than `max_num_patches` patches.
    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages {
        let p = patchSize, width = 3 * p * p
        let pixels = Tensor(zeros: [images.count, maxNumPatches, width])
        let mask = Tensor(zeros: [images.count, maxNumPatches])
        var shapes: [ImageSize] = []
        for (n, image) in images.enumerated() {
            let (height, width) = outputSize(height: image.height, width: image.width)
            let (rows, columns) = (height / p, width / p)
            guard height % p == 0, width % p == 0, rows * columns <= maxNumPatches else {
                throw ImageProcessorError.invalidConfig(file: "Siglip2ImageProcessor", reason: "a \(image.width)×\(image.height) image does not cut into at most \(maxNumPatches) patches of \(p)×\(p) without do_resize")
            }
            var exact = config
            exact.size = .exact(height: height, width: width)
            exact.doCenterCrop = false
            let planes = try StandardImageProcessor(config: exact).preprocess([image]).pixelValues
            patchify(planes, rows: rows, columns: columns, into: pixels.storage.pointer + n * maxNumPatches * 3 * p * p)
            (mask.storage.pointer + n * maxNumPatches).update(repeating: 1, count: rows * columns)
            shapes.append(ImageSize(height: rows, width: columns))
        }
        return ProcessedImages(pixelValues: pixels, imageSizes: images.map { ImageSize(height: $0.height, width: $0.width) },
                               pixelAttentionMask: mask, spatialShapes: shapes)
    }

    /// `convert_image_to_patches`: `[1, 3, rows·p, columns·p]` → `[rows·columns, p·p·3]`, patch (r, c) at row
    /// `r·columns + c`, its values ordered (y, x, channel).
    private func patchify(_ planes: Tensor, rows: Int, columns: Int, into out: UnsafeMutablePointer<Float>) {
        let p = patchSize, imageWidth = columns * p, plane = rows * p * imageWidth
        let source = planes.storage.pointer
        for r in 0..<rows {
            for c in 0..<columns {
                let patch = out + (r * columns + c) * 3 * p * p
                for y in 0..<p {
                    for x in 0..<p {
                        let pixel = (r * p + y) * imageWidth + c * p + x
                        for channel in 0..<3 { patch[(y * p + x) * 3 + channel] = source[channel * plane + pixel] }
                    }
                }
            }
        }
    }
}
