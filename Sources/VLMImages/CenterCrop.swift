public extension RGBImage {
    /// The `height`×`width` centre of the image as transformers' `center_crop` takes it: offsets
    /// `(size - crop) // 2` (floored), and where the image is smaller than the crop, the image is first padded with
    /// black to the crop size, `ceil(difference / 2)` before it.
    func centerCropped(width cropWidth: Int, height cropHeight: Int) -> RGBImage {
        precondition(cropWidth > 0 && cropHeight > 0, "crop to \(cropWidth)x\(cropHeight)")
        let top = offset(height, cropHeight), left = offset(width, cropWidth)
        var out = [UInt8](repeating: 0, count: cropWidth * cropHeight * 3)
        for y in 0..<cropHeight where (0..<height).contains(y + top) {
            for x in 0..<cropWidth where (0..<width).contains(x + left) {
                let from = ((y + top) * width + x + left) * 3, to = (y * cropWidth + x) * 3
                out[to] = pixels[from]; out[to + 1] = pixels[from + 1]; out[to + 2] = pixels[from + 2]
            }
        }
        return RGBImage(width: cropWidth, height: cropHeight, pixels: out)
    }
}

/// Where the crop starts in image coordinates (negative: padding first). When the image is at least as large, this
/// is `(size - crop) // 2`; when smaller, transformers pads `ceil((crop - size) / 2)` before the image and crops
/// from 0, so the image starts that far into the crop.
private func offset(_ size: Int, _ crop: Int) -> Int {
    size >= crop ? (size - crop) / 2 : -((crop - size + 1) / 2)
}
