import Foundation

/// The result of encoding one text.
public struct Encoding: Sendable, Equatable {
    /// Vocabulary ids, special tokens and padding included.
    public let ids: [Int]
    /// The token strings of `ids` as tokenizers reports them (byte-level spelling for byte-level BPE).
    public let tokens: [String]
    /// 1 for real tokens, 0 for padding.
    public let attentionMask: [Int]
}

/// How `Tokenizer.encode(_:padding:truncation:maxLength:)` pads a batch.
public enum Padding: Sendable {
    /// No padding.
    case none
    /// Pad to the longest encoding of the batch (transformers' `padding=True`).
    case longest
    /// Pad to `maxLength`, or to the model's maximum length (transformers' `padding="max_length"`).
    case maxLength
}

/// A Hugging Face tokenizer: tokenizer.json's normalizer, pre-tokenizer, model, post-processor, decoder and added
/// tokens, with tokenizer_config.json's special tokens and limits. Gives the same ids as transformers with the
/// `tokenizers` backend.
public final class Tokenizer: Sendable {
    private let normalizer: (any Normalizer)?
    private let preTokenizer: (any PreTokenizer)?
    private let model: any TokenizationModel
    private let postProcessor: (any PostProcessor)?
    private let decoder: (any Decoder)?
    private let addedTokens: [Int: AddedToken]
    private let addedTokenIds: [String: Int]
    private let rawMatcher: AddedTokenMatcher
    private let normalizedMatcher: AddedTokenMatcher
    private let specialTokens: Set<String>
    private let padToken: String?
    private let padOnLeft: Bool
    private let cleanUpTokenizationSpaces: Bool
    /// CLIPTokenizer's decode turns the end-of-word suffix into spaces and strips the result.
    private let endOfWordSuffixToSpace: String?

    /// The longest input the model accepts (tokenizer_config.json's `model_max_length`), nil when unlimited.
    public let modelMaxLength: Int?
    /// The id of the beginning-of-sequence token, if the tokenizer has one.
    public let bosTokenId: Int?
    /// The id of the end-of-sequence token, if the tokenizer has one.
    public let eosTokenId: Int?
    /// The id of the padding token, if the tokenizer has one.
    public let padTokenId: Int?

    /// Loads tokenizer.json (+ tokenizer_config.json for model_max_length, special tokens, padding side...) from a
    /// checkpoint directory; falls back to vocab.json + merges.txt (CLIP/GPT-2 style: tokenizer_config.json's
    /// "tokenizer_class" says which) when there is no tokenizer.json.
    public convenience init(directory: URL) throws {
        let configURL = directory.appendingPathComponent("tokenizer_config.json")
        let config = FileManager.default.fileExists(atPath: configURL.path) ? try JSONObject.read(configURL) : nil
        let tokenizerURL = directory.appendingPathComponent("tokenizer.json")
        let pipeline: Pipeline
        if FileManager.default.fileExists(atPath: tokenizerURL.path) {
            pipeline = try Pipeline(tokenizerJSON: try JSONObject.read(tokenizerURL))
        } else {
            pipeline = try Pipeline(legacyDirectory: directory, config: config)
        }
        try self.init(pipeline: pipeline, config: config)
    }

    private init(pipeline: Pipeline, config: JSONObject?) throws {
        normalizer = pipeline.normalizer
        preTokenizer = pipeline.preTokenizer
        model = pipeline.model
        postProcessor = pipeline.postProcessor
        decoder = pipeline.decoder

        var added = pipeline.addedTokens
        func tokenId(_ content: String) -> Int? {
            added.first { $0.content == content }?.id ?? pipeline.model.tokenId(content)
        }
        func addSpecial(_ content: String?) {
            guard let content, !content.isEmpty, !added.contains(where: { $0.content == content }) else { return }
            let id = pipeline.model.tokenId(content) ?? max(pipeline.model.vocabularySize, (added.map(\.id).max() ?? -1) + 1)
            added.append(AddedToken(id: id, content: content, normalized: false, special: true))
        }
        if let config, let decoderTable = try config.optionalObject("added_tokens_decoder") {
            for (key, _) in decoderTable.values.sorted(by: { (Int($0.key) ?? 0) < (Int($1.key) ?? 0) }) {
                guard let id = Int(key) else { throw decoderTable.invalid(key, "added token ids must be integers") }
                let token = try AddedToken(try decoderTable.object(key), id: id)
                if !added.contains(where: { $0.content == token.content }) { added.append(token) }
            }
        }
        let specialKeys = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]
        var named: [String: String] = [:]
        for key in specialKeys {
            if let content = try config?.tokenContent(key) { named[key] = content; addSpecial(content) }
        }

        addedTokens = Dictionary(added.map { ($0.id, $0) }, uniquingKeysWith: { _, last in last })
        addedTokenIds = Dictionary(added.map { ($0.content, $0.id) }, uniquingKeysWith: { _, last in last })
        specialTokens = Set(added.filter(\.special).map(\.content))
        rawMatcher = AddedTokenMatcher(added.filter { !$0.normalized }.map { (Array($0.content.unicodeScalars), $0) })
        let normalizer = pipeline.normalizer
        normalizedMatcher = AddedTokenMatcher(added.filter(\.normalized).map { token in
            let scalars = Array(token.content.unicodeScalars)
            return (normalizer?.normalize(scalars) ?? scalars, token)
        })

        bosTokenId = named["bos_token"].flatMap(tokenId)
        eosTokenId = named["eos_token"].flatMap(tokenId)
        padToken = named["pad_token"]
        padTokenId = named["pad_token"].flatMap(tokenId)
        // Configurations write "no limit" as a huge float such as 1e30.
        modelMaxLength = config.flatMap { JSONObject.integer($0.values["model_max_length"]) }.flatMap { $0 > 0 && $0 < 1 << 40 ? $0 : nil }
        padOnLeft = (try config?.optionalString("padding_side")) == "left"
        cleanUpTokenizationSpaces = try config?.bool("clean_up_tokenization_spaces", default: false) ?? false
        let tokenizerClass = try config?.optionalString("tokenizer_class")
        if tokenizerClass == "CLIPTokenizer" || tokenizerClass == "CLIPTokenizerFast", let bpe = pipeline.model as? BPE,
           !bpe.endOfWordSuffix.isEmpty {
            endOfWordSuffixToSpace = bpe.endOfWordSuffix
        } else {
            endOfWordSuffixToSpace = nil
        }
    }

    /// The id of a token string: added tokens first, then the model's vocabulary.
    public func tokenId(_ token: String) -> Int? {
        addedTokenIds[token] ?? model.tokenId(token)
    }

    /// The token string of an id, if the vocabulary has it.
    public func token(_ id: Int) -> String? {
        addedTokens[id]?.content ?? model.token(id)
    }

    /// Encodes one text like `tokenizer(text)`: added tokens, normalization, pre-tokenization, the model, and (when
    /// `addSpecialTokens`) the post-processor's special tokens. No truncation, no padding.
    public func encode(_ text: String, addSpecialTokens: Bool = true) -> Encoding {
        let (ids, tokens) = encodeUnprocessed(text)
        return finish(ids: ids, tokens: tokens, addSpecialTokens: addSpecialTokens, truncateTo: nil)
    }

    /// Batch encode like tokenizer(texts, padding=..., truncation=True, max_length=...): truncation to maxLength (or
    /// model_max_length) keeping the special tokens as transformers does, padding with the pad token on the tokenizer's
    /// padding side to the longest or to maxLength.
    public func encode(_ texts: [String], padding: Padding = .none, truncation: Bool = false, maxLength: Int? = nil) -> [Encoding] {
        let limit = maxLength ?? modelMaxLength
        var encodings = texts.map { text in
            let (ids, tokens) = encodeUnprocessed(text)
            return finish(ids: ids, tokens: tokens, addSpecialTokens: true, truncateTo: truncation ? limit : nil)
        }
        let target: Int? = switch padding {
        case .none: nil
        case .longest: encodings.map(\.ids.count).max()
        case .maxLength: limit
        }
        if let target, let padTokenId {
            encodings = encodings.map { encoding in
                let count = target - encoding.ids.count
                guard count > 0 else { return encoding }
                let ids = [Int](repeating: padTokenId, count: count)
                let tokens = [String](repeating: padToken ?? "", count: count)
                let mask = [Int](repeating: 0, count: count)
                return padOnLeft
                    ? Encoding(ids: ids + encoding.ids, tokens: tokens + encoding.tokens, attentionMask: mask + encoding.attentionMask)
                    : Encoding(ids: encoding.ids + ids, tokens: encoding.tokens + tokens, attentionMask: encoding.attentionMask + mask)
            }
        }
        return encodings
    }

    /// Decodes ids like `tokenizer.decode(ids)`; ids outside the vocabulary are skipped.
    public func decode(_ ids: [Int], skipSpecialTokens: Bool = false) -> String {
        let tokens = ids.compactMap { id -> String? in
            guard let token = token(id) else { return nil }
            return skipSpecialTokens && specialTokens.contains(token) ? nil : token
        }
        var text = decoder.map { $0.decode(tokens).joined() } ?? tokens.joined(separator: " ")
        // transformers skips this cleanup for BPE models: it would eat real spaces before punctuation.
        if cleanUpTokenizationSpaces && !(model is BPE) {
            text = cleanUpTokenization(text, includingDoNot: false)
        }
        if let suffix = endOfWordSuffixToSpace {
            let scalars = replacingScalars(in: text, of: suffix, with: " ").unicodeScalars
            let start = scalars.firstIndex { !$0.isPythonWhitespace } ?? scalars.endIndex
            let end = scalars.lastIndex { !$0.isPythonWhitespace }.map { scalars.index(after: $0) } ?? start
            text = String(scalars[start..<max(start, end)])
        }
        return text
    }

    private func encodeUnprocessed(_ text: String) -> (ids: [Int], tokens: [String]) {
        var ids: [Int] = []
        var tokens: [String] = []
        func appendToken(_ id: Int, _ text: [Unicode.Scalar]) {
            ids.append(id)
            tokens.append(String(String.UnicodeScalarView(text)))
        }
        for segment in rawMatcher.split(Array(text.unicodeScalars)) {
            switch segment {
            case let .token(id, text):
                appendToken(id, text)
            case let .text(raw):
                let normalized = normalizer?.normalize(raw) ?? raw
                for piece in normalizedMatcher.split(normalized) {
                    switch piece {
                    case let .token(id, text):
                        appendToken(id, text)
                    case let .text(text):
                        let words = preTokenizer?.preTokenize([text]) ?? [text]
                        for word in words {
                            for id in model.tokenize(word) {
                                ids.append(id)
                                tokens.append(model.token(id) ?? "")
                            }
                        }
                    }
                }
            }
        }
        return (ids, tokens)
    }

    /// Truncates (leaving room for the special tokens, keeping the start as tokenizers' default `longest_first` does
    /// for one sequence) and then adds the special tokens.
    private func finish(ids: [Int], tokens: [String], addSpecialTokens: Bool, truncateTo limit: Int?) -> Encoding {
        var ids = ids
        var tokens = tokens
        let added = addSpecialTokens ? (postProcessor?.addedTokenCount ?? 0) : 0
        if let limit {
            let keep = max(0, limit - added)
            if ids.count > keep {
                ids.removeSubrange(keep...)
                tokens.removeSubrange(keep...)
            }
        }
        if addSpecialTokens, let postProcessor {
            (ids, tokens) = postProcessor.process(ids: ids, tokens: tokens)
        }
        return Encoding(ids: ids, tokens: tokens, attentionMask: [Int](repeating: 1, count: ids.count))
    }
}

/// The components of a tokenizer, from tokenizer.json or rebuilt from older vocabulary files.
struct Pipeline {
    var normalizer: (any Normalizer)?
    var preTokenizer: (any PreTokenizer)?
    var model: any TokenizationModel
    var postProcessor: (any PostProcessor)?
    var decoder: (any Decoder)?
    var addedTokens: [AddedToken]

    init(tokenizerJSON json: JSONObject) throws {
        normalizer = try json.optionalObject("normalizer").map(makeNormalizer)
        preTokenizer = try json.optionalObject("pre_tokenizer").map(makePreTokenizer)
        model = try makeModel(try json.object("model"))
        postProcessor = try json.optionalObject("post_processor").map(makePostProcessor)
        decoder = try json.optionalObject("decoder").map(makeDecoder)
        addedTokens = json.isNull("added_tokens") ? [] : try json.objects("added_tokens").map { try AddedToken($0, id: try $0.int("id")) }
    }

    /// CLIP's pipeline over vocab.json + merges.txt, as transformers' CLIPTokenizer builds it.
    init(legacyDirectory directory: URL, config: JSONObject?) throws {
        let tokenizerClass = try config?.optionalString("tokenizer_class")
        guard tokenizerClass == "CLIPTokenizer" || tokenizerClass == "CLIPTokenizerFast" else {
            throw TokenizerError.noTokenizerFiles(
                directory: directory.path,
                reason: "no tokenizer.json, and tokenizer class \(tokenizerClass.map { "\"\($0)\"" } ?? "(none)") has no vocab.json + merges.txt loader")
        }
        let vocabularyURL = directory.appendingPathComponent("vocab.json")
        let vocabularyJSON = try JSONObject.read(vocabularyURL)
        var vocabulary: [String: Int] = [:]
        for (token, value) in vocabularyJSON.values {
            guard let id = JSONObject.integer(value), id >= 0 else { throw vocabularyJSON.invalid(token, "expected a non-negative integer id") }
            vocabulary[token] = id
        }
        let mergesURL = directory.appendingPathComponent("merges.txt")
        let mergesText: String
        do {
            mergesText = try String(contentsOf: mergesURL, encoding: .utf8)
        } catch {
            throw TokenizerError.unreadable(file: mergesURL.path, reason: "\(error)")
        }
        var merges: [(String, String)] = []
        // Scalars, not Characters: "\r\n" and a space before a combining mark are single Characters.
        var lines = mergesText.unicodeScalars.split(separator: "\n", omittingEmptySubsequences: false)
        if lines.last?.isEmpty == true { lines.removeLast() }
        for (index, line) in lines.enumerated() {
            let line = line.last == "\r" ? line.dropLast() : line
            if line.starts(with: "#version".unicodeScalars) { continue }
            let parts = line.split(separator: " ", omittingEmptySubsequences: false).map { String(String.UnicodeScalarView($0)) }
            guard parts.count == 2 else {
                throw TokenizerError.invalidField(file: mergesURL.path, path: "line \(index + 1)", reason: "expected two tokens separated by one space")
            }
            merges.append((String(parts[0]), String(parts[1])))
        }

        let bos = try config?.tokenContent("bos_token") ?? "<|startoftext|>"
        let eos = try config?.tokenContent("eos_token") ?? "<|endoftext|>"
        let unknown = try config?.tokenContent("unk_token") ?? "<|endoftext|>"
        model = try BPE(vocabulary: vocabulary, merges: merges, file: mergesURL.path, unknownToken: unknown,
                        continuingSubwordPrefix: "", endOfWordSuffix: "</w>")
        normalizer = NormalizerSequence(normalizers: [
            UnicodeNormalization(form: .nfc),
            Replace(pattern: AlternationPattern.known(#"\s+"#)!, content: [" "]),
            Lowercase(),
        ])
        preTokenizer = PreTokenizerSequence(preTokenizers: [
            Split(pattern: AlternationPattern.known(#"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"#)!,
                  behavior: .removed, invert: true),
            ByteLevelPreTokenizer(addPrefixSpace: false, useRegex: true),
        ])
        decoder = ByteLevelDecoder()
        var addedTokens: [AddedToken] = []
        var nextId = vocabulary.count
        for content in [bos, eos] where !addedTokens.contains(where: { $0.content == content }) {
            let id = vocabulary[content] ?? nextId
            if id == nextId { nextId += 1 }
            addedTokens.append(AddedToken(id: id, content: content, normalized: false, special: true))
        }
        self.addedTokens = addedTokens
        postProcessor = Surround(prefix: [(addedTokens[0].id, bos)], suffix: [(addedTokens.last!.id, eos)])
    }
}
