import Foundation
import VLMTensor

/// The target size of the resize step, in the forms transformers' `SizeDict` takes.
public enum ResizeTarget: Sendable, Equatable {
    /// `{"height", "width"}`: exactly this size.
    case exact(height: Int, width: Int)
    /// `{"shortest_edge"}` (and an int `size` in CLIP's configs): the short side becomes this, the long side keeps
    /// the aspect ratio, truncated.
    case shortestEdge(Int)
    /// `{"shortest_edge", "longest_edge"}`: as `shortestEdge`, but scaled down so the long side stays within bound.
    case shortestEdgeBounded(shortest: Int, longest: Int)
    /// `{"max_height", "max_width"}`: the largest aspect-preserving size within both.
    case maxHeightWidth(maxHeight: Int, maxWidth: Int)

    /// The (height, width) transformers' PIL backend resizes an image of this size to.
    public func outputSize(height: Int, width: Int) -> (height: Int, width: Int) {
        switch self {
        case .exact(let h, let w):
            return (h, w)
        case .shortestEdge(let size):
            // get_resize_output_image_size(default_to_square=False): int(size * long / short).
            let (short, long) = width <= height ? (width, height) : (height, width)
            let newLong = Int(Double(size * long) / Double(short))
            return width <= height ? (newLong, size) : (size, newLong)
        case .shortestEdgeBounded(var size, let maxSize):
            // get_size_with_aspect_ratio, with Python's round-half-even.
            let minOriginal = Double(min(height, width)), maxOriginal = Double(max(height, width))
            var rawSize: Double?
            if maxOriginal / minOriginal * Double(size) > Double(maxSize) {
                let raw = Double(maxSize) * minOriginal / maxOriginal
                rawSize = raw
                size = Int(raw.rounded(.toNearestOrEven))
            }
            if (height <= width && height == size) || (width <= height && width == size) {
                return (height, width)
            }
            if width < height {
                let long = rawSize.map { Int($0 * Double(height) / Double(width)) } ?? Int(Double(size * height) / Double(width))
                return (long, size)
            }
            let long = rawSize.map { Int($0 * Double(width) / Double(height)) } ?? Int(Double(size * width) / Double(height))
            return (size, long)
        case .maxHeightWidth(let maxHeight, let maxWidth):
            let scale = min(Double(maxHeight) / Double(height), Double(maxWidth) / Double(width))
            return (Int(Double(height) * scale), Int(Double(width) * scale))
        }
    }
}

/// preprocessor_config.json of CLIP-style processors, with `CLIPImageProcessorPil`'s defaults for absent or null
/// keys, and both the old (int / list) and new (dict) forms of `size` and `crop_size`.
public struct CLIPImageProcessorConfig: Decodable, Sendable, Equatable {
    public var doResize = true
    public var size = ResizeTarget.shortestEdge(224)
    public var resample = ResampleFilter.bicubic
    public var doCenterCrop = true
    /// (height, width) of the centre crop.
    public var cropHeight = 224
    public var cropWidth = 224
    public var doRescale = true
    public var rescaleFactor = 1.0 / 255.0
    public var doNormalize = true
    public var imageMean: [Double] = [0.48145466, 0.4578275, 0.40821073]
    public var imageStd: [Double] = [0.26862954, 0.26130258, 0.27577711]

    /// CLIP's defaults (openai/clip-vit-*).
    public init() {}

    enum CodingKeys: String, CodingKey {
        case doResize = "do_resize", size, resample, doCenterCrop = "do_center_crop", cropSize = "crop_size"
        case doRescale = "do_rescale", rescaleFactor = "rescale_factor", doNormalize = "do_normalize"
        case imageMean = "image_mean", imageStd = "image_std", defaultToSquare = "default_to_square"
    }

    /// `size`/`crop_size` as JSON spells them: an int, a [height, width] list, or a dict of known keys.
    private enum SizeValue: Decodable {
        case int(Int)
        case list([Int])
        case dict([String: Int])

        init(from decoder: Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let value = try? container.decode(Int.self) {
                self = .int(value)
            } else if let value = try? container.decode([Int].self) {
                self = .list(value)
            } else {
                self = .dict(try container.decode([String: Int].self))
            }
        }
    }

    /// A number or a list of per-channel numbers.
    private enum ChannelValues: Decodable {
        case values([Double])
        init(from decoder: Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let value = try? container.decode(Double.self) {
                self = .values([value, value, value])
            } else {
                self = .values(try container.decode([Double].self))
            }
        }
        var values: [Double] { switch self { case .values(let v): v } }
    }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        func flag(_ key: CodingKeys, _ fallback: Bool) throws -> Bool {
            try container.decodeIfPresent(Bool.self, forKey: key) ?? fallback
        }
        func invalid(_ key: CodingKeys, _ message: String) -> DecodingError {
            .dataCorruptedError(forKey: key, in: container, debugDescription: message)
        }
        func positive(_ values: Int...) -> Bool { values.allSatisfy { $0 > 0 } }

        doResize = try flag(.doResize, doResize)
        doCenterCrop = try flag(.doCenterCrop, doCenterCrop)
        doRescale = try flag(.doRescale, doRescale)
        doNormalize = try flag(.doNormalize, doNormalize)
        rescaleFactor = try container.decodeIfPresent(Double.self, forKey: .rescaleFactor) ?? rescaleFactor
        if let raw = try container.decodeIfPresent(Int.self, forKey: .resample) {
            guard let filter = ResampleFilter(rawValue: raw) else { throw invalid(.resample, "unknown filter \(raw)") }
            resample = filter
        }
        let defaultToSquare = try container.decodeIfPresent(Bool.self, forKey: .defaultToSquare) ?? false

        switch try container.decodeIfPresent(SizeValue.self, forKey: .size) {
        case nil: break
        case .int(let value) where positive(value):
            size = defaultToSquare ? .exact(height: value, width: value) : .shortestEdge(value)
        case .list(let values) where values.count == 2 && positive(values[0], values[1]):
            size = .exact(height: values[0], width: values[1])
        case .dict(let dict):
            switch (dict["height"], dict["width"], dict["shortest_edge"], dict["longest_edge"], dict["max_height"],
                    dict["max_width"]) {
            case (let h?, let w?, nil, nil, nil, nil) where dict.count == 2 && positive(h, w):
                size = .exact(height: h, width: w)
            case (nil, nil, let s?, nil, nil, nil) where dict.count == 1 && positive(s):
                size = .shortestEdge(s)
            case (nil, nil, let s?, let l?, nil, nil) where dict.count == 2 && positive(s, l):
                size = .shortestEdgeBounded(shortest: s, longest: l)
            case (nil, nil, nil, nil, let h?, let w?) where dict.count == 2 && positive(h, w):
                size = .maxHeightWidth(maxHeight: h, maxWidth: w)
            default:
                throw invalid(.size, "unsupported size \(dict.sorted { $0.key < $1.key })")
            }
        default:
            throw invalid(.size, "size must be a positive int, [height, width] or a size dict")
        }

        switch try container.decodeIfPresent(SizeValue.self, forKey: .cropSize) {
        case nil: break
        case .int(let value) where positive(value): (cropHeight, cropWidth) = (value, value)
        case .list(let values) where values.count == 2 && positive(values[0], values[1]):
            (cropHeight, cropWidth) = (values[0], values[1])
        case .dict(let dict) where dict.count == 2 && positive(dict["height"] ?? 0, dict["width"] ?? 0):
            (cropHeight, cropWidth) = (dict["height"]!, dict["width"]!)
        default:
            throw invalid(.cropSize, "crop_size must be a positive int, [height, width] or {height, width}")
        }

        imageMean = try container.decodeIfPresent(ChannelValues.self, forKey: .imageMean)?.values ?? imageMean
        imageStd = try container.decodeIfPresent(ChannelValues.self, forKey: .imageStd)?.values ?? imageStd
        guard imageMean.count == 3 else { throw invalid(.imageMean, "image_mean needs 3 channels") }
        guard imageStd.count == 3 else { throw invalid(.imageStd, "image_std needs 3 channels") }
    }
}

/// `CLIPImageProcessorPil`: resize, centre crop, rescale, normalise, in transformers' order and arithmetic.
public struct CLIPImageProcessor: Sendable {
    public let config: CLIPImageProcessorConfig

    public init(config: CLIPImageProcessorConfig) {
        self.config = config
    }

    /// Reads a preprocessor_config.json.
    public init(contentsOf url: URL) throws {
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw ImageError.unreadable(file: url.path, reason: error.localizedDescription)
        }
        do {
            config = try JSONDecoder().decode(CLIPImageProcessorConfig.self, from: data)
        } catch {
            throw ImageError.unsupported(file: url.path, reason: "bad preprocessor config: \(error)")
        }
    }

    /// The (height, width) of every output image.
    public func outputSize(height: Int, width: Int) -> (height: Int, width: Int) {
        if config.doCenterCrop { return (config.cropHeight, config.cropWidth) }
        return config.doResize ? config.size.outputSize(height: height, width: width) : (height, width)
    }

    /// One image through the pipeline, before normalisation: resized and cropped RGB.
    public func resizedAndCropped(_ image: RGBImage) -> RGBImage {
        var image = image
        if config.doResize {
            let (height, width) = config.size.outputSize(height: image.height, width: image.width)
            image = image.resized(width: width, height: height, filter: config.resample)
        }
        if config.doCenterCrop {
            image = image.centerCropped(width: config.cropWidth, height: config.cropHeight)
        }
        return image
    }

    /// pixel_values [N, 3, H, W] fp32, exactly as `CLIPImageProcessorPil(images, return_tensors="pt").pixel_values`.
    ///
    /// Rescaling multiplies in float64 and rounds to float32; normalisation subtracts and divides in float32, as
    /// transformers' numpy code does. All images must come out the same size (always so with centre cropping).
    public func callAsFunction(_ images: [RGBImage]) -> Tensor {
        let prepared = images.map(resizedAndCropped)
        guard let first = prepared.first else { return Tensor(zeros: [0, 3, config.cropHeight, config.cropWidth]) }
        let (height, width) = (first.height, first.width)
        precondition(prepared.allSatisfy { $0.height == height && $0.width == width },
                     "images of different sizes cannot be batched; enable center crop")
        let plane = height * width
        let mean = config.imageMean.map { Float($0) }, std = config.imageStd.map { Float($0) }
        let tensor = Tensor(uninitialized: [prepared.count, 3, height, width])
        tensor.withUnsafeMutableBufferPointer { out in
            for (n, image) in prepared.enumerated() {
                image.pixels.withUnsafeBufferPointer { pixels in
                    for c in 0..<3 {
                        let base = (n * 3 + c) * plane
                        for i in 0..<plane {
                            let byte = pixels[i * 3 + c]
                            var value = config.doRescale ? Float(Double(byte) * config.rescaleFactor) : Float(byte)
                            if config.doNormalize { value = (value - mean[c]) / std[c] }
                            out[base + i] = value
                        }
                    }
                }
            }
        }
        return tensor
    }
}
