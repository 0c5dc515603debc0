/// What one character of the text must be for a pattern item that reads one character to match.
enum PythonRegexCharacterTest: Sendable {
    case scalar(UInt32)
    /// A literal under `(?i)`: the scalar and every scalar the `regex` module treats as the same letter.
    case caseless([UInt32])
    /// `.` under DOTALL.
    case any
    /// `.` without DOTALL: everything but "\n" (not "\r", not U+2028).
    case notNewline
    case set(PythonRegexCharacterSet)
    /// An alternation of single characters (`(?:a|\s)`), which the module turns into a set.
    indirect case anyOf([PythonRegexCharacterTest])

    func matches(_ scalar: UInt32) -> Bool {
        switch self {
        case let .scalar(expected): scalar == expected
        case let .caseless(cases): cases.contains(scalar)
        case .any: true
        case .notNewline: scalar != 0x0A
        case let .set(set): set.matches(scalar)
        case let .anyOf(tests): tests.contains { $0.matches(scalar) }
        }
    }
}

/// A bracketed set (`[a-z\d]`), or one of the class escapes (`\w`, `\S`, `\p{L}`) standing alone.
struct PythonRegexCharacterSet: Sendable {
    var ranges: [ClosedRange<UInt32>] = []
    var classes: [PythonRegexCharacterClass] = []
    var negated = false
    /// Under `(?i)` a character is in the set when any of its case variants is (then `negated` applies).
    var caseless = false

    func matches(_ scalar: UInt32) -> Bool {
        let member = caseless
            ? PythonRegexCaseFolding.variants(of: scalar).contains(where: contains)
            : contains(scalar)
        return member != negated
    }

    private func contains(_ scalar: UInt32) -> Bool {
        ranges.contains { $0.contains(scalar) } || classes.contains { $0.matches(scalar) }
    }
}

/// The class escapes, with the `regex` module's Unicode definitions (checked against it over every code point
/// assigned in the Swift standard library's Unicode version).
enum PythonRegexCharacterClass: Sendable {
    /// `\w` (or `\W` when negated): Alphabetic, marks, decimal digits, connector punctuation and the joiners.
    case word(negated: Bool)
    /// `\d`: Unicode decimal digits (Nd), so "٣" is a digit.
    case digit(negated: Bool)
    /// `\s`: the White_Space property, so NBSP and U+2028 are spaces but U+001C...U+001F are not.
    case space(negated: Bool)
    /// `\p{…}` / `\P{…}` over general categories.
    case categories(Set<Unicode.GeneralCategory>, negated: Bool)

    func matches(_ scalar: UInt32) -> Bool {
        switch self {
        case let .word(negated): PythonRegexCharacterClass.isWord(scalar) != negated
        case let .digit(negated): PythonRegexCharacterClass.isDigit(scalar) != negated
        case let .space(negated): PythonRegexCharacterClass.isSpace(scalar) != negated
        case let .categories(categories, negated):
            (Unicode.Scalar(scalar).map { categories.contains($0.properties.generalCategory) } ?? false) != negated
        }
    }

    static func isWord(_ scalar: UInt32) -> Bool {
        if scalar < 0x80 {
            return (0x30...0x39).contains(scalar) || (0x41...0x5A).contains(scalar) || (0x61...0x7A).contains(scalar)
                || scalar == 0x5F
        }
        guard let properties = Unicode.Scalar(scalar)?.properties else { return false }
        switch properties.generalCategory {
        case .nonspacingMark, .spacingMark, .enclosingMark, .decimalNumber, .connectorPunctuation: return true
        default: return properties.isAlphabetic || properties.isJoinControl
        }
    }

    static func isDigit(_ scalar: UInt32) -> Bool {
        if scalar < 0x80 { return (0x30...0x39).contains(scalar) }
        return Unicode.Scalar(scalar)?.properties.generalCategory == .decimalNumber
    }

    static func isSpace(_ scalar: UInt32) -> Bool {
        if scalar < 0x80 { return (0x09...0x0D).contains(scalar) || scalar == 0x20 }
        return Unicode.Scalar(scalar)?.properties.isWhitespace ?? false
    }

    /// The general categories a `\p{…}` name stands for: the one- and two-letter names and `L&`.
    static func categories(named name: String) -> Set<Unicode.GeneralCategory>? {
        let letters: [Unicode.GeneralCategory] = [.uppercaseLetter, .lowercaseLetter, .titlecaseLetter, .modifierLetter, .otherLetter]
        let marks: [Unicode.GeneralCategory] = [.nonspacingMark, .spacingMark, .enclosingMark]
        let numbers: [Unicode.GeneralCategory] = [.decimalNumber, .letterNumber, .otherNumber]
        let punctuation: [Unicode.GeneralCategory] = [.connectorPunctuation, .dashPunctuation, .openPunctuation,
                                                      .closePunctuation, .initialPunctuation, .finalPunctuation, .otherPunctuation]
        let symbols: [Unicode.GeneralCategory] = [.mathSymbol, .currencySymbol, .modifierSymbol, .otherSymbol]
        let separators: [Unicode.GeneralCategory] = [.spaceSeparator, .lineSeparator, .paragraphSeparator]
        let others: [Unicode.GeneralCategory] = [.control, .format, .surrogate, .privateUse, .unassigned]
        let table: [String: [Unicode.GeneralCategory]] = [
            "L": letters, "L&": [.uppercaseLetter, .lowercaseLetter, .titlecaseLetter],
            "Lu": [.uppercaseLetter], "Ll": [.lowercaseLetter], "Lt": [.titlecaseLetter], "Lm": [.modifierLetter],
            "Lo": [.otherLetter],
            "M": marks, "Mn": [.nonspacingMark], "Mc": [.spacingMark], "Me": [.enclosingMark],
            "N": numbers, "Nd": [.decimalNumber], "Nl": [.letterNumber], "No": [.otherNumber],
            "P": punctuation, "Pc": [.connectorPunctuation], "Pd": [.dashPunctuation], "Ps": [.openPunctuation],
            "Pe": [.closePunctuation], "Pi": [.initialPunctuation], "Pf": [.finalPunctuation], "Po": [.otherPunctuation],
            "S": symbols, "Sm": [.mathSymbol], "Sc": [.currencySymbol], "Sk": [.modifierSymbol], "So": [.otherSymbol],
            "Z": separators, "Zs": [.spaceSeparator], "Zl": [.lineSeparator], "Zp": [.paragraphSeparator],
            "C": others, "Cc": [.control], "Cf": [.format], "Cs": [.surrogate], "Co": [.privateUse], "Cn": [.unassigned],
        ]
        return table[name].map(Set.init)
    }
}

/// The `regex` module's simple case equivalence: which scalars `(?i)` lets stand for one another.
///
/// Built from the standard library's case mappings (a letter's class is everything whose uppercase-then-lowercase
/// mapping lands on the same scalar), with the few pairs the module adds from CaseFolding.txt and its Turkic
/// treatment of I/i/İ/ı, which is not symmetric: `i` also matches "İ", but `İ` does not match "I".
enum PythonRegexCaseFolding {
    /// The scalar itself first, then the other scalars it matches under `(?i)`.
    static func variants(of scalar: UInt32) -> [UInt32] {
        guard let others = table[scalar] else { return [scalar] }
        return [scalar] + others.filter { $0 != scalar }
    }

    /// Scalars with at least one case variant → all their variants (themselves included).
    private static let table: [UInt32: [UInt32]] = {
        // Every cased scalar lies below U+20000.
        var classes: [UInt32: [UInt32]] = [:]
        for value in UInt32(0)..<0x20000 where !turkic.keys.contains(value) {
            guard let scalar = Unicode.Scalar(value) else { continue }
            classes[foldingKey(scalar), default: []].append(value)
        }
        var table: [UInt32: [UInt32]] = [:]
        for members in classes.values where members.count > 1 {
            for member in members { table[member] = members }
        }
        for (first, second) in caseFoldingPairs {
            let members = Array(Set((table[first] ?? [first]) + (table[second] ?? [second]))).sorted()
            for member in members { table[member] = members }
        }
        for (scalar, variants) in turkic { table[scalar] = variants }
        return table
    }()

    private static let turkic: [UInt32: [UInt32]] = [
        0x49: [0x49, 0x69, 0x131], 0x69: [0x49, 0x69, 0x130], 0x130: [0x69, 0x130], 0x131: [0x49, 0x131],
    ]

    /// Simple case foldings (CaseFolding.txt status S) that the standard library's mappings do not imply.
    private static let caseFoldingPairs: [(UInt32, UInt32)] = [(0x390, 0x1FD3), (0x3B0, 0x1FE3), (0xFB05, 0xFB06)]

    private static func foldingKey(_ scalar: Unicode.Scalar) -> UInt32 {
        guard scalar.properties.changesWhenCaseMapped else { return scalar.value }
        var key = scalar
        if let upper = single(scalar.properties.uppercaseMapping) { key = upper }
        if let lower = single(key.properties.lowercaseMapping) { key = lower }
        return key.value
    }

    private static func single(_ mapping: String) -> Unicode.Scalar? {
        let scalars = mapping.unicodeScalars
        return scalars.count == 1 ? scalars.first : nil
    }
}
