/// A token matched in the raw text before the model sees it (tokenizer.json's `added_tokens`).
struct AddedToken: Sendable {
    let id: Int
    let content: String
    let singleWord: Bool
    let leftStrip: Bool
    let rightStrip: Bool
    /// Matched in the normalized text rather than the raw text.
    let normalized: Bool
    /// Dropped by `decode(_:skipSpecialTokens: true)`.
    let special: Bool

    init(id: Int, content: String, singleWord: Bool = false, leftStrip: Bool = false, rightStrip: Bool = false,
         normalized: Bool, special: Bool) {
        self.id = id
        self.content = content
        self.singleWord = singleWord
        self.leftStrip = leftStrip
        self.rightStrip = rightStrip
        self.normalized = normalized
        self.special = special
    }

    init(_ object: JSONObject, id: Int) throws {
        let special = try object.bool("special", default: false)
        self.init(id: id, content: try object.string("content"),
                  singleWord: try object.bool("single_word", default: false),
                  leftStrip: try object.bool("lstrip", default: false),
                  rightStrip: try object.bool("rstrip", default: false),
                  normalized: try object.bool("normalized", default: !special), special: special)
    }
}

/// A piece of the input: either plain text still to tokenize, or an added token (with the text it covered).
enum Segment {
    case text(Range<Int>)
    case token(id: Int, range: Range<Int>)
}

/// Finds added tokens as tokenizers does: leftmost-longest matches, then `single_word`, `lstrip` and `rstrip`.
struct AddedTokenMatcher: Sendable {
    private struct Candidate: Sendable {
        let scalars: [Unicode.Scalar]
        let token: AddedToken
    }

    /// Candidates by first scalar, longest first.
    private let candidates: [Unicode.Scalar: [Candidate]]

    init(_ tokens: [(scalars: [Unicode.Scalar], token: AddedToken)]) {
        var candidates: [Unicode.Scalar: [Candidate]] = [:]
        for (scalars, token) in tokens where !scalars.isEmpty {
            candidates[scalars[0], default: []].append(Candidate(scalars: scalars, token: token))
        }
        // Stable for equal lengths: the first token listed wins, as in tokenizers' trie.
        self.candidates = candidates.mapValues { list in
            list.enumerated().sorted { ($0.element.scalars.count, -$0.offset) > ($1.element.scalars.count, -$1.offset) }.map(\.element)
        }
    }

    var isEmpty: Bool { candidates.isEmpty }

    private func longestMatch(in text: ArraySlice<Unicode.Scalar>, at position: Int) -> Candidate? {
        guard let list = candidates[text[position]] else { return nil }
        return list.first { candidate in
            position + candidate.scalars.count <= text.endIndex
                && text[position..<position + candidate.scalars.count].elementsEqual(candidate.scalars)
        }
    }

    /// Splits `text` (whose indices are its own) into added tokens and the text between them.
    func split(_ text: ArraySlice<Unicode.Scalar>, start: Int) -> [Segment] {
        if isEmpty || text.isEmpty { return text.isEmpty ? [] : [.text(text.indices)] }
        var segments: [Segment] = []
        var segmentStart = text.startIndex
        var position = text.startIndex
        while position < text.endIndex {
            guard let match = longestMatch(in: text, at: position) else { position += 1; continue }
            var start = position
            var stop = position + match.scalars.count
            position = stop
            let token = match.token
            if token.singleWord {
                let startsWord = start == text.startIndex || !text[start - 1].isRegexWordCharacter
                let endsWord = stop == text.endIndex || !text[stop].isRegexWordCharacter
                if !startsWord || !endsWord { continue }
            }
            if token.leftStrip {
                while start > segmentStart && text[start - 1].isRegexWhitespace { start -= 1 }
            }
            if token.rightStrip {
                while stop < text.endIndex && text[stop].isRegexWhitespace { stop += 1 }
                position = stop
            }
            if segmentStart < start { segments.append(.text(segmentStart..<start)) }
            segments.append(.token(id: token.id, range: start..<stop))
            segmentStart = stop
        }
        if segmentStart < text.endIndex { segments.append(.text(segmentStart..<text.endIndex)) }
        return segments
    }
}
