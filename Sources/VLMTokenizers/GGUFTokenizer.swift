import Foundation

/// The tokenizer a GGUF file describes in its metadata (llama.cpp's `tokenizer.ggml.*` keys and
/// `tokenizer.chat_template`), as plain values: VLMTokenizers does not read GGUF files itself (VLMCheckpoint does), so
/// whoever opens the file fills this in.
public struct GGUFTokenizerMetadata: Sendable {
    /// The GGUF file, named in errors.
    public var file: String
    /// `general.architecture`: picks the SentencePiece variant (phi3) for a "llama" tokenizer.
    public var architecture: String?
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE), "llama" (SentencePiece BPE with byte fallback), "gemma4"
    /// (SentencePiece-style BPE with merges) or "bert" (WordPiece).
    public var model: String
    /// `tokenizer.ggml.pre`: the pre-tokenizer's split regex, by llama.cpp's name for it.
    public var pre: String?
    /// `tokenizer.ggml.tokens`, by id.
    public var tokens: [String]
    /// `tokenizer.ggml.scores`: SentencePiece scores, from which merges are derived when the file has none.
    public var scores: [Double]?
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    public var tokenTypes: [Int]?
    /// `tokenizer.ggml.merges`: "left right" pairs, best first.
    public var merges: [String]?
    /// `tokenizer.ggml.bos_token_id`, `eos_token_id`, `unknown_token_id` and `padding_token_id`.
    public var bosTokenId: Int?
    public var eosTokenId: Int?
    public var unknownTokenId: Int?
    public var paddingTokenId: Int?
    /// `tokenizer.ggml.add_bos_token` and `add_eos_token`, nil when the file does not say.
    public var addBosToken: Bool?
    public var addEosToken: Bool?
    /// `tokenizer.ggml.seperator_token_id` (llama.cpp's spelling), `cls_token_id` and `mask_token_id`: BERT's.
    public var separatorTokenId: Int?
    public var clsTokenId: Int?
    public var maskTokenId: Int?
    /// `tokenizer.ggml.normalizer.lowercase` and `strip_accents` (BERT; llama.cpp's defaults: true, and as lowercase).
    public var lowercase: Bool?
    public var stripAccents: Bool?
    /// `tokenizer.chat_template`.
    public var chatTemplate: String?

    public init(file: String, architecture: String? = nil, model: String, pre: String? = nil, tokens: [String],
                scores: [Double]? = nil, tokenTypes: [Int]? = nil, merges: [String]? = nil, bosTokenId: Int? = nil,
                eosTokenId: Int? = nil, unknownTokenId: Int? = nil, paddingTokenId: Int? = nil,
                addBosToken: Bool? = nil, addEosToken: Bool? = nil, separatorTokenId: Int? = nil,
                clsTokenId: Int? = nil, maskTokenId: Int? = nil, lowercase: Bool? = nil, stripAccents: Bool? = nil,
                chatTemplate: String? = nil) {
        self.file = file
        self.architecture = architecture
        self.model = model
        self.pre = pre
        self.tokens = tokens
        self.scores = scores
        self.tokenTypes = tokenTypes
        self.merges = merges
        self.bosTokenId = bosTokenId
        self.eosTokenId = eosTokenId
        self.unknownTokenId = unknownTokenId
        self.paddingTokenId = paddingTokenId
        self.addBosToken = addBosToken
        self.addEosToken = addEosToken
        self.separatorTokenId = separatorTokenId
        self.clsTokenId = clsTokenId
        self.maskTokenId = maskTokenId
        self.lowercase = lowercase
        self.stripAccents = stripAccents
        self.chatTemplate = chatTemplate
    }
}

extension Tokenizer {
    /// The tokenizer transformers builds for `AutoTokenizer.from_pretrained(dir, gguf_file=name)`, or the family's own
    /// Hugging Face tokenizer where that and llama.cpp agree against transformers' GGUF loader: for "gpt2", GPT-2's
    /// byte-level BPE (tokens outside the byte alphabet respelled as bytes) split as `tokenizer.ggml.pre` names
    /// (``knownPreTokenizerNames``; ``preTokenizerWarning`` for others); for "llama", Llama's SentencePiece BPE (byte
    /// fallback, the legacy dummy prefix of Llama-2's tokenizer.json and llama.cpp), with merges derived from the
    /// scores when the file has none, and for Gemma 1-3's "llama" files GemmaTokenizer's BPE (no dummy prefix) with
    /// merges derived in token order; for "gemma4", GemmaTokenizer's BPE over the file's merges; for "bert", BERT's
    /// WordPiece from llama.cpp's phantom-space vocabulary (`tokenizer.ggml.normalizer.*`, [CLS] $A [SEP]); for "t5",
    /// T5Tokenizer's Unigram. Control tokens become special added tokens, user-defined ones plain added tokens; the
    /// bos/eos/unk/pad (and BERT's cls/sep/mask) ids name the special tokens; `add_bos_token` (default true for
    /// "llama" and "gemma4") and `add_eos_token` say what encoding adds.
    /// - Throws: `TokenizerError` naming the file and the key when a tokenizer type is unsupported, a key is missing,
    ///   or arrays disagree.
    public convenience init(gguf metadata: GGUFTokenizerMetadata) throws {
        let (pipeline, named) = try Pipeline.make(gguf: metadata)
        var members: [(key: String, value: Any)] = []
        for (key, token) in named { if let token { members.append((key, token)) } }
        let config = JSONObject(file: metadata.file, path: "$",
                                members: JSONMembers(pairs: members, dictionary: Dictionary(members, uniquingKeysWith: { $1 })))
        try self.init(pipeline: pipeline, config: config)
    }
}

private let controlType = 3
/// The sentinel tokens T5Tokenizer declares (`extra_ids`).
private let t5ExtraIds = 100

/// "[PAD<digits>]", how GGUF files name T5's sentinel tokens.
private func isPlaceholder(_ token: String) -> Bool {
    guard let digits = token.droppingScalarPrefix("[PAD"), digits.unicodeScalars.last == "]" else { return false }
    let number = digits.unicodeScalars.dropLast()
    return !number.isEmpty && number.allSatisfy { $0.value >= 0x30 && $0.value <= 0x39 }
}
private let userDefinedType = 4

extension Pipeline {
    private init(model: any TokenizationModel, normalizer: (any Normalizer)?, preTokenizer: (any PreTokenizer)?,
                 postProcessor: (any PostProcessor)?, decoder: (any Decoder)?, addedTokens: [AddedToken]) {
        self.model = model
        self.normalizer = normalizer
        self.preTokenizer = preTokenizer
        self.postProcessor = postProcessor
        self.decoder = decoder
        self.addedTokens = addedTokens
    }

    /// The pipeline of a GGUF tokenizer, and its special tokens by tokenizer_config.json's names.
    fileprivate static func make(gguf metadata: GGUFTokenizerMetadata) throws -> (Pipeline, [(String, String?)]) {
        let file = metadata.file
        let tokens = metadata.tokens
        func invalid(_ key: String, _ reason: String) -> TokenizerError {
            .invalidField(file: file, path: key, reason: reason)
        }
        if tokens.isEmpty { throw invalid("tokenizer.ggml.tokens", "no tokens") }
        if let scores = metadata.scores, scores.count != tokens.count {
            throw invalid("tokenizer.ggml.scores", "\(scores.count) scores for \(tokens.count) tokens")
        }
        if let types = metadata.tokenTypes, types.count != tokens.count {
            throw invalid("tokenizer.ggml.token_type", "\(types.count) token types for \(tokens.count) tokens")
        }
        func specialToken(_ id: Int?, _ key: String) throws -> String? {
            guard let id else { return nil }
            guard tokens.indices.contains(id) else {
                throw invalid("tokenizer.ggml.\(key)", "\(id) is not a token id (the file has \(tokens.count) tokens)")
            }
            return tokens[id]
        }
        let isBert = metadata.model == "bert"
        var named: [(String, String?)] = [
            ("bos_token", try specialToken(isBert ? nil : metadata.bosTokenId, "bos_token_id")),
            ("eos_token", try specialToken(isBert ? nil : metadata.eosTokenId, "eos_token_id")),
            ("unk_token", try specialToken(metadata.unknownTokenId, "unknown_token_id")),
            ("pad_token", try specialToken(metadata.paddingTokenId, "padding_token_id")),
        ]
        if isBert {
            named += [("cls_token", try specialToken(metadata.clsTokenId, "cls_token_id")),
                      ("sep_token", try specialToken(metadata.separatorTokenId, "seperator_token_id")),
                      ("mask_token", try specialToken(metadata.maskTokenId, "mask_token_id"))]
        }

        let byteLevel: Bool
        let vocabulary: Vocabulary
        // The special tokens transformers' tokenizer class declares by default, added before the file's own.
        var classDefaults: [String] = []
        var pipeline: Pipeline
        let space: Unicode.Scalar = "\u{2581}"
        func plainVocabulary(_ tokens: [String]) -> Vocabulary {
            var plain = Vocabulary()
            for (id, token) in tokens.enumerated() { plain[token] = id }
            return plain
        }
        // transformers' GemmaTokenizer: spaces become "▁", no dummy prefix, byte fallback.
        func gemmaPipeline(_ vocabulary: Vocabulary, merges: [(String, String)]) throws -> Pipeline {
            let unknown = try specialToken(metadata.unknownTokenId, "unknown_token_id")
            let model = try BPE(vocabulary: vocabulary, merges: merges, file: file, unknownToken: unknown,
                                continuingSubwordPrefix: "", endOfWordSuffix: "", fuseUnknown: true, byteFallback: true)
            return Pipeline(model: model, normalizer: Replace(pattern: LiteralPattern(literal: [" "]), content: [space]),
                            preTokenizer: Split(pattern: LiteralPattern(literal: [" "]), behavior: .mergedWithPrevious,
                                                invert: false),
                            postProcessor: nil,
                            decoder: DecoderSequence(decoders: [
                                ReplaceDecoder(pattern: LiteralPattern(literal: [space]), content: [" "]),
                                ByteFallbackDecoder(), FuseDecoder(),
                            ]), addedTokens: [])
        }
        switch metadata.model {
        case "gpt2":
            let split = GGUFPreTokenization(metadata.pre)
            if split.rawUTF8 {
                // Pre-tokenizers of SentencePiece-style BPE vocabularies (gemma4, sarvam-moe, whitespace) need a
                // vocabulary that is not byte-level, which a "gpt2" file does not have.
                throw TokenizerError.unsupportedComponent(file: file, path: "tokenizer.ggml.pre", type: metadata.pre ?? "")
            }
            byteLevel = true
            vocabulary = byteLevelVocabulary(tokens)
            let model = try BPE(vocabulary: vocabulary, merges: try ggufMerges(metadata, vocabularyOrder: tokens),
                                file: file, unknownToken: nil, continuingSubwordPrefix: "", endOfWordSuffix: "",
                                ignoreMerges: split.ignoreMerges)
            let preTokenizer: any PreTokenizer
            if let regexes = split.regexes {
                preTokenizer = PreTokenizerSequence(preTokenizers: try regexes.map { regex in
                    Split(pattern: try AlternationPattern.known(regex) ?? RegexPattern(regex, file: file),
                          behavior: .isolated, invert: false)
                } + [ByteLevelPreTokenizer(addPrefixSpace: false, useRegex: false)])
            } else {
                preTokenizer = ByteLevelPreTokenizer(addPrefixSpace: false, useRegex: true)
            }
            pipeline = Pipeline(model: model, normalizer: nil, preTokenizer: preTokenizer,
                                postProcessor: nil, decoder: ByteLevelDecoder(), addedTokens: [])
            classDefaults = ["<|endoftext|>"]
        case "llama" where ["gemma", "gemma2", "gemma3"].contains(metadata.architecture ?? ""):
            // transformers' gemma_tokenizer: GemmaTokenizer over the vocabulary with each all-whitespace token holding
            // a space respelled as that many "▁" (Gemma files store those pieces as real spaces), and merges derived
            // in the file's token order, which Gemma's scores do not follow.
            let respelled = tokens.map { token in
                token.unicodeScalars.contains(" ") && token.unicodeScalars.allSatisfy(pythonWhitespace.contains)
                    ? String(repeating: "\u{2581}", count: token.unicodeScalars.count) : token
            }
            var byPosition = metadata
            byPosition.scores = respelled.indices.map { -Double($0) }
            byteLevel = false
            vocabulary = plainVocabulary(respelled)
            pipeline = try gemmaPipeline(vocabulary, merges: ggufMerges(byPosition, vocabularyOrder: respelled))
        case "llama":
            byteLevel = false
            vocabulary = plainVocabulary(tokens)
            let model = try BPE(vocabulary: vocabulary, merges: try ggufMerges(metadata, vocabularyOrder: tokens),
                                file: file, unknownToken: nil, continuingSubwordPrefix: "", endOfWordSuffix: "",
                                fuseUnknown: true, byteFallback: true)
            let decoder = DecoderSequence(decoders: [
                ReplaceDecoder(pattern: LiteralPattern(literal: [space]), content: [" "]),
                ByteFallbackDecoder(), FuseDecoder(), StripDecoder(content: " ", start: 1, stop: 0),
            ])
            // The legacy Llama-2 tokenizer.json and llama.cpp's SentencePiece: "▁" prepended to the text through the
            // normalizer, every space a "▁", so "  hi" keeps both spaces after the dummy prefix. transformers' GGUF
            // loader does this for phi3 only (Metaspace for the others, which folds the prefix into a leading space).
            pipeline = Pipeline(model: model, normalizer: NormalizerSequence(normalizers: [
                Prepend(prefix: [space]), Replace(pattern: LiteralPattern(literal: [" "]), content: [space]),
            ]), preTokenizer: nil, postProcessor: nil, decoder: decoder, addedTokens: [])
            classDefaults = ["<s>", "</s>", "<unk>"]
        case "gemma4":
            byteLevel = false
            vocabulary = plainVocabulary(tokens)
            pipeline = try gemmaPipeline(vocabulary, merges: ggufMerges(metadata, vocabularyOrder: tokens))
        case "bert":
            // llama.cpp's converter writes WordPiece's vocabulary with a phantom space: "▁word" starts a word,
            // "word" continues one (BERT's "##word"), "[CLS]"-style tokens stay as they are.
            byteLevel = false
            let wordPieceTokens = tokens.map { token -> String in
                if let word = token.droppingScalarPrefix(String(space)) { return word }
                if token.hasPrefix("[") && token.hasSuffix("]") { return token }
                return "##" + token
            }
            vocabulary = plainVocabulary(wordPieceTokens)
            let unknown = try specialToken(metadata.unknownTokenId, "unknown_token_id") ?? "[UNK]"
            let lowercase = metadata.lowercase ?? true
            pipeline = Pipeline(model: WordPiece(vocabulary: vocabulary, unknownToken: unknown, continuingSubwordPrefix: "##",
                                                 maxInputCharactersPerWord: 100),
                                normalizer: BertNormalizer(cleanText: true, handleChineseCharacters: true,
                                                           stripAccents: metadata.stripAccents ?? lowercase, lowercase: lowercase),
                                preTokenizer: bertPreTokenizer(), postProcessor: nil,
                                decoder: WordPieceDecoder(prefix: "##", cleanup: true), addedTokens: [])
        case "t5":
            // transformers' T5Tokenizer over the file's pieces and scores: Unigram with unk_id 2, whitespace split
            // and "▁" always prepended, "$A </s>"; the first 100 "[PAD<n>]" placeholders are T5's <extra_id_*>
            // again, counted down (the precompiled charsmap is not read, as transformers does not read it).
            guard let scores = metadata.scores else {
                throw invalid("tokenizer.ggml.scores", "a Unigram (t5) tokenizer needs scores")
            }
            guard tokens.count > 2 else { throw invalid("tokenizer.ggml.tokens", "T5's unknown id 2 needs 3 tokens") }
            byteLevel = false
            var pieces = tokens
            let blanks = tokens.indices.filter { isPlaceholder(tokens[$0]) }.prefix(t5ExtraIds)
            for (offset, index) in blanks.enumerated() { pieces[index] = "<extra_id_\(t5ExtraIds - 1 - offset)>" }
            vocabulary = plainVocabulary(pieces)
            pipeline = Pipeline(model: Unigram(pieces: pieces, scores: scores, unknownId: 2, byteFallback: false),
                                normalizer: nil,
                                preTokenizer: PreTokenizerSequence(preTokenizers: [
                                    Split(pattern: ScalarPattern { $0.isRegexWhitespace }, behavior: .removed, invert: false),
                                    Metaspace(replacement: space, prependScheme: .always, split: true),
                                ]), postProcessor: nil,
                                decoder: MetaspaceDecoder(replacement: space, dropsFirstReplacement: true), addedTokens: [])
            classDefaults = ["</s>", "<unk>", "<pad>"] + (0..<t5ExtraIds).map { "<extra_id_\($0)>" }
        default:
            throw TokenizerError.unsupportedComponent(file: file, path: "tokenizer.ggml.model", type: metadata.model)
        }

        // tokenizers' AddedVocabulary: a token already added stays as it is; one outside the vocabulary gets the next id.
        var added: [TokenKey: Int] = [:]
        var nextId = vocabulary.count
        func add(_ content: String, id explicitId: Int? = nil, special: Bool) {
            guard added[TokenKey(content)] == nil else { return }
            let id = explicitId ?? vocabulary[content] ?? nextId
            nextId = max(nextId, id + 1)
            added[TokenKey(content)] = id
            pipeline.addedTokens.append(AddedToken(id: id, content: content, normalized: false, special: special))
        }
        for content in classDefaults { add(content, special: true) }
        let types = metadata.tokenTypes ?? []
        let alphabet = Set(ByteLevelAlphabet.characters)
        // A byte-level control token spelled outside the byte alphabet is a llama.cpp mislabel; transformers skips it.
        for (token, type) in zip(tokens, types) where type == controlType && !isBert {
            if !byteLevel || token.unicodeScalars.allSatisfy(alphabet.contains) { add(token, special: true) }
        }
        for (id, (token, type)) in zip(tokens, types).enumerated() where type == userDefinedType && !isBert {
            if vocabulary[token] != nil || added[TokenKey(token)] != nil {
                add(token, special: false)
            } else if byteLevel {
                // Spelled in plain text, like GPT-NeoX's runs of spaces: llama.cpp matches these whole in the text,
                // as the Hugging Face tokenizer's added tokens (transformers' GGUF loader leaves them out).
                add(token, id: id, special: false)
            }
        }
        for case let (_, token?) in named { add(token, special: true) }

        func entry(_ token: String?) -> (id: Int, token: String)? {
            guard let token else { return nil }
            return (added[TokenKey(token)] ?? vocabulary[token]).map { ($0, token) }
        }
        if isBert {
            // BertTokenizer's "[CLS] $A [SEP]" and "[CLS] $A [SEP] $B:1 [SEP]:1".
            let cls = entry(named[4].1), sep = entry(named[5].1)
            let clsPiece = cls.map { [Template.Piece.special([$0], typeId: 0)] } ?? []
            func sepPiece(_ typeId: Int) -> [Template.Piece] { sep.map { [.special([$0], typeId: typeId)] } ?? [] }
            pipeline.postProcessor = Template(single: clsPiece + [.sequence(second: false, typeId: 0)] + sepPiece(0),
                                              pair: clsPiece + [.sequence(second: false, typeId: 0)] + sepPiece(0)
                                                  + [.sequence(second: true, typeId: 1)] + sepPiece(1))
            return (pipeline, named)
        }
        if metadata.model == "t5" {
            let eos = entry(named[1].1 ?? "</s>").map { [Template.Piece.special([$0], typeId: 0)] } ?? []
            pipeline.postProcessor = Template(single: [.sequence(second: false, typeId: 0)] + eos,
                                              pair: [.sequence(second: false, typeId: 0)] + eos
                                                  + [.sequence(second: true, typeId: 0)] + eos)
            return (pipeline, named)
        }
        // transformers' update_post_processor: "bos $A eos" and "bos $A eos bos:1 $B:1 eos:1".
        let addsBos = metadata.addBosToken ?? (metadata.model == "llama" || metadata.model == "gemma4")
        let bos = addsBos ? entry(named[0].1) : nil
        let eos = (metadata.addEosToken ?? false) ? entry(named[1].1) : nil
        func pieces(_ sequence: Bool, typeId: Int) -> [Template.Piece] {
            (bos.map { [Template.Piece.special([$0], typeId: typeId)] } ?? [])
                + [.sequence(second: sequence, typeId: typeId)]
                + (eos.map { [Template.Piece.special([$0], typeId: typeId)] } ?? [])
        }
        pipeline.postProcessor = Template(single: pieces(false, typeId: 0),
                                          pair: pieces(false, typeId: 0) + pieces(true, typeId: 1))
        return (pipeline, named)
    }
}

/// GPT-2's vocabulary of a GGUF: tokens already in the byte alphabet as they are, others (llama.cpp writes some added
/// tokens in plain text) respelled byte by byte; a later token with the same spelling takes it over.
private func byteLevelVocabulary(_ tokens: [String]) -> Vocabulary {
    let alphabet = Set(ByteLevelAlphabet.characters)
    var vocabulary = Vocabulary()
    for (id, token) in tokens.enumerated() {
        if token.unicodeScalars.allSatisfy(alphabet.contains) {
            vocabulary[token] = id
        } else {
            var spelled = String.UnicodeScalarView()
            for byte in token.utf8 { spelled.append(ByteLevelAlphabet.characters[Int(byte)]) }
            vocabulary[String(spelled)] = id
        }
    }
    return vocabulary
}

/// The file's merges, or those transformers' `generate_merges` derives from the vocabulary: every split of a token
/// into two tokens, ordered by the token's score (best first), or by its id when there are no scores.
private func ggufMerges(_ metadata: GGUFTokenizerMetadata, vocabularyOrder tokens: [String]) throws -> [(String, String)] {
    if let merges = metadata.merges {
        return try merges.enumerated().map { index, merge in
            let parts = merge.unicodeScalars.split(separator: " ", omittingEmptySubsequences: false)
            guard parts.count == 2 else {
                throw TokenizerError.invalidField(file: metadata.file, path: "tokenizer.ggml.merges[\(index)]",
                                                  reason: "expected two tokens separated by one space")
            }
            return (String(String.UnicodeScalarView(parts[0])), String(String.UnicodeScalarView(parts[1])))
        }
    }
    if metadata.model == "llama" && metadata.scores == nil {
        throw TokenizerError.invalidField(file: metadata.file, path: "tokenizer.ggml.scores",
                                          reason: "a SentencePiece tokenizer without tokenizer.ggml.merges needs scores")
    }
    // Python dicts: a repeated token keeps its first place in the order and the last id and score.
    var ids: [TokenKey: Int] = [:]
    var order: [String] = []
    var keyScores: [TokenKey: Double] = [:]
    for (id, token) in tokens.enumerated() {
        let key = TokenKey(token)
        if ids[key] == nil { order.append(token) }
        ids[key] = id
        keyScores[key] = metadata.scores?[id] ?? Double(id)
    }
    struct Candidate { let left: [Unicode.Scalar]; let right: [Unicode.Scalar]; let score: Double; let position: Int }
    var candidates: [Candidate] = []
    for token in order {
        let scalars = Array(token.unicodeScalars)
        guard scalars.count > 1 else { continue }
        let score = keyScores[TokenKey(token)]!
        var local: [(left: Int, right: Int, split: Int)] = []
        for split in 1..<scalars.count {
            let left = String(String.UnicodeScalarView(scalars[..<split]))
            let right = String(String.UnicodeScalarView(scalars[split...]))
            if let leftId = ids[TokenKey(left)], let rightId = ids[TokenKey(right)] { local.append((leftId, rightId, split)) }
        }
        local.sort { ($0.left, $0.right, $0.split) < ($1.left, $1.right, $1.split) }
        for merge in local {
            candidates.append(Candidate(left: Array(scalars[..<merge.split]), right: Array(scalars[merge.split...]),
                                        score: score, position: candidates.count))
        }
    }
    // Python's stable sort, descending by score with scores and ascending by id without.
    let descending = metadata.scores != nil
    candidates.sort { a, b in
        if a.score != b.score { return descending ? a.score > b.score : a.score < b.score }
        if a.left.count != b.left.count { return descending ? a.left.count > b.left.count : a.left.count < b.left.count }
        if a.right.count != b.right.count { return descending ? a.right.count > b.right.count : a.right.count < b.right.count }
        return a.position < b.position
    }
    return candidates.map { (String(String.UnicodeScalarView($0.left)), String(String.UnicodeScalarView($0.right))) }
}
