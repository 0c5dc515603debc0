import Foundation
import VLMTensor

/// A height and width in pixels.
public struct ImageSize: Sendable, Hashable, Codable {
    public var height: Int
    public var width: Int

    public init(height: Int, width: Int) {
        self.height = height
        self.width = width
    }
}

/// What an image processor makes of a batch of images, as transformers' `BatchFeature`: the pixel values, and each
/// image's size before processing (`image_sizes`, which tiling processors report and their models read).
public struct ProcessedImages: Sendable {
    /// `pixel_values` as the model takes them: `[N, 3, H, W]` for the fixed-size processors (`[N + Σ crops, 3, H, W]`
    /// with Gemma 3's pan and scan), `[N, patches, 3, H, W]` for the tiling ones, `[N, max_num_patches, p·p·3]` for
    /// SigLIP 2's flattened patches.
    public var pixelValues: Tensor
    /// Each input image's (height, width), in order.
    public var imageSizes: [ImageSize]
    /// `pixel_mask` `[N, H, W]`, 1 where a padded batch holds an image's pixels (ViLT); nil when nothing is padded.
    public var pixelMask: Tensor?
    /// Per image, whether a tiling processor cut it into tiles (LLaVA-OneVision tiles an image only when it is its
    /// conversation's only one, transformers' `batch_num_images`); nil: as the processor always does.
    public var tiled: [Bool]?
    /// `pixel_attention_mask` `[N, patches]`, 1 for an image's patches and 0 for the padding after them, where
    /// `pixelValues` holds flattened patches (SigLIP 2's NaFlex processor); nil otherwise.
    public var pixelAttentionMask: Tensor?
    /// `spatial_shapes`: each image's patch grid, its rows and columns as `height` and `width`, where `pixelValues`
    /// holds flattened patches; nil otherwise.
    public var spatialShapes: [ImageSize]?
    /// Gemma 3's pan and scan (transformers' `num_crops`): per image, how many crops of it follow it in
    /// `pixelValues`; nil where nothing was cropped so.
    public var crops: [Int]?

    public init(pixelValues: Tensor, imageSizes: [ImageSize], pixelMask: Tensor? = nil, tiled: [Bool]? = nil,
                pixelAttentionMask: Tensor? = nil, spatialShapes: [ImageSize]? = nil, crops: [Int]? = nil) {
        self.pixelValues = pixelValues
        self.imageSizes = imageSizes
        self.pixelMask = pixelMask
        self.tiled = tiled
        self.pixelAttentionMask = pixelAttentionMask
        self.spatialShapes = spatialShapes
        self.crops = crops
    }
}

/// Turns decoded RGB images into a model's inputs exactly as one of transformers' `*ImageProcessorPil` classes does.
/// ``ImageProcessorRegistry/load(directory:modelType:)`` picks the implementation a checkpoint names.
public protocol ImageProcessor: Sendable {
    func preprocess(_ images: [RGBImage]) throws -> ProcessedImages
}

/// Why a checkpoint's image processor could not be set up or run. Each case names the file where there is one.
public enum ImageProcessorError: Error, CustomStringConvertible, Equatable {
    case unreadable(file: String, reason: String)
    case invalidConfig(file: String, reason: String)
    /// The class the config asks for (or the model type's default) has no implementation here.
    case unsupportedType(String, file: String, supported: [String])
    /// The directory has neither processor config file.
    case missingConfig(directory: String)
    /// The config names no class, and the model type has no default one here.
    case unnamedType(file: String, modelType: String?, supported: [String])
    case unequalSizes([ImageSize])
    /// Images tiled into different numbers of patches, which only padding (`do_pad`) lets one tensor hold.
    case unequalPatchCounts([Int])

    public var description: String {
        switch self {
        case .unreadable(let file, let reason): "\(file): cannot read: \(reason)"
        case .invalidConfig(let file, let reason): "\(file): bad image processor config: \(reason)"
        case .unsupportedType(let type, let file, let supported):
            "\(file): image processor \"\(type)\" is not supported here (supported: \(supported.joined(separator: ", ")))"
        case .missingConfig(let directory):
            "\(directory): no preprocessor_config.json or processor_config.json"
        case .unnamedType(let file, let modelType, let supported):
            "\(file): names no image_processor_type, and model type \(modelType.map { "\"\($0)\"" } ?? "(unknown)") has no default processor here (supported: \(supported.joined(separator: ", ")))"
        case .unequalSizes(let sizes):
            "images come out of the processor in different sizes (\(sizes.map { "\($0.width)x\($0.height)" }.joined(separator: ", "))) and cannot be batched"
        case .unequalPatchCounts(let counts):
            "images come out of the processor in different numbers of patches (\(counts.map(String.init).joined(separator: ", "))) and cannot be batched without do_pad"
        }
    }
}

/// Chooses and builds a checkpoint's image processor the way transformers' `AutoImageProcessor` does.
public enum ImageProcessorRegistry {
    /// The implementations, by transformers' class name without backend suffix.
    static let builders: [String: @Sendable (_ json: Data, _ file: String) throws -> any ImageProcessor] = [
        "CLIPImageProcessor": { try StandardImageProcessor(config: .init(json: $0, defaults: .clip, file: $1)) },
        "BlipImageProcessor": { try StandardImageProcessor(config: .init(json: $0, defaults: .blip, file: $1)) },
        "ViTImageProcessor": { try StandardImageProcessor(config: .init(json: $0, defaults: .vit, file: $1)) },
        "SiglipImageProcessor": { try StandardImageProcessor(config: .init(json: $0, defaults: .siglip, file: $1)) },
        "OwlViTImageProcessor": { try StandardImageProcessor(config: .owlViT(json: $0, file: $1)) },
        "Owlv2ImageProcessor": { try Owlv2ImageProcessor(json: $0, file: $1) },
        "ViltImageProcessor": { try ViltImageProcessor(json: $0, file: $1) },
        "LlavaNextImageProcessor": { try LlavaNextImageProcessor(config: .init(json: $0, file: $1)) },
        "LlavaOnevisionImageProcessor": { try LlavaOnevisionImageProcessor(json: $0, file: $1) },
        "Siglip2ImageProcessor": { try Siglip2ImageProcessor(json: $0, file: $1) },
        "Gemma3ImageProcessor": { try StandardImageProcessor(config: .gemma3(json: $0, file: $1)) },
    ]

    /// The processor class of a model type whose processor config names none (transformers'
    /// `IMAGE_PROCESSOR_MAPPING_NAMES`, for the model types with an implementation here).
    static let classByModelType = [
        "clip": "CLIPImageProcessor",
        "blip": "BlipImageProcessor",
        "blip-2": "BlipImageProcessor",
        "clipseg": "ViTImageProcessor",
        "groupvit": "CLIPImageProcessor",
        "siglip": "SiglipImageProcessor",
        "owlvit": "OwlViTImageProcessor",
        "owlv2": "Owlv2ImageProcessor",
        "vilt": "ViltImageProcessor",
        "llava_next": "LlavaNextImageProcessor",
        "llava_onevision": "LlavaOnevisionImageProcessor",
        "siglip2": "Siglip2ImageProcessor",
        "gemma3": "Gemma3ImageProcessor",
    ]

    /// The class names ``load(directory:modelType:)`` accepts (each also with its `Fast` or `Pil` suffix).
    public static var supportedTypes: [String] { builders.keys.sorted() }

    /// transformers' class name for what a config says: the `Fast` (legacy) and `Pil` backend suffixes dropped, and
    /// an old `…FeatureExtractor` read as its `…ImageProcessor`.
    public static func baseClassName(_ name: String) -> String {
        if name.hasSuffix("FeatureExtractor") { return String(name.dropLast("FeatureExtractor".count)) + "ImageProcessor" }
        for suffix in ["Fast", "Pil"] where name.hasSuffix(suffix) { return String(name.dropLast(suffix.count)) }
        return name
    }

    /// The image processor of a checkpoint directory, found as transformers finds it: the `image_processor` object
    /// of processor_config.json, else preprocessor_config.json; its class from `image_processor_type`, else
    /// `feature_extractor_type`, else the model type's default.
    ///
    /// - Parameter modelType: config.json's `model_type`, for configs that name no class.
    /// - Throws: ``ImageProcessorError`` naming the file: unreadable or invalid JSON, a class with no implementation
    ///   here (listing the supported ones), no config at all.
    public static func load(directory: URL, modelType: String? = nil) throws -> any ImageProcessor {
        guard let settings = try processorSettings(directory: directory) else {
            throw ImageProcessorError.missingConfig(directory: directory.path)
        }
        let named = (settings.object["image_processor_type"] as? String)
            ?? (settings.object["feature_extractor_type"] as? String)
            ?? modelType.flatMap { classByModelType[$0] }
        guard let named else {
            throw ImageProcessorError.unnamedType(file: settings.file, modelType: modelType, supported: supportedTypes)
        }
        guard let build = builders[baseClassName(named)] else {
            throw ImageProcessorError.unsupportedType(named, file: settings.file, supported: supportedTypes)
        }
        return try build(settings.json, settings.file)
    }

    /// A processor settings object: its JSON text, parsed, and where it came from (named in errors).
    private struct Settings {
        let json: Data
        let object: [String: Any]
        let file: String
    }

    /// The `image_processor` object of processor_config.json, else preprocessor_config.json; nil when the directory
    /// has neither.
    private static func processorSettings(directory: URL) throws -> Settings? {
        let nested = directory.appendingPathComponent("processor_config.json")
        if let (_, object) = try jsonObject(nested), let imageProcessor = object["image_processor"] {
            let file = nested.path + ": image_processor"
            guard let settings = imageProcessor as? [String: Any],
                  let json = try? JSONSerialization.data(withJSONObject: settings) else {
                throw ImageProcessorError.invalidConfig(file: file, reason: "not an object")
            }
            return Settings(json: json, object: settings, file: file)
        }
        let flat = directory.appendingPathComponent("preprocessor_config.json")
        return try jsonObject(flat).map { Settings(json: $0.data, object: $0.object, file: flat.path) }
    }

    /// A JSON file's bytes and top-level object; nil when there is no such file.
    private static func jsonObject(_ url: URL) throws -> (data: Data, object: [String: Any])? {
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw ImageProcessorError.unreadable(file: url.path, reason: error.localizedDescription)
        }
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw ImageProcessorError.invalidConfig(file: url.path, reason: "not a JSON object")
        }
        return (data, object)
    }
}
