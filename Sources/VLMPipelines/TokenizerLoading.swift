import Foundation
import VLMCheckpoint
import VLMTemplates
import VLMTokenizers

/// A checkpoint's tokenizer and its chat template, from a checkpoint directory (tokenizer.json or the legacy vocabulary
/// files; chat_template.jinja, chat_template.json or tokenizer_config.json) or from a GGUF file's metadata
/// (`tokenizer.ggml.*`, `tokenizer.chat_template`), as transformers' `AutoTokenizer.from_pretrained(dir)` and
/// `AutoTokenizer.from_pretrained(dir, gguf_file=name)` load them.
///
/// - Returns: the tokenizer, and the chat template (nil when there is none).
/// - Throws: `TokenizerError`, `ChatTemplateError` or `CheckpointError`, naming the file and what is wrong.
public func loadTokenizer(path: URL) throws -> (tokenizer: Tokenizer, chatTemplate: ChatTemplate?) {
    var isDirectory: ObjCBool = false
    guard FileManager.default.fileExists(atPath: path.path, isDirectory: &isDirectory) else {
        throw TokenizerError.unreadable(file: path.path, reason: "no such file or directory")
    }
    if isDirectory.boolValue {
        return (try Tokenizer(directory: path), try ChatTemplate.load(directory: path))
    }
    return try loadTokenizer(gguf: GGUFFile(url: path))
}

/// ``loadTokenizer(path:)`` from a GGUF file already opened (its model may come from the same file).
public func loadTokenizer(gguf file: GGUFFile) throws -> (tokenizer: Tokenizer, chatTemplate: ChatTemplate?) {
    let metadata = try GGUFTokenizerMetadata(file)
    if let warning = metadata.preTokenizerWarning { FileHandle.standardError.write(Data((warning + "\n").utf8)) }
    let template = try metadata.chatTemplate.map { source throws(ChatTemplateError) in
        try ChatTemplate(source: source, file: "\(file.url.path): tokenizer.chat_template")
    }
    return (try Tokenizer(gguf: metadata), template)
}

extension GGUFTokenizerMetadata {
    /// The tokenizer keys of a GGUF file's metadata.
    /// - Throws: `TokenizerError.invalidField` naming the file and the key when `tokenizer.ggml.model` or
    ///   `tokenizer.ggml.tokens` is missing or a key holds the wrong kind of value.
    public init(_ file: GGUFFile) throws {
        let path = file.url.path
        func invalid(_ key: String, _ reason: String) -> TokenizerError {
            .invalidField(file: path, path: key, reason: reason)
        }
        func string(_ key: String) throws -> String? {
            guard let value = file.metadata[key] else { return nil }
            guard let text = value.string else { throw invalid(key, "expected a string") }
            return text
        }
        func integer(_ key: String) throws -> Int? {
            guard let value = file.metadata[key] else { return nil }
            guard let number = value.integer else { throw invalid(key, "expected an integer") }
            return number
        }
        func bool(_ key: String) throws -> Bool? {
            guard let value = file.metadata[key] else { return nil }
            guard case let .bool(flag) = value else { throw invalid(key, "expected a boolean") }
            return flag
        }
        func array<T>(_ key: String, of kind: String, _ element: (GGUFValue) -> T?) throws -> [T]? {
            guard let value = file.metadata[key] else { return nil }
            guard let values = value.array else { throw invalid(key, "expected an array of \(kind)") }
            return try values.enumerated().map { index, value in
                guard let converted = element(value) else { throw invalid("\(key)[\(index)]", "expected \(kind)") }
                return converted
            }
        }
        guard let model = try string("tokenizer.ggml.model") else {
            throw invalid("tokenizer.ggml.model", "missing: the file describes no tokenizer")
        }
        guard let tokens = try array("tokenizer.ggml.tokens", of: "strings", \.string) else {
            throw invalid("tokenizer.ggml.tokens", "missing")
        }
        self.init(file: path, architecture: try string("general.architecture"), model: model,
                  pre: try string("tokenizer.ggml.pre"), tokens: tokens,
                  scores: try array("tokenizer.ggml.scores", of: "numbers", \.number),
                  tokenTypes: try array("tokenizer.ggml.token_type", of: "integers", \.integer),
                  merges: try array("tokenizer.ggml.merges", of: "strings", \.string),
                  bosTokenId: try integer("tokenizer.ggml.bos_token_id"),
                  eosTokenId: try integer("tokenizer.ggml.eos_token_id"),
                  unknownTokenId: try integer("tokenizer.ggml.unknown_token_id"),
                  paddingTokenId: try integer("tokenizer.ggml.padding_token_id"),
                  addBosToken: try bool("tokenizer.ggml.add_bos_token"),
                  addEosToken: try bool("tokenizer.ggml.add_eos_token"),
                  separatorTokenId: try integer("tokenizer.ggml.seperator_token_id"),
                  clsTokenId: try integer("tokenizer.ggml.cls_token_id"),
                  maskTokenId: try integer("tokenizer.ggml.mask_token_id"),
                  lowercase: try bool("tokenizer.ggml.normalizer.lowercase"),
                  stripAccents: try bool("tokenizer.ggml.normalizer.strip_accents"),
                  chatTemplate: try string("tokenizer.chat_template"))
    }
}
