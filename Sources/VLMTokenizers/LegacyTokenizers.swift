import Foundation

/// Pipelines rebuilt from the vocabulary files of checkpoints without tokenizer.json, as transformers 5 builds them
/// (tokenizer_config.json's "tokenizer_class" says which): CLIPTokenizer and GPT2Tokenizer from vocab.json +
/// merges.txt, BertTokenizer from vocab.txt, SiglipTokenizer from spiece.model.
extension Pipeline {
    init(legacyDirectory directory: URL, config: JSONObject?) throws {
        let tokenizerClass = try config?.optionalString("tokenizer_class")
        switch tokenizerClass {
        case "CLIPTokenizer", "CLIPTokenizerFast": try self.init(clipDirectory: directory, config: config)
        case "GPT2Tokenizer", "GPT2TokenizerFast": try self.init(gpt2Directory: directory, config: config)
        case "BertTokenizer", "BertTokenizerFast": try self.init(bertDirectory: directory, config: config)
        case "SiglipTokenizer": try self.init(siglipDirectory: directory, config: config)
        default:
            throw TokenizerError.noTokenizerFiles(
                directory: directory.path,
                reason: "no tokenizer.json, and tokenizer class \(tokenizerClass.map { "\"\($0)\"" } ?? "(none)") has no vocabulary-file loader")
        }
    }

    /// CLIPTokenizer: NFC, whitespace runs to one space, lowercase; CLIP's split pattern then byte-level; "</w>" ends
    /// words; <|startoftext|> $A <|endoftext|>.
    private init(clipDirectory directory: URL, config: JSONObject?) throws {
        let (vocabulary, merges, mergesFile) = try readVocabularyAndMerges(directory)
        let bos = try config?.tokenContent("bos_token") ?? "<|startoftext|>"
        let eos = try config?.tokenContent("eos_token") ?? "<|endoftext|>"
        let unknown = try config?.tokenContent("unk_token") ?? "<|endoftext|>"
        model = try BPE(vocabulary: vocabulary, merges: merges, file: mergesFile, unknownToken: unknown,
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
        for content in [bos, eos] where !addedTokens.contains(where: { $0.content.utf8.elementsEqual(content.utf8) }) {
            let id = vocabulary[content] ?? nextId
            if id == nextId { nextId += 1 }
            addedTokens.append(AddedToken(id: id, content: content, normalized: false, special: true))
        }
        self.addedTokens = addedTokens
        let bosToken = (id: addedTokens[0].id, token: bos), eosToken = (id: addedTokens.last!.id, token: eos)
        postProcessor = Template(
            single: [.special([bosToken], typeId: 0), .sequence(second: false, typeId: 0), .special([eosToken], typeId: 0)],
            pair: [.special([bosToken], typeId: 0), .sequence(second: false, typeId: 0), .special([eosToken, eosToken], typeId: 0),
                   .sequence(second: true, typeId: 0), .special([eosToken], typeId: 0)],
            overflowingTypeId: 0)  // transformers converts CLIP to RobertaProcessing
    }

    /// GPT2Tokenizer: byte-level BPE with no unknown token and no post-processor; <|endoftext|> is bos, eos and unk.
    private init(gpt2Directory directory: URL, config: JSONObject?) throws {
        let (vocabulary, merges, mergesFile) = try readVocabularyAndMerges(directory)
        model = try BPE(vocabulary: vocabulary, merges: merges, file: mergesFile, unknownToken: nil,
                        continuingSubwordPrefix: "", endOfWordSuffix: "")
        normalizer = nil
        preTokenizer = ByteLevelPreTokenizer(addPrefixSpace: try config?.bool("add_prefix_space", default: false) ?? false, useRegex: true)
        decoder = ByteLevelDecoder()
        postProcessor = nil
        addedTokens = []
        for key in ["unk_token", "bos_token", "eos_token"] where config?.isNull(key) ?? true {
            addSpecialToken("<|endoftext|>", vocabulary: vocabulary)
        }
    }

    /// BertTokenizer: BertNormalizer (clean text, Chinese characters spaced, accents stripped when lowercasing unless
    /// strip_accents says otherwise), BERT's pre-tokenizer, WordPiece, [CLS] $A [SEP] / [CLS] $A [SEP] $B:1 [SEP]:1.
    private init(bertDirectory directory: URL, config: JSONObject?) throws {
        let vocabularyURL = directory.appendingPathComponent("vocab.txt")
        let vocabulary = try readVocabularyLines(vocabularyURL)
        func token(_ key: String, _ defaultValue: String) throws -> String {
            try config?.tokenContent(key) ?? defaultValue
        }
        let unknown = try token("unk_token", "[UNK]"), sep = try token("sep_token", "[SEP]"),
            pad = try token("pad_token", "[PAD]"), cls = try token("cls_token", "[CLS]"), mask = try token("mask_token", "[MASK]")
        let lowercase = try config?.bool("do_lower_case", default: true) ?? true
        let stripAccents = (config?.isNull("strip_accents") ?? true) ? lowercase : try config!.bool("strip_accents", default: lowercase)
        model = WordPiece(vocabulary: vocabulary, unknownToken: unknown, continuingSubwordPrefix: "##", maxInputCharactersPerWord: 100)
        normalizer = BertNormalizer(cleanText: true,
                                    handleChineseCharacters: try config?.bool("tokenize_chinese_chars", default: true) ?? true,
                                    stripAccents: stripAccents, lowercase: lowercase)
        preTokenizer = bertPreTokenizer()
        decoder = WordPieceDecoder(prefix: "##", cleanup: true)
        addedTokens = []
        for content in [pad, unknown, cls, sep, mask] { addSpecialToken(content, vocabulary: vocabulary) }
        // transformers falls back to ids 2 and 3 when the vocabulary lacks the tokens.
        let clsToken = (id: vocabulary[cls] ?? 2, token: cls), sepToken = (id: vocabulary[sep] ?? 3, token: sep)
        postProcessor = Template(
            single: [.special([clsToken], typeId: 0), .sequence(second: false, typeId: 0), .special([sepToken], typeId: 0)],
            pair: [.special([clsToken], typeId: 0), .sequence(second: false, typeId: 0), .special([sepToken], typeId: 0),
                   .sequence(second: true, typeId: 1), .special([sepToken], typeId: 1)])
    }

    /// SiglipTokenizer, which transformers 5.23 runs only as Python over sentencepiece (no converter exists), as the
    /// tokenizer.json that oracle/siglip.py converts it to: `tokenize` turns "▁" into spaces and prepends one "▁",
    /// `canonicalize_text` lowercases (do_lower_case), drops ASCII punctuation, turns whitespace runs (Python's
    /// `\s`) into one space and strips (the "▁" keeps a leading space); then SentencePiece's own rules, its extra
    /// spaces and a lone "▁" removed; Unigram over the pieces split before each "▁"; "</s>" appended. Texts holding
    /// "</s>" or "<unk>" as text encode as tokenizers would, not as the slow tokenizer's chunk-by-chunk rules do.
    private init(siglipDirectory directory: URL, config: JSONObject?) throws {
        let spm = try SentencePieceModel(url: directory.appendingPathComponent("spiece.model"))
        guard spm.modelType == .unigram else {
            throw TokenizerError.invalidField(file: spm.file, path: "ModelProto.trainer_spec.model_type",
                                              reason: "SiglipTokenizer reads Unigram models, this one is \(spm.modelType)")
        }
        let pieces = spm.pieces.map(\.piece)
        model = Unigram(pieces: pieces, scores: spm.pieces.map { Double($0.score) }, unknownId: spm.unknownId,
                        byteFallback: spm.byteFallback)
        func regex(_ source: String) throws -> RegexPattern { try RegexPattern(source, file: spm.file) }
        var steps: [any Normalizer] = [Replace(pattern: LiteralPattern(literal: ["\u{2581}"]), content: [" "]),
                                       Prepend(prefix: ["\u{2581}"])]
        if try config?.bool("do_lower_case", default: true) ?? true { steps.append(Lowercase()) }
        steps += [
            Replace(pattern: try regex("[!-/:-@\\[-`{-~]"), content: []),
            Replace(pattern: try regex("[" + String(String.UnicodeScalarView(pythonWhitespace)) + "]+"), content: [" "]),
            Strip(left: false, right: true),
        ]
        if !spm.precompiledCharsmap.isEmpty {
            steps.append(try PrecompiledNormalizer(charsmap: spm.precompiledCharsmap) {
                TokenizerError.invalidField(file: spm.file, path: "ModelProto.normalizer_spec.precompiled_charsmap", reason: $0)
            })
        }
        if spm.removeExtraWhitespaces {
            steps += [Replace(pattern: try regex(" {2,}"), content: [" "]), Strip(left: false, right: true)]
        }
        steps.append(Replace(pattern: try regex("^\u{2581}$"), content: []))
        normalizer = NormalizerSequence(normalizers: steps)
        preTokenizer = Metaspace(replacement: "\u{2581}", prependScheme: .never, split: true)
        decoder = MetaspaceDecoder(replacement: "\u{2581}", dropsFirstReplacement: true)
        var addedTokens: [AddedToken] = []
        func specialToken(_ key: String, default defaultValue: String) throws -> (id: Int, token: String) {
            let content = try config?.tokenContent(key) ?? defaultValue
            if let token = addedTokens.first(where: { $0.content.utf8.elementsEqual(content.utf8) }) { return (token.id, content) }
            let id = pieces.firstIndex { $0.utf8.elementsEqual(content.utf8) } ?? pieces.count + addedTokens.count
            addedTokens.append(AddedToken(id: id, content: content, normalized: false, special: true))
            return (id, content)
        }
        _ = try specialToken("unk_token", default: "<unk>")
        let eosToken = try specialToken("eos_token", default: "</s>")
        _ = try specialToken("pad_token", default: "</s>")
        self.addedTokens = addedTokens
        postProcessor = Template(
            single: [.sequence(second: false, typeId: 0), .special([eosToken], typeId: 0)],
            pair: [.sequence(second: false, typeId: 0), .special([eosToken], typeId: 0),
                   .sequence(second: true, typeId: 0), .special([eosToken], typeId: 0)])
    }

    /// A special token the tokenizer class declares by default; tokenizer_config.json's own are added later.
    private mutating func addSpecialToken(_ content: String, vocabulary: Vocabulary) {
        guard !addedTokens.contains(where: { $0.content.utf8.elementsEqual(content.utf8) }) else { return }
        let id = vocabulary[content] ?? max(vocabulary.count, (addedTokens.map(\.id).max() ?? -1) + 1)
        addedTokens.append(AddedToken(id: id, content: content, normalized: false, special: true))
    }
}

/// What Python's `str.isspace()` accepts, so `\s` in its regexes, one by one as the converted tokenizer.json lists
/// them.
let pythonWhitespace: [Unicode.Scalar] = ([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680]
    + Array(0x2000...0x200A) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]).compactMap(Unicode.Scalar.init)

/// vocab.json and merges.txt as tokenizers' BPE::from_file reads them: "#version" lines skipped, every other line
/// two tokens separated by one space.
private func readVocabularyAndMerges(_ directory: URL) throws -> (Vocabulary, [(String, String)], String) {
    let vocabularyJSON = try JSONObject.read(directory.appendingPathComponent("vocab.json"))
    let vocabulary = try Vocabulary(vocabularyJSON, field: "vocab")
    let mergesURL = directory.appendingPathComponent("merges.txt")
    let mergesText = try readUTF8(mergesURL)
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
        merges.append((parts[0], parts[1]))
    }
    return (vocabulary, merges, mergesURL.path)
}

/// vocab.txt as tokenizers' WordPiece::read_file reads it: one token a line, its trailing whitespace trimmed, the
/// line number its id (a repeated token keeps its last line).
private func readVocabularyLines(_ url: URL) throws -> Vocabulary {
    var vocabulary = Vocabulary()
    var lines = try readUTF8(url).unicodeScalars.split(separator: "\n", omittingEmptySubsequences: false)
    if lines.last?.isEmpty == true { lines.removeLast() }
    for (index, line) in lines.enumerated() {
        let end = line.lastIndex { !$0.properties.isWhitespace }.map { line.index(after: $0) } ?? line.startIndex
        vocabulary[String(String.UnicodeScalarView(line[..<end]))] = index
    }
    return vocabulary
}

private func readUTF8(_ url: URL) throws -> String {
    let data: Data
    do {
        data = try Data(contentsOf: url)
    } catch {
        throw TokenizerError.unreadable(file: url.path, reason: "\(error)")
    }
    guard let text = String(validating: data, as: UTF8.self) else {
        throw TokenizerError.unreadable(file: url.path, reason: "not valid UTF-8")
    }
    return text
}
