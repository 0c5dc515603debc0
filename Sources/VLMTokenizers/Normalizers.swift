import Synchronization
import Foundation

/// A tokenizer.json `normalizer`: rewrites the text before it is split into words, keeping track of where each
/// scalar came from.
protocol Normalizer: Sendable {
    func normalize(_ text: inout NormalizedText)
}

extension Normalizer {
    /// The normalized scalars alone (for added tokens' contents).
    func normalize(_ scalars: [Unicode.Scalar]) -> [Unicode.Scalar] {
        var text = NormalizedText(scalars[...], start: 0)
        normalize(&text)
        return text.scalars
    }
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
    case "Precompiled":
        // Converters write a null charsmap for SentencePiece models that had no normalization rules.
        if object.isNull("precompiled_charsmap") { return NormalizerSequence(normalizers: []) }
        return try PrecompiledNormalizer(base64: try object.string("precompiled_charsmap"), object: object)
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

    func normalize(_ text: inout NormalizedText) {
        for normalizer in normalizers { normalizer.normalize(&text) }
    }
}

/// NFC, NFD, NFKC, NFKD through Foundation, aligned chunk by chunk (a chunk is a starter and the marks after it).
struct UnicodeNormalization: Normalizer {
    enum Form: Sendable { case nfc, nfd, nfkc, nfkd }
    let form: Form

    private func normalized(_ scalars: ArraySlice<Unicode.Scalar>) -> [Unicode.Scalar] {
        let string = String(String.UnicodeScalarView(scalars))
        let result = switch form {
        case .nfc: string.precomposedStringWithCanonicalMapping
        case .nfd: string.decomposedStringWithCanonicalMapping
        case .nfkc: string.precomposedStringWithCompatibilityMapping
        case .nfkd: string.decomposedStringWithCompatibilityMapping
        }
        return Array(result.unicodeScalars)
    }

    /// Single scalars normalized before, per form: Foundation's normalization costs microseconds a call.
    private static let singleScalarCache = Mutex<[UInt64: [Unicode.Scalar]]>([:])
    private static let singleScalarCacheCapacity = 1 << 16

    private func normalized(_ scalar: Unicode.Scalar) -> [Unicode.Scalar] {
        let formIndex: UInt64 = switch form {
        case .nfc: 0
        case .nfd: 1
        case .nfkc: 2
        case .nfkd: 3
        }
        let key = UInt64(scalar.value) | formIndex << 32
        if let cached = Self.singleScalarCache.withLock({ $0[key] }) { return cached }
        let result = normalized([scalar][...])
        Self.singleScalarCache.withLock { cache in
            if cache.count < Self.singleScalarCacheCapacity { cache[key] = result }
        }
        return result
    }

    func normalize(_ text: inout NormalizedText) {
        // Below U+0300 every character is already NFC; ASCII is invariant under all four forms.
        let invariantBelow: UInt32 = form == .nfc ? 0x300 : 0x80
        guard let firstVariant = text.scalars.firstIndex(where: { $0.value >= invariantBelow }) else { return }
        var chunkStarts: [Int] = []
        for index in firstVariant..<text.scalars.count {
            let scalar = text.scalars[index]
            let joinsPrevious = scalar.value >= 0x300 && (scalar.properties.canonicalCombiningClass != .notReordered
                || (0x1160...0x11FF).contains(scalar.value) || (0xD7B0...0xD7FF).contains(scalar.value))
            if index == firstVariant || !joinsPrevious { chunkStarts.append(index) }
        }
        chunkStarts.append(text.scalars.count)
        // The chunk before the first variant scalar may take combining marks that follow it.
        if firstVariant > 0 && chunkStarts.count > 1 && text.scalars[firstVariant].properties.canonicalCombiningClass != .notReordered {
            chunkStarts[0] = firstVariant - 1
        }
        var changes: [(Unicode.Scalar, Int)] = []
        changes.reserveCapacity(text.scalars.count + 8)
        for scalar in text.scalars[..<chunkStarts[0]] { changes.append((scalar, 0)) }
        var unchanged = true
        for (start, end) in zip(chunkStarts, chunkStarts.dropFirst()) {
            let chunk = text.scalars[start..<end]
            let new = chunk.count == 1 ? (chunk.first!.value < invariantBelow ? [chunk.first!] : normalized(chunk.first!)) : normalized(chunk)
            if unchanged && !new.elementsEqual(chunk) { unchanged = false }
            appendChanges(from: end - start, to: new, into: &changes)
        }
        if unchanged && (form == .nfd || form == .nfkd) { return }
        // Decompositions never cross chunks; compositions (NFC, NFKC) rarely do: then align the whole text as one chunk.
        if form == .nfc || form == .nfkc {
            let whole = normalized(text.scalars[...])
            if changes.count != whole.count || !zip(changes, whole).allSatisfy({ $0.0 == $1 }) {
                changes.removeAll()
                appendChanges(from: text.scalars.count, to: whole, into: &changes)
            } else if unchanged {
                return
            }
        }
        text.transform(changes)
    }

    /// `count` old scalars become `new`: a composition absorbs the removed scalars into the first new one, a
    /// decomposition inserts the extra ones after the first.
    private func appendChanges(from count: Int, to new: [Unicode.Scalar], into changes: inout [(Unicode.Scalar, Int)]) {
        for (index, scalar) in new.enumerated() {
            if new.count <= count {
                changes.append((scalar, index == 0 ? new.count - count : 0))
            } else {
                changes.append((scalar, index < count ? 0 : 1))
            }
        }
    }
}

/// Lowercases character by character, like Rust's `char::to_lowercase`: full mappings (İ → i̇), no context (no final
/// sigma).
struct Lowercase: Normalizer {
    func normalize(_ text: inout NormalizedText) {
        if text.scalars.allSatisfy({ $0.value < 0x80 }) {
            for index in text.scalars.indices where text.scalars[index].value >= 0x41 && text.scalars[index].value <= 0x5A {
                text.scalars[index] = Unicode.Scalar(text.scalars[index].value + 32)!
            }
            return
        }
        text.flatMap { scalar, output in
            if scalar.value < 0x80 {
                output.append(scalar.value >= 0x41 && scalar.value <= 0x5A ? Unicode.Scalar(scalar.value + 32)! : scalar)
            } else {
                output.append(contentsOf: scalar.properties.lowercaseMapping.unicodeScalars)
            }
        }
    }
}

struct Replace: Normalizer {
    let pattern: any Pattern
    let content: [Unicode.Scalar]

    func normalize(_ text: inout NormalizedText) {
        text.replace(pattern.matches(in: text.scalars), with: content)
    }
}

struct Prepend: Normalizer {
    let prefix: [Unicode.Scalar]

    func normalize(_ text: inout NormalizedText) {
        text.prepend(prefix)
    }
}

struct Strip: Normalizer {
    let left: Bool
    let right: Bool

    func normalize(_ text: inout NormalizedText) {
        var lower = 0
        var upper = text.scalars.count
        if left { while lower < upper && text.scalars[lower].isRegexWhitespace { lower += 1 } }
        if right { while upper > lower && text.scalars[upper - 1].isRegexWhitespace { upper -= 1 } }
        if lower > 0 || upper < text.scalars.count {
            text = NormalizedText(scalars: Array(text.scalars[lower..<upper]), alignments: Array(text.alignments[lower..<upper]),
                                  originalStart: text.originalStart)
        }
    }
}

/// Drops nonspacing marks (meant to follow NFD or NFKD).
struct StripAccents: Normalizer {
    func normalize(_ text: inout NormalizedText) {
        text.filter { $0.value < 0x300 || $0.properties.generalCategory != .nonspacingMark }
    }
}

/// BERT's original text cleaning, CJK spacing, accent stripping and lowercasing.
struct BertNormalizer: Normalizer {
    let cleanText: Bool
    let handleChineseCharacters: Bool
    let stripAccents: Bool
    let lowercase: Bool

    func normalize(_ text: inout NormalizedText) {
        if cleanText {
            text.filter { !isRemovedByCleanText($0) }
            text.map { $0.isRegexWhitespace ? " " : $0 }
        }
        if handleChineseCharacters && text.scalars.contains(where: isCJKIdeograph) {
            text.flatMap { scalar, output in
                if isCJKIdeograph(scalar) {
                    output.append(" ")
                    output.append(scalar)
                    output.append(" ")
                } else {
                    output.append(scalar)
                }
            }
        }
        if stripAccents {
            UnicodeNormalization(form: .nfd).normalize(&text)
            StripAccents().normalize(&text)
        }
        if lowercase { Lowercase().normalize(&text) }
    }
}

/// NUL, U+FFFD and what BERT counts as controls: tokenizers' table of Cc, Cf and Co (not tab, newline and carriage
/// return, which are whitespace; not unassigned code points, which its table lacks).
func isRemovedByCleanText(_ scalar: Unicode.Scalar) -> Bool {
    let value = scalar.value
    if value < 0x80 { return value == 0x7F || (value < 0x20 && value != 0x09 && value != 0x0A && value != 0x0D) }
    return bertCleanTextRemovedRanges.contains { $0.contains(value) }
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
