import Foundation

/// The result of encoding one text or one pair of texts.
public struct Encoding: Sendable, Equatable {
    /// Vocabulary ids, special tokens and padding included.
    public let ids: [Int]
    /// The token strings of `ids` as tokenizers reports them (byte-level spelling for byte-level BPE).
    public let tokens: [String]
    /// 1 for real tokens, 0 for padding.
    public let attentionMask: [Int]
    /// Which sequence of a pair each token belongs to, as the post-processor sets it (transformers' token_type_ids).
    public let typeIds: [Int]
    /// For each token, the range of Unicode scalars (Python's str indices) of its text in the input it came from;
    /// empty for special tokens and padding (transformers' `return_offsets_mapping=True`).
    public let offsets: [Range<Int>]
    /// 1 for special tokens added by the post-processor and for padding, 0 otherwise.
    public let specialTokensMask: [Int]
    /// What truncation cut off, as further encodings of at most the same length, each with the special tokens and
    /// repeating `EncodingOptions.stride` tokens of the window before it (tokenizers' `overflowing`; transformers'
    /// `return_overflowing_tokens=True` returns this encoding followed by these).
    public let overflowing: [Encoding]
}

extension Encoding {
    /// 1 for each token that `spans` of the input (Unicode scalar offsets) cover, as transformers'
    /// `apply_chat_template(..., return_assistant_tokens_mask=True)` marks them with `char_to_token`: from the token
    /// holding a span's first character to the one holding its last, or to the end where that one is the first token
    /// or no token holds it; a span whose first character no token holds ends the marking.
    public func mask(covering spans: [Range<Int>]) -> [Int] {
        var mask = Array(repeating: 0, count: ids.count)
        func token(at character: Int) -> Int? { offsets.firstIndex { $0.contains(character) } }
        for span in spans {
            guard let start = token(at: span.lowerBound) else { break }
            // transformers tests `if end_token`, so a span ending in token 0 runs to the end as well.
            let end = token(at: span.upperBound - 1).flatMap { $0 == 0 ? nil : $0 + 1 } ?? ids.count
            for index in start..<max(start, end) { mask[index] = 1 }
        }
        return mask
    }
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

/// Which sequence of a pair loses tokens when an encoding is too long (transformers' `truncation=` strategies).
public enum TruncationStrategy: Sendable {
    /// Remove from the longer sequence until both fit (`"longest_first"`, what `truncation=True` means).
    case longestFirst
    /// Only the first sequence loses tokens (`"only_first"`).
    case onlyFirst
    /// Only the second sequence of a pair loses tokens (`"only_second"`).
    case onlySecond
}

/// Which end of a sequence padding or truncation applies to.
public enum Side: Sendable {
    case left, right
}

/// Everything `Tokenizer.encode(_:pairs:options:)` can be asked, with transformers' defaults.
public struct EncodingOptions: Sendable {
    /// Add the post-processor's special tokens.
    public var addSpecialTokens = true
    public var padding = Padding.none
    /// nil: no truncation.
    public var truncation: TruncationStrategy? = nil
    /// The length truncation and `.maxLength` padding aim at; nil: tokenizer_config.json's `model_max_length`.
    public var maxLength: Int? = nil
    /// Round the padded length up to a multiple of this.
    public var padToMultipleOf: Int? = nil
    /// nil: tokenizer_config.json's `truncation_side` (default right).
    public var truncationSide: Side? = nil
    /// nil: tokenizer_config.json's `padding_side` (default right).
    public var paddingSide: Side? = nil
    /// With truncation, how many tokens each overflowing window repeats from the one before (transformers' `stride`);
    /// it must be below the length left for a sequence.
    public var stride = 0

    public init(addSpecialTokens: Bool = true, padding: Padding = .none, truncation: TruncationStrategy? = nil,
                maxLength: Int? = nil, padToMultipleOf: Int? = nil, truncationSide: Side? = nil, paddingSide: Side? = nil,
                stride: Int = 0) {
        self.addSpecialTokens = addSpecialTokens
        self.padding = padding
        self.truncation = truncation
        self.maxLength = maxLength
        self.padToMultipleOf = padToMultipleOf
        self.truncationSide = truncationSide
        self.paddingSide = paddingSide
        self.stride = stride
    }
}

/// Why a batch could not be truncated as asked (tokenizers raises the same errors).
public enum TruncationError: Error, CustomStringConvertible, Equatable {
    /// `.onlySecond` was asked for a text without a pair.
    case secondSequenceNotProvided
    /// The sequence allowed to lose tokens is shorter than what has to go.
    case sequenceTooShort(length: Int, excess: Int)
    /// The stride is not below the number of tokens a sequence may keep (tokenizers raises this one when truncation
    /// is set, for max_length less the special tokens of a single text, or panics when encoding).
    case strideTooLong(stride: Int, maxLength: Int)

    public var description: String {
        switch self {
        case .secondSequenceNotProvided: "truncation only_second needs a pair of texts"
        case let .sequenceTooShort(length, excess):
            "the sequence to truncate has \(length) tokens, fewer than the \(excess) that must go to respect max_length"
        case let .strideTooLong(stride, maxLength):
            "stride \(stride) must be below the \(maxLength) tokens a sequence may keep once special tokens are counted"
        }
    }
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
    private let addedTokenIds: [TokenKey: Int]
    private let rawMatcher: AddedTokenMatcher
    private let normalizedMatcher: AddedTokenMatcher
    private let specialTokens: Set<TokenKey>
    private let padToken: String?
    private let padOnLeft: Bool
    private let truncateOnLeft: Bool
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
    /// tokenizer_config.json's `model_input_names`: what the tokenizer hands the model, where the config overrides its
    /// class (SigLIP's checkpoints say `["input_ids"]`: no attention mask, as the model was trained). nil when absent.
    public let modelInputNames: [String]?

    /// Loads tokenizer.json (+ tokenizer_config.json for model_max_length, special tokens, padding side...) from a
    /// checkpoint directory; without tokenizer.json, rebuilds the pipeline from the vocabulary files as transformers
    /// does for tokenizer_config.json's "tokenizer_class": vocab.json + merges.txt for CLIPTokenizer and
    /// GPT2Tokenizer, vocab.txt for BertTokenizer. A siglip2 checkpoint's tokenizer.json is read as transformers'
    /// Siglip2Tokenizer reads it (lowercasing), as AutoTokenizer does whatever class tokenizer_config.json names.
    public convenience init(directory: URL) throws {
        let configURL = directory.appendingPathComponent("tokenizer_config.json")
        let config = FileManager.default.fileExists(atPath: configURL.path) ? try JSONObject.read(configURL) : nil
        let tokenizerURL = directory.appendingPathComponent("tokenizer.json")
        let pipeline: Pipeline
        if FileManager.default.fileExists(atPath: tokenizerURL.path) {
            // As AutoTokenizer, config.json's model type overrides a tokenizer class known to be wrong for it.
            if Self.modelType(directory) == "siglip2" {
                pipeline = try Pipeline(siglip2TokenizerJSON: try JSONObject.read(tokenizerURL), config: config)
            } else {
                pipeline = try Pipeline(tokenizerJSON: try JSONObject.read(tokenizerURL))
            }
        } else {
            pipeline = try Pipeline(legacyDirectory: directory, config: config)
        }
        try self.init(pipeline: pipeline, config: config)
    }

    /// config.json's `model_type`, if the directory has a readable config.json that names one (a broken one is the
    /// model loader's to report).
    private static func modelType(_ directory: URL) -> String? {
        let url = directory.appendingPathComponent("config.json")
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        return (try? JSONObject.read(url))?.values["model_type"] as? String
    }

    init(pipeline: Pipeline, config: JSONObject?) throws {
        normalizer = pipeline.normalizer
        preTokenizer = pipeline.preTokenizer
        model = pipeline.model
        postProcessor = pipeline.postProcessor
        decoder = pipeline.decoder

        var added = pipeline.addedTokens
        func tokenId(_ content: String) -> Int? {
            added.first { $0.content.utf8.elementsEqual(content.utf8) }?.id ?? pipeline.model.tokenId(content)
        }
        func addSpecial(_ content: String?) {
            guard let content, !content.isEmpty, !added.contains(where: { $0.content.utf8.elementsEqual(content.utf8) }) else { return }
            let id = pipeline.model.tokenId(content) ?? max(pipeline.model.vocabularySize, (added.map(\.id).max() ?? -1) + 1)
            added.append(AddedToken(id: id, content: content, normalized: false, special: true))
        }
        if let config, let decoderTable = try config.optionalObject("added_tokens_decoder") {
            for (key, _) in decoderTable.values.sorted(by: { (Int($0.key) ?? 0) < (Int($1.key) ?? 0) }) {
                guard let id = Int(key) else { throw decoderTable.invalid(key, "added token ids must be integers") }
                let token = try AddedToken(try decoderTable.object(key), id: id)
                if !added.contains(where: { $0.content.utf8.elementsEqual(token.content.utf8) }) { added.append(token) }
            }
        }
        let specialKeys = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]
        var named: [String: String] = [:]
        for key in specialKeys {
            if let content = try config?.tokenContent(key) { named[key] = content; addSpecial(content) }
        }

        addedTokens = Dictionary(added.map { ($0.id, $0) }, uniquingKeysWith: { _, last in last })
        addedTokenIds = Dictionary(added.map { (TokenKey($0.content), $0.id) }, uniquingKeysWith: { _, last in last })
        specialTokens = Set(added.filter(\.special).map { TokenKey($0.content) })
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
        padOnLeft = try config?.optionalString("padding_side").map { $0 == "left" } ?? pipeline.padsOnLeftByDefault
        if let config, !config.isNull("model_input_names") {
            guard let names = config.values["model_input_names"] as? [Any], let strings = names as? [String] else {
                throw config.invalid("model_input_names", "expected an array of strings")
            }
            modelInputNames = strings
        } else {
            modelInputNames = nil
        }
        truncateOnLeft = (try config?.optionalString("truncation_side")) == "left"
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
        addedTokenIds[TokenKey(token)] ?? model.tokenId(token)
    }

    /// The ids of the added tokens marked special (control tokens such as bos, eos and chat markers): not text.
    public var specialTokenIds: Set<Int> { Set(addedTokens.values.filter(\.special).map(\.id)) }

    /// The token string of an id, if the vocabulary has it.
    public func token(_ id: Int) -> String? {
        addedTokens[id]?.content ?? model.token(id)
    }

    /// Encodes one text, or a pair, like `tokenizer(text, pair)`: added tokens, normalization, pre-tokenization, the
    /// model, and (when `addSpecialTokens`) the post-processor's special tokens. No truncation, no padding.
    public func encode(_ text: String, pair: String? = nil, addSpecialTokens: Bool = true) -> Encoding {
        let first = encodeSequence(text, typeId: 0)
        let second = pair.map { encodeSequence($0, typeId: 1) }
        return finish(first, second, addSpecialTokens: addSpecialTokens)
    }

    /// Batch encode like tokenizer(texts, padding=..., truncation=True, max_length=...): truncation to maxLength (or
    /// model_max_length) keeping the special tokens as transformers does, padding with the pad token on the tokenizer's
    /// padding side to the longest or to maxLength.
    public func encode(_ texts: [String], padding: Padding = .none, truncation: Bool = false, maxLength: Int? = nil) -> [Encoding] {
        // Single texts with longest_first cannot fail to truncate.
        (try? encode(texts, pairs: nil, options: EncodingOptions(padding: padding, truncation: truncation ? .longestFirst : nil,
                                                                  maxLength: maxLength))) ?? []
    }

    /// Batch encode texts, or pairs of texts (`pairs` as long as `texts`), like `tokenizer(texts, pairs, ...)`
    /// with transformers' truncation strategies, truncation and padding sides and `pad_to_multiple_of`.
    public func encode(_ texts: [String], pairs: [String]?, options: EncodingOptions) throws -> [Encoding] {
        let limit = options.maxLength ?? modelMaxLength
        let truncateLeft = (options.truncationSide ?? (truncateOnLeft ? .left : .right)) == .left
        let stride = max(0, options.stride)
        if options.truncation != nil, let limit {
            // tokenizers checks the stride against a single text's room when truncation is set, before any text.
            let room = limit - (postProcessor?.addedTokenCount(pair: false) ?? 0)
            if room >= 0 && room < stride { throw TruncationError.strideTooLong(stride: stride, maxLength: room) }
        }
        var encodings: [Encoding] = []
        encodings.reserveCapacity(texts.count)
        for (index, text) in texts.enumerated() {
            var first = encodeSequence(text, typeId: 0)
            var second = pairs.flatMap { $0[safe: index] }.map { encodeSequence($0, typeId: 1) }
            // A limit below the special tokens' count wraps around in tokenizers' unsigned arithmetic: no truncation.
            let added = options.addSpecialTokens ? (postProcessor?.addedTokenCount(pair: second != nil) ?? 0) : 0
            if let strategy = options.truncation, let limit, limit >= added {
                if limit == added {
                    try first.truncate(to: 0, fromLeft: truncateLeft)
                    try second?.truncate(to: 0, fromLeft: truncateLeft)
                } else {
                    try truncate(&first, &second, to: limit - added, strategy: strategy, stride: stride, fromLeft: truncateLeft)
                }
            }
            encodings.append(finish(first, second, addSpecialTokens: options.addSpecialTokens))
        }
        var target: Int? = switch options.padding {
        case .none: nil
        case .longest: encodings.map(\.ids.count).max()
        case .maxLength: limit
        }
        if let multiple = options.padToMultipleOf, multiple > 0, let length = target, length % multiple != 0 {
            target = (length / multiple + 1) * multiple
        }
        guard let target, let padTokenId else { return encodings }
        let padLeft = (options.paddingSide ?? (padOnLeft ? .left : .right)) == .left
        // Overflowing encodings are padded to the same length (tokenizers' `Encoding::pad`).
        func padded(_ encoding: Encoding) -> Encoding {
            let count = target - encoding.ids.count
            guard count > 0 || !encoding.overflowing.isEmpty else { return encoding }
            func pad<T>(_ values: [T], _ value: T) -> [T] {
                guard count > 0 else { return values }
                let padding = [T](repeating: value, count: count)
                return padLeft ? padding + values : values + padding
            }
            return Encoding(ids: pad(encoding.ids, padTokenId), tokens: pad(encoding.tokens, padToken ?? ""),
                            attentionMask: pad(encoding.attentionMask, 0), typeIds: pad(encoding.typeIds, 0),
                            offsets: pad(encoding.offsets, 0..<0), specialTokensMask: pad(encoding.specialTokensMask, 1),
                            overflowing: encoding.overflowing.map(padded))
        }
        return encodings.map(padded)
    }

    /// tokenizers' `truncate_encodings`, with `limit` already net of the special tokens.
    private func truncate(_ first: inout EncodingParts, _ second: inout EncodingParts?, to limit: Int,
                          strategy: TruncationStrategy, stride: Int, fromLeft: Bool) throws {
        let total = first.ids.count + (second?.ids.count ?? 0)
        guard total > limit else { return }
        let excess = total - limit
        switch strategy {
        case .longestFirst:
            guard var pair = second else {
                try first.truncate(to: limit, stride: stride, fromLeft: fromLeft)
                return
            }
            var shorter = min(first.ids.count, pair.ids.count)
            var longer: Int
            if shorter > limit {
                longer = shorter
            } else {
                longer = max(shorter, limit - shorter)
            }
            if shorter + longer > limit {
                shorter = limit / 2
                longer = shorter + limit % 2
            }
            let firstIsLonger = first.ids.count > pair.ids.count
            try first.truncate(to: firstIsLonger ? longer : shorter, stride: stride, fromLeft: fromLeft)
            try pair.truncate(to: firstIsLonger ? shorter : longer, stride: stride, fromLeft: fromLeft)
            second = pair
        case .onlyFirst, .onlySecond:
            if strategy == .onlySecond {
                guard var pair = second else { throw TruncationError.secondSequenceNotProvided }
                guard pair.ids.count > excess else { throw TruncationError.sequenceTooShort(length: pair.ids.count, excess: excess) }
                try pair.truncate(to: pair.ids.count - excess, stride: stride, fromLeft: fromLeft)
                second = pair
            } else {
                guard first.ids.count > excess else { throw TruncationError.sequenceTooShort(length: first.ids.count, excess: excess) }
                try first.truncate(to: first.ids.count - excess, stride: stride, fromLeft: fromLeft)
            }
        }
    }

    /// Decodes ids like `tokenizer.decode(ids)`; ids outside the vocabulary are skipped.
    public func decode(_ ids: [Int], skipSpecialTokens: Bool = false) -> String {
        let tokens = ids.compactMap { id -> String? in
            guard let token = token(id) else { return nil }
            return skipSpecialTokens && specialTokens.contains(TokenKey(token)) ? nil : token
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

    /// One sequence through added tokens, normalizer, pre-tokenizer and model, with offsets into `text`.
    private func encodeSequence(_ text: String, typeId: Int) -> EncodingParts {
        var parts = EncodingParts()
        func appendToken(_ id: Int, _ token: String, _ offsets: Range<Int>) {
            parts.ids.append(id)
            parts.tokens.append(token)
            parts.offsets.append(offsets)
        }
        let original = Array(text.unicodeScalars)
        for segment in rawMatcher.split(original[...], start: 0) {
            switch segment {
            case let .token(id, range):
                appendToken(id, String(String.UnicodeScalarView(original[range])), range)
            case let .text(range):
                var normalized = NormalizedText(original[range], start: range.lowerBound)
                normalizer?.normalize(&normalized)
                for piece in normalizedMatcher.split(normalized.scalars[...], start: 0) {
                    switch piece {
                    case let .token(id, pieceRange):
                        appendToken(id, String(String.UnicodeScalarView(normalized.scalars[pieceRange])),
                                    normalized.originalRange(pieceRange))
                    case let .text(pieceRange):
                        let text = pieceRange.count == normalized.scalars.count ? normalized : normalized.slice(pieceRange)
                        let words = preTokenizer?.preTokenize([text]) ?? [text]
                        for word in words {
                            for token in model.tokenize(word.scalars) {
                                appendToken(token.id, token.text ?? model.token(token.id) ?? "", word.originalRange(token.range))
                            }
                        }
                    }
                }
            }
        }
        parts.typeIds = [Int](repeating: typeId, count: parts.ids.count)
        parts.specialTokensMask = [Int](repeating: 0, count: parts.ids.count)
        return parts
    }

    /// The post-processor (or plain concatenation) over one sequence or a pair.
    private func finish(_ first: EncodingParts, _ second: EncodingParts?, addSpecialTokens: Bool) -> Encoding {
        let encodings = second.map { [first, $0] } ?? [first]
        var merged = EncodingParts()
        for part in postProcessor?.process(encodings, addSpecialTokens: addSpecialTokens) ?? encodings { merged.append(part) }
        return Encoding(merged)
    }
}

extension Encoding {
    init(_ parts: EncodingParts) {
        self.init(ids: parts.ids, tokens: parts.tokens, attentionMask: [Int](repeating: 1, count: parts.ids.count),
                  typeIds: parts.typeIds, offsets: parts.offsets, specialTokensMask: parts.specialTokensMask,
                  overflowing: parts.overflowing.map(Encoding.init))
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
    /// Where the tokenizer class pads when tokenizer_config.json names no `padding_side` (Siglip2Tokenizer: left).
    var padsOnLeftByDefault = false

    init(tokenizerJSON json: JSONObject) throws {
        normalizer = try json.optionalObject("normalizer").map(makeNormalizer)
        preTokenizer = try json.optionalObject("pre_tokenizer").map(makePreTokenizer)
        model = try makeModel(try json.object("model"))
        postProcessor = try json.optionalObject("post_processor").map(makePostProcessor)
        decoder = try json.optionalObject("decoder").map(makeDecoder)
        addedTokens = json.isNull("added_tokens") ? [] : try json.objects("added_tokens").map { try AddedToken($0, id: try $0.int("id")) }
    }
}
