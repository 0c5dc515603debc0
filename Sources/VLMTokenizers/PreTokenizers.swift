/// A tokenizer.json `pre_tokenizer`: splits normalized text into the words the model tokenizes one by one.
protocol PreTokenizer: Sendable {
    func preTokenize(_ words: [[Unicode.Scalar]]) -> [[Unicode.Scalar]]
}

func makePreTokenizer(_ object: JSONObject) throws -> any PreTokenizer {
    let type = try object.string("type")
    switch type {
    case "Sequence":
        return PreTokenizerSequence(preTokenizers: try object.objects("pretokenizers").map(makePreTokenizer))
    case "Split":
        let behaviorName = try object.string("behavior")
        guard let behavior = SplitBehavior(rawValue: behaviorName) else {
            throw object.invalid("behavior", "unknown split behavior \"\(behaviorName)\"")
        }
        return Split(pattern: try makePattern(try object.object("pattern")), behavior: behavior,
                     invert: try object.bool("invert", default: false))
    case "ByteLevel":
        return ByteLevelPreTokenizer(addPrefixSpace: try object.bool("add_prefix_space", default: true),
                                     useRegex: try object.bool("use_regex", default: true))
    case "WhitespaceSplit":
        return Split(pattern: AlternationPattern.known(#"\s+"#)!, behavior: .removed, invert: false)
    case "BertPreTokenizer":
        return BertPreTokenizer()
    default:
        throw TokenizerError.unsupportedComponent(file: object.file, path: object.path, type: type)
    }
}

struct PreTokenizerSequence: PreTokenizer {
    let preTokenizers: [any PreTokenizer]

    func preTokenize(_ words: [[Unicode.Scalar]]) -> [[Unicode.Scalar]] {
        preTokenizers.reduce(words) { $1.preTokenize($0) }
    }
}

struct Split: PreTokenizer {
    let pattern: any Pattern
    let behavior: SplitBehavior
    let invert: Bool

    func preTokenize(_ words: [[Unicode.Scalar]]) -> [[Unicode.Scalar]] {
        words.flatMap { behavior.split($0, by: pattern, invert: invert) }
    }
}

/// GPT-2's byte-level pre-tokenizer: optionally splits with GPT-2's regex, then spells every word's UTF-8 bytes in
/// the byte-level alphabet.
struct ByteLevelPreTokenizer: PreTokenizer {
    static let gpt2Pattern = AlternationPattern.known(
        #"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"#)!

    let addPrefixSpace: Bool
    let useRegex: Bool

    func preTokenize(_ words: [[Unicode.Scalar]]) -> [[Unicode.Scalar]] {
        var result: [[Unicode.Scalar]] = []
        result.reserveCapacity(words.count)
        for var word in words {
            if addPrefixSpace && word.first != " " { word.insert(" ", at: 0) }
            let pieces = useRegex ? SplitBehavior.isolated.split(word, by: Self.gpt2Pattern) : [word]
            for piece in pieces { result.append(Self.spellBytes(piece)) }
        }
        return result
    }

    static func spellBytes(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        var spelled: [Unicode.Scalar] = []
        spelled.reserveCapacity(text.count)
        for scalar in text {
            if scalar.value < 0x80 {
                spelled.append(ByteLevelAlphabet.characters[Int(scalar.value)])
            } else {
                for byte in UTF8.encode(scalar)! { spelled.append(ByteLevelAlphabet.characters[Int(byte)]) }
            }
        }
        return spelled
    }
}

/// BERT's basic tokenization: whitespace separates words and is dropped, every punctuation character is a word.
struct BertPreTokenizer: PreTokenizer {
    func preTokenize(_ words: [[Unicode.Scalar]]) -> [[Unicode.Scalar]] {
        var result: [[Unicode.Scalar]] = []
        for word in words {
            var current: [Unicode.Scalar] = []
            for scalar in word {
                if scalar.isRegexWhitespace {
                    if !current.isEmpty { result.append(current); current.removeAll(keepingCapacity: true) }
                } else if isBertPunctuation(scalar) {
                    if !current.isEmpty { result.append(current); current.removeAll(keepingCapacity: true) }
                    result.append([scalar])
                } else {
                    current.append(scalar)
                }
            }
            if !current.isEmpty { result.append(current) }
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
