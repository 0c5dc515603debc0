import Dispatch
import Foundation

/// Pillow's resampling filters, with PIL's numbering (as preprocessor_config.json's "resample" stores it).
public enum ResampleFilter: Int, Sendable {
    case nearest = 0, lanczos = 1, bilinear = 2, bicubic = 3, box = 4, hamming = 5
}

public extension RGBImage {
    /// Byte-identical to Pillow's `Image.resize((width, height), filter)` on an RGB image.
    ///
    /// A port of libImaging/Resample.c: separable convolution, horizontal pass first (over only the rows the vertical
    /// pass reads) unless Pillow 13 would go vertical first; coefficients in double, normalised, then fixed point with 22 fractional bits; integer sums rounded
    /// and clipped. `.nearest` follows Pillow's affine nearest-neighbour scaling. Both dimensions must be positive.
    func resized(width outWidth: Int, height outHeight: Int, filter: ResampleFilter) -> RGBImage {
        precondition(outWidth > 0 && outHeight > 0, "resize to \(outWidth)x\(outHeight)")
        if outWidth == width && outHeight == height { return self }
        guard let kernel = Resampler.Kernel(filter) else {
            return Resampler.nearest(self, width: outWidth, height: outHeight)
        }
        var image = self
        let vertical = Resampler.Coefficients(inSize: height, outSize: outHeight, kernel: kernel)
        // Pillow 13 (python-pillow/Pillow#9549) runs the vertical pass first when the height shrinks by more than
        // twice as many pixels as the width does; the 8-bit intermediate makes the order visible in the output.
        // The rule was found by probing Pillow 13.0.0 (its C source is not public here); resize fixtures pin both
        // sides of its boundary.
        if outWidth != width && outHeight < height && height - outHeight > 2 * (width - outWidth) {
            image = Resampler.vertical(image, rowOffset: 0, coefficients: vertical)
            let horizontal = Resampler.Coefficients(inSize: width, outSize: outWidth, kernel: kernel)
            return Resampler.horizontal(image, rows: 0..<outHeight, coefficients: horizontal)
        }
        if outWidth != width {
            // Only rows firstRow..<lastRow feed the vertical pass.
            let firstRow = vertical.bounds[0]
            let lastRow = vertical.bounds[(outHeight - 1) * 2] + vertical.bounds[(outHeight - 1) * 2 + 1]
            let horizontal = Resampler.Coefficients(inSize: width, outSize: outWidth, kernel: kernel)
            image = Resampler.horizontal(image, rows: firstRow..<lastRow, coefficients: horizontal)
            if outHeight == height { return image }
            return Resampler.vertical(image, rowOffset: firstRow, coefficients: vertical)
        }
        return Resampler.vertical(image, rowOffset: 0, coefficients: vertical)
    }
}

enum Resampler {
    static let precisionBits = 32 - 8 - 2

    struct Kernel {
        let support: Double
        let weight: (Double) -> Double

        init?(_ filter: ResampleFilter) {
            switch filter {
            case .nearest: return nil
            case .box: (support, weight) = (0.5, { x in x > -0.5 && x <= 0.5 ? 1.0 : 0.0 })
            case .bilinear: (support, weight) = (1.0, { x in abs(x) < 1.0 ? 1.0 - abs(x) : 0.0 })
            case .hamming:
                (support, weight) = (1.0, { x in
                    let x = abs(x)
                    if x == 0.0 { return 1.0 }
                    if x >= 1.0 { return 0.0 }
                    let px = x * Double.pi
                    // Resample.c writes these constants as C floats.
                    return sin(px) / px * (Double(Float(0.54)) + Double(Float(0.46)) * cos(px))
                })
            case .bicubic:
                (support, weight) = (2.0, { x in
                    let a = -0.5, x = abs(x)
                    if x < 1.0 { return ((a + 2.0) * x - (a + 3.0)) * x * x + 1 }
                    if x < 2.0 { return (((x - 5) * x + 8) * x - 4) * a }
                    return 0.0
                })
            case .lanczos:
                (support, weight) = (3.0, { x in
                    func sinc(_ x: Double) -> Double {
                        if x == 0.0 { return 1.0 }
                        let px = x * Double.pi
                        return sin(px) / px
                    }
                    return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0
                })
            }
        }
    }

    /// `precompute_coeffs` + `normalize_coeffs_8bpc`: per output pixel, the first input index, the tap count, and
    /// `taps` fixed-point weights.
    struct Coefficients {
        let taps: Int
        var bounds: [Int]
        var weights: [Int32]

        init(inSize: Int, outSize: Int, kernel: Kernel) {
            // Pillow passes the box as C floats: (double)(in1 - in0) / outSize.
            let scale = Double(Float(inSize)) / Double(outSize)
            let filterScale = max(scale, 1.0)
            let support = kernel.support * filterScale
            taps = Int(ceil(support)) * 2 + 1
            bounds = [Int](repeating: 0, count: outSize * 2)
            weights = [Int32](repeating: 0, count: outSize * taps)
            let inverseFilterScale = 1.0 / filterScale
            var k = [Double](repeating: 0, count: taps)
            for xx in 0..<outSize {
                let center = (Double(xx) + 0.5) * scale
                let xmin = max(Int(center - support + 0.5), 0)
                let xmax = min(Int(center + support + 0.5), inSize) - xmin
                var total = 0.0
                for x in 0..<xmax {
                    let w = kernel.weight((Double(x + xmin) - center + 0.5) * inverseFilterScale)
                    k[x] = w
                    total += w
                }
                for x in 0..<xmax {
                    let w = total != 0.0 ? k[x] / total : k[x]
                    let fixed = w * Double(1 << Resampler.precisionBits)
                    weights[xx * taps + x] = Int32(w < 0 ? -0.5 + fixed : 0.5 + fixed)
                }
                bounds[xx * 2] = xmin
                bounds[xx * 2 + 1] = xmax
            }
        }
    }

    /// Buffers that the row-parallel passes share: each thread writes disjoint output rows.
    struct UncheckedSendable<Value>: @unchecked Sendable {
        let value: Value
        init(_ value: Value) { self.value = value }
    }

    @inline(__always)
    static func clip8(_ sum: Int) -> UInt8 {
        let value = sum >> precisionBits
        return value < 0 ? 0 : value > 255 ? 255 : UInt8(value)
    }

    /// Splits `count` rows over two threads (the work is memory-light and evenly spread).
    static func forEachRowRange(_ count: Int, _ body: @Sendable (Range<Int>) -> Void) {
        let parts = count >= 64 ? 2 : 1
        DispatchQueue.concurrentPerform(iterations: parts) { part in
            body((count * part / parts)..<(count * (part + 1) / parts))
        }
    }

    static func horizontal(_ image: RGBImage, rows: Range<Int>, coefficients: Coefficients) -> RGBImage {
        let outWidth = coefficients.bounds.count / 2
        var out = [UInt8](repeating: 0, count: outWidth * rows.count * 3)
        let taps = coefficients.taps
        image.pixels.withUnsafeBufferPointer { source in
            coefficients.bounds.withUnsafeBufferPointer { bounds in
                coefficients.weights.withUnsafeBufferPointer { weights in
                    out.withUnsafeMutableBufferPointer { target in
                        let pointers = UncheckedSendable((source.baseAddress!, bounds.baseAddress!,
                                                          weights.baseAddress!, target.baseAddress!))
                        forEachRowRange(rows.count) { range in
                            let (source, bounds, weights, target) = pointers.value
                            for y in range {
                                let line = source + (y + rows.lowerBound) * image.width * 3
                                let lineOut = target + y * outWidth * 3
                                for xx in 0..<outWidth {
                                    let xmin = bounds[xx * 2], count = bounds[xx * 2 + 1]
                                    let k = weights + xx * taps
                                    let half = 1 << (precisionBits - 1)
                                    var r = half, g = half, b = half
                                    for x in 0..<count {
                                        let w = Int(k[x]), p = line + (x + xmin) * 3
                                        r += Int(p[0]) * w
                                        g += Int(p[1]) * w
                                        b += Int(p[2]) * w
                                    }
                                    lineOut[xx * 3] = clip8(r)
                                    lineOut[xx * 3 + 1] = clip8(g)
                                    lineOut[xx * 3 + 2] = clip8(b)
                                }
                            }
                        }
                    }
                }
            }
        }
        return RGBImage(width: outWidth, height: rows.count, pixels: out)
    }

    /// `rowOffset` is the first input row `image` holds (the horizontal pass keeps only the rows needed).
    static func vertical(_ image: RGBImage, rowOffset: Int, coefficients: Coefficients) -> RGBImage {
        let outHeight = coefficients.bounds.count / 2
        let rowBytes = image.width * 3
        var out = [UInt8](repeating: 0, count: rowBytes * outHeight)
        let taps = coefficients.taps
        image.pixels.withUnsafeBufferPointer { source in
            coefficients.bounds.withUnsafeBufferPointer { bounds in
                coefficients.weights.withUnsafeBufferPointer { weights in
                    out.withUnsafeMutableBufferPointer { target in
                        let pointers = UncheckedSendable((source.baseAddress!, bounds.baseAddress!,
                                                          weights.baseAddress!, target.baseAddress!))
                        forEachRowRange(outHeight) { range in
                            let (source, bounds, weights, target) = pointers.value
                            for yy in range {
                                let ymin = bounds[yy * 2] - rowOffset, count = bounds[yy * 2 + 1]
                                let k = weights + yy * taps
                                let lineOut = target + yy * rowBytes
                                for i in 0..<rowBytes {
                                    var sum = 1 << (precisionBits - 1)
                                    var p = source + ymin * rowBytes + i
                                    for y in 0..<count {
                                        sum += Int(p.pointee) * Int(k[y])
                                        p += rowBytes
                                    }
                                    lineOut[i] = clip8(sum)
                                }
                            }
                        }
                    }
                }
            }
        }
        return RGBImage(width: image.width, height: outHeight, pixels: out)
    }

    /// `ImagingScaleAffine`: the source of each output pixel at `(x + 0.5) * scale`, stepped by repeated addition
    /// as Pillow does, so the rounding matches.
    static func nearest(_ image: RGBImage, width outWidth: Int, height outHeight: Int) -> RGBImage {
        let xScale = Double(Float(image.width)) / Double(outWidth)
        let yScale = Double(Float(image.height)) / Double(outHeight)
        func coordinates(_ count: Int, scale: Double) -> [Int] {
            var position = scale * 0.5
            return (0..<count).map { _ in
                defer { position += scale }
                return position < 0 ? -1 : Int(position)
            }
        }
        let xs = coordinates(outWidth, scale: xScale), ys = coordinates(outHeight, scale: yScale)
        var out = [UInt8](repeating: 0, count: outWidth * outHeight * 3)
        for (y, sy) in ys.enumerated() where sy < image.height {
            for (x, sx) in xs.enumerated() where sx < image.width {
                for c in 0..<3 { out[(y * outWidth + x) * 3 + c] = image.pixels[(sy * image.width + sx) * 3 + c] }
            }
        }
        return RGBImage(width: outWidth, height: outHeight, pixels: out)
    }
}
