/// Which start positions a search tries, and what a partial search that finds nothing reports: both as the `regex`
/// module decides them from the start of the pattern (its partial results depend on where its search for a
/// starting point looks, not only on the pattern's meaning).
struct PythonRegexSearchPlan: Sendable {
    /// Every branch starts with `^` or `\A` (looking into non-capturing groups and repeated groups that must match):
    /// only the start of the text is tried, and a partial search that fails there finds nothing at all.
    let anchoredAtStart: Bool
    /// When every match reads a first character, the tests one of which it passes: a complete search skips the
    /// positions where none does.
    let firstCharacters: [PythonRegexCharacterTest]?
    /// Whether a partial search may skip positions by `firstCharacters` too: only where the module searches for a
    /// first character (elsewhere it tries every position, and a lazy repeat may declare a partial match at one
    /// whose character fits nothing).
    let filtersPartialSearch: Bool
    /// The module searches for a first character from its "first set": a partial search that reaches the end of the
    /// text reports an empty partial match there without trying the pattern.
    let usesFirstSet: Bool
    /// A partial search that finds nothing reports an empty partial match at the end rather than no match: where the
    /// module's search for a first character runs off the end of the text.
    let reportsPartialAtEnd: Bool
    /// The assertion the pattern starts with, which the module searches for: a partial search that tried the end of
    /// the text because the assertion holds there, and failed, reports an empty partial match there.
    let startAssertion: PythonRegexAssertion?
    /// The pattern is optional items, none of which can begin with a character of the repeat without maximum that
    /// follows them (`(?:<\|model\|>)?[^<]*<\|text\|>`): after a complete attempt fails at a position holding one
    /// of the repeat's characters, each start inside that run of characters would try only what the failed attempt
    /// tried already (the repeat taking more), so a complete search goes on at the run's end.
    let runAfterOptionalItems: PythonRegexCharacterTest?

    init(_ tree: PythonRegexNode) {
        anchoredAtStart = Self.isAnchored(tree)
        let first = Self.firstSet(of: tree)
        firstCharacters = first.usableForSkipping && !first.canBeEmpty ? first.tests : nil
        let startsSimply = Self.startsWithCharacter(tree)
        usesFirstSet = !anchoredAtStart && !startsSimply && first.usableByModule && !first.canBeEmpty
        filtersPartialSearch = firstCharacters != nil && (usesFirstSet || startsSimply)
        reportsPartialAtEnd = !anchoredAtStart && (usesFirstSet || Self.startsWithLookbehindsThenAnyCharacter(tree))
        startAssertion = anchoredAtStart || usesFirstSet ? nil : Self.leadingAssertion(tree)
        runAfterOptionalItems = Self.runAfterOptionalItems(tree)
    }

    private static func runAfterOptionalItems(_ tree: PythonRegexNode) -> PythonRegexCharacterTest? {
        guard case let .sequence(items) = tree,
              let at = items.firstIndex(where: { if case .repetition(.character, _, nil, _) = $0 { true } else { false } }),
              at > 0, case let .repetition(.character(run), _, nil, _) = items[at] else { return nil }
        for item in items[..<at] {
            guard case let .repetition(body, 0, _, _) = item, isPlain(body) else { return nil }
            for test in firstSet(of: body).tests {
                let scalars: [UInt32]
                switch test {
                case let .scalar(scalar): scalars = [scalar]
                case let .caseless(cases): scalars = cases
                default: return nil
                }
                if scalars.contains(where: run.matches) { return nil }
            }
        }
        return run
    }

    /// Characters, sequences, alternations, groups and repeats: nothing whose matching depends on the text around it.
    private static func isPlain(_ node: PythonRegexNode) -> Bool {
        switch node {
        case .empty, .character: true
        case let .sequence(items), let .alternation(items): items.allSatisfy(isPlain)
        case let .capture(_, body), let .repetition(body, _, _, _): isPlain(body)
        case .assertion, .lookaround, .atomic, .backreference: false
        }
    }

    private static func leadingAssertion(_ node: PythonRegexNode) -> PythonRegexAssertion? {
        switch node {
        case let .assertion(assertion): assertion
        case let .sequence(items): items.first.flatMap(leadingAssertion)
        case let .capture(_, body): leadingAssertion(body)
        case let .repetition(body, min, _, _) where min > 0: leadingAssertion(body)
        default: nil
        }
    }

    private struct FirstSet {
        var tests: [PythonRegexCharacterTest] = []
        var canBeEmpty: Bool
        /// Sound for skipping start positions in a complete search.
        var usableForSkipping = true
        /// Also what the module would build: no `.`, no single negated character, no set of everything.
        var usableByModule = true
    }

    /// What a match of the node can start with, zero-width items (lookarounds included) being transparent, as the
    /// module's first set sees it.
    private static func firstSet(of node: PythonRegexNode) -> FirstSet {
        switch node {
        case .empty, .assertion:
            return FirstSet(canBeEmpty: true)
        case let .character(test):
            return FirstSet(tests: [test], canBeEmpty: false, usableByModule: isUsableByModule(test))
        case let .sequence(items):
            var combined = FirstSet(canBeEmpty: true)
            for item in items {
                let first = firstSet(of: item)
                combined.tests += first.tests
                combined.usableForSkipping = combined.usableForSkipping && first.usableForSkipping
                combined.usableByModule = combined.usableByModule && first.usableByModule
                if !first.canBeEmpty {
                    combined.canBeEmpty = false
                    break
                }
            }
            return combined
        case let .alternation(branches):
            var combined = FirstSet(canBeEmpty: false)
            for branch in branches {
                let first = firstSet(of: branch)
                combined.tests += first.tests
                combined.canBeEmpty = combined.canBeEmpty || first.canBeEmpty
                combined.usableForSkipping = combined.usableForSkipping && first.usableForSkipping
                combined.usableByModule = combined.usableByModule && first.usableByModule
            }
            return combined
        case let .capture(_, body), let .atomic(body):
            return firstSet(of: body)
        case let .repetition(body, min, max, _):
            guard max != 0 else { return FirstSet(canBeEmpty: true) }
            var first = firstSet(of: body)
            first.canBeEmpty = first.canBeEmpty || min == 0
            return first
        case .lookaround:
            return FirstSet(canBeEmpty: true)
        case .backreference:
            return FirstSet(canBeEmpty: false, usableForSkipping: false, usableByModule: false)
        }
    }

    private static func isUsableByModule(_ test: PythonRegexCharacterTest) -> Bool {
        switch test {
        case .any, .notNewline: return false
        case let .set(set): return !isSingleNegatedCharacter(set) && !matchesEverything(set)
        case let .anyOf(tests): return tests.allSatisfy(isUsableByModule)
        default: return true
        }
    }

    private static func isSingleNegatedCharacter(_ set: PythonRegexCharacterSet) -> Bool {
        set.negated && set.classes.isEmpty && set.ranges.count == 1 && set.ranges[0].count == 1
    }

    /// `[\s\S]` and the like, which the module treats as `.` under DOTALL.
    private static func matchesEverything(_ set: PythonRegexCharacterSet) -> Bool {
        guard !set.negated else { return false }
        return set.classes.contains { member in
            set.classes.contains { other in
                switch (member, other) {
                case let (.word(first), .word(second)), let (.digit(first), .digit(second)),
                     let (.space(first), .space(second)):
                    first != second
                case let (.categories(first, firstNegated), .categories(second, secondNegated)):
                    first == second && firstNegated != secondNegated
                default:
                    false
                }
            }
        }
    }

    private static func isAnchored(_ node: PythonRegexNode) -> Bool {
        switch node {
        case .assertion(.startOfText): true
        case let .sequence(items): items.first.map(isAnchored) ?? false
        case let .alternation(branches): branches.allSatisfy(isAnchored)
        case let .repetition(body, min, _, _): min > 0 && isAnchored(body)
        default: false
        }
    }

    /// The pattern starts by reading a character (the module then searches for that item itself).
    private static func startsWithCharacter(_ node: PythonRegexNode) -> Bool {
        switch node {
        case .character: true
        case let .sequence(items): items.first.map(startsWithCharacter) ?? false
        case let .capture(_, body), let .atomic(body): startsWithCharacter(body)
        default: false
        }
    }

    /// Lookbehinds followed by `.` (without DOTALL) or a single negated character, possibly in a group or repeated at
    /// least once: the module searches for that character past the lookbehinds.
    private static func startsWithLookbehindsThenAnyCharacter(_ tree: PythonRegexNode) -> Bool {
        guard case let .sequence(items) = tree, case .lookaround(_, behind: true, _)? = items.first else { return false }
        var next = items.first { item in
            if case .lookaround(_, behind: true, _) = item { return false }
            return true
        }
        while let node = next {
            switch node {
            case let .capture(_, body): next = body
            case let .repetition(body, min, _, _) where min > 0: next = body
            case let .sequence(inner): next = inner.first
            case .character(.notNewline): return true
            case let .character(.set(set)): return isSingleNegatedCharacter(set)
            default: return false
            }
        }
        return false
    }
}
