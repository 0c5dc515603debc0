/// Pillow's `convert("RGB")` from the modes images open in (libImaging/Convert.c).
enum PixelConversion {
    static func greyToRGB(_ grey: [UInt8]) -> [UInt8] {
        var rgb = [UInt8](repeating: 0, count: grey.count * 3)
        for (i, value) in grey.enumerated() {
            rgb[i * 3] = value
            rgb[i * 3 + 1] = value
            rgb[i * 3 + 2] = value
        }
        return rgb
    }

    /// Keeps the first three samples of each pixel: `convert("RGB")` drops alpha rather than compositing it.
    static func firstThree(_ samples: [UInt8], channels: Int) -> [UInt8] {
        let count = samples.count / channels
        var rgb = [UInt8](repeating: 0, count: count * 3)
        for i in 0..<count {
            rgb[i * 3] = samples[i * channels]
            rgb[i * 3 + 1] = samples[i * channels + 1]
            rgb[i * 3 + 2] = samples[i * channels + 2]
        }
        return rgb
    }

    /// Pillow reads JPEG CMYK as "CMYK;I" (Adobe's inverted polarity), then `cmyk2rgb`: nk - nk*c/255, rounded.
    static func invertedCMYKToRGB(_ cmyk: [UInt8]) -> [UInt8] {
        let count = cmyk.count / 4
        var rgb = [UInt8](repeating: 0, count: count * 3)
        for i in 0..<count {
            let nk = Int(cmyk[i * 4 + 3])  // 255 - k, with k = 255 - stored
            for c in 0..<3 {
                let ink = 255 - Int(cmyk[i * 4 + c])
                let product = ink * nk + 128
                let value = nk - (((product >> 8) + product) >> 8)
                rgb[i * 3 + c] = UInt8(clamping: value)
            }
        }
        return rgb
    }
}
