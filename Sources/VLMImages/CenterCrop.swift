public extension RGBImage {
    /// The `height`×`width` centre of the image as transformers' `center_crop` takes it: offsets
    /// `(size - crop) // 2` (floored), and where the image is smaller than the crop, the image is first padded with
    /// black to the crop size, `ceil(difference / 2)` before it.
    func centerCropped(width cropWidth: Int, height cropHeight: Int) -> RGBImage {
        precondition(cropWidth > 0 && cropHeight > 0, "crop to \(cropWidth)x\(cropHeight)")
        return region(left: centerCropOffset(width, cropWidth), top: centerCropOffset(height, cropHeight), width: cropWidth, height: cropHeight)
    }

    /// The `width`×`height` rectangle whose top-left corner is at (`left`, `top`) in image coordinates, black where it
    /// leaves the image: a crop, black padding (negative offsets, or a rectangle larger than the image), or both.
    func region(left: Int, top: Int, width regionWidth: Int, height regionHeight: Int) -> RGBImage {
        precondition(regionWidth >= 0 && regionHeight >= 0, "region of \(regionWidth)x\(regionHeight)")
        var out = [UInt8](repeating: 0, count: regionWidth * regionHeight * 3)
        let columns = max(left, 0)..<max(min(left + regionWidth, width), max(left, 0))
        for y in 0..<regionHeight where (0..<height).contains(y + top) && !columns.isEmpty {
            let from = ((y + top) * width + columns.lowerBound) * 3, to = (y * regionWidth + columns.lowerBound - left) * 3
            out.replaceSubrange(to..<(to + columns.count * 3), with: pixels[from..<(from + columns.count * 3)])
        }
        return RGBImage(width: regionWidth, height: regionHeight, pixels: out)
    }
}

/// Where the crop starts in image coordinates (negative: padding first). When the image is at least as large, this
/// is `(size - crop) // 2`; when smaller, transformers pads `ceil((crop - size) / 2)` before the image and crops
/// from 0, so the image starts that far into the crop.
func centerCropOffset(_ size: Int, _ crop: Int) -> Int {
    size >= crop ? (size - crop) / 2 : -((crop - size + 1) / 2)
}
