/// A pattern that cannot be compiled, or a match that would cost too much.
package struct PythonRegexError: Error, CustomStringConvertible, Equatable {
    /// One line naming the pattern and the problem.
    package var description: String

    init(pattern: String, problem: String) {
        description = "regex \(Self.quoted(pattern)): \(problem)"
    }

    static func budgetExceeded(_ pattern: String, steps: Int) -> PythonRegexError {
        PythonRegexError(pattern: pattern, problem: "too costly for the text (gave up after \(steps) backtracking steps)")
    }

    /// The pattern on one line (control characters escaped) and at most 200 characters long.
    private static func quoted(_ pattern: String) -> String {
        var text = "'"
        for (offset, scalar) in pattern.unicodeScalars.enumerated() {
            if offset == 200 {
                text += "…"
                break
            }
            switch scalar {
            case "\n": text += "\\n"
            case "\r": text += "\\r"
            case "\t": text += "\\t"
            case _ where scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar == "\u{2028}" || scalar == "\u{2029}":
                text += "\\u{\(String(scalar.value, radix: 16))}"
            default: text.unicodeScalars.append(scalar)
            }
        }
        return text + "'"
    }
}

/// A compiled pattern with the semantics of Python's `regex` module (the one transformers imports as `re`), for
/// `str` patterns in its default VERSION0 mode, over texts given as Unicode scalars (offsets are scalar indexes,
/// which are Python `str` indexes).
///
/// Supported: literals and the escapes `\a \f \n \r \t \v \xhh \uhhhh \Uhhhhhhhh \0 \ooo` and escaped
/// punctuation; sets `[…]` with ranges, negation and class escapes; `.`; `\d \D \s \S \w \W` (Unicode, as the
/// module defines them) and `\p{…}`/`\P{…}` for general categories; `^ $ \A \Z \z \b \B`; capturing, named
/// (`(?P<n>…)`, `(?<n>…)`), non-capturing and atomic groups; alternation; greedy, lazy and possessive `* + ? {n}
/// {n,} {,m} {n,m}`; lookahead and lookbehind (of any width, matched right to left as the module does);
/// back-references `\1`, `(?P=n)`, `\g<n>`; comments `(?#…)`; the inline flags `i m s u`, global or scoped.
/// Refused with an error naming the construct: `(?x)`, `(?a)`, `(?L)` and the module's other flags, fuzzy
/// matching, conditionals, recursion and group calls, branch reset, `(*VERB)`s, `\G \K \X \m \M \h \R \N`, POSIX
/// classes, properties other than general categories, counts above 100 000, and nesting deeper than 100.
///
/// Partial matching (`search(_:from:partial:)` with `partial: true`) follows the module, rules found by experiment
/// (oracle/python_regex.py records them; the module's C matcher decides some of them by its optimisations):
/// - It first searches for a complete match from `pos`; only when there is none anywhere does it search again for a
///   partial one. So a complete match wins even when it starts after a possible partial one (`abc|b` in "ab" finds
///   "b" at 1), and a complete match that ends at the end of the text is complete even if more text could extend it
///   (`ab|abc` in "ab").
/// - The partial search tries start positions left to right; an attempt becomes a partial match the first time, in
///   backtracking order, it needs a character past the end: a literal or set at the end, a greedy repeat that runs
///   into the end short of its maximum, a back-reference cut short, a lookahead (even a negative one) reading past the
///   end. Zero-width checks never ask for more text (`$`, `\Z`, `\b` hold or fail as at a real end) and lookbehinds
///   never read past it.
/// - A partial match spans from its start to the end of the text; groups closed by then keep their spans, groups still
///   open are unset.
/// - A lazy single-character repeat followed by a literal looks ahead for the literal, as the module does: before a
///   one-character literal the attempt is partial as soon as one more character would reach the end (without checking
///   that character: `a*?b` in "aac" is partial from 0); before a longer literal it is partial as soon as the literal
///   does not occur again within reach (`.*?ab` in "c\nd" is partial from 0 even without DOTALL); before a set or
///   class it is partial when that item would start at the end. The groups around the repeat are still open then.
///   The module's optimiser first turns alternations of single characters into sets and takes a literal prefix shared
///   by all branches out in front (`(?:</a>|</b>)` is `</(?:a>|b>)`), which decides what counts as the literal.
/// - Where the module searches for a first character, start positions whose character cannot begin a match are
///   skipped, and if that search runs off the end of the text, the answer is an empty partial match at the end: for
///   patterns that always start (past zero-width items) with a literal, set or class, like `\b</a>` or `(?<=x)a`,
///   and for patterns that start with an assertion holding at the end. Otherwise a partial search that finds nothing
///   answers nil, as does one for a pattern anchored by `^`/`\A` in every branch (which only tries the start).
/// - After a failed attempt of a pattern that starts with a character repeat, the search skips the characters that
///   repeat took (as the module does).
///
/// Known differences (python-regex.json's `divergences`): for patterns that start with zero-width items only, or
/// with a DOTALL `.` searched from the end of the text, the module may answer nil where this engine answers an
/// empty partial match at the end or the other way round (both mean nothing is pending); some group spans of partial
/// matches with nested lazy repeats; group spans after empty iterations of bounded repeats; two module bugs (`.+?`
/// from the end of the text returning an impossible span). Texts are searched with a step budget
/// (`stepBudget`): where the module would backtrack exponentially or quadratically for a long time, this engine
/// throws instead.
package struct PythonRegex: Sendable {
    /// Backtracking steps one call may take before it gives up with an error.
    package static let stepBudget = 10_000_000

    package let pattern: String
    /// Named groups → group number (Python's `groupindex`).
    package let groupIndex: [String: Int]
    package let groupCount: Int
    private let program: PythonRegexProgram

    package init(_ pattern: String, dotAll: Bool = false) throws(PythonRegexError) {
        var parser = PythonRegexParser(pattern)
        let tree = try parser.parse(dotAll: dotAll)
        self.pattern = pattern
        groupIndex = parser.groupNames
        groupCount = parser.groupCount
        program = PythonRegexProgram(tree)
    }

    /// `regex.search(text, pos, partial=partial)`. A `pos` past the end searches at the end; a negative one counts
    /// from the end, as the module does.
    package func search(_ text: [Unicode.Scalar], from pos: Int = 0, partial: Bool = false) throws(PythonRegexError) -> PythonRegexMatch? {
        let start = Self.clamped(pos, count: text.count)
        return try withMatcher(text) { (matcher: inout PythonRegexMatcher) throws(PythonRegexError) in
            if let match = try find(&matcher, from: start) { return match }
            guard partial else { return nil }
            matcher.allowsPartial = true
            return try find(&matcher, from: start)
        }
    }

    /// `regex.fullmatch(text)`.
    package func fullMatch(_ text: [Unicode.Scalar]) throws(PythonRegexError) -> PythonRegexMatch? {
        try withMatcher(text) { (matcher: inout PythonRegexMatcher) throws(PythonRegexError) in
            matcher.mustReachEnd = true
            guard case .matched = try matcher.attempt(at: 0) else { return nil }
            return match(matcher, partial: false)
        }
    }

    /// `regex.finditer(text, pos)`: the non-overlapping matches left to right. After an empty match the next one may
    /// start at the same position but must not be empty there.
    package func matches(in text: [Unicode.Scalar], from pos: Int = 0) throws(PythonRegexError) -> [PythonRegexMatch] {
        var position = Self.clamped(pos, count: text.count)
        return try withMatcher(text) { (matcher: inout PythonRegexMatcher) throws(PythonRegexError) in
            var found: [PythonRegexMatch] = []
            while position <= text.count, let match = try find(&matcher, from: position) {
                found.append(match)
                position = match.range.upperBound
                matcher.forbiddenEmptyMatch = match.range.isEmpty ? position : nil
            }
            return found
        }
    }

    /// `regex.sub(pattern, template, text)`: every match of `matches(in:)` replaced by the template, in which `\1`,
    /// `\g<1>` and `\g<name>` stand for groups (empty when unset) and `\n`-style escapes for characters.
    package func substitute(in text: [Unicode.Scalar], template: String) throws(PythonRegexError) -> [Unicode.Scalar] {
        let replacement = try PythonRegexTemplate(template, for: self)
        let found = try matches(in: text)
        if let group = replacement.missingGroup, !found.isEmpty {
            throw PythonRegexError(pattern: pattern, problem: "replacement template refers to missing group \(group)")
        }
        var result: [Unicode.Scalar] = []
        var copied = 0
        for match in found {
            result += text[copied..<match.range.lowerBound]
            result += replacement.expand(match, in: text)
            copied = match.range.upperBound
        }
        return result + text[copied...]
    }

    /// The pattern text that matches `literal` exactly, as `regex.escape(literal)` writes it.
    package static func escape(_ literal: String) -> String {
        var pattern = ""
        for scalar in literal.unicodeScalars {
            if "()[]{}?*+|^$\\.-#&~".unicodeScalars.contains(scalar) || isPythonSpace(scalar) {
                pattern += "\\"
            }
            pattern.unicodeScalars.append(scalar)
        }
        return pattern
    }

    /// Python's `str.isspace()`: White_Space and the information separators U+001C...U+001F.
    private static func isPythonSpace(_ scalar: Unicode.Scalar) -> Bool {
        scalar.properties.isWhitespace || (0x1C...0x1F).contains(scalar.value)
    }

    private static func clamped(_ pos: Int, count: Int) -> Int {
        pos < 0 ? max(0, count + pos) : min(pos, count)
    }

    private func withMatcher<Result>(_ text: [Unicode.Scalar],
                                     _ body: (inout PythonRegexMatcher) throws(PythonRegexError) -> Result) throws(PythonRegexError) -> Result {
        let outcome: Swift.Result<Result, PythonRegexError> = text.withUnsafeBufferPointer { buffer in
            var matcher = PythonRegexMatcher(program: program, groupCount: groupCount, text: buffer,
                                             pattern: pattern, budget: Self.stepBudget)
            do throws(PythonRegexError) {
                return .success(try body(&matcher))
            } catch {
                return .failure(error)
            }
        }
        return try outcome.get()
    }

    /// The first match from `start`, trying start positions left to right. A partial search that finds nothing
    /// may report an empty partial match at the end of the text, as the module does when its search for a starting
    /// character runs off the end.
    private func find(_ matcher: inout PythonRegexMatcher, from start: Int) throws(PythonRegexError) -> PythonRegexMatch? {
        let plan = program.plan
        let count = matcher.textCount
        let partial = matcher.allowsPartial
        if plan.anchoredAtStart {
            guard start == 0 else { return nil }
            switch try matcher.attempt(at: 0) {
            case .matched: return match(matcher, partial: false)
            case .partial: return match(matcher, partial: true, start: 0)
            case .failed: return nil
            }
        }
        let skipping = partial && !plan.filtersPartialSearch ? nil : plan.firstCharacters
        var position = start
        while position <= count {
            if position == count, partial, plan.usesFirstSet { break }
            if let skipping, position < count, !skipping.contains(where: { $0.matches(matcher.scalar(at: position)) }) {
                position += 1
                continue
            }
            switch try matcher.attempt(at: position) {
            case .matched: return match(matcher, partial: false)
            case .partial: return match(matcher, partial: true, start: position)
            case .failed: position = matcher.nextStart(afterFailureAt: position)
            }
        }
        guard partial, plan.reportsPartialAtEnd || plan.startAssertion.map({ matcher.holds($0, at: count) }) == true else {
            return nil
        }
        return PythonRegexMatch(range: count..<count, partial: true, groups: Array(repeating: nil, count: groupCount),
                                groupIndex: groupIndex)
    }

    private func match(_ matcher: borrowing PythonRegexMatcher, partial: Bool, start: Int? = nil) -> PythonRegexMatch {
        let spans = matcher.spans
        let range = start.map { $0..<matcher.textCount } ?? spans[0]..<spans[1]
        let groups = (0..<groupCount).map { index -> Range<Int>? in
            let group = index + 1
            return spans[2 * group] < 0 ? nil : spans[2 * group]..<spans[2 * group + 1]
        }
        return PythonRegexMatch(range: range, partial: partial, groups: groups, groupIndex: groupIndex)
    }
}

/// One match: a complete one, or (from a partial search) the start of a possible match that the text ends inside.
package struct PythonRegexMatch: Sendable, Equatable {
    package let range: Range<Int>
    package let partial: Bool
    /// Spans of groups 1...groupCount, nil where the group did not take part.
    package let groups: [Range<Int>?]
    private let groupIndex: [String: Int]

    init(range: Range<Int>, partial: Bool, groups: [Range<Int>?], groupIndex: [String: Int]) {
        self.range = range
        self.partial = partial
        self.groups = groups
        self.groupIndex = groupIndex
    }

    /// `groupdict()` restricted to groups that matched: name → span.
    package func named(_ name: String) -> Range<Int>? {
        groupIndex[name].flatMap { groups[$0 - 1] }
    }
}
