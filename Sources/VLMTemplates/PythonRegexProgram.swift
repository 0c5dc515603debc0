/// One step of a compiled pattern. Reading instructions come in two directions: lookbehind bodies are compiled
/// to run right to left from the lookbehind's position, as the `regex` module matches them (so their width may vary).
enum PythonRegexInstruction: Sendable {
    case character(PythonRegexCharacterTest, backward: Bool)
    /// Consecutive case-sensitive literals, read forward.
    case literal([UInt32])
    case repeatCharacter(PythonRegexCharacterRepeat)
    /// Try `preferred`; on failure, `alternative` from the same position.
    case split(preferred: Int, alternative: Int)
    case jump(Int)
    /// Where a capture group is entered (its end, when read backward).
    case captureOpen(Int)
    /// Where it is left: its span becomes the text between the two.
    case captureClose(Int)
    case assertion(PythonRegexAssertion)
    /// Resets the counter of a repeated group before its first iteration.
    case repeatStart(counter: Int)
    /// Decides between another iteration (the body follows) and `exit`.
    case repeatLoop(PythonRegexLoop)
    /// The body follows, up to `lookaroundEnd`; `exit` is the instruction after that.
    case lookaround(negative: Bool, exit: Int)
    case lookaroundEnd
    case atomicStart
    case atomicEnd
    case backreference(Int, caseless: Bool, backward: Bool)
    case succeed
}

/// A quantifier on a single-character item (`\s*`, `.*?`, `[^>\n]+`), run without one backtrack entry per character.
struct PythonRegexCharacterRepeat: Sendable {
    var test: PythonRegexCharacterTest
    var min: Int
    /// `Int.max` when unbounded.
    var max: Int
    var greedy: Bool
    var backward: Bool
    /// What the pattern goes on with (forward repeats only): the module's matcher looks at it when it backtracks
    /// into the repeat, which decides where partial matches are declared.
    var tail = PythonRegexRepeatTail.other
}

/// The first thing a character repeat is followed by, seen through group boundaries and into repeated groups that
/// must match at least once, as the `regex` module's matcher looks ahead (its "test node").
enum PythonRegexRepeatTail: Sendable {
    /// Literal characters (one test per character, case-insensitive ones included).
    case literal([PythonRegexCharacterTest])
    /// Another test that reads one character.
    case character
    /// Anything else: assertions, repeats, alternations, lookarounds, the end of the pattern.
    case other
}

/// A quantifier on anything longer than one character, counted in `counter`.
struct PythonRegexLoop: Sendable {
    var counter: Int
    var min: Int
    /// `Int.max` when unbounded.
    var max: Int
    var greedy: Bool
    var exit: Int
}

/// A pattern compiled for the matcher.
struct PythonRegexProgram: Sendable {
    private(set) var instructions: [PythonRegexInstruction] = []
    private(set) var counterCount = 0
    /// Where a search tries the program.
    let plan: PythonRegexSearchPlan

    init(_ parsed: PythonRegexNode) {
        let tree = Self.shapedLikeTheModule(parsed)
        plan = PythonRegexSearchPlan(tree)
        emit(tree, backward: false)
        instructions.append(.succeed)
        for index in instructions.indices {
            guard case var .repeatCharacter(repeated) = instructions[index], !repeated.backward else { continue }
            repeated.tail = tail(after: index)
            instructions[index] = .repeatCharacter(repeated)
        }
    }

    private mutating func emit(_ node: PythonRegexNode, backward: Bool) {
        // One small function per kind keeps the frames of this recursion (one per nesting level) small.
        switch node {
        case .empty: break
        case let .character(test): instructions.append(.character(test, backward: backward))
        case let .sequence(items): emitSequence(items, backward: backward)
        case let .alternation(branches): emitAlternation(branches, backward: backward)
        case let .capture(group, body): emitCapture(group, body, backward: backward)
        case let .repetition(body, min, max, mode):
            emitRepetition(body, min: min, max: max ?? Int.max, mode: mode, backward: backward)
        case let .assertion(assertion): instructions.append(.assertion(assertion))
        case let .lookaround(body, behind, negative): emitLookaround(body, behind: behind, negative: negative)
        case let .atomic(body): emitAtomic(body, backward: backward)
        case let .backreference(group, caseless):
            instructions.append(.backreference(group, caseless: caseless, backward: backward))
        }
    }

    /// Forward, runs of literal characters become one `literal`; backward, the items come in reverse.
    private mutating func emitSequence(_ items: [PythonRegexNode], backward: Bool) {
        guard !backward else {
            for item in items.reversed() { emit(item, backward: true) }
            return
        }
        var run: [UInt32] = []
        for item in items {
            if case let .character(.scalar(value)) = item {
                run.append(value)
                continue
            }
            flushLiteral(&run)
            emit(item, backward: false)
        }
        flushLiteral(&run)
    }

    private mutating func emitAlternation(_ branches: [PythonRegexNode], backward: Bool) {
        var jumpsToEnd: [Int] = []
        for branch in branches.dropLast() {
            let split = instructions.count
            instructions.append(.split(preferred: split + 1, alternative: -1))
            emit(branch, backward: backward)
            jumpsToEnd.append(instructions.count)
            instructions.append(.jump(-1))
            instructions[split] = .split(preferred: split + 1, alternative: instructions.count)
        }
        emit(branches[branches.count - 1], backward: backward)
        for jump in jumpsToEnd { instructions[jump] = .jump(instructions.count) }
    }

    private mutating func emitCapture(_ group: Int, _ body: PythonRegexNode, backward: Bool) {
        instructions.append(.captureOpen(group))
        emit(body, backward: backward)
        instructions.append(.captureClose(group))
    }

    private mutating func emitLookaround(_ body: PythonRegexNode, behind: Bool, negative: Bool) {
        let start = instructions.count
        instructions.append(.lookaround(negative: negative, exit: -1))
        emit(body, backward: behind)
        instructions.append(.lookaroundEnd)
        instructions[start] = .lookaround(negative: negative, exit: instructions.count)
    }

    private mutating func emitAtomic(_ body: PythonRegexNode, backward: Bool) {
        instructions.append(.atomicStart)
        emit(body, backward: backward)
        instructions.append(.atomicEnd)
    }

    /// The tree rewritten as the module's compiler rewrites alternations, without changing what matches: branches that
    /// are all single characters become one set, and the literal characters that start every branch are taken out in
    /// front. What follows a lazy repeat then looks the same to the matcher as to the module (see
    /// `PythonRegexRepeatTail`).
    private static func shapedLikeTheModule(_ node: PythonRegexNode) -> PythonRegexNode {
        switch node {
        case let .sequence(items):
            return .sequence(flattened(items.map(shapedLikeTheModule)))
        case let .alternation(branches):
            // Shaped after the branches, off the path of the recursion.
            return factored(branches.map(shapedLikeTheModule))
        case let .capture(group, body):
            return .capture(group, shapedLikeTheModule(body))
        case let .repetition(body, min, max, mode):
            return .repetition(shapedLikeTheModule(body), min: min, max: max, mode: mode)
        case let .lookaround(body, behind, negative):
            return .lookaround(shapedLikeTheModule(body), behind: behind, negative: negative)
        case let .atomic(body):
            return .atomic(shapedLikeTheModule(body))
        default:
            return node
        }
    }

    /// Shaped branches as one alternation, with their common literal prefix in front, or as one set when they are
    /// single characters.
    private static func factored(_ branches: [PythonRegexNode]) -> PythonRegexNode {
        let branchItems = branches.map { branch -> [PythonRegexNode] in
            switch branch {
            case .empty: []
            case let .sequence(items): items
            case let other: [other]
            }
        }
        var prefixLength = 0
        while let first = branchItems[0].dropFirst(prefixLength).first, let value = literalValue(first),
              branchItems.allSatisfy({ items in items.count > prefixLength && literalValue(items[prefixLength]) == value }) {
            prefixLength += 1
        }
        let rests = branchItems.map { Array($0.dropFirst(prefixLength)) }
        let singles = rests.compactMap { items -> PythonRegexCharacterTest? in
            if items.count == 1, case let .character(test) = items[0] { return test }
            return nil
        }
        let alternation: PythonRegexNode = singles.count == rests.count
            ? .character(.anyOf(singles))
            : .alternation(rests.map { $0.isEmpty ? .empty : $0.count == 1 ? $0[0] : .sequence($0) })
        return prefixLength == 0 ? alternation : .sequence(Array(branchItems[0].prefix(prefixLength)) + [alternation])
    }

    /// The scalars a literal character matches, to compare literals by; nil for anything else.
    private static func literalValue(_ node: PythonRegexNode) -> [UInt32]? {
        switch node {
        case let .character(.scalar(value)): [value]
        case let .character(.caseless(values)): values
        default: nil
        }
    }

    /// Items of nested sequences (non-capturing groups) spliced in, so that their literals join their neighbours'.
    private static func flattened(_ items: [PythonRegexNode]) -> [PythonRegexNode] {
        items.flatMap { item -> [PythonRegexNode] in
            if case let .sequence(inner) = item { return flattened(inner) }
            return [item]
        }
    }

    private func tail(after index: Int) -> PythonRegexRepeatTail {
        var next = index + 1
        while true {
            switch instructions[next] {
            case .captureOpen, .captureClose, .repeatStart:
                next += 1
            case let .repeatLoop(loop) where loop.min > 0:
                next += 1
            case let .jump(target) where target > next:
                next = target
            case .literal, .character(.scalar, false), .character(.caseless, false):
                var tests: [PythonRegexCharacterTest] = []
                scan: while next < instructions.count {
                    switch instructions[next] {
                    case let .literal(run): tests += run.map { .scalar($0) }
                    case let .character(test, false):
                        switch test {
                        case .scalar, .caseless: tests.append(test)
                        default: break scan
                        }
                    default: break scan
                    }
                    next += 1
                }
                return .literal(tests)
            case .character(_, false):
                return .character
            case let .repeatCharacter(repeated) where repeated.min > 0 && !repeated.backward:
                return .character
            default:
                return .other
            }
        }
    }

    private mutating func flushLiteral(_ run: inout [UInt32]) {
        switch run.count {
        case 0: return
        case 1: instructions.append(.character(.scalar(run[0]), backward: false))
        default: instructions.append(.literal(run))
        }
        run.removeAll()
    }

    private mutating func emitRepetition(_ body: PythonRegexNode, min: Int, max: Int, mode: PythonRegexRepetitionMode,
                                         backward: Bool) {
        if mode == .possessive {
            instructions.append(.atomicStart)
            emitRepetition(body, min: min, max: max, mode: .greedy, backward: backward)
            instructions.append(.atomicEnd)
            return
        }
        if max == 0 { return }
        if min == 1, max == 1 {
            emit(body, backward: backward)
            return
        }
        if case let .character(test) = body {
            instructions.append(.repeatCharacter(PythonRegexCharacterRepeat(
                test: test, min: min, max: max, greedy: mode == .greedy, backward: backward)))
            return
        }
        let counter = counterCount
        counterCount += 1
        instructions.append(.repeatStart(counter: counter))
        let loop = instructions.count
        instructions.append(.jump(-1))
        emit(body, backward: backward)
        instructions.append(.jump(loop))
        instructions[loop] = .repeatLoop(PythonRegexLoop(
            counter: counter, min: min, max: max, greedy: mode == .greedy, exit: instructions.count))
    }
}
