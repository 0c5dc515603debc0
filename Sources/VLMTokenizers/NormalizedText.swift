/// Text being tokenized, with, for every scalar, the range of scalars of the original input it stands for — what
/// tokenizers' `NormalizedString` tracks in bytes, kept here in scalars because Python reports offsets in code points.
struct NormalizedText {
    var scalars: [Unicode.Scalar]
    var alignments: [Range<Int>]
    /// Where the text starts in the original input (tokenizers' `offsets_original().0`), whatever normalization did.
    let originalStart: Int

    /// Unchanged text whose first scalar sits at `start` in the original input.
    init(_ scalars: ArraySlice<Unicode.Scalar>, start: Int) {
        self.scalars = Array(scalars)
        alignments = (0..<scalars.count).map { start + $0 ..< start + $0 + 1 }
        originalStart = start
    }

    init(scalars: [Unicode.Scalar], alignments: [Range<Int>], originalStart: Int) {
        self.scalars = scalars
        self.alignments = alignments
        self.originalStart = originalStart
    }

    var isEmpty: Bool { scalars.isEmpty }

    /// The original range a range of this text covers: from the first scalar's start to the last one's end.
    func originalRange(_ range: Range<Int>) -> Range<Int> {
        if range.isEmpty || range.upperBound > alignments.count { return originalStart..<originalStart }
        let lower = alignments[range.lowerBound].lowerBound
        return lower..<max(lower, alignments[range.upperBound - 1].upperBound)
    }

    func slice(_ range: Range<Int>) -> NormalizedText {
        NormalizedText(scalars: Array(scalars[range]), alignments: Array(alignments[range]),
                       originalStart: range.isEmpty ? originalStart : alignments[range.lowerBound].lowerBound)
    }

    /// Replaces the whole text as tokenizers' `NormalizedString::transform` does: each new scalar comes with a change
    /// (0: replaces the next old scalar, > 0: inserted and aligned with the previous old scalar, < 0: replaces the
    /// next old scalar and removes that many after it); `initialOffset` old scalars are removed first.
    mutating func transform(_ changes: [(Unicode.Scalar, Int)], initialOffset: Int = 0) {
        var newScalars: [Unicode.Scalar] = []
        var newAlignments: [Range<Int>] = []
        newScalars.reserveCapacity(changes.count)
        newAlignments.reserveCapacity(changes.count)
        var offset = initialOffset
        let empty = originalStart..<originalStart
        for (scalar, change) in changes {
            let alignment: Range<Int>
            if change > 0 {
                alignment = offset >= 1 && offset - 1 < alignments.count ? alignments[offset - 1] : empty
            } else {
                alignment = offset < alignments.count ? alignments[offset] : (alignments.last ?? empty)
                offset += 1 - change
            }
            newScalars.append(scalar)
            newAlignments.append(alignment)
        }
        scalars = newScalars
        alignments = newAlignments
    }

    /// Keeps the scalars `keep` accepts, each with its own alignment (tokenizers' `filter`).
    mutating func filter(_ keep: (Unicode.Scalar) -> Bool) {
        guard let firstDropped = scalars.firstIndex(where: { !keep($0) }) else { return }
        var newScalars = Array(scalars[..<firstDropped])
        var newAlignments = Array(alignments[..<firstDropped])
        for (scalar, alignment) in zip(scalars[(firstDropped + 1)...], alignments[(firstDropped + 1)...]) where keep(scalar) {
            newScalars.append(scalar)
            newAlignments.append(alignment)
        }
        scalars = newScalars
        alignments = newAlignments
    }

    /// Maps each scalar to zero or more scalars, which `map` appends to its second argument: the first inherits the
    /// old scalar's alignment, the others are insertions.
    mutating func flatMap(_ map: (Unicode.Scalar, inout [Unicode.Scalar]) -> Void) {
        var newScalars: [Unicode.Scalar] = []
        var newAlignments: [Range<Int>] = []
        newScalars.reserveCapacity(scalars.count)
        newAlignments.reserveCapacity(scalars.count)
        for (scalar, alignment) in zip(scalars, alignments) {
            let before = newScalars.count
            map(scalar, &newScalars)
            for _ in before..<newScalars.count { newAlignments.append(alignment) }
        }
        scalars = newScalars
        alignments = newAlignments
    }

    /// Replaces each scalar with one scalar, alignments unchanged.
    mutating func map(_ transform: (Unicode.Scalar) -> Unicode.Scalar) {
        for index in scalars.indices { scalars[index] = transform(scalars[index]) }
    }

    /// Inserts `prefix` before the first scalar, aligned with it (tokenizers' `prepend`).
    mutating func prepend(_ prefix: [Unicode.Scalar]) {
        guard let first = alignments.first, !prefix.isEmpty else { return }
        scalars.insert(contentsOf: prefix, at: 0)
        alignments.insert(contentsOf: repeatElement(first, count: prefix.count), at: 0)
    }

    /// Replaces each match with `content`, aligned with the match's last scalar (tokenizers' `replace`).
    mutating func replace(_ matches: [Range<Int>], with content: [Unicode.Scalar]) {
        if matches.isEmpty { return }
        var newScalars: [Unicode.Scalar] = []
        var newAlignments: [Range<Int>] = []
        newScalars.reserveCapacity(scalars.count)
        newAlignments.reserveCapacity(scalars.count)
        var previous = 0
        for match in matches {
            newScalars.append(contentsOf: scalars[previous..<match.lowerBound])
            newAlignments.append(contentsOf: alignments[previous..<match.lowerBound])
            newScalars.append(contentsOf: content)
            newAlignments.append(contentsOf: repeatElement(alignments[match.upperBound - 1], count: content.count))
            previous = match.upperBound
        }
        newScalars.append(contentsOf: scalars[previous...])
        newAlignments.append(contentsOf: alignments[previous...])
        scalars = newScalars
        alignments = newAlignments
    }
}
