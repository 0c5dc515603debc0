import Foundation
import VLMTensor

/// All weights of a checkpoint directory: `model.safetensors`, or `model.safetensors.index.json` and its shards
/// (only the shards named by the index are opened). Tensors are looked up by Hugging Face name.
public final class WeightStore: @unchecked Sendable {
    public static let singleFileName = "model.safetensors"
    public static let indexFileName = "model.safetensors.index.json"

    /// The file a missing tensor is reported against: model.safetensors or the shard index.
    private let source: String
    // name → the file holding it. Immutable after init.
    private let files: [String: SafetensorsFile]
    /// The file a store made by ``init(gguf:tensors:)`` reads, and where it reads each Hugging Face name.
    private let ggufFile: GGUFFile?
    private let ggufTensors: [String: GGUFSource]

    /// A tensor of a GGUF file under its own name, or a value the file leaves out.
    public enum GGUFSource: Sendable {
        case tensor(String)
        case value(Tensor)
    }

    /// Sorted tensor names.
    public let names: [String]

    /// The tensors of a GGUF file under Hugging Face names (`tensors` maps each to the file's tensor, or to a value the
    /// file leaves out), so that a model built from a checkpoint's names reads them; fp32, dequantized on reading.
    /// Missing tensors are reported against the GGUF file.
    public init(gguf file: GGUFFile, tensors: [String: GGUFSource]) {
        source = file.url.path
        files = [:]
        ggufFile = file
        ggufTensors = tensors
        names = tensors.filter { _, source in
            if case let .tensor(stored) = source { return file.info(stored) != nil }
            return true
        }.keys.sorted()
    }

    /// Opens the checkpoint in `directory`: `model.safetensors` if present, else the shards that
    /// `model.safetensors.index.json` names. Every header is validated, and every tensor the index lists must be in
    /// the shard it names.
    public init(directory: URL) throws {
        let indexURL = directory.appendingPathComponent(Self.indexFileName)
        let singleURL = directory.appendingPathComponent(Self.singleFileName)
        // The single file wins when both are present, as in transformers.
        if FileManager.default.fileExists(atPath: singleURL.path) {
            source = singleURL.path
            let file = try SafetensorsFile(url: singleURL)
            files = Dictionary(uniqueKeysWithValues: file.tensorNames.map { ($0, file) })
        } else if FileManager.default.fileExists(atPath: indexURL.path) {
            source = indexURL.path
            files = try Self.openShards(index: indexURL, directory: directory)
        } else {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: directory.path, isDirectory: &isDirectory) else {
                throw CheckpointError.missingFile(path: directory.path)
            }
            guard isDirectory.boolValue else { throw CheckpointError.notADirectory(path: directory.path) }
            throw CheckpointError.noWeights(directory: directory.path)
        }
        names = files.keys.sorted()
        ggufFile = nil
        ggufTensors = [:]
    }

    public func contains(_ name: String) -> Bool {
        switch ggufTensors[name] {
        case .value: true
        // A name mapped to a tensor the file lacks is not there (reading it throws naming the file's tensor).
        case let .tensor(stored): ggufFile?.info(stored) != nil
        case nil: files[name] != nil
        }
    }

    /// Whether the checkpoint's weights are stored in bf16: of its floating-point tensors, bf16 ones hold most of the
    /// elements (a bf16 checkpoint may keep a few buffers in fp32). Always false for a GGUF file.
    public var storesBFloat16: Bool {
        var elements: [String: Int] = [:]
        for name in names {
            guard let info = info(name), ["F64", "F32", "F16", "BF16"].contains(info.dtype) else { continue }
            elements[info.dtype, default: 0] += info.elementCount
        }
        return elements.max { $0.value < $1.value }?.key == "BF16"
    }

    /// The matrix precision a model of this checkpoint runs in unless its user asks for another: bf16 for a checkpoint
    /// stored in bf16, whose weights hold no more than bf16 can, fp32 otherwise.
    public var defaultMatrixPrecision: MatrixPrecision { storesBFloat16 ? .bfloat16 : .float32 }

    /// The dtype, shape and location of `name`, or nil when the checkpoint has no such tensor.
    public func info(_ name: String) -> TensorInfo? { files[name]?.info(name) }

    /// `name` as fp32; throws naming the file and tensor if it is missing, or if its shape differs from `shape`.
    /// The shape is checked before any data is read.
    public func tensor(_ name: String, shape: [Int]) throws -> Tensor {
        if let gguf = ggufTensors[name], let ggufFile {
            switch gguf {
            case let .tensor(stored): return try ggufFile.tensor(stored, shape: shape)
            case let .value(value):
                guard value.shape == shape else {
                    throw CheckpointError.shapeMismatch(file: source, tensor: name, expected: shape, actual: value.shape)
                }
                return value
            }
        }
        let file = try file(holding: name)
        if let actual = file.info(name)?.shape, actual != shape {
            throw CheckpointError.shapeMismatch(file: file.url.path, tensor: name, expected: shape, actual: actual)
        }
        return try file.tensor(name)
    }

    /// `name` as fp32, whatever its shape; throws naming the file and tensor if it is missing.
    public func tensor(_ name: String) throws -> Tensor {
        if let gguf = ggufTensors[name], let ggufFile {
            switch gguf {
            case let .tensor(stored): return try ggufFile.tensor(stored)
            case let .value(value): return value
            }
        }
        return try file(holding: name).tensor(name)
    }

    private func file(holding name: String) throws -> SafetensorsFile {
        guard let file = files[name] else { throw CheckpointError.missingTensor(file: source, tensor: name) }
        return file
    }

    private struct ShardIndex: Decodable {
        let weightMap: [String: String]

        enum CodingKeys: String, CodingKey {
            case weightMap = "weight_map"
        }
    }

    private static func openShards(index indexURL: URL, directory: URL) throws -> [String: SafetensorsFile] {
        let indexPath = indexURL.path
        let weightMap = try decodeJSON(
            ShardIndex.self, from: readJSONFile(indexPath),
            syntaxError: { CheckpointError.invalidJSON(file: indexPath, reason: $0) },
            contentError: { keyPath, reason in
                CheckpointError.invalidIndex(file: indexPath, reason: keyPath.isEmpty ? reason : "'\(keyPath)': \(reason)")
            }
        ).weightMap

        // Open each shard once, in a fixed order so that the first error reported does not vary between runs.
        var shards: [String: SafetensorsFile] = [:]
        for shardName in Set(weightMap.values).sorted() {
            guard isContained(shardName) else {
                throw CheckpointError.unsafeShardName(index: indexPath, shard: shardName)
            }
            let shardURL = directory.appendingPathComponent(shardName)
            guard FileManager.default.fileExists(atPath: shardURL.path) else {
                throw CheckpointError.missingShard(index: indexPath, shard: shardName)
            }
            shards[shardName] = try SafetensorsFile(url: shardURL)
        }

        var files: [String: SafetensorsFile] = [:]
        for (name, shardName) in weightMap.sorted(by: { $0.key < $1.key }) {
            let shard = shards[shardName]!
            guard shard.info(name) != nil else {
                throw CheckpointError.missingTensor(file: shard.url.path, tensor: name)
            }
            files[name] = shard
        }
        return files
    }

    /// Whether a shard name stays inside the checkpoint directory: relative, with no empty, `.` or `..` component.
    private static func isContained(_ shardName: String) -> Bool {
        guard !shardName.hasPrefix("/"), !shardName.contains("\0") else { return false }
        return shardName.split(separator: "/", omittingEmptySubsequences: false)
            .allSatisfy { !$0.isEmpty && $0 != "." && $0 != ".." }
    }
}

/// A view of a ``WeightStore`` under a name prefix: `weights.scoped("vision_model").scoped("encoder.layers.0")`
/// reads `vision_model.encoder.layers.0.…`.
public struct Weights: Sendable {
    public let store: WeightStore
    /// The dotted prefix, empty for the whole store.
    public let prefix: String

    public init(_ store: WeightStore, prefix: String = "") {
        self.store = store
        self.prefix = prefix
    }

    /// The view under `prefix.component`.
    public func scoped(_ component: String) -> Weights {
        Weights(store, prefix: fullName(component))
    }

    /// The tensor `prefix.name`, which must have `shape`.
    public func callAsFunction(_ name: String, shape: [Int]) throws -> Tensor {
        try store.tensor(fullName(name), shape: shape)
    }

    /// The tensor `prefix.name`, whatever its shape.
    public func callAsFunction(_ name: String) throws -> Tensor {
        try store.tensor(fullName(name))
    }

    public func contains(_ name: String) -> Bool {
        store.contains(fullName(name))
    }

    /// The view under the first of `candidates` that holds `name` (under the first candidate when none does, so that
    /// the missing-tensor error names it): a checkpoint saved in one of several layouts.
    public func scoped(firstOf candidates: [String], holding name: String) -> Weights {
        scoped(candidates.first { contains("\($0).\(name)") } ?? candidates[0])
    }

    /// `prefix.name`, or either alone when the other is empty.
    public func fullName(_ name: String) -> String {
        if prefix.isEmpty { return name }
        if name.isEmpty { return prefix }
        return prefix + "." + name
    }
}
