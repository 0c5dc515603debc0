/// A context-free grammar in llama.cpp's GBNF notation, compiled for matching text code point by code point.
///
/// The notation and its meaning are llama.cpp's (grammars/README.md there): `name ::= alternatives` rules, `#`
/// comments, `"literals"`, `[character classes]` with `^` negation and ranges, `.` for any character, `( groups )`,
/// the repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, and tokens by id `<[id]>` or by text `<think>` (text the
/// model's tokenizer encodes as one token, special tokens included), each negated by a leading `!`.
/// Repetitions become helper rules as llama.cpp rewrites them, with its limit of 2,000 repeated rules, so that a
/// grammar llama.cpp refuses is refused here; left recursion is refused too (the matcher would loop on it).
///
/// Matching follows llama.cpp's pushdown stacks: the set of ways the text so far can continue, each a stack of
/// positions in the rules whose top is a terminal (a character class or a token).
public struct Grammar: Sendable {
    /// One position in a rule's alternative.
    enum Element: Equatable, Sendable {
        case characters(CharacterClass)
        case rule(Int)
        case token(Int)
        case notToken(Int)
        /// Ends an alternative.
        case end
    }

    struct CharacterClass: Equatable, Sendable {
        var ranges: [ClosedRange<UInt32>]
        var negated: Bool

        func matches(_ scalar: UInt32) -> Bool {
            ranges.contains { $0.contains(scalar) } != negated
        }

        /// Whether some code point between `low` and `high` (what a cut UTF-8 sequence can still become) matches.
        func matches(anyIn low: UInt32, _ high: UInt32) -> Bool {
            if ranges.contains(where: { $0.lowerBound <= high && low <= $0.upperBound }) { return !negated }
            return negated
        }
    }

    /// Every rule's alternatives back to back, each ending in `.end`.
    let elements: [Element]
    /// Where each alternative of each rule starts in `elements`.
    let alternatives: [[Int32]]
    /// Rule ids by name (helper rules for groups and repetitions are named `name_N`, as llama.cpp names them).
    public let ruleIds: [String: Int]
    let root: Int
    /// The GBNF text and start rule it was parsed from: what identifies it, for caches of compiled grammars.
    public let source: String
    public let rootName: String

    /// Parses GBNF text. `root` names the start rule. `tokenize` is how the model's tokenizer encodes text with its
    /// special tokens and without added ones (what llama.cpp's `tokenize(text, add_special: false, parse_special:
    /// true)` gives); tokens by text (`<think>`) need it and must encode to exactly one token.
    public init(gbnf text: String, root: String = "root", tokenize: ((String) -> [Int])? = nil) throws(GrammarError) {
        var parser = GBNFParser(text, tokenize: tokenize)
        try parser.parseRules()
        guard let rootId = parser.symbols[root] else {
            throw .invalidGrammar("no rule named '\(root)' to start from")
        }
        var elements: [Element] = []
        var alternatives: [[Int32]] = []
        for (id, rule) in parser.rules.enumerated() {
            guard let rule else {
                let name = parser.symbols.first { $0.value == id }?.key ?? "#\(id)"
                throw .invalidGrammar("undefined rule '\(name)'")
            }
            var starts: [Int32] = []
            for alternative in rule {
                starts.append(Int32(elements.count))
                elements.append(contentsOf: alternative)
                elements.append(.end)
            }
            alternatives.append(starts)
        }
        self.elements = elements
        self.alternatives = alternatives
        self.ruleIds = parser.symbols
        self.root = rootId
        source = text
        rootName = root
        if let recursive = leftRecursiveRule() {
            let name = parser.symbols.first { $0.value == recursive }?.key ?? "#\(recursive)"
            throw .invalidGrammar("left recursion in rule '\(name)', which llama.cpp's grammars do not allow")
        }
    }

    /// A rule that can reach itself without consuming text, if any, found as llama.cpp finds it: a depth-first walk
    /// into each rule's leading rule references, past a reference only when that rule has an empty alternative of
    /// its own. (Emptiness through other rules is not looked through, so llama.cpp accepts grammars such as
    /// `root ::= ( [x]* )*`, whose recursion the matcher's duplicate-stack check ends; refusing them would refuse
    /// grammars llama.cpp runs.)
    private func leftRecursiveRule() -> Int? {
        var inProgress = Array(repeating: false, count: alternatives.count)
        var visited = Array(repeating: false, count: alternatives.count)
        var mayBeEmpty = Array(repeating: false, count: alternatives.count)
        // Depth first with an explicit stack, as a chain of thousands of rules would overflow a thread's: per rule
        // being walked, the alternative and element it is at, and whether it waits for the rule referenced there.
        struct Frame {
            var rule: Int
            var alternative = 0
            var index: Int
            var waiting = false
        }
        func enter(_ rule: Int) -> Frame {
            inProgress[rule] = true
            if alternatives[rule].contains(where: { elements[Int($0)] == .end }) { mayBeEmpty[rule] = true }
            return Frame(rule: rule, index: Int(alternatives[rule].first ?? 0))
        }
        for root in alternatives.indices where !visited[root] {
            var frames = [enter(root)]
            while var frame = frames.popLast() {
                if frame.waiting, case .rule(let other) = elements[frame.index] {
                    frame.waiting = false
                    // Past the reference only when its rule may be empty; on to the next alternative otherwise.
                    if mayBeEmpty[other] {
                        frame.index += 1
                    } else {
                        frame.alternative += 1
                        if frame.alternative < alternatives[frame.rule].count {
                            frame.index = Int(alternatives[frame.rule][frame.alternative])
                        }
                    }
                }
                while frame.alternative < alternatives[frame.rule].count {
                    if case .rule(let other) = elements[frame.index] {
                        if inProgress[other] { return frame.rule }
                        break
                    }
                    frame.alternative += 1
                    if frame.alternative < alternatives[frame.rule].count {
                        frame.index = Int(alternatives[frame.rule][frame.alternative])
                    }
                }
                guard frame.alternative < alternatives[frame.rule].count, case .rule(let other) = elements[frame.index] else {
                    inProgress[frame.rule] = false
                    visited[frame.rule] = true
                    continue
                }
                frame.waiting = true
                frames.append(frame)
                frames.append(enter(other))
            }
        }
        return nil
    }

    // MARK: Matching

    /// The stacks `stack` stands for once every rule reference on top is expanded, added to `into` (no
    /// duplicates): each ends at a terminal, or is empty where the whole grammar has matched.
    func expand(_ stack: [Int32], into result: inout [[Int32]]) {
        // Most reads leave a terminal on top, with nothing to expand.
        if let top = stack.last, isTerminal(elements[Int(top)]) {
            if !result.contains(stack) { result.append(stack) }
            return
        }
        var todo = [stack]
        var seen = Set<[Int32]>()
        while let current = todo.popLast() {
            guard seen.insert(current).inserted else { continue }
            guard let top = current.last else {
                if !result.contains(current) { result.append(current) }
                continue
            }
            switch elements[Int(top)] {
            case .rule(let rule):
                for start in alternatives[rule] {
                    var next = Array(current.dropLast())
                    if elements[Int(top) + 1] != .end { next.append(top + 1) }
                    if elements[Int(start)] != .end { next.append(start) }
                    todo.append(next)
                }
            case .characters, .token, .notToken:
                if !result.contains(current) { result.append(current) }
            case .end:
                preconditionFailure("a grammar stack never rests on the end of an alternative")
            }
        }
    }

    private func isTerminal(_ element: Element) -> Bool {
        switch element {
        case .characters, .token, .notToken: true
        case .rule, .end: false
        }
    }

    /// The stacks the grammar starts from.
    var initialStacks: [[Int32]] {
        var stacks: [[Int32]] = []
        for start in alternatives[root] {
            expand(elements[Int(start)] == .end ? [] : [start], into: &stacks)
        }
        return stacks
    }

    /// The stacks after `scalar` is read from `stacks`.
    func accept(_ scalar: UInt32, _ stacks: [[Int32]]) -> [[Int32]] {
        var result: [[Int32]] = []
        for stack in stacks {
            guard let top = stack.last, case .characters(let set) = elements[Int(top)], set.matches(scalar) else { continue }
            var next = Array(stack.dropLast())
            if elements[Int(top) + 1] != .end { next.append(top + 1) }
            expand(next, into: &result)
        }
        return result
    }

    /// The stacks after a token element on top matches `token` (stacks whose top is a character class drop out).
    func accept(token: Int, _ stacks: [[Int32]]) -> [[Int32]] {
        var result: [[Int32]] = []
        for stack in stacks {
            guard let top = stack.last else { continue }
            let matches: Bool
            switch elements[Int(top)] {
            case .token(let id): matches = id == token
            case .notToken(let id): matches = id != token
            default: matches = false
            }
            guard matches else { continue }
            var next = Array(stack.dropLast())
            if elements[Int(top) + 1] != .end { next.append(top + 1) }
            expand(next, into: &result)
        }
        return result
    }

    /// Whether a code point cut short (one that lies between `low` and `high`) can still continue one of `stacks`.
    func allowsPartial(_ low: UInt32, _ high: UInt32, _ stacks: [[Int32]]) -> Bool {
        stacks.contains { stack in
            guard let top = stack.last, case .characters(let set) = elements[Int(top)] else { return false }
            return set.matches(anyIn: low, high)
        }
    }

    /// Whether any of `stacks` waits for a token element.
    func waitsForToken(_ stacks: [[Int32]]) -> Bool {
        stacks.contains { stack in
            guard let top = stack.last else { return false }
            switch elements[Int(top)] {
            case .token, .notToken: return true
            default: return false
            }
        }
    }
}

/// The GBNF parser, over the text's UTF-8 bytes.
private struct GBNFParser {
    let bytes: [UInt8]
    var position = 0
    /// Rule ids by name, in order of first mention (helper rules included).
    var symbols: [String: Int] = [:]
    /// Each rule's alternatives; nil for a rule mentioned but not (yet) defined.
    var rules: [[[Grammar.Element]]?] = []

    /// llama.cpp's bound on the rules one repetition may generate.
    static let repetitionLimit = 2000
    /// Groups within groups: parsing recurses into each, and a thread's stack is finite.
    static let groupDepthLimit = 200
    var groupDepth = 0

    let tokenize: ((String) -> [Int])?

    init(_ text: String, tokenize: ((String) -> [Int])?) {
        bytes = Array(text.utf8)
        self.tokenize = tokenize
    }

    var current: UInt8 { position < bytes.count ? bytes[position] : 0 }
    func byte(at offset: Int) -> UInt8 { position + offset < bytes.count ? bytes[position + offset] : 0 }

    func error(_ message: String) -> GrammarError {
        var line = 1, column = 1
        for byte in bytes[..<min(position, bytes.count)] {
            if byte == UInt8(ascii: "\n") { line += 1; column = 1 } else if byte & 0xC0 != 0x80 { column += 1 }
        }
        return .invalidGrammar("\(message) at line \(line), column \(column)")
    }

    static func isWordByte(_ byte: UInt8) -> Bool {
        (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x30 && byte <= 0x39) || byte == 0x2D
    }

    mutating func symbol(_ name: String) -> Int {
        if let id = symbols[name] { return id }
        let id = symbols.count
        symbols[name] = id
        rules.append(nil)
        return id
    }

    /// A helper rule's id, named after the rule it serves and its id (`name_N`).
    mutating func helperSymbol(_ base: String) -> Int {
        let id = symbols.count
        symbols["\(base)_\(id)"] = id
        rules.append(nil)
        return id
    }

    mutating func skipSpace(newlines: Bool) {
        while position < bytes.count {
            let byte = bytes[position]
            if byte == UInt8(ascii: "#") {
                while position < bytes.count && bytes[position] != 0x0A && bytes[position] != 0x0D { position += 1 }
            } else if byte == 0x20 || byte == 0x09 || (newlines && (byte == 0x0A || byte == 0x0D)) {
                position += 1
            } else {
                return
            }
        }
    }

    mutating func parseRules() throws(GrammarError) {
        skipSpace(newlines: true)
        while position < bytes.count {
            try parseRule()
        }
    }

    mutating func parseName() throws(GrammarError) -> String {
        let start = position
        while position < bytes.count && Self.isWordByte(bytes[position]) { position += 1 }
        guard position > start else { throw error("expecting a rule name") }
        return String(decoding: bytes[start..<position], as: UTF8.self)
    }

    mutating func parseInteger() throws(GrammarError) -> UInt64 {
        let start = position
        while position < bytes.count && bytes[position] >= 0x30 && bytes[position] <= 0x39 { position += 1 }
        guard position > start else { throw error("expecting an integer") }
        guard let value = UInt64(String(decoding: bytes[start..<position], as: UTF8.self)) else {
            throw error("integer out of range")
        }
        return value
    }

    mutating func parseRule() throws(GrammarError) {
        let name = try parseName()
        skipSpace(newlines: false)
        let id = symbol(name)
        guard current == UInt8(ascii: ":"), byte(at: 1) == UInt8(ascii: ":"), byte(at: 2) == UInt8(ascii: "=") else {
            throw error("expecting ::=")
        }
        position += 3
        skipSpace(newlines: true)
        rules[id] = try parseAlternatives(ruleName: name, nested: false)
        if current == 0x0D {
            position += byte(at: 1) == 0x0A ? 2 : 1
        } else if current == 0x0A {
            position += 1
        } else if position < bytes.count {
            throw error("expecting a newline or the end")
        }
        skipSpace(newlines: true)
    }

    mutating func parseAlternatives(ruleName: String, nested: Bool) throws(GrammarError) -> [[Grammar.Element]] {
        var alternatives = [try parseSequence(ruleName: ruleName, nested: nested)]
        while current == UInt8(ascii: "|") {
            position += 1
            skipSpace(newlines: true)
            alternatives.append(try parseSequence(ruleName: ruleName, nested: nested))
        }
        return alternatives
    }

    /// One escape or UTF-8 character of a literal or class.
    mutating func parseCharacter() throws(GrammarError) -> UInt32 {
        guard position < bytes.count else { throw error("unexpected end of input") }
        if bytes[position] == UInt8(ascii: "\\") {
            let kind = byte(at: 1)
            position += 2
            switch kind {
            case UInt8(ascii: "x"): return try parseHex(2)
            case UInt8(ascii: "u"): return try parseHex(4)
            case UInt8(ascii: "U"): return try parseHex(8)
            case UInt8(ascii: "t"): return 0x09
            case UInt8(ascii: "r"): return 0x0D
            case UInt8(ascii: "n"): return 0x0A
            case UInt8(ascii: "\\"), UInt8(ascii: "\""), UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "-"):
                return UInt32(kind)
            default:
                position -= 2
                throw error("unknown escape")
            }
        }
        // A UTF-8 sequence, its length from the lead byte as llama.cpp reads it.
        let lead = bytes[position]
        let length = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4][Int(lead >> 4)]
        var value = UInt32(lead) & ((1 << (8 - UInt32(length))) - 1)
        position += 1
        var remaining = length - 1
        while remaining > 0 && position < bytes.count {
            value = (value << 6) | UInt32(bytes[position] & 0x3F)
            position += 1
            remaining -= 1
        }
        return value
    }

    mutating func parseHex(_ digits: Int) throws(GrammarError) -> UInt32 {
        var value: UInt32 = 0
        for _ in 0..<digits {
            guard let digit = hexValue(current) else { throw error("expecting \(digits) hex digits") }
            value = value << 4 | digit
            position += 1
        }
        return value
    }

    func hexValue(_ byte: UInt8) -> UInt32? {
        switch byte {
        case 0x30...0x39: UInt32(byte - 0x30)
        case 0x41...0x46: UInt32(byte - 0x41 + 10)
        case 0x61...0x66: UInt32(byte - 0x61 + 10)
        default: nil
        }
    }

    mutating func parseSequence(ruleName: String, nested: Bool) throws(GrammarError) -> [Grammar.Element] {
        var sequence: [Grammar.Element] = []
        // Where the last repeatable item starts, and how many rules it generated (nested repetitions multiply).
        var lastItemStart = 0
        var rulesInLastItem: UInt64 = 1

        while position < bytes.count {
            let byte = bytes[position]
            if byte == UInt8(ascii: "\"") {
                position += 1
                lastItemStart = sequence.count
                rulesInLastItem = 1
                while current != UInt8(ascii: "\"") {
                    guard position < bytes.count else { throw error("unexpected end of input in a literal") }
                    let scalar = try parseCharacter()
                    sequence.append(.characters(.init(ranges: [scalar...scalar], negated: false)))
                }
                position += 1
                skipSpace(newlines: nested)
            } else if byte == UInt8(ascii: "[") {
                position += 1
                var negated = false
                if current == UInt8(ascii: "^") {
                    negated = true
                    position += 1
                }
                var ranges: [ClosedRange<UInt32>] = []
                while current != UInt8(ascii: "]") {
                    guard position < bytes.count else { throw error("unexpected end of input in a character class") }
                    let low = try parseCharacter()
                    if current == UInt8(ascii: "-") && self.byte(at: 1) != UInt8(ascii: "]") {
                        guard position + 1 < bytes.count else { throw error("unexpected end of input in a character class") }
                        position += 1
                        let high = try parseCharacter()
                        // An inverted range matches nothing, as in llama.cpp.
                        if low <= high { ranges.append(low...high) }
                    } else {
                        ranges.append(low...low)
                    }
                }
                position += 1
                lastItemStart = sequence.count
                rulesInLastItem = 1
                sequence.append(.characters(.init(ranges: ranges, negated: negated)))
                skipSpace(newlines: nested)
            } else if byte == UInt8(ascii: "<") || byte == UInt8(ascii: "!") {
                let negated = byte == UInt8(ascii: "!")
                if negated { position += 1 }
                let id = try parseTokenId()
                lastItemStart = sequence.count
                rulesInLastItem = 1
                sequence.append(negated ? .notToken(id) : .token(id))
                skipSpace(newlines: nested)
            } else if Self.isWordByte(byte) {
                let name = try parseName()
                skipSpace(newlines: nested)
                lastItemStart = sequence.count
                rulesInLastItem = 1
                sequence.append(.rule(symbol(name)))
            } else if byte == UInt8(ascii: "(") {
                guard groupDepth < Self.groupDepthLimit else { throw error("groups nested deeper than \(Self.groupDepthLimit)") }
                groupDepth += 1
                defer { groupDepth -= 1 }
                position += 1
                skipSpace(newlines: true)
                let before = symbols.count
                let id = helperSymbol(ruleName)
                rules[id] = try parseAlternatives(ruleName: ruleName, nested: true)
                rulesInLastItem = UInt64(max(1, symbols.count - before))
                lastItemStart = sequence.count
                sequence.append(.rule(id))
                guard current == UInt8(ascii: ")") else { throw error("expecting ')'") }
                position += 1
                skipSpace(newlines: nested)
            } else if byte == UInt8(ascii: ".") {
                position += 1
                lastItemStart = sequence.count
                rulesInLastItem = 1
                sequence.append(.characters(.init(ranges: [], negated: true)))
                skipSpace(newlines: nested)
            } else if byte == UInt8(ascii: "*") || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "?") {
                position += 1
                skipSpace(newlines: nested)
                let bounds: (UInt64, UInt64?) = byte == UInt8(ascii: "*") ? (0, nil) : byte == UInt8(ascii: "+") ? (1, nil) : (0, 1)
                try repeatLastItem(&sequence, from: lastItemStart, rules: &rulesInLastItem, min: bounds.0, max: bounds.1,
                                   ruleName: ruleName)
            } else if byte == UInt8(ascii: "{") {
                position += 1
                skipSpace(newlines: nested)
                let low = try parseInteger()
                skipSpace(newlines: nested)
                var high: UInt64? = low
                if current == UInt8(ascii: "}") {
                    position += 1
                } else if current == UInt8(ascii: ",") {
                    position += 1
                    skipSpace(newlines: nested)
                    high = nil
                    if current >= 0x30 && current <= 0x39 {
                        high = try parseInteger()
                        skipSpace(newlines: nested)
                    }
                    guard current == UInt8(ascii: "}") else { throw error("expecting '}'") }
                    position += 1
                } else {
                    throw error("expecting ','")
                }
                skipSpace(newlines: nested)
                guard low <= UInt64(Self.repetitionLimit) else { throw error("more than \(Self.repetitionLimit) repetitions") }
                if let bound = high, bound > UInt64(Self.repetitionLimit) { high = nil }
                try repeatLastItem(&sequence, from: lastItemStart, rules: &rulesInLastItem, min: low, max: high,
                                   ruleName: ruleName)
            } else {
                break
            }
        }
        return sequence
    }

    /// `S{m,n}` becomes `S` m times and then n−m nested optional rules (`S'(k) ::= S S'(k−1) |`); `S{m,}` becomes
    /// `S` m times and `S' ::= S S' |`: llama.cpp's rewriting, which keeps matching free of counters.
    mutating func repeatLastItem(_ sequence: inout [Grammar.Element], from start: Int, rules generated: inout UInt64,
                                 min: UInt64, max: UInt64?, ruleName: String) throws(GrammarError) {
        guard start < sequence.count else { throw error("expecting an item before */+/?/{") }
        let item = Array(sequence[start...])
        let total: UInt64 = if let max, max > 0 { max } else if min > 0 { min } else { 1 }
        guard generated.multipliedReportingOverflow(by: total).partialValue <= UInt64(Self.repetitionLimit),
              !generated.multipliedReportingOverflow(by: total).overflow else {
            throw error("a repetition that would generate more than \(Self.repetitionLimit) rules")
        }
        if min == 0 {
            sequence.removeSubrange(start...)
        } else {
            for _ in 1..<min { sequence.append(contentsOf: item) }
        }
        let optional: UInt64 = max.map { $0 - Swift.min($0, min) } ?? 1
        var previous = -1
        for index in 0..<optional {
            let id = helperSymbol(ruleName)
            var body = item
            if max == nil {
                body.append(.rule(id))
            } else if index > 0 {
                body.append(.rule(previous))
            }
            rules[id] = [body, []]
            previous = id
        }
        if optional > 0 { sequence.append(.rule(previous)) }
        generated *= total
    }

    /// `<[id]>`, or `<text>` as the one token the tokenizer makes of it (angle brackets included).
    mutating func parseTokenId() throws(GrammarError) -> Int {
        guard current == UInt8(ascii: "<") else { throw error("expecting '<'") }
        let start = position
        position += 1
        guard current == UInt8(ascii: "[") else {
            while position < bytes.count && bytes[position] != UInt8(ascii: ">") { position += 1 }
            guard position < bytes.count else { throw error("expecting '>'") }
            position += 1
            let text = String(decoding: bytes[start..<position], as: UTF8.self)
            guard let tokenize else {
                position = start
                throw error("tokens by text (\(text)) need the model's vocabulary; write them by id, <[id]>")
            }
            let ids = tokenize(text)
            guard ids.count == 1 else {
                position = start
                throw error("invalid token '\(text)': the tokenizer makes \(ids.count) tokens of it, not one")
            }
            return ids[0]
        }
        position += 1
        let id = try parseInteger()
        guard id <= UInt64(UInt32.max) else { throw error("token id too big") }
        guard current == UInt8(ascii: "]") else { throw error("expecting ']'") }
        position += 1
        guard current == UInt8(ascii: ">") else { throw error("expecting '>'") }
        position += 1
        return Int(id)
    }
}
