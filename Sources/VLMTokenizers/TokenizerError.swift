/// Why a tokenizer could not be loaded. Every case names the file it is about.
public enum TokenizerError: Error, CustomStringConvertible {
    /// A file could not be read.
    case unreadable(file: String, reason: String)
    /// A file is not valid JSON, or not the JSON object expected at its top level.
    case malformedJSON(file: String, reason: String)
    /// A field is missing or has the wrong kind of value; `path` is its location inside the file.
    case invalidField(file: String, path: String, reason: String)
    /// A component's `"type"` is not one this library implements.
    case unsupportedComponent(file: String, path: String, type: String)
    /// A regular expression in the file does not compile.
    case invalidRegex(file: String, pattern: String, reason: String)
    /// A merge names a token that the vocabulary lacks, or merges into one it lacks.
    case mergeOutOfVocabulary(file: String, index: Int, merge: String)
    /// The directory has no tokenizer.json, and no vocabulary files this library knows how to read for its class.
    case noTokenizerFiles(directory: String, reason: String)

    public var description: String {
        switch self {
        case let .unreadable(file, reason): "\(file): cannot read: \(reason)"
        case let .malformedJSON(file, reason): "\(file): malformed JSON: \(reason)"
        case let .invalidField(file, path, reason): "\(file): \(path): \(reason)"
        case let .unsupportedComponent(file, path, type): "\(file): \(path): unsupported type \"\(type)\""
        case let .invalidRegex(file, pattern, reason): "\(file): regex \(pattern) does not compile: \(reason)"
        case let .mergeOutOfVocabulary(file, index, merge):
            "\(file): merge #\(index) \"\(merge)\" uses or makes a token that is not in the vocabulary"
        case let .noTokenizerFiles(directory, reason): "\(directory): no usable tokenizer files: \(reason)"
        }
    }
}
