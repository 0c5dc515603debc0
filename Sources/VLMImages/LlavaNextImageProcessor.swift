import Foundation
import VLMTensor

// LLaVA-NeXT's "anyres" images as transformers' models/llava_next/image_processing_pil_llava_next.py makes them: the
// image resized (aspect kept) and padded with black to the best of a few grid resolutions, cut into crop-sized tiles,
// and preceded by the whole image squeezed to the base size; each of those then goes through the standard pipeline
// (resize, centre crop, rescale, normalise).

/// The settings of `LlavaNextImageProcessorPil`: the standard pipeline's, with its class defaults (CLIP's: shortest
/// edge 224, 224×224 crop, bicubic, CLIP's mean and std), plus the tile grids and batch padding.
public struct LlavaNextImageProcessorConfig: Sendable, Equatable {
    /// Resize, crop, rescale and normalise, applied to the base image and to every tile.
    public var standard: StandardImageProcessorConfig
    /// `image_grid_pinpoints`: the (height, width) resolutions an image may be tiled at.
    public var imageGridPinpoints: [ImageSize]
    /// `do_pad`: pad every image's tiles with all-zero ones to the batch's largest count, so they stack.
    public var doPad: Bool
    /// The size the whole image is squeezed to before the standard pipeline: `size`'s height and width, else its
    /// shortest edge for both.
    public private(set) var baseSize: ImageSize

    /// `LlavaNextImageProcessorPil.image_grid_pinpoints`: 1×2, 2×1, 2×2, 1×3 and 3×1 tiles of 336.
    public static let defaultPinpoints = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
        .map { ImageSize(height: $0[0], width: $0[1]) }

    /// Reads a preprocessor config's JSON object over the class defaults.
    ///
    /// - Throws: `ImageProcessorError.invalidConfig` naming `file` and the key: the standard keys' errors, pinpoints
    ///   that are not a non-empty list of positive [height, width] pairs, a `size` that gives no base image size.
    public init(json data: Data, file: String = "preprocessor_config.json") throws {
        try self.init(json: data, defaults: .clip, pinpoints: Self.defaultPinpoints, classCropsByDefault: true, file: file)
    }

    /// Reads a preprocessor config's JSON object over a tiling class's defaults: its standard settings, its
    /// pinpoints, and whether it gives a `crop_size` (LLaVA-NeXT's does; LLaVA-OneVision's does not, so its tiles are
    /// `size`'s height unless the config names a crop size).
    init(json data: Data, defaults: StandardImageProcessorConfig, pinpoints defaultPinpoints: [ImageSize],
         classCropsByDefault: Bool, file: String) throws {
        standard = try StandardImageProcessorConfig(json: data, defaults: defaults, file: file)
        let extra: Extra
        do {
            extra = try JSONDecoder().decode(Extra.self, from: data)
        } catch {
            throw ImageProcessorError.invalidConfig(file: file, reason: "image_grid_pinpoints must be a list of [height, width] pairs and do_pad a boolean")
        }
        let pairs = extra.imageGridPinpoints ?? defaultPinpoints.map { [$0.height, $0.width] }
        guard !pairs.isEmpty, pairs.allSatisfy({ $0.count == 2 && $0[0] > 0 && $0[1] > 0 }) else {
            throw ImageProcessorError.invalidConfig(file: file, reason: "image_grid_pinpoints \(pairs) must be a non-empty list of positive [height, width] pairs")
        }
        imageGridPinpoints = pairs.map { ImageSize(height: $0[0], width: $0[1]) }
        doPad = extra.doPad ?? true
        switch standard.size {
        case .exact(let height, let width): baseSize = ImageSize(height: height, width: width)
        case .shortestEdge(let edge), .shortestEdgeBounded(let edge, _): baseSize = ImageSize(height: edge, width: edge)
        case .maxHeightWidth:
            throw ImageProcessorError.invalidConfig(file: file, reason: "size {max_height, max_width} gives LLaVA-NeXT no base image size")
        }
        // transformers tiles at crop_size's height, else size's height (or shortest edge).
        let namesCropSize = ((try? JSONSerialization.jsonObject(with: data)) as? [String: Any])?["crop_size"].map { !($0 is NSNull) }
        tileSize = (namesCropSize ?? classCropsByDefault) ? standard.cropHeight : baseSize.height
    }

    private struct Extra: Decodable {
        let imageGridPinpoints: [[Int]]?
        let doPad: Bool?
        enum CodingKeys: String, CodingKey { case imageGridPinpoints = "image_grid_pinpoints", doPad = "do_pad" }
    }

    /// The side of the square tiles: the crop height, else (a class without a default crop size, a config naming
    /// none) the base size's height.
    public private(set) var tileSize: Int
}

/// transformers' `select_best_resolution`: the pinpoint at which the image, scaled to fit with its aspect ratio
/// kept, keeps the most of its pixels (never counting more than it has), ties going to the one that wastes the least
/// area; the first such in `pinpoints`' order. `size` must be positive and `pinpoints` not empty.
public func selectBestResolution(_ size: ImageSize, among pinpoints: [ImageSize]) -> ImageSize {
    precondition(size.height > 0 && size.width > 0 && !pinpoints.isEmpty,
                 "select_best_resolution of \(size.width)x\(size.height) among \(pinpoints.count) resolutions")
    var best = pinpoints[0], mostEffective = 0, leastWasted = Int.max
    for pinpoint in pinpoints {
        let scale = min(Double(pinpoint.width) / Double(size.width), Double(pinpoint.height) / Double(size.height))
        let downscaled = Int(Double(size.width) * scale) * Int(Double(size.height) * scale)
        let effective = min(downscaled, size.width * size.height)
        let wasted = pinpoint.width * pinpoint.height - effective
        if effective > mostEffective || (effective == mostEffective && wasted < leastWasted) {
            (best, mostEffective, leastWasted) = (pinpoint, effective, wasted)
        }
    }
    return best
}

/// transformers' `LlavaNextImageProcessorPil`: per image, the base image and the tiles of its best grid resolution,
/// each through the standard pipeline; `pixel_values` `[N, tiles + 1, 3, H, W]`, padded with all-zero tiles to the
/// batch's largest count, and each image's original size in `imageSizes`.
public struct LlavaNextImageProcessor: ImageProcessor {
    public let config: LlavaNextImageProcessorConfig
    let standard: StandardImageProcessor

    public init(config: LlavaNextImageProcessorConfig) {
        self.config = config
        standard = StandardImageProcessor(config: config.standard)
    }

    /// The (height, width) of every patch: the crop size, else the base size after the standard resize.
    public var outputSize: ImageSize {
        let (height, width) = standard.outputSize(height: config.baseSize.height, width: config.baseSize.width)
        return ImageSize(height: height, width: width)
    }

    /// One image's patches before normalisation, as `get_image_patches` and the per-patch pipeline make them: the
    /// base image, then the tiles row by row.
    public func patches(_ image: RGBImage) -> [RGBImage] {
        let target = selectBestResolution(ImageSize(height: image.height, width: image.width), among: config.imageGridPinpoints)
        // get_patch_output_size: the side that limits the scale fills the target, the other is rounded up.
        let scaleWidth = Double(target.width) / Double(image.width), scaleHeight = Double(target.height) / Double(image.height)
        let (height, width) = scaleWidth < scaleHeight
            ? (min(Int((Double(image.height) * scaleWidth).rounded(.up)), target.height), target.width)
            : (target.height, min(Int((Double(image.width) * scaleHeight).rounded(.up)), target.width))
        let resized = image.resized(width: width, height: height, filter: config.standard.resample)
        // _pad_for_patching centres the resized image in black, the odd pixel after it; the tiles are read straight
        // from the resized image with the padding as the region outside it.
        let (left, top) = ((target.width - width) / 2, (target.height - height) / 2)
        let tile = config.tileSize
        var tiles: [RGBImage] = []
        for y in stride(from: 0, to: target.height, by: tile) {
            for x in stride(from: 0, to: target.width, by: tile) {
                tiles.append(resized.region(left: x - left, top: y - top, width: min(tile, target.width - x),
                                            height: min(tile, target.height - y)))
            }
        }
        let base = image.resized(width: config.baseSize.width, height: config.baseSize.height, filter: config.standard.resample)
        return ([base] + tiles).map(standard.resizedAndCropped)
    }

    /// pixel_values `[N, maxPatches, 3, H, W]` fp32 and the images' sizes, exactly as
    /// `LlavaNextImageProcessorPil()(images, return_tensors="pt")`.
    ///
    /// - Throws: `ImageProcessorError.unequalSizes` when patches come out in different sizes (no centre crop), and
    ///   `.unequalPatchCounts` when images have different numbers of patches without `do_pad`: one tensor cannot
    ///   hold them, and transformers refuses to stack them.
    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages {
        try stacked(images.map(patches), sizes: images.map { ImageSize(height: $0.height, width: $0.width) })
    }

    /// Each image's patches normalised into one `[N, maxPatches, 3, H, W]` tensor, padded with all-zero patches.
    func stacked(_ prepared: [[RGBImage]], sizes: [ImageSize]) throws -> ProcessedImages {
        guard let first = prepared.first?.first else {
            return ProcessedImages(pixelValues: Tensor(zeros: [0, 1, 3, config.standard.cropHeight, config.standard.cropWidth]),
                                   imageSizes: [])
        }
        let (height, width) = (first.height, first.width)
        let all = prepared.joined()
        guard all.allSatisfy({ $0.height == height && $0.width == width }) else {
            throw ImageProcessorError.unequalSizes(all.map { ImageSize(height: $0.height, width: $0.width) })
        }
        let counts = prepared.map(\.count)
        let maxPatches = counts.max() ?? 0
        guard config.doPad || counts.allSatisfy({ $0 == maxPatches }) else {
            throw ImageProcessorError.unequalPatchCounts(counts)
        }
        let patchValues = 3 * height * width
        let tensor = Tensor(zeros: [prepared.count, maxPatches, 3, height, width])
        tensor.withUnsafeMutableBufferPointer { out in
            for (n, patches) in prepared.enumerated() {
                for (p, patch) in patches.enumerated() {
                    standard.writeNormalized(patch, into: out, at: (n * maxPatches + p) * patchValues)
                }
            }
        }
        return ProcessedImages(pixelValues: tensor, imageSizes: sizes)
    }
}
