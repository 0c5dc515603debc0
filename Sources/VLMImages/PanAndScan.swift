/// Gemma 3's pan and scan (`Gemma3ImageProcessorPil.pan_and_scan`): an image much wider than tall (or taller than
/// wide) is read whole and also as a few crops side by side, each resized as a whole image is, so that a square
/// input loses less of it. transformers turns it on per call (`processor(..., do_pan_and_scan=True)`, or through
/// `apply_chat_template`), with the processor's defaults, which are these.
public struct PanAndScan: Sendable, Equatable {
    /// The smallest crop side (`pan_and_scan_min_crop_size`): fewer crops are cut where they would be narrower, and
    /// none where even two would be.
    public var minCropSize: Int
    /// The most crops of one image (`pan_and_scan_max_num_crops`).
    public var maxCrops: Int
    /// How much wider than tall (or taller than wide) an image must be to be cut (`pan_and_scan_min_ratio_to_activate`).
    public var minRatioToActivate: Double

    /// - Precondition: `minCropSize` and `maxCrops` positive.
    public init(minCropSize: Int = 256, maxCrops: Int = 4, minRatioToActivate: Double = 1.2) {
        precondition(minCropSize > 0 && maxCrops > 0, "pan and scan needs a positive crop size and crop count")
        (self.minCropSize, self.maxCrops, self.minRatioToActivate) = (minCropSize, maxCrops, minRatioToActivate)
    }

    /// The crops of an image of `width` × `height` as transformers cuts them: as many as the aspect ratio rounds to
    /// (2 to ``maxCrops``, fewer where crops would be narrower than ``minCropSize``), all the same size but the last,
    /// which the image's edge may cut short; left to right, or top to bottom. None for an image not wide or tall
    /// enough, or whose crops would be too small.
    public func cropRectangles(width: Int, height: Int) -> [(x: Int, y: Int, width: Int, height: Int)] {
        guard width > 0, height > 0 else { return [] }
        let wide = width >= height
        let (long, short) = wide ? (width, height) : (height, width)
        guard Double(long) / Double(short) >= minRatioToActivate else { return [] }
        let rounded = Int((Double(long) / Double(short) + 0.5).rounded(.down))
        let count = min(maxCrops, max(2, min(long / minCropSize, rounded)))
        let (columns, rows) = wide ? (count, 1) : (1, count)
        let cropWidth = Int((Double(width) / Double(columns)).rounded(.up))
        let cropHeight = Int((Double(height) / Double(rows)).rounded(.up))
        guard min(cropWidth, cropHeight) >= minCropSize else { return [] }
        return (0..<rows).flatMap { row in
            (0..<columns).map { column in
                let (x, y) = (column * cropWidth, row * cropHeight)
                return (x, y, max(0, min(cropWidth, width - x)), max(0, min(cropHeight, height - y)))
            }
        }
    }

    /// The crops of `image` (``cropRectangles(width:height:)``'s), their pixels copied.
    ///
    /// - Throws: `ImageProcessorError.invalidConfig` when a crop would be empty (many crops of a few pixels each run
    ///   past the image's edge; transformers fails to resize such a crop).
    public func crops(of image: RGBImage) throws -> [RGBImage] {
        try cropRectangles(width: image.width, height: image.height).map { crop in
            guard crop.width > 0, crop.height > 0 else {
                throw ImageProcessorError.invalidConfig(file: "pan and scan", reason: "crops of at least \(minCropSize) pixels, at most \(maxCrops), leave one of a \(image.width)x\(image.height) image empty")
            }
            var pixels: [UInt8] = []
            pixels.reserveCapacity(crop.width * crop.height * 3)
            for row in crop.y..<(crop.y + crop.height) {
                let start = (row * image.width + crop.x) * 3
                pixels += image.pixels[start..<(start + crop.width * 3)]
            }
            return RGBImage(width: crop.width, height: crop.height, pixels: pixels)
        }
    }
}
