/// Something that finds the non-overlapping, leftmost-first matches in a text, as scalar offset ranges.
protocol Pattern: Sendable {
    func matches(in text: [Unicode.Scalar]) -> [Range<Int>]
}

/// A literal string (tokenizer.json's `{"String": ...}` patterns).
struct LiteralPattern: Pattern {
    let literal: [Unicode.Scalar]

    func matches(in text: [Unicode.Scalar]) -> [Range<Int>] {
        guard !literal.isEmpty, text.count >= literal.count else { return [] }
        var result: [Range<Int>] = []
        var start = 0
        while start + literal.count <= text.count {
            if text[start] == literal[0] && text[start..<start + literal.count].elementsEqual(literal) {
                result.append(start..<start + literal.count)
                start += literal.count
            } else {
                start += 1
            }
        }
        return result
    }
}

/// A hand-compiled form of the regexes that CLIP, GPT-2 and most byte-level tokenizers use: an ordered alternation of
/// literals and character-class runs, matched with the same leftmost-first semantics as Oniguruma, without a regex
/// engine in the hot path. `RegexPattern` is the general fallback; the tests check that both agree.
struct AlternationPattern: Pattern {
    enum CharacterClass: Sendable {
        case letter, number, whitespace
        /// `[^\s\p{L}\p{N}]`
        case other

        /// Whether a scalar of the given `kind` (see `AlternationPattern.kind`) is in the class.
        func contains(kind: UInt8) -> Bool {
            switch self {
            case .letter: kind == AlternationPattern.letterKind
            case .number: kind == AlternationPattern.numberKind
            case .whitespace: kind == AlternationPattern.whitespaceKind
            case .other: kind == 0
            }
        }
    }

    fileprivate static let letterKind: UInt8 = 1, numberKind: UInt8 = 2, whitespaceKind: UInt8 = 3
    private static let asciiKinds: [UInt8] = (0..<128).map { kind(Unicode.Scalar(UInt8($0))) }

    /// Which of the classes a scalar is in, as Oniguruma's `\p{L}` and `\p{N}` (0: none, "other").
    private static func kind(_ scalar: Unicode.Scalar) -> UInt8 {
        if scalar.isRegexWhitespace { return whitespaceKind }
        if OnigurumaClasses.letters.contains(scalar.value) { return letterKind }
        if OnigurumaClasses.numbers.contains(scalar.value) { return numberKind }
        return 0
    }

    enum Alternative: Sendable {
        case literal([Unicode.Scalar])
        /// `X`, `X+`, ` ?X` or ` ?X+`.
        case run(CharacterClass, repeated: Bool, optionalSpace: Bool)
        /// `\s+(?!\S)`: a whitespace run that is not followed by a non-space, backing off one character if needed.
        case whitespaceNotBeforeNonSpace
    }

    let alternatives: [Alternative]

    /// The alternations of the regexes this type compiles, keyed by their exact source text.
    static func known(_ regex: String) -> AlternationPattern? {
        let contractions: [Alternative] = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"].map { .literal(Array($0.unicodeScalars)) }
        switch regex {
        case #"\s+"#:
            return AlternationPattern(alternatives: [.run(.whitespace, repeated: true, optionalSpace: false)])
        case #"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"#:
            return AlternationPattern(alternatives: contractions + [
                .run(.letter, repeated: true, optionalSpace: true),
                .run(.number, repeated: true, optionalSpace: true),
                .run(.other, repeated: true, optionalSpace: true),
                .whitespaceNotBeforeNonSpace,
                .run(.whitespace, repeated: true, optionalSpace: false),
            ])
        case #"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"#:
            return AlternationPattern(alternatives: [
                .literal(Array("<|startoftext|>".unicodeScalars)), .literal(Array("<|endoftext|>".unicodeScalars)),
            ] + contractions + [
                .run(.letter, repeated: true, optionalSpace: false),
                .run(.number, repeated: false, optionalSpace: false),
                .run(.other, repeated: true, optionalSpace: false),
            ])
        default:
            return nil
        }
    }

    func matches(in text: [Unicode.Scalar]) -> [Range<Int>] {
        var result: [Range<Int>] = []
        let kinds = text.map { $0.value < 0x80 ? Self.asciiKinds[Int($0.value)] : Self.kind($0) }
        var position = 0
        while position < text.count {
            if let end = matchEnd(in: text, kinds: kinds, at: position) {
                result.append(position..<end)
                position = end
            } else {
                position += 1
            }
        }
        return result
    }

    /// The end of the first alternative that matches at `start`; none of them can match empty.
    private func matchEnd(in text: [Unicode.Scalar], kinds: [UInt8], at start: Int) -> Int? {
        for alternative in alternatives {
            switch alternative {
            case let .literal(literal):
                if start + literal.count <= text.count && text[start..<start + literal.count].elementsEqual(literal) {
                    return start + literal.count
                }
            case let .run(characterClass, repeated, optionalSpace):
                var first = start
                if optionalSpace && text[start] == " " && start + 1 < text.count && characterClass.contains(kind: kinds[start + 1]) {
                    first = start + 1
                }
                guard characterClass.contains(kind: kinds[first]) else { continue }
                var end = first + 1
                if repeated {
                    while end < text.count && characterClass.contains(kind: kinds[end]) { end += 1 }
                }
                return end
            case .whitespaceNotBeforeNonSpace:
                guard kinds[start] == Self.whitespaceKind else { continue }
                var end = start + 1
                while end < text.count && kinds[end] == Self.whitespaceKind { end += 1 }
                if end == text.count { return end }
                if end - 1 > start { return end - 1 }
            }
        }
        return nil
    }
}

/// Any other regex, run by Swift's regex engine on Unicode scalars (never on grapheme clusters, which would glue
/// combining marks and emoji sequences together where Oniguruma sees separate characters), with its Unicode classes
/// as Oniguruma's (`OnigurumaClasses`).
struct RegexPattern: Pattern, @unchecked Sendable {
    // Regex is an immutable value, but not declared Sendable.
    let regex: Regex<AnyRegexOutput>

    init(_ source: String, file: String) throws {
        do {
            regex = try Regex(OnigurumaClasses.rewrite(source)).matchingSemantics(.unicodeScalar)
        } catch {
            throw TokenizerError.invalidRegex(file: file, pattern: source, reason: "\(error)")
        }
    }

    func matches(in text: [Unicode.Scalar]) -> [Range<Int>] {
        var string = String.UnicodeScalarView()
        string.append(contentsOf: text)
        let view = String(string)
        // Offsets are counted on the scalar view while walking matches in order.
        var result: [Range<Int>] = []
        var offset = 0
        var index = view.unicodeScalars.startIndex
        for match in view.matches(of: regex) where !match.range.isEmpty {
            let lower = offset + view.unicodeScalars.distance(from: index, to: match.range.lowerBound)
            let upper = lower + view.unicodeScalars.distance(from: match.range.lowerBound, to: match.range.upperBound)
            result.append(lower..<upper)
            offset = upper
            index = match.range.upperBound
        }
        return result
    }
}

/// Every scalar a predicate accepts, each one a match of its own (tokenizers' `char` patterns).
struct ScalarPattern: Pattern {
    let accepts: @Sendable (Unicode.Scalar) -> Bool

    func matches(in text: [Unicode.Scalar]) -> [Range<Int>] {
        text.indices.filter { accepts(text[$0]) }.map { $0..<$0 + 1 }
    }
}

/// `\w+|[^\w\s]+`, the Whitespace pre-tokenizer's regex: runs of word characters and runs of other non-spaces.
struct WordOrSymbolRunsPattern: Pattern {
    func matches(in text: [Unicode.Scalar]) -> [Range<Int>] {
        var result: [Range<Int>] = []
        var position = 0
        while position < text.count {
            let scalar = text[position]
            if scalar.isRegexWhitespace && !scalar.isRegexWordCharacter { position += 1; continue }
            let isWord = scalar.isRegexWordCharacter
            var end = position + 1
            while end < text.count && text[end].isRegexWordCharacter == isWord && (isWord || !text[end].isRegexWhitespace) {
                end += 1
            }
            result.append(position..<end)
            position = end
        }
        return result
    }
}

/// Builds the pattern of a tokenizer.json `{"String": ...}` or `{"Regex": ...}` object.
func makePattern(_ object: JSONObject) throws -> any Pattern {
    if let literal = try object.optionalString("String") {
        return LiteralPattern(literal: Array(literal.unicodeScalars))
    }
    if let source = try object.optionalString("Regex") {
        return try AlternationPattern.known(source) ?? RegexPattern(source, file: object.file)
    }
    throw object.invalid("String", "a pattern needs \"String\" or \"Regex\"")
}

/// What a split does with the pieces a pattern matched (tokenizers' `SplitDelimiterBehavior`).
enum SplitBehavior: String, Sendable {
    case removed = "Removed"
    case isolated = "Isolated"
    case mergedWithPrevious = "MergedWithPrevious"
    case mergedWithNext = "MergedWithNext"
    case contiguous = "Contiguous"

    /// Splits `text` at the matches of `pattern` (or, inverted, at what lies between them); never yields empty pieces.
    func split(_ text: [Unicode.Scalar], by pattern: any Pattern, invert: Bool = false) -> [Range<Int>] {
        split(count: text.count, matches: pattern.matches(in: text), invert: invert)
    }

    func split(count: Int, matches: [Range<Int>], invert: Bool = false) -> [Range<Int>] {
        var spans: [(range: Range<Int>, isMatch: Bool)] = []
        var previous = 0
        for match in matches {
            if previous < match.lowerBound { spans.append((previous..<match.lowerBound, invert)) }
            spans.append((match, !invert))
            previous = match.upperBound
        }
        if previous < count { spans.append((previous..<count, invert)) }

        var pieces: [Range<Int>] = []
        var previousWasMatch = false
        switch self {
        case .removed:
            pieces = spans.filter { !$0.isMatch }.map(\.range)
        case .isolated:
            pieces = spans.map(\.range)
        case .mergedWithPrevious:
            // A match joins the piece before it, unless that piece is a match itself.
            for (range, isMatch) in spans {
                if isMatch && !previousWasMatch, let last = pieces.last {
                    pieces[pieces.count - 1] = last.lowerBound..<range.upperBound
                } else {
                    pieces.append(range)
                }
                previousWasMatch = isMatch
            }
        case .mergedWithNext:
            // A match joins the piece after it, unless that piece is a match itself.
            for (range, isMatch) in spans.reversed() {
                if isMatch && !previousWasMatch, let last = pieces.last {
                    pieces[pieces.count - 1] = range.lowerBound..<last.upperBound
                } else {
                    pieces.append(range)
                }
                previousWasMatch = isMatch
            }
            pieces.reverse()
        case .contiguous:
            for (range, isMatch) in spans {
                if isMatch == previousWasMatch, let last = pieces.last {
                    pieces[pieces.count - 1] = last.lowerBound..<range.upperBound
                } else {
                    pieces.append(range)
                }
                previousWasMatch = isMatch
            }
        }
        return pieces.filter { !$0.isEmpty }
    }
}
