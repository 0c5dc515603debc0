import Foundation
import VLMTensor

// LLaVA-OneVision's images as transformers' models/llava_onevision/image_processing_pil_llava_onevision.py makes
// them: an image that is its conversation's only one is tiled as LLaVA-NeXT tiles it (anyres, over finer pinpoints);
// the images of a conversation holding several are each padded to a square with the mean colour and read whole
// ("only single image patching is supported").

extension StandardImageProcessorConfig {
    /// `LlavaOnevisionImageProcessorPil`'s defaults: 384×384 bicubic, no crop, CLIP's mean and std.
    public static let llavaOnevision: StandardImageProcessorConfig = {
        var config = StandardImageProcessorConfig.blip
        config.defaultToSquare = false
        return config
    }()
}

/// transformers' `LlavaOnevisionImageProcessorPil`: per image, either its base view and the tiles of its best grid
/// resolution (as ``LlavaNextImageProcessor``), or the image padded to a square with the mean colour as its one view;
/// `pixel_values` `[N, patches, 3, H, W]`, padded with all-zero patches to the batch's largest count.
public struct LlavaOnevisionImageProcessor: ImageProcessor {
    /// The settings: LLaVA-NeXT's keys over this class's defaults (see ``StandardImageProcessorConfig/llavaOnevision``
    /// and ``defaultPinpoints``).
    public let config: LlavaNextImageProcessorConfig
    let tiling: LlavaNextImageProcessor

    /// `LlavaOnevisionImageProcessorPil.image_grid_pinpoints`: every grid of 1 to 6 by 1 to 6 tiles of 384.
    public static let defaultPinpoints = (1...6).flatMap { rows in (1...6).map { ImageSize(height: 384 * rows, width: 384 * $0) } }

    /// Reads a preprocessor config's JSON object over the class defaults.
    ///
    /// - Throws: `ImageProcessorError.invalidConfig` naming `file` and the key, as ``LlavaNextImageProcessorConfig``.
    public init(json data: Data, file: String = "preprocessor_config.json") throws {
        config = try LlavaNextImageProcessorConfig(json: data, defaults: .llavaOnevision, pinpoints: Self.defaultPinpoints,
                                                   classCropsByDefault: false, file: file)
        tiling = LlavaNextImageProcessor(config: config)
    }

    /// The (height, width) of every patch.
    public var outputSize: ImageSize { tiling.outputSize }

    /// Every image tiled, as `LlavaOnevisionImageProcessorPil()(images)` takes a flat list: each image its own
    /// prompt's only one.
    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages {
        try preprocess(images, tiled: Array(repeating: true, count: images.count))
    }

    /// The images of one conversation, as `LlavaOnevisionImageProcessorPil()([images])` takes them
    /// (`batch_num_images` = [count]): tiled when there is one, else each read whole.
    public func preprocess(conversation images: [RGBImage]) throws -> ProcessedImages {
        try preprocess(images, tiled: Array(repeating: images.count == 1, count: images.count))
    }

    /// Each image tiled or read whole as `tiled` says; the result records which.
    public func preprocess(_ images: [RGBImage], tiled: [Bool]) throws -> ProcessedImages {
        precondition(tiled.count == images.count, "\(tiled.count) tiling flags for \(images.count) images")
        // pad_to_square's background: each channel's mean as `int(mean * 255)`.
        let background = config.standard.imageMean.map { UInt8(clamping: Int($0 * 255)) }
        let prepared = zip(images, tiled).map { image, tiles in
            tiles ? tiling.patches(image) : [tiling.standard.resizedAndCropped(image.paddedToSquare(background: background))]
        }
        var processed = try tiling.stacked(prepared, sizes: images.map { ImageSize(height: $0.height, width: $0.width) })
        processed.tiled = tiled
        return processed
    }
}

extension RGBImage {
    /// The image centred on a square of its longer side filled with `background` (R, G, B), the odd pixel of
    /// padding after it, as `pad_to_square` does.
    func paddedToSquare(background: [UInt8]) -> RGBImage {
        guard width != height else { return self }
        let side = max(width, height)
        var out = [UInt8](repeating: 0, count: side * side * 3)
        for i in 0..<(side * side) { out.replaceSubrange((i * 3)..<(i * 3 + 3), with: background) }
        let (left, top) = ((side - width) / 2, (side - height) / 2)
        for y in 0..<height {
            let to = ((y + top) * side + left) * 3, from = y * width * 3
            out.replaceSubrange(to..<(to + width * 3), with: pixels[from..<(from + width * 3)])
        }
        return RGBImage(width: side, height: side, pixels: out)
    }
}
