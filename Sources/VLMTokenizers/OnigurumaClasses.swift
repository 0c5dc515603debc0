import Synchronization

/// Swift's regex engine knows the Unicode classes of split regexes (`\p{L}`, `\p{N}`, `\p{Han}`, ...) by the
/// toolchain's Unicode data; Hugging Face tokenizers' Oniguruma by its own, older one (code points assigned since,
/// U+0295 still a lowercase letter, `\p{Han}` by script rather than script extensions). `RegexPattern` rewrites each
/// such class into Swift's class with the difference taken out and added back, so that a regex splits as tokenizers
/// does on every code point. The difference is worked out once per class, on first use.
enum OnigurumaClasses {
    private static let replacements = Mutex<[String: String]>([:])

    /// Oniguruma's `\p{L}` and `\p{N}`, for the patterns that classify scalars without a regex engine.
    static let letters = ScalarRanges(onigurumaClassRanges[#"\p{L}"#]!)
    static let numbers = ScalarRanges(onigurumaClassRanges[#"\p{N}"#]!)

    /// `source` with every class whose members differ between the two engines replaced by the Oniguruma one.
    static func rewrite(_ source: String) -> String {
        guard source.contains(#"\p{"#) else { return source }
        var result = source
        for name in onigurumaClassRanges.keys.sorted(by: { $0.count > $1.count }) where result.contains(name) {
            result = result.replacingOccurrences(of: name, with: replacement(name))
        }
        return result
    }

    private static func replacement(_ name: String) -> String {
        if let known = replacements.withLock({ $0[name] }) { return known }
        let computed = difference(name)
        replacements.withLock { $0[name] = computed }
        return computed
    }

    private static func difference(_ name: String) -> String {
        let ranges = onigurumaClassRanges[name]!
        var extra: [UInt32] = [], missing: [UInt32] = []
        var rangeIndex = 0
        func compare(_ value: UInt32, swift: Bool) {
            while rangeIndex < ranges.count && ranges[rangeIndex].upperBound < value { rangeIndex += 1 }
            let oniguruma = rangeIndex < ranges.count && ranges[rangeIndex].lowerBound <= value
            if swift != oniguruma { if swift { extra.append(value) } else { missing.append(value) } }
        }
        // Swift's \p{Han} follows script extensions (U+00B7 is in it), Oniguruma's the script, which is Swift's
        // \p{sc=Han}; the standard library does not expose scripts, so Swift's members come from its regex.
        let swiftName = name == #"\p{Han}"# ? #"\p{sc=Han}"# : name
        if let mask = categoryMasks[name] {
            swiftCategories.withUnsafeBufferPointer { categories in
                for value in 0..<UInt32(categories.count) { compare(value, swift: mask & (1 << categories[Int(value)]) != 0) }
            }
        } else if let regex = try? Regex(swiftName).matchingSemantics(.unicodeScalar) {
            var all = String.UnicodeScalarView()
            all.append(contentsOf: (UInt32(0)..<0x110000).compactMap(Unicode.Scalar.init))
            let text = String(all)
            var matched = Set<UInt32>()
            for match in text.matches(of: regex) { for scalar in text.unicodeScalars[match.range] { matched.insert(scalar.value) } }
            for scalar in all { compare(scalar.value, swift: matched.contains(scalar.value)) }
        }
        if extra.isEmpty && missing.isEmpty { return swiftName }
        let subtracted = extra.isEmpty ? swiftName : "[\(swiftName)--[\(members(extra))]]"
        return "[\(subtracted)\(members(missing))]"
    }

    /// The general category of every code point as Swift sees it (the bit index of `categoryBit`; surrogates none).
    private static let swiftCategories: [UInt8] = (UInt32(0)..<0x110000).map { value in
        Unicode.Scalar(value).map { categoryBit($0.properties.generalCategory) } ?? 31
    }

    private static func categoryBit(_ category: Unicode.GeneralCategory) -> UInt8 {
        switch category {
        case .uppercaseLetter: 0
        case .lowercaseLetter: 1
        case .titlecaseLetter: 2
        case .modifierLetter: 3
        case .otherLetter: 4
        case .nonspacingMark, .spacingMark, .enclosingMark: 5
        case .decimalNumber, .letterNumber, .otherNumber: 6
        case .connectorPunctuation, .dashPunctuation, .openPunctuation, .closePunctuation, .initialPunctuation,
             .finalPunctuation, .otherPunctuation: 7
        case .mathSymbol, .currencySymbol, .modifierSymbol, .otherSymbol: 8
        default: 9
        }
    }

    /// Swift's classes as sets of `categoryBit`s.
    private static let categoryMasks: [String: UInt32] = [
        #"\p{L}"#: 0b11111, #"\p{Lu}"#: 1 << 0, #"\p{Ll}"#: 1 << 1, #"\p{Lt}"#: 1 << 2, #"\p{Lm}"#: 1 << 3,
        #"\p{Lo}"#: 1 << 4, #"\p{M}"#: 1 << 5, #"\p{N}"#: 1 << 6, #"\p{P}"#: 1 << 7, #"\p{S}"#: 1 << 8,
    ]

    /// Class members for the code points, in order: runs as ranges, except that a code point that is not its own
    /// NFC form (U+212A KELVIN SIGN) stands alone, as Swift's regex parser refuses it as a range bound.
    private static func members(_ values: [UInt32]) -> String {
        // Full_Composition_Exclusion: the code points NFC never leaves as they are (NFC_Quick_Check = No).
        func isOwnNFC(_ value: UInt32) -> Bool { !Unicode.Scalar(value)!.properties.isFullCompositionExclusion }
        func escaped(_ value: UInt32) -> String { "\\u{" + String(value, radix: 16, uppercase: true) + "}" }
        var out = ""
        var index = 0
        while index < values.count {
            var end = index
            if isOwnNFC(values[index]) {
                while end + 1 < values.count && values[end + 1] == values[end] + 1 && isOwnNFC(values[end + 1]) { end += 1 }
            }
            out += end > index ? escaped(values[index]) + "-" + escaped(values[end]) : escaped(values[index])
            index = end + 1
        }
        return out
    }
}

/// Sorted, disjoint code point ranges, searched by bisection.
struct ScalarRanges: Sendable {
    private let lower: [UInt32]
    private let upper: [UInt32]

    init(_ ranges: [ClosedRange<UInt32>]) {
        lower = ranges.map(\.lowerBound)
        upper = ranges.map(\.upperBound)
    }

    func contains(_ value: UInt32) -> Bool {
        // The last range starting at or before value.
        var low = 0, high = lower.count
        while low < high {
            let middle = (low + high) / 2
            if lower[middle] <= value { low = middle + 1 } else { high = middle }
        }
        return low > 0 && value <= upper[low - 1]
    }
}
