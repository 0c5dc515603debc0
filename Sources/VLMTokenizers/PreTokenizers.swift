/// A tokenizer.json `pre_tokenizer`: splits normalized text into the words the model tokenizes one by one.
protocol PreTokenizer: Sendable {
    func preTokenize(_ words: [NormalizedText]) -> [NormalizedText]
}

func makePreTokenizer(_ object: JSONObject) throws -> any PreTokenizer {
    let type = try object.string("type")
    func behavior(default defaultValue: SplitBehavior?) throws -> SplitBehavior {
        guard let name = try object.optionalString("behavior") else {
            guard let defaultValue else { throw object.invalid("behavior", "expected a split behavior") }
            return defaultValue
        }
        guard let behavior = SplitBehavior(rawValue: name) else {
            throw object.invalid("behavior", "unknown split behavior \"\(name)\"")
        }
        return behavior
    }
    switch type {
    case "Sequence":
        return PreTokenizerSequence(preTokenizers: try object.objects("pretokenizers").map(makePreTokenizer))
    case "Split":
        return Split(pattern: try makePattern(try object.object("pattern")), behavior: try behavior(default: nil),
                     invert: try object.bool("invert", default: false))
    case "ByteLevel":
        return ByteLevelPreTokenizer(addPrefixSpace: try object.bool("add_prefix_space", default: true),
                                     useRegex: try object.bool("use_regex", default: true))
    case "Whitespace":
        return Split(pattern: WordOrSymbolRunsPattern(), behavior: .removed, invert: true)
    case "WhitespaceSplit":
        return Split(pattern: ScalarPattern { $0.isRegexWhitespace }, behavior: .removed, invert: false)
    case "CharDelimiterSplit":
        let delimiter = Array(try object.string("delimiter").unicodeScalars)
        guard delimiter.count == 1 else { throw object.invalid("delimiter", "expected one character") }
        return Split(pattern: ScalarPattern { $0 == delimiter[0] }, behavior: .removed, invert: false)
    case "BertPreTokenizer":
        return bertPreTokenizer()
    case "Punctuation":
        return Split(pattern: ScalarPattern(accepts: isBertPunctuation), behavior: try behavior(default: .isolated), invert: false)
    case "Digits":
        let individual = try object.bool("individual_digits", default: false)
        return Split(pattern: ScalarPattern { $0.isNumber }, behavior: individual ? .isolated : .contiguous, invert: false)
    case "UnicodeScripts":
        return UnicodeScripts()
    case "Metaspace":
        let replacement = Array(try object.string("replacement").unicodeScalars)
        guard replacement.count == 1 else { throw object.invalid("replacement", "expected one character") }
        var scheme = try object.optionalString("prepend_scheme").map { name in
            guard let scheme = PrependScheme(rawValue: name) else { throw object.invalid("prepend_scheme", "unknown scheme \"\(name)\"") }
            return scheme
        } ?? .always
        if object.values["add_prefix_space"] as? Bool == false { scheme = .never }
        return Metaspace(replacement: replacement[0], prependScheme: scheme, split: try object.bool("split", default: true))
    default:
        throw TokenizerError.unsupportedComponent(file: object.file, path: object.path, type: type)
    }
}

struct PreTokenizerSequence: PreTokenizer {
    let preTokenizers: [any PreTokenizer]

    func preTokenize(_ words: [NormalizedText]) -> [NormalizedText] {
        preTokenizers.reduce(words) { $1.preTokenize($0) }
    }
}

struct Split: PreTokenizer {
    let pattern: any Pattern
    let behavior: SplitBehavior
    let invert: Bool

    func preTokenize(_ words: [NormalizedText]) -> [NormalizedText] {
        var result: [NormalizedText] = []
        result.reserveCapacity(words.count)
        for word in words {
            for range in behavior.split(word.scalars, by: pattern, invert: invert) {
                result.append(range.count == word.scalars.count ? word : word.slice(range))
            }
        }
        return result
    }
}

/// GPT-2's byte-level pre-tokenizer: optionally splits with GPT-2's regex, then spells every word's UTF-8 bytes in
/// the byte-level alphabet (each byte aligned with the character it comes from).
struct ByteLevelPreTokenizer: PreTokenizer {
    static let gpt2Pattern = AlternationPattern.known(
        #"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"#)!

    let addPrefixSpace: Bool
    let useRegex: Bool

    func preTokenize(_ words: [NormalizedText]) -> [NormalizedText] {
        var result: [NormalizedText] = []
        result.reserveCapacity(words.count)
        for var word in words {
            if addPrefixSpace && word.scalars.first != " " { word.prepend([" "]) }
            if useRegex {
                for range in SplitBehavior.isolated.split(word.scalars, by: Self.gpt2Pattern) {
                    result.append(Self.spellBytes(word.slice(range)))
                }
            } else if !word.isEmpty {
                result.append(Self.spellBytes(word))
            }
        }
        return result
    }

    static func spellBytes(_ text: NormalizedText) -> NormalizedText {
        var text = text
        if text.scalars.allSatisfy({ $0.value < 0x80 }) {
            for index in text.scalars.indices {
                text.scalars[index] = ByteLevelAlphabet.characters[Int(text.scalars[index].value)]
            }
            return text
        }
        text.flatMap { scalar, output in
            for byte in UTF8.encode(scalar)! { output.append(ByteLevelAlphabet.characters[Int(byte)]) }
        }
        return text
    }
}

/// Where Metaspace puts a replacement character before a word's first space-less start.
enum PrependScheme: String, Sendable {
    case always, first, never
}

/// SentencePiece's spaces: every space becomes the replacement character (▁), one is prepended as the scheme says,
/// and words split before each replacement character.
struct Metaspace: PreTokenizer {
    let replacement: Unicode.Scalar
    let prependScheme: PrependScheme
    let split: Bool

    func preTokenize(_ words: [NormalizedText]) -> [NormalizedText] {
        var result: [NormalizedText] = []
        for var word in words {
            word.replace(word.scalars.indices.filter { word.scalars[$0] == " " }.map { $0..<$0 + 1 }, with: [replacement])
            let startsWithReplacement = word.scalars.first == replacement
            switch prependScheme {
            case .always where !startsWithReplacement: word.prepend([replacement])
            case .first where !startsWithReplacement && word.originalStart == 0: word.prepend([replacement])
            default: break
            }
            if split {
                let pattern = ScalarPattern { [replacement] in $0 == replacement }
                for range in SplitBehavior.mergedWithNext.split(word.scalars, by: pattern) { result.append(word.slice(range)) }
            } else if !word.isEmpty {
                result.append(word)
            }
        }
        return result
    }
}

/// ASCII punctuation (including symbols such as $ + < = > ^ ` | ~) and every Unicode punctuation category.
func isBertPunctuation(_ scalar: Unicode.Scalar) -> Bool {
    if scalar.value < 0x80 {
        return (0x21...0x2F).contains(scalar.value) || (0x3A...0x40).contains(scalar.value)
            || (0x5B...0x60).contains(scalar.value) || (0x7B...0x7E).contains(scalar.value)
    }
    switch scalar.properties.generalCategory {
    case .connectorPunctuation, .dashPunctuation, .openPunctuation, .closePunctuation, .initialPunctuation,
         .finalPunctuation, .otherPunctuation:
        return true
    default:
        return false
    }
}

/// BERT's pre-tokenizer: split on whitespace, then every punctuation character on its own.
func bertPreTokenizer() -> PreTokenizerSequence {
    PreTokenizerSequence(preTokenizers: [
        Split(pattern: ScalarPattern { $0.isRegexWhitespace }, behavior: .removed, invert: false),
        Split(pattern: ScalarPattern(accepts: isBertPunctuation), behavior: .isolated, invert: false),
    ])
}

/// tokenizers' UnicodeScripts: a new word wherever the script changes. Spaces belong to no script and stay with the
/// word before them (leading ones are dropped, as tokenizers drops them); Hiragana, Katakana and U+30FC count as Han.
struct UnicodeScripts: PreTokenizer {
    /// The script number of a scalar in `unicodeScriptRanges` (0: none).
    static func script(_ scalar: Unicode.Scalar) -> UInt32 {
        if scalar == " " { return 0 }
        let key = scalar.value << 8 | 0xFF
        // The last range starting at or before the scalar.
        var low = 0, high = unicodeScriptRanges.count
        while low < high {
            let middle = (low + high) / 2
            if unicodeScriptRanges[middle] <= key { low = middle + 1 } else { high = middle }
        }
        return low == 0 ? 0 : unicodeScriptRanges[low - 1] & 0xFF
    }

    func preTokenize(_ words: [NormalizedText]) -> [NormalizedText] {
        var result: [NormalizedText] = []
        result.reserveCapacity(words.count)
        for word in words {
            var starts: [Int] = []
            var last: UInt32? = nil
            for (index, scalar) in word.scalars.enumerated() {
                let script = Self.script(scalar)
                guard script != 0 else { continue }
                if last != script { starts.append(index) }
                last = script
            }
            for (index, start) in starts.enumerated() {
                let end = index + 1 < starts.count ? starts[index + 1] : word.scalars.count
                result.append(start == 0 && end == word.scalars.count ? word : word.slice(start..<end))
            }
        }
        return result
    }
}
