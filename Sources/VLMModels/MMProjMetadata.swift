import Foundation
import VLMCheckpoint

/// The fields of a vision tower's config that a llama.cpp mmproj records (`clip.vision.*`): CLIP's and SigLIP's
/// configs both have them.
protocol MMProjVisionTower {
    var imageSize: Int { get set }
    var patchSize: Int { get set }
    var hiddenSize: Int { get set }
    var intermediateSize: Int { get set }
    var numAttentionHeads: Int { get set }
    var numHiddenLayers: Int { get set }
    var layerNormEps: Float { get set }
    var hiddenAct: String { get set }
}

extension CLIPVisionConfig: MMProjVisionTower {}
extension SiglipVisionConfig: MMProjVisionTower {}

/// What every llama.cpp mmproj file says in the same keys whatever its projector (`general.architecture` "clip",
/// `clip.vision.*`), with errors naming the file.
struct MMProjMetadata {
    let file: GGUFFile

    /// - Throws: `CheckpointError.invalidGGUF` when `file` is not an mmproj (`general.architecture` is not "clip").
    init(_ file: GGUFFile) throws {
        self.file = file
        let architecture = file.metadata["general.architecture"]?.string
        guard architecture == "clip" else {
            throw invalid("not an mmproj file: general.architecture is \(architecture.map { "\"\($0)\"" } ?? "missing"), expected \"clip\"")
        }
    }

    func invalid(_ reason: String) -> CheckpointError { .invalidGGUF(file: file.url.path, tensor: nil, reason: reason) }

    /// `clip.vision.<key>`, a positive count.
    func count(_ key: String) throws -> Int {
        guard let value = file.metadata["clip.vision.\(key)"] else { throw invalid("clip.vision.\(key) is missing") }
        guard let integer = value.integer, integer > 0 else { throw invalid("clip.vision.\(key) is \(value), expected a positive count") }
        return integer
    }

    /// `clip.vision.<key>`, three numbers (a mean or std per channel), `values` when absent.
    func channels(_ key: String, default values: [Double]) throws -> [Double] {
        guard let value = file.metadata["clip.vision.\(key)"] else { return values }
        guard let numbers = value.array?.compactMap(\.number), numbers.count == 3 else {
            throw invalid("clip.vision.\(key) is \(value), expected 3 numbers")
        }
        return numbers
    }

    /// `tower` with the shape the file records, its layer-norm epsilon (`epsilon` when absent) and the activation
    /// llama.cpp's clip.cpp runs: `gelu` when `clip.use_gelu` is set, SiLU when `clip.use_silu` is, quick GELU
    /// (OpenAI CLIP's) otherwise.
    func tower<Tower: MMProjVisionTower>(_ tower: Tower, epsilon: Float, gelu: String) throws -> Tower {
        var tower = tower
        tower.imageSize = try count("image_size")
        tower.patchSize = try count("patch_size")
        tower.hiddenSize = try count("embedding_length")
        tower.intermediateSize = try count("feed_forward_length")
        tower.numAttentionHeads = try count("attention.head_count")
        tower.numHiddenLayers = try count("block_count")
        tower.layerNormEps = Float(file.metadata["clip.vision.attention.layer_norm_epsilon"]?.number ?? Double(epsilon))
        let metadata = file.metadata
        tower.hiddenAct = metadata["clip.use_gelu"] == .bool(true) ? gelu : metadata["clip.use_silu"] == .bool(true) ? "silu" : "quick_gelu"
        return tower
    }
}
