import Foundation
import VLMTensor

/// transformers' `Owlv2ImageProcessorPil`: rescale, pad to a square with zeros at the bottom and right, resize as
/// scikit-image does (a Gaussian anti-aliasing filter when shrinking, then `scipy.ndimage.zoom` with linear
/// interpolation, mirrored edges and `grid_mode=True`, clipped to the padded image's range), normalize. Every step in
/// transformers' dtypes: fp32 pixels between steps, each filter pass and the zoom computed in double.
public struct Owlv2ImageProcessor: ImageProcessor {
    /// The standard settings (size, rescale, mean and std) over `Owlv2ImageProcessorPil`'s defaults: 960×960, CLIP's
    /// mean and std; no centre crop.
    public let config: StandardImageProcessorConfig
    public let doPad: Bool
    /// Whether the resize filters before shrinking. transformers passes `resample` where `resize` takes
    /// `anti_aliasing`, so it is on unless `resample` is 0 (nearest) or null.
    public let antiAliasing: Bool

    /// `Owlv2ImageProcessorPil`'s defaults.
    public static let defaults: StandardImageProcessorConfig = {
        var config = StandardImageProcessorConfig.owlViT
        config.size = .exact(height: 960, width: 960)
        config.resample = .bilinear
        return config
    }()

    /// Reads preprocessor_config.json's object over the class defaults.
    ///
    /// - Throws: `ImageProcessorError.invalidConfig` naming `file` and the key.
    public init(json data: Data, file: String = "preprocessor_config.json") throws {
        var config = try StandardImageProcessorConfig(json: data, defaults: Self.defaults, file: file)
        let object = (try? JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
        if let rescale = object["rescale"] {
            guard let flag = rescale as? Bool else {
                throw ImageProcessorError.invalidConfig(file: file, reason: "rescale must be true or false")
            }
            config.doRescale = flag
        }
        guard case .exact = config.size else {
            throw ImageProcessorError.invalidConfig(file: file, reason: "size must be a height and width (or an int) for Owlv2ImageProcessor")
        }
        config.doCenterCrop = false
        self.config = config
        doPad = object["do_pad"] as? Bool ?? true
        switch object["resample"] {
        case nil: antiAliasing = true
        case is NSNull: antiAliasing = false
        case let value as Int: antiAliasing = value != 0
        default: antiAliasing = true
        }
    }

    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages {
        guard case let .exact(height, width) = config.size else { fatalError("checked in init") }
        var outputs: [[Float]] = []
        var sizes: [ImageSize] = []
        for image in images {
            var plane = Plane(image, scale: config.doRescale ? config.rescaleFactor : 1)
            if doPad { plane = plane.paddedToSquare() }
            if config.doResize { plane = plane.resized(height: height, width: width, antiAliasing: antiAliasing) }
            if config.doNormalize { plane.normalize(mean: config.imageMean, std: config.imageStd) }
            sizes.append(ImageSize(height: plane.height, width: plane.width))
            outputs.append(plane.channelsFirst())
        }
        guard Set(sizes.map { [$0.height, $0.width] }).count <= 1 else { throw ImageProcessorError.unequalSizes(sizes) }
        let side = sizes.first ?? ImageSize(height: height, width: width)
        return ProcessedImages(pixelValues: Tensor(shape: [images.count, 3, side.height, side.width], scalars: outputs.flatMap { $0 }),
                               imageSizes: images.map { ImageSize(height: $0.height, width: $0.width) })
    }
}

/// An fp32 image, height × width × 3, row by row (numpy's channels-last array).
private struct Plane {
    var height: Int
    var width: Int
    var values: [Float]

    /// `image.astype(float64) * scale`, stored as fp32 (transformers' `rescale`).
    init(_ image: RGBImage, scale: Double) {
        height = image.height
        width = image.width
        values = image.pixels.map { Float(Double($0) * scale) }
    }

    init(height: Int, width: Int, values: [Float]) {
        (self.height, self.width, self.values) = (height, width, values)
    }

    /// Zeros added at the bottom or right to make a square.
    func paddedToSquare() -> Plane {
        let side = max(height, width)
        if side == height && side == width { return self }
        var padded = [Float](repeating: 0, count: side * side * 3)
        for row in 0..<height {
            for index in 0..<(width * 3) { padded[row * side * 3 + index] = values[row * width * 3 + index] }
        }
        return Plane(height: side, width: side, values: padded)
    }

    /// skimage-style `resize` as Owlv2ImageProcessorPil.resize implements it.
    func resized(height outHeight: Int, width outWidth: Int, antiAliasing: Bool) -> Plane {
        let factors = (Double(height) / Double(outHeight), Double(width) / Double(outWidth))
        var filtered = self
        if antiAliasing {
            let sigmas = (max(0, (factors.0 - 1) / 2), max(0, (factors.1 - 1) / 2))
            if sigmas.0 > 1e-15 { filtered = filtered.gaussianFiltered(sigma: sigmas.0, alongRows: true) }
            if sigmas.1 > 1e-15 { filtered = filtered.gaussianFiltered(sigma: sigmas.1, alongRows: false) }
        }
        let rows = Self.linearTaps(output: outHeight, input: height, zoom: factors.0)
        let columns = Self.linearTaps(output: outWidth, input: width, zoom: factors.1)
        // _clip_warp_output: the result stays within the unfiltered image's range.
        let low = values.min() ?? 0, high = values.max() ?? 0
        var output = [Float](repeating: 0, count: outHeight * outWidth * 3)
        let source = filtered.values
        for (y, row) in rows.enumerated() {
            for (x, column) in columns.enumerated() {
                for channel in 0..<3 {
                    func at(_ r: Int, _ c: Int) -> Double { Double(source[(r * width + c) * 3 + channel]) }
                    var sum = at(row.first, column.first) * row.firstWeight * column.firstWeight
                    sum += at(row.first, column.second) * row.firstWeight * column.secondWeight
                    sum += at(row.second, column.first) * row.secondWeight * column.firstWeight
                    sum += at(row.second, column.second) * row.secondWeight * column.secondWeight
                    output[(y * outWidth + x) * 3 + channel] = min(max(Float(sum), low), high)
                }
            }
        }
        return Plane(height: outHeight, width: outWidth, values: output)
    }

    /// The two input positions and weights of each output position of `scipy.ndimage.zoom(order=1, grid_mode=True,
    /// mode="mirror")` along one axis: coordinate `(k + 0.5) · zoom − 0.5`, mirrored into the line, then linear.
    static func linearTaps(output: Int, input: Int, zoom: Double) -> [(first: Int, second: Int, firstWeight: Double, secondWeight: Double)] {
        (0..<output).map { k in
            let coordinate = mirrored((Double(k) + 0.5) * zoom - 0.5, length: input)
            let start = Int(coordinate.rounded(.down))
            let t = coordinate - Double(start)
            return (mirroredIndex(start, length: input), mirroredIndex(start + 1, length: input), 1 - t, t)
        }
    }

    /// scipy's `map_coordinate` for mode mirror (reflection about the first and last samples).
    static func mirrored(_ coordinate: Double, length: Int) -> Double {
        guard length > 1 else { return 0 }
        let period = Double(2 * length - 2)
        var c = coordinate
        if c < 0 {
            c = period * Double(Int(-c / period)) + c
            c = c <= Double(1 - length) ? c + period : -c
        } else if c > Double(length - 1) {
            c -= period * Double(Int(c / period))
            if c >= Double(length) { c = period - c }
        }
        return c
    }

    static func mirroredIndex(_ index: Int, length: Int) -> Int {
        guard length > 1 else { return 0 }
        let period = 2 * length - 2
        var i = index % period
        if i < 0 { i += period }
        return i >= length ? period - i : i
    }

    /// `scipy.ndimage.gaussian_filter1d(mode="mirror", truncate=4)` along the rows (down each column) or along the
    /// columns, in double, stored as fp32.
    func gaussianFiltered(sigma: Double, alongRows: Bool) -> Plane {
        let radius = Int(4 * sigma + 0.5)
        let exponents = (-radius...radius).map { exp(-0.5 / (sigma * sigma) * Double($0 * $0)) }
        let total = exponents.reduce(0, +)
        let weights = exponents.map { $0 / total }  // symmetric: weights[radius + j] == weights[radius - j]
        let length = alongRows ? height : width
        let lines = alongRows ? width * 3 : height * 3
        var output = values
        var line = [Double](repeating: 0, count: length + 2 * radius)
        for lineIndex in 0..<lines {
            // A line runs down a column (one channel) or along a row (one channel).
            let (fixed, channel) = (lineIndex / 3, lineIndex % 3)
            func offset(_ position: Int) -> Int {
                alongRows ? (position * width + fixed) * 3 + channel : (fixed * width + position) * 3 + channel
            }
            for position in -radius..<(length + radius) {
                line[position + radius] = Double(values[offset(Self.mirroredIndex(position, length: length))])
            }
            for position in 0..<length {
                let centre = position + radius
                // NI_Correlate1D's symmetric sum: the centre tap, then pairs from the outermost in.
                var sum = line[centre] * weights[radius]
                for j in stride(from: radius, to: 0, by: -1) {
                    sum += (line[centre - j] + line[centre + j]) * weights[radius - j]
                }
                output[offset(position)] = Float(sum)
            }
        }
        return Plane(height: height, width: width, values: output)
    }

    /// `(x - mean) / std` in fp32, per channel.
    mutating func normalize(mean: [Double], std: [Double]) {
        let (m, s) = (mean.map(Float.init), std.map(Float.init))
        for index in values.indices { values[index] = (values[index] - m[index % 3]) / s[index % 3] }
    }

    /// Channels first, [3, height, width] flattened.
    func channelsFirst() -> [Float] {
        (0..<3).flatMap { channel in (0..<(height * width)).map { values[$0 * 3 + channel] } }
    }
}
