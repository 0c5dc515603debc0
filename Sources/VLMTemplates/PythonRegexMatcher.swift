/// Runs a compiled pattern over a text with an explicit backtrack stack (never recursion), within a step budget.
struct PythonRegexMatcher: ~Copyable {
    /// Where one attempt at a start position ended.
    enum Outcome {
        case matched(end: Int)
        /// The attempt read past the end of the text (only when partial matches are allowed).
        case partial
        case failed
    }

    /// What backtracking pops: choices to resume, and the undo records of captures and counters.
    private enum Backtrack {
        case resume(pc: Int, position: Int)
        case restoreSpan(group: Int, start: Int, end: Int)
        case restoreOpen(group: Int, position: Int)
        case restoreCounter(counter: Int, count: Int, start: Int)
        /// A lazy group repeat (at `pc`) that may still take another iteration at `position`.
        case enterLoopBody(pc: Int, position: Int)
        /// A greedy character repeat (at `pc`) that may give back characters: it last took `count` from `start`.
        case giveBack(pc: Int, start: Int, count: Int)
        /// A lazy character repeat (at `pc`) that may take more: it last took `count` from `start`.
        case takeMore(pc: Int, start: Int, count: Int)
        /// Below a lookaround's body (the lookaround is at `pc`, entered at `position`).
        case lookaroundMarker(pc: Int, position: Int)
        case atomicMarker

        var isRestore: Bool {
            switch self {
            case .restoreSpan, .restoreOpen, .restoreCounter: true
            default: false
            }
        }
    }

    private let instructions: [PythonRegexInstruction]
    private let text: UnsafeBufferPointer<Unicode.Scalar>
    private let end: Int
    private let pattern: String
    private let budget: Int
    private var steps = 0
    private let runAfterOptionalItems: PythonRegexCharacterTest?
    /// Start and end of group 0 (the match) and of each group, -1 when unset.
    private(set) var spans: [Int]
    private var opens: [Int]
    private var counts: [Int]
    private var iterationStarts: [Int]
    private var stack: [Backtrack] = []
    /// Stack indexes of the markers of the lookarounds and atomic groups being matched, innermost last.
    private var frames: [Int] = []
    /// A scan for the first position from `from` on where something holds (`found`, nil when nowhere).
    private struct Scan {
        var from: Int
        var found: Int?
        /// Positions this scan looked at, for the step count.
        var scanned: Int
    }
    /// Per lazy repeat: where its literal tail occurs next, and where its item next fails to match.
    private var literalScans: [Int: Scan] = [:]
    private var itemMismatchScans: [Int: Scan] = [:]

    /// Reads past the end of the text end the attempt as a partial match.
    var allowsPartial = false
    /// A match may not be empty at this position (the next `finditer` match after an empty one).
    var forbiddenEmptyMatch: Int?
    /// A match must end at the end of the text (`fullmatch`).
    var mustReachEnd = false

    init(program: PythonRegexProgram, groupCount: Int, text: UnsafeBufferPointer<Unicode.Scalar>, pattern: String,
         budget: Int) {
        instructions = program.instructions
        runAfterOptionalItems = program.plan.runAfterOptionalItems
        self.text = text
        end = text.count
        self.pattern = pattern
        self.budget = budget
        spans = Array(repeating: -1, count: 2 * (groupCount + 1))
        opens = Array(repeating: -1, count: groupCount + 1)
        counts = Array(repeating: 0, count: program.counterCount)
        iterationStarts = Array(repeating: -1, count: program.counterCount)
    }

    var textCount: Int { end }

    func scalar(at position: Int) -> UInt32 { text[position].value }

    /// Where to try next after an attempt at `start` failed. Like the module, when the pattern starts with a
    /// character repeat, skip the run of characters it would take there (from inside that run the rest of the
    /// pattern would be tried at the same place again), unless the run is cut by the repeat's maximum.
    /// Behind optional items that cannot start inside the run (``PythonRegexSearchPlan/runAfterOptionalItems``), a
    /// complete search goes on at the run's end, where those items may start.
    mutating func nextStart(afterFailureAt start: Int) -> Int {
        if case let .repeatCharacter(repeated) = instructions[0], !repeated.backward {
            var run = 0
            while run < repeated.max, start + run < end, repeated.test.matches(text[start + run].value) { run += 1 }
            steps += run
            return run < repeated.max ? start + run + 1 : start + 1
        }
        guard !allowsPartial, let test = runAfterOptionalItems else { return start + 1 }
        var run = 0
        while start + run < end, test.matches(text[start + run].value) { run += 1 }
        steps += run
        return start + max(run, 1)
    }

    /// One attempt at matching from `start`.
    mutating func attempt(at start: Int) throws(PythonRegexError) -> Outcome {
        stack.removeAll(keepingCapacity: true)
        frames.removeAll(keepingCapacity: true)
        for index in spans.indices { spans[index] = -1 }
        var pc = 0
        var position = start
        execution: while true {
            steps += 1
            if steps > budget { throw PythonRegexError.budgetExceeded(pattern, steps: budget) }
            switch instructions[pc] {
            case let .character(test, backward):
                if backward {
                    if position > 0, test.matches(text[position - 1].value) {
                        position -= 1
                        pc += 1
                        continue execution
                    }
                } else if position < end {
                    if test.matches(text[position].value) {
                        position += 1
                        pc += 1
                        continue execution
                    }
                } else if allowsPartial {
                    return .partial
                }
            case let .literal(run):
                var offset = 0
                while offset < run.count {
                    if position + offset == end {
                        if allowsPartial { return .partial }
                        break
                    }
                    if text[position + offset].value != run[offset] { break }
                    offset += 1
                }
                if offset == run.count {
                    position += offset
                    pc += 1
                    continue execution
                }
            case let .repeatCharacter(repeated):
                switch startRepeat(repeated, pc: pc, at: position) {
                case let .matched(next):
                    position = next
                    pc += 1
                    continue execution
                case .partial: return .partial
                case .failed: break
                }
            case let .split(preferred, alternative):
                stack.append(.resume(pc: alternative, position: position))
                pc = preferred
                continue execution
            case let .jump(target):
                pc = target
                continue execution
            case let .captureOpen(group):
                stack.append(.restoreOpen(group: group, position: opens[group]))
                opens[group] = position
                pc += 1
                continue execution
            case let .captureClose(group):
                stack.append(.restoreSpan(group: group, start: spans[2 * group], end: spans[2 * group + 1]))
                spans[2 * group] = min(opens[group], position)
                spans[2 * group + 1] = max(opens[group], position)
                pc += 1
                continue execution
            case let .assertion(assertion):
                if holds(assertion, at: position) {
                    pc += 1
                    continue execution
                }
            case let .repeatStart(counter):
                stack.append(.restoreCounter(counter: counter, count: counts[counter], start: iterationStarts[counter]))
                counts[counter] = 0
                iterationStarts[counter] = -1
                pc += 1
                continue execution
            case let .repeatLoop(loop):
                let count = counts[loop.counter]
                if count > 0, iterationStarts[loop.counter] == position {
                    // An iteration that matched nothing would match nothing forever: go on with what follows.
                    pc = loop.exit
                    continue execution
                }
                if count >= loop.min {
                    if count >= loop.max {
                        pc = loop.exit
                        continue execution
                    }
                    if !loop.greedy {
                        stack.append(.enterLoopBody(pc: pc, position: position))
                        pc = loop.exit
                        continue execution
                    }
                    stack.append(.resume(pc: loop.exit, position: position))
                }
                beginIteration(loop.counter, at: position)
                pc += 1
                continue execution
            case .lookaround:
                frames.append(stack.count)
                stack.append(.lookaroundMarker(pc: pc, position: position))
                pc += 1
                continue execution
            case .lookaroundEnd:
                let marker = frames.removeLast()
                guard case let .lookaroundMarker(lookaroundPC, entry) = stack[marker],
                      case let .lookaround(negative, exit) = instructions[lookaroundPC] else { preconditionFailure() }
                if negative {
                    unwind(to: marker)
                } else {
                    // Lookarounds are atomic: drop the body's choices but keep its captures undoable.
                    keepOnlyRestores(above: marker)
                    position = entry
                    pc = exit
                    continue execution
                }
            case .atomicStart:
                frames.append(stack.count)
                stack.append(.atomicMarker)
                pc += 1
                continue execution
            case .atomicEnd:
                keepOnlyRestores(above: frames.removeLast())
                pc += 1
                continue execution
            case let .backreference(group, caseless, backward):
                switch matchReference(group, caseless: caseless, backward: backward, at: position) {
                case let .matched(next):
                    position = next
                    pc += 1
                    continue execution
                case .partial: return .partial
                case .failed: break
                }
            case .succeed:
                if !(mustReachEnd && position != end) && position != forbiddenEmptyMatch {
                    spans[0] = start
                    spans[1] = position
                    return .matched(end: position)
                }
            }

            // The instruction failed: resume the most recent choice.
            while let entry = stack.popLast() {
                steps += 1
                switch entry {
                case let .resume(resumePC, resumePosition):
                    pc = resumePC
                    position = resumePosition
                    continue execution
                case .restoreSpan, .restoreOpen, .restoreCounter:
                    restore(entry)
                case let .enterLoopBody(loopPC, resumePosition):
                    guard case let .repeatLoop(loop) = instructions[loopPC] else { preconditionFailure() }
                    beginIteration(loop.counter, at: resumePosition)
                    pc = loopPC + 1
                    position = resumePosition
                    continue execution
                case let .giveBack(repeatPC, start, count):
                    guard case let .repeatCharacter(repeated) = instructions[repeatPC] else { preconditionFailure() }
                    var fewer = count - 1
                    // Like the module, never give back to where a literal tail could not fit before the end.
                    if !repeated.backward, case let .literal(tail) = repeated.tail, tail.count > 1 {
                        fewer = min(fewer, end - tail.count - start)
                        if fewer < repeated.min { continue }
                    }
                    // Where the text holds a character the tail cannot start with, the tail fails at once: give back
                    // past it (a repeat ahead of a delimiter backtracks to the delimiter's first characters only).
                    if !repeated.backward, case let .literal(tail) = repeated.tail, let first = tail.first {
                        let before = fewer
                        while fewer > repeated.min, start + fewer < end, !first.matches(text[start + fewer].value) { fewer -= 1 }
                        steps += before - fewer
                    }
                    if fewer > repeated.min { stack.append(.giveBack(pc: repeatPC, start: start, count: fewer)) }
                    position = repeated.backward ? start - fewer : start + fewer
                    pc = repeatPC + 1
                    continue execution
                case let .takeMore(repeatPC, start, count):
                    guard case let .repeatCharacter(repeated) = instructions[repeatPC] else { preconditionFailure() }
                    switch extendLazyRepeat(repeated, pc: repeatPC, start: start, count: count) {
                    case let .matched(next):
                        position = next
                        pc = repeatPC + 1
                        continue execution
                    case .partial: return .partial
                    case .failed: break
                    }
                case let .lookaroundMarker(lookaroundPC, entry):
                    frames.removeLast()
                    guard case let .lookaround(negative, exit) = instructions[lookaroundPC] else { preconditionFailure() }
                    if negative {
                        position = entry
                        pc = exit
                        continue execution
                    }
                case .atomicMarker:
                    frames.removeLast()
                }
            }
            return .failed
        }
    }

    // MARK: Steps

    private mutating func beginIteration(_ counter: Int, at position: Int) {
        stack.append(.restoreCounter(counter: counter, count: counts[counter], start: iterationStarts[counter]))
        counts[counter] += 1
        iterationStarts[counter] = position
    }

    /// Enters a character repeat: a greedy one takes all it can, a lazy one its minimum.
    private mutating func startRepeat(_ repeated: PythonRegexCharacterRepeat, pc: Int, at position: Int) -> Outcome {
        let wanted = repeated.greedy ? repeated.max : repeated.min
        var count = 0
        if repeated.backward {
            while count < wanted, position - count > 0, repeated.test.matches(text[position - count - 1].value) {
                count += 1
            }
        } else {
            while count < wanted, position + count < end, repeated.test.matches(text[position + count].value) {
                count += 1
            }
            // Stopping at the end of the text short of what it wants is reading past the end.
            if allowsPartial, position + count == end, count < wanted { return .partial }
        }
        steps += count
        guard count >= repeated.min else { return .failed }
        if repeated.greedy {
            if count > repeated.min { stack.append(.giveBack(pc: pc, start: position, count: count)) }
        } else if count < repeated.max {
            stack.append(.takeMore(pc: pc, start: position, count: count))
        }
        return .matched(end: repeated.backward ? position - count : position + count)
    }

    /// A lazy character repeat takes more: one character, or, before a literal, up to where the literal occurs next.
    ///
    /// This follows the `regex` module's matcher, which looks at the tail before reading on. In a partial search
    /// that decides where partial matches are declared: when one more character would reach the end before a
    /// one-character literal (without checking that character), when a longer literal does not occur again within
    /// reach (whatever lies before the end), and when a tail that reads a character would start at the end. The
    /// groups the repeat is in are still open then.
    private mutating func extendLazyRepeat(_ repeated: PythonRegexCharacterRepeat, pc: Int, start: Int, count: Int) -> Outcome {
        if repeated.backward {
            let index = start - count - 1
            guard index >= 0, repeated.test.matches(text[index].value) else { return .failed }
            if count + 1 < repeated.max { stack.append(.takeMore(pc: pc, start: start, count: count + 1)) }
            return .matched(end: index)
        }
        // The repeat never takes the last character and then backtracks for more.
        let reach = min(end - start, repeated.max)
        let outcome: Outcome
        switch repeated.tail {
        case let .literal(tail) where tail.count > 1:
            outcome = stopBefore(tail, repeated, pc: pc, start: start, count: count, reach: reach)
        case let .literal(tail):
            outcome = stopBefore(tail[0], repeated, start: start, count: count, reach: reach)
        default:
            let position = start + count
            if position == end {
                outcome = allowsPartial ? .partial : .failed
            } else if !repeated.test.matches(text[position].value) {
                outcome = .failed
            } else if allowsPartial, position + 1 == end, case .character = repeated.tail {
                outcome = .partial
            } else {
                outcome = .matched(end: position + 1)
            }
        }
        if case let .matched(next) = outcome, next - start < reach {
            stack.append(.takeMore(pc: pc, start: start, count: next - start))
        }
        return outcome
    }

    /// Before a one-character literal: the next position after the current end where that character is, the
    /// repeat taking everything before it; partial (in a partial search) once the scan comes within one character
    /// of the end.
    private mutating func stopBefore(_ tail: PythonRegexCharacterTest, _ repeated: PythonRegexCharacterRepeat, start: Int,
                                     count: Int, reach: Int) -> Outcome {
        var position = start + count
        let limit = min(start + reach, end - 1)
        while true {
            if allowsPartial, position + 1 >= end { return .partial }
            guard position < limit, repeated.test.matches(text[position].value) else { return .failed }
            position += 1
            steps += 1
            if tail.matches(text[position].value) { return .matched(end: position) }
        }
    }

    /// Before a literal of two or more characters: its first complete occurrence after the current end and within
    /// reach, if the repeat matches everything before it; partial (in a partial search) when there is none.
    private mutating func stopBefore(_ tail: [PythonRegexCharacterTest], _ repeated: PythonRegexCharacterRepeat, pc: Int,
                                     start: Int, count: Int, reach: Int) -> Outcome {
        let position = start + count
        let limit = min(start + reach, end - tail.count)
        guard position < end, position < limit else { return allowsPartial ? .partial : .failed }
        let text = self.text
        var scan = literalScans[pc]
        let occurrence = Self.firstPosition(in: &scan, from: position + 1, before: end - tail.count + 1) { index in
            (0..<tail.count).allSatisfy { tail[$0].matches(text[index + $0].value) }
        }
        literalScans[pc] = scan
        steps += scan?.scanned ?? 0
        guard let found = occurrence, found <= limit else { return allowsPartial ? .partial : .failed }
        scan = itemMismatchScans[pc]
        let mismatch = Self.firstPosition(in: &scan, from: position, before: end) { index in
            !repeated.test.matches(text[index].value)
        }
        itemMismatchScans[pc] = scan
        steps += scan?.scanned ?? 0
        if let mismatch, mismatch < found { return .failed }
        return .matched(end: found)
    }

    /// The first position in `from..<bound` where `holds`, resuming an earlier scan for the same repeat that started
    /// no later (the text does not change during a call, so no position is scanned twice).
    private static func firstPosition(in scan: inout Scan?, from start: Int, before bound: Int,
                                      where holds: (Int) -> Bool) -> Int? {
        if let earlier = scan, earlier.from <= start, earlier.found.map({ $0 >= start }) ?? true {
            scan?.scanned = 0
            return earlier.found
        }
        var index = start
        while index < bound, !holds(index) { index += 1 }
        scan = Scan(from: start, found: index < bound ? index : nil, scanned: index - start)
        return scan?.found
    }

    private mutating func matchReference(_ group: Int, caseless: Bool, backward: Bool, at position: Int) -> Outcome {
        let start = spans[2 * group]
        guard start >= 0 else { return .failed }
        let length = spans[2 * group + 1] - start
        let from = backward ? position - length : position
        guard from >= 0 else { return .failed }
        for offset in 0..<length {
            guard from + offset < end else { return allowsPartial ? .partial : .failed }
            let captured = text[start + offset].value
            let actual = text[from + offset].value
            if captured != actual, !(caseless && PythonRegexCaseFolding.variants(of: captured).contains(actual)) {
                return .failed
            }
        }
        steps += length
        return .matched(end: backward ? from : position + length)
    }

    func holds(_ assertion: PythonRegexAssertion, at position: Int) -> Bool {
        switch assertion {
        case .startOfText: return position == 0
        case .startOfLine: return position == 0 || text[position - 1] == "\n"
        case .endOfText: return position == end
        case .endOfTextOrFinalNewline: return position == end || (position == end - 1 && text[position] == "\n")
        case .endOfLine: return position == end || text[position] == "\n"
        case .wordBoundary, .notWordBoundary:
            let before = position > 0 && PythonRegexCharacterClass.isWord(text[position - 1].value)
            let after = position < end && PythonRegexCharacterClass.isWord(text[position].value)
            return (before != after) == (assertion == .wordBoundary)
        }
    }

    /// Undoes everything above the marker at `marker`, and the marker.
    private mutating func unwind(to marker: Int) {
        while stack.count > marker {
            restore(stack.removeLast())
        }
    }

    /// Puts back the group or counter state a backtrack entry saved; other entries are choices, not state.
    private mutating func restore(_ entry: Backtrack) {
        switch entry {
        case let .restoreSpan(group, start, end):
            spans[2 * group] = start
            spans[2 * group + 1] = end
        case let .restoreOpen(group, position):
            opens[group] = position
        case let .restoreCounter(counter, count, start):
            counts[counter] = count
            iterationStarts[counter] = start
        default:
            break
        }
    }

    /// Removes the marker at `marker` and the choices above it, keeping the undo records.
    private mutating func keepOnlyRestores(above marker: Int) {
        var kept = marker
        for index in marker + 1..<stack.count where stack[index].isRestore {
            stack[kept] = stack[index]
            kept += 1
        }
        stack.removeSubrange(kept...)
    }
}
