/// Everything that can be wrong with a checkpoint on disk. Every case names the file it is about, and the tensor or
/// key when there is one, so that a message alone tells the user what to fix.
public enum CheckpointError: Error, CustomStringConvertible, Sendable {
    /// The file or directory does not exist.
    case missingFile(path: String)
    /// The path exists but is not a directory.
    case notADirectory(path: String)
    /// The file exists but cannot be opened, read or mapped (permissions, not a regular file, I/O error).
    case unreadable(file: String, reason: String)
    /// The file cannot be written (no such directory, permissions, disk full).
    case unwritable(path: String, reason: String)
    /// A JSON file of the checkpoint is larger than any sane config or index.
    case fileTooLarge(file: String, size: Int, limit: Int)
    /// A safetensors file shorter than its 8-byte header length.
    case fileTooShort(file: String, size: Int)
    /// The header length is larger than the rest of the file, or larger than any sane header.
    case headerLengthOutOfRange(file: String, length: UInt64, available: Int)
    /// The header is not valid JSON, or not shaped like a safetensors header.
    case invalidHeader(file: String, reason: String)
    /// A header entry names a dtype that safetensors does not define.
    case unknownDType(file: String, tensor: String, dtype: String)
    /// A header entry whose shape is negative, or whose element count times the dtype size is not its byte count.
    case byteCountMismatch(file: String, tensor: String, reason: String)
    /// A header entry whose byte range is reversed or reaches past the end of the file.
    case dataOutOfBounds(file: String, tensor: String, begin: Int, end: Int, dataSize: Int)
    /// Two header entries share bytes.
    case overlappingTensors(file: String, first: String, second: String)
    /// The tensor exists but its dtype cannot be widened to fp32 (only F32, F16 and BF16 can).
    case unsupportedDType(file: String, tensor: String, dtype: String)
    /// No tensor of that name; `file` is the safetensors file or the shard index that was searched.
    case missingTensor(file: String, tensor: String)
    /// The tensor exists with another shape than the model expects.
    case shapeMismatch(file: String, tensor: String, expected: [Int], actual: [Int])
    /// The directory has neither `model.safetensors` nor `model.safetensors.index.json`.
    case noWeights(directory: String)
    /// `model.safetensors.index.json` is not shaped like a shard index.
    case invalidIndex(file: String, reason: String)
    /// The shard index names a shard that is not in the directory.
    case missingShard(index: String, shard: String)
    /// The shard index names a shard outside the directory (absolute, or through `..`).
    case unsafeShardName(index: String, shard: String)
    /// A JSON file that is not valid JSON, or whose top level is not an object.
    case invalidJSON(file: String, reason: String)
    /// A config value that is missing or of the wrong type; `keyPath` is dotted, e.g. `vision_config.hidden_size`.
    case invalidConfig(file: String, keyPath: String, reason: String)
    /// A GGUF file that is truncated, corrupt or of a kind this reader does not handle; `tensor` is set when the
    /// problem is one tensor's (its shape, offset, or a tensor type that cannot be dequantized).
    case invalidGGUF(file: String, tensor: String?, reason: String)

    public var description: String {
        switch self {
        case let .missingFile(path):
            return "\(path): no such file or directory"
        case let .notADirectory(path):
            return "\(path): not a directory"
        case let .unreadable(file, reason):
            return "\(file): cannot read: \(reason)"
        case let .unwritable(path, reason):
            return "\(path): cannot write: \(reason)"
        case let .fileTooLarge(file, size, limit):
            return "\(file): \(size) bytes, more than the \(limit) bytes allowed for this kind of file"
        case let .fileTooShort(file, size):
            return "\(file): \(size) bytes, too short for a safetensors file (it starts with an 8-byte header length)"
        case let .headerLengthOutOfRange(file, length, available):
            return "\(file): header length \(length) is out of range (\(available) bytes follow it; the limit is \(SafetensorsFile.maximumHeaderLength))"
        case let .invalidHeader(file, reason):
            return "\(file): invalid safetensors header: \(reason)"
        case let .unknownDType(file, tensor, dtype):
            return "\(file): tensor '\(tensor)' has unknown dtype '\(dtype)'"
        case let .byteCountMismatch(file, tensor, reason):
            return "\(file): tensor '\(tensor)': \(reason)"
        case let .dataOutOfBounds(file, tensor, begin, end, dataSize):
            return "\(file): tensor '\(tensor)' has data offsets [\(begin), \(end)] outside the \(dataSize)-byte data section (truncated file?)"
        case let .overlappingTensors(file, first, second):
            return "\(file): tensors '\(first)' and '\(second)' have overlapping data"
        case let .unsupportedDType(file, tensor, dtype):
            return "\(file): tensor '\(tensor)' has dtype \(dtype); only F32, F16 and BF16 load as fp32"
        case let .missingTensor(file, tensor):
            return "\(file): no tensor named '\(tensor)'"
        case let .shapeMismatch(file, tensor, expected, actual):
            return "\(file): tensor '\(tensor)' has shape \(actual), expected \(expected)"
        case let .noWeights(directory):
            return "\(directory): neither model.safetensors nor model.safetensors.index.json"
        case let .invalidIndex(file, reason):
            return "\(file): invalid shard index: \(reason)"
        case let .missingShard(index, shard):
            return "\(index): shard '\(shard)' is missing"
        case let .unsafeShardName(index, shard):
            return "\(index): shard name '\(shard)' points outside the checkpoint directory"
        case let .invalidJSON(file, reason):
            return "\(file): invalid JSON: \(reason)"
        case let .invalidConfig(file, keyPath, reason):
            return "\(file): \(keyPath.isEmpty ? "top level" : "'\(keyPath)'"): \(reason)"
        case let .invalidGGUF(file, tensor, reason):
            return "\(file): \(tensor.map { "tensor '\($0)': " } ?? "invalid GGUF: ")\(reason)"
        }
    }
}
