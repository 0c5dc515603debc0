import Foundation

/// A tokenizer.json `normalizer`: rewrites the text before it is split into words.
protocol Normalizer: Sendable {
    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar]
}

func makeNormalizer(_ object: JSONObject) throws -> any Normalizer {
    let type = try object.string("type")
    switch type {
    case "Sequence":
        return NormalizerSequence(normalizers: try object.objects("normalizers").map(makeNormalizer))
    case "NFC": return UnicodeNormalization(form: .nfc)
    case "NFD": return UnicodeNormalization(form: .nfd)
    case "NFKC": return UnicodeNormalization(form: .nfkc)
    case "NFKD": return UnicodeNormalization(form: .nfkd)
    case "Lowercase": return Lowercase()
    case "Replace":
        return Replace(pattern: try makePattern(try object.object("pattern")),
                       content: Array(try object.string("content").unicodeScalars))
    case "Prepend": return Prepend(prefix: Array(try object.string("prepend").unicodeScalars))
    case "Strip":
        return Strip(left: try object.bool("strip_left", default: true), right: try object.bool("strip_right", default: true))
    case "StripAccents": return StripAccents()
    case "BertNormalizer":
        let lowercase = try object.bool("lowercase", default: true)
        return BertNormalizer(
            cleanText: try object.bool("clean_text", default: true),
            handleChineseCharacters: try object.bool("handle_chinese_chars", default: true),
            stripAccents: object.isNull("strip_accents") ? lowercase : try object.bool("strip_accents", default: lowercase),
            lowercase: lowercase)
    default:
        throw TokenizerError.unsupportedComponent(file: object.file, path: object.path, type: type)
    }
}

struct NormalizerSequence: Normalizer {
    let normalizers: [any Normalizer]

    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        normalizers.reduce(text) { $1.normalize($0) }
    }
}

/// NFC, NFD, NFKC, NFKD through Foundation.
struct UnicodeNormalization: Normalizer {
    enum Form: Sendable { case nfc, nfd, nfkc, nfkd }
    let form: Form

    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        // Below U+0300 every character is already NFC; ASCII is invariant under all four forms.
        let invariantBelow: UInt32 = form == .nfc ? 0x300 : 0x80
        if text.allSatisfy({ $0.value < invariantBelow }) { return text }
        let string = String(String.UnicodeScalarView(text))
        let normalized = switch form {
        case .nfc: string.precomposedStringWithCanonicalMapping
        case .nfd: string.decomposedStringWithCanonicalMapping
        case .nfkc: string.precomposedStringWithCompatibilityMapping
        case .nfkd: string.decomposedStringWithCompatibilityMapping
        }
        return Array(normalized.unicodeScalars)
    }
}

/// Lowercases character by character, like Rust's `char::to_lowercase`: full mappings (İ → i̇), no context (no final
/// sigma).
struct Lowercase: Normalizer {
    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        var result: [Unicode.Scalar] = []
        result.reserveCapacity(text.count)
        for scalar in text {
            if scalar.value < 0x80 {
                result.append(scalar.value >= 0x41 && scalar.value <= 0x5A ? Unicode.Scalar(scalar.value + 32)! : scalar)
            } else {
                result.append(contentsOf: scalar.properties.lowercaseMapping.unicodeScalars)
            }
        }
        return result
    }
}

struct Replace: Normalizer {
    let pattern: any Pattern
    let content: [Unicode.Scalar]

    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        let matches = pattern.matches(in: text)
        if matches.isEmpty { return text }
        var result: [Unicode.Scalar] = []
        result.reserveCapacity(text.count)
        var previous = 0
        for match in matches {
            result.append(contentsOf: text[previous..<match.lowerBound])
            result.append(contentsOf: content)
            previous = match.upperBound
        }
        result.append(contentsOf: text[previous...])
        return result
    }
}

struct Prepend: Normalizer {
    let prefix: [Unicode.Scalar]

    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        text.isEmpty ? text : prefix + text
    }
}

struct Strip: Normalizer {
    let left: Bool
    let right: Bool

    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        var lower = 0
        var upper = text.count
        if left { while lower < upper && text[lower].isRegexWhitespace { lower += 1 } }
        if right { while upper > lower && text[upper - 1].isRegexWhitespace { upper -= 1 } }
        return Array(text[lower..<upper])
    }
}

/// Drops nonspacing marks (meant to follow NFD or NFKD).
struct StripAccents: Normalizer {
    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        text.filter { $0.properties.generalCategory != .nonspacingMark }
    }
}

/// BERT's original text cleaning, CJK spacing, accent stripping and lowercasing.
struct BertNormalizer: Normalizer {
    let cleanText: Bool
    let handleChineseCharacters: Bool
    let stripAccents: Bool
    let lowercase: Bool

    func normalize(_ text: [Unicode.Scalar]) -> [Unicode.Scalar] {
        var text = text
        if cleanText {
            text = text.compactMap { scalar in
                if scalar.value == 0 || scalar.value == 0xFFFD || isBertControl(scalar) { return nil }
                return scalar.isRegexWhitespace ? " " : scalar
            }
        }
        if handleChineseCharacters {
            var spaced: [Unicode.Scalar] = []
            spaced.reserveCapacity(text.count)
            for scalar in text {
                if isCJKIdeograph(scalar) { spaced += [" ", scalar, " "] } else { spaced.append(scalar) }
            }
            text = spaced
        }
        if stripAccents {
            text = StripAccents().normalize(UnicodeNormalization(form: .nfd).normalize(text))
        }
        if lowercase { text = Lowercase().normalize(text) }
        return text
    }
}

/// BERT counts tab, newline and carriage return as whitespace, every other category C character as a control.
func isBertControl(_ scalar: Unicode.Scalar) -> Bool {
    if scalar == "\t" || scalar == "\n" || scalar == "\r" { return false }
    switch scalar.properties.generalCategory {
    case .control, .format, .unassigned, .privateUse, .surrogate: return true
    default: return false
    }
}

/// The "Chinese characters" of BERT: the CJK Unified Ideographs blocks and their compatibility blocks.
func isCJKIdeograph(_ scalar: Unicode.Scalar) -> Bool {
    switch scalar.value {
    case 0x4E00...0x9FFF, 0x3400...0x4DBF, 0x20000...0x2A6DF, 0x2A700...0x2B73F, 0x2B740...0x2B81F,
         0x2B820...0x2CEAF, 0xF900...0xFAFF, 0x2F800...0x2FA1F:
        true
    default: false
    }
}
