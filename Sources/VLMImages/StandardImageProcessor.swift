import Foundation
import VLMTensor

/// The settings of transformers' standard PIL image pipeline (`PilBackend._preprocess`: resize, centre crop, rescale,
/// normalise), which CLIP, BLIP, ViT and SigLIP processors share; they differ only in their class defaults.
///
/// Decoded from preprocessor_config.json over a class's defaults: absent or null keys keep the default, and both the
/// old (int / list) and new (dict) forms of `size` and `crop_size` are read.
public struct StandardImageProcessorConfig: Sendable, Equatable {
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
    public var imageMean: [Double] = openAICLIPMean
    public var imageStd: [Double] = openAICLIPStd
    /// How an int `size` reads: a square (true) or the shortest edge (false).
    public var defaultToSquare = false

    static let openAICLIPMean = [0.48145466, 0.4578275, 0.40821073]
    static let openAICLIPStd = [0.26862954, 0.26130258, 0.27577711]
    static let imageNetStandard = [0.5, 0.5, 0.5]

    /// `CLIPImageProcessorPil`'s defaults (openai/clip-vit-*).
    public static let clip = StandardImageProcessorConfig()

    /// `BlipImageProcessorPil`'s defaults (BLIP and BLIP-2): 384×384 bicubic, no crop, CLIP's mean and std.
    public static let blip: StandardImageProcessorConfig = {
        var config = StandardImageProcessorConfig()
        config.size = .exact(height: 384, width: 384)
        config.doCenterCrop = false
        config.defaultToSquare = true
        return config
    }()

    /// `ViTImageProcessorPil`'s defaults (ViT, CLIPSeg): 224×224 bilinear, mean and std 0.5.
    public static let vit: StandardImageProcessorConfig = {
        var config = StandardImageProcessorConfig()
        config.size = .exact(height: 224, width: 224)
        config.resample = .bilinear
        config.doCenterCrop = false
        config.imageMean = imageNetStandard
        config.imageStd = imageNetStandard
        config.defaultToSquare = true
        return config
    }()

    /// `SiglipImageProcessorPil`'s defaults: 224×224 bicubic, mean and std 0.5.
    public static let siglip: StandardImageProcessorConfig = {
        var config = vit
        config.resample = .bicubic
        config.defaultToSquare = false
        return config
    }()

    /// A Gemma 3 preprocessor config: `Gemma3ImageProcessorPil`'s defaults are ViT's (224×224 bilinear, mean and
    /// std 0.5, no crop). Its pan-and-scan keys are not read: transformers' `Gemma3Processor` passes its own call-time
    /// settings over them (off unless the call asks; see ``PanAndScan``).
    static func gemma3(json data: Data, file: String) throws -> StandardImageProcessorConfig {
        try StandardImageProcessorConfig(json: data, defaults: .vit, file: file)
    }

    /// `OwlViTImageProcessorPil`'s defaults: 768×768 bicubic, no crop (a 768×768 one when asked), CLIP's mean and std.
    public static let owlViT: StandardImageProcessorConfig = {
        var config = StandardImageProcessorConfig()
        config.size = .exact(height: 768, width: 768)
        config.doCenterCrop = false
        (config.cropHeight, config.cropWidth) = (768, 768)
        config.defaultToSquare = true
        return config
    }()

    /// An OWL-ViT preprocessor config over ``owlViT``, where the early configs' `rescale` flag, if any, is
    /// `do_rescale` (as `OwlViTImageProcessorPil.__init__` reads it, over `do_rescale`).
    static func owlViT(json data: Data, file: String) throws -> StandardImageProcessorConfig {
        var config = try StandardImageProcessorConfig(json: data, defaults: .owlViT, file: file)
        let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        if let rescale = object?["rescale"] {
            guard let flag = rescale as? Bool else {
                throw ImageProcessorError.invalidConfig(file: file, reason: "rescale must be true or false")
            }
            config.doRescale = flag
        }
        return config
    }

    /// Reads a preprocessor config's JSON object over `defaults`.
    ///
    /// - Throws: `ImageProcessorError.invalidConfig` naming `file` and the key.
    public init(json data: Data, defaults: StandardImageProcessorConfig = .clip, file: String = "preprocessor_config.json") throws {
        let decoder = JSONDecoder()
        decoder.userInfo[Self.defaultsKey] = defaults
        do {
            self = try decoder.decode(Self.self, from: data)
        } catch let error as DecodingError {
            throw ImageProcessorError.invalidConfig(file: file, reason: Self.describe(error))
        }
    }

    private static let defaultsKey = CodingUserInfoKey(rawValue: "StandardImageProcessorConfig.defaults")!

    private static func describe(_ error: DecodingError) -> String {
        switch error {
        case .dataCorrupted(let context), .typeMismatch(_, let context), .valueNotFound(_, let context),
             .keyNotFound(_, let context):
            let path = context.codingPath.map(\.stringValue).joined(separator: ".")
            return path.isEmpty ? context.debugDescription : "\(path): \(context.debugDescription)"
        @unknown default:
            return "\(error)"
        }
    }

    private init() {}
}

extension StandardImageProcessorConfig: Decodable {
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

    /// Decodes over the defaults in `userInfo` (CLIP's when there are none).
    public init(from decoder: Decoder) throws {
        self = decoder.userInfo[Self.defaultsKey] as? Self ?? .clip
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
        defaultToSquare = try flag(.defaultToSquare, defaultToSquare)

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

/// transformers' standard PIL pipeline (`CLIPImageProcessorPil`, `BlipImageProcessorPil`, `ViTImageProcessorPil`,
/// `SiglipImageProcessorPil`): resize, centre crop, rescale, normalise, in transformers' order and arithmetic.
public struct StandardImageProcessor: ImageProcessor {
    public let config: StandardImageProcessorConfig

    public init(config: StandardImageProcessorConfig) {
        self.config = config
    }

    /// The (height, width) of every output image.
    public func outputSize(height: Int, width: Int) -> (height: Int, width: Int) {
        if config.doCenterCrop { return (config.cropHeight, config.cropWidth) }
        return config.doResize ? config.size.outputSize(height: height, width: width) : (height, width)
    }

    /// The rectangle of an image of `height`×`width` pixels that its pixel values show, in the image's own pixels:
    /// the whole image, or, with a centre crop, where the crop's edges fall once the resize is undone (rounded half
    /// up; reaching outside the image where the crop pads it). A per-pixel map of the model's input belongs there.
    public func shownRegion(height: Int, width: Int) -> (top: Int, left: Int, height: Int, width: Int) {
        guard config.doCenterCrop else { return (0, 0, height, width) }
        let resized = config.doResize ? config.size.outputSize(height: height, width: width) : (height: height, width: width)
        func edges(_ size: Int, _ resizedSize: Int, _ crop: Int) -> (start: Int, count: Int) {
            let start = centerCropOffset(resizedSize, crop)
            let first = Int((Double(start * size) / Double(resizedSize) + 0.5).rounded(.down))
            let last = Int((Double((start + crop) * size) / Double(resizedSize) + 0.5).rounded(.down))
            return (first, last - first)
        }
        let (rows, columns) = (edges(height, resized.height, config.cropHeight), edges(width, resized.width, config.cropWidth))
        return (rows.start, columns.start, rows.count, columns.count)
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

    /// `image` rescaled and normalised into `out` from `offset` on, channels first (`[3, H, W]`).
    ///
    /// Rescaling multiplies in float64 and rounds to float32; normalisation subtracts and divides in float32, as
    /// transformers' numpy code does.
    func writeNormalized(_ image: RGBImage, into out: UnsafeMutableBufferPointer<Float>, at offset: Int) {
        let plane = image.height * image.width
        let mean = config.imageMean.map { Float($0) }, std = config.imageStd.map { Float($0) }
        image.pixels.withUnsafeBufferPointer { pixels in
            for c in 0..<3 {
                let base = offset + c * plane
                for i in 0..<plane {
                    let byte = pixels[i * 3 + c]
                    var value = config.doRescale ? Float(Double(byte) * config.rescaleFactor) : Float(byte)
                    if config.doNormalize { value = (value - mean[c]) / std[c] }
                    out[base + i] = value
                }
            }
        }
    }

    /// pixel_values [N, 3, H, W] fp32, exactly as `processor(images, return_tensors="pt").pixel_values`.
    ///
    /// - Throws: `ImageProcessorError.unequalSizes` when the images come out in different sizes (no centre crop),
    ///   which one tensor cannot hold, as transformers refuses to stack them.
    public func preprocess(_ images: [RGBImage]) throws -> ProcessedImages {
        let sizes = images.map { ImageSize(height: $0.height, width: $0.width) }
        let prepared = images.map(resizedAndCropped)
        guard let first = prepared.first else {
            return ProcessedImages(pixelValues: Tensor(zeros: [0, 3, config.cropHeight, config.cropWidth]), imageSizes: [])
        }
        let (height, width) = (first.height, first.width)
        guard prepared.allSatisfy({ $0.height == height && $0.width == width }) else {
            throw ImageProcessorError.unequalSizes(prepared.map { ImageSize(height: $0.height, width: $0.width) })
        }
        let tensor = Tensor(uninitialized: [prepared.count, 3, height, width])
        tensor.withUnsafeMutableBufferPointer { out in
            for (n, image) in prepared.enumerated() { writeNormalized(image, into: out, at: n * 3 * height * width) }
        }
        return ProcessedImages(pixelValues: tensor, imageSizes: sizes)
    }
}
