/// A parsed pattern.
indirect enum PythonRegexNode: Sendable {
    case empty
    case character(PythonRegexCharacterTest)
    case sequence([PythonRegexNode])
    case alternation([PythonRegexNode])
    case capture(Int, PythonRegexNode)
    case repetition(PythonRegexNode, min: Int, max: Int?, mode: PythonRegexRepetitionMode)
    case assertion(PythonRegexAssertion)
    case lookaround(PythonRegexNode, behind: Bool, negative: Bool)
    case atomic(PythonRegexNode)
    case backreference(Int, caseless: Bool)
}

enum PythonRegexRepetitionMode: Sendable {
    case greedy, lazy, possessive
}

enum PythonRegexAssertion: Sendable {
    /// `^`, `\A`.
    case startOfText
    /// `^` under MULTILINE.
    case startOfLine
    /// `$`: the end, or just before a "\n" that ends the text.
    case endOfTextOrFinalNewline
    /// `$` under MULTILINE.
    case endOfLine
    /// `\Z`, `\z`.
    case endOfText
    case wordBoundary
    case notWordBoundary
}

/// Reads a pattern as the `regex` module (VERSION0) does, refusing what the engine does not implement.
struct PythonRegexParser {
    /// Deeper group nesting is refused: compiling recurses once per level (parsing and matching do not), and at this
    /// depth it needs under 256 KiB of stack even in a debug build.
    static let maximumDepth = 100
    /// Larger `{n,m}` counts are refused.
    static let maximumCount = 100_000

    private struct Flags {
        var caseless = false
        var dotAll: Bool
        var multiline = false
    }

    private let pattern: String
    private let scalars: [Unicode.Scalar]
    private var index = 0
    private(set) var groupCount = 0
    private(set) var groupNames: [String: Int] = [:]
    private var openGroups: Set<Int> = []
    /// Numbered and named back-references, checked once every group is known (they may refer forward).
    private var pendingReferences: [(group: Int, position: Int)] = []
    private var pendingNamedReferences: [(name: String, position: Int, placeholder: Int)] = []

    init(_ pattern: String) {
        self.pattern = pattern
        scalars = Array(pattern.unicodeScalars)
    }

    /// A group whose `)` has not come yet: what it becomes then, and what it holds so far.
    private struct OpenGroup {
        enum Kind {
            case pattern
            case capture(Int, reopened: Bool)
            /// `(?:…)` and `(?flags:…)`.
            case plain
            case lookaround(behind: Bool, negative: Bool)
            case atomic
        }

        var kind: Kind
        /// The flags outside the group, back in force after it (flags set inside end with it).
        var outerFlags: Flags
        var branches: [PythonRegexNode] = []
        var items: [PythonRegexNode] = []

        mutating func endBranch() {
            branches.append(items.count == 1 ? items[0] : items.isEmpty ? .empty : .sequence(items))
            items = []
        }

        /// The group's node, once its last branch has ended.
        var node: PythonRegexNode {
            let body = branches.count == 1 ? branches[0] : .alternation(branches)
            switch kind {
            case .pattern, .plain: return body
            case let .capture(group, _): return .capture(group, body)
            case let .lookaround(behind, negative): return .lookaround(body, behind: behind, negative: negative)
            case .atomic: return .atomic(body)
            }
        }
    }

    /// What a `(` starts.
    private enum GroupStart {
        case group(OpenGroup.Kind, scopedFlags: Flags?)
        /// A back-reference written as a group, `(?P=name)`.
        case item(PythonRegexNode)
        /// A comment, or flags for the rest of the enclosing group.
        case nothing
    }

    /// Reads the pattern with an explicit stack of open groups, so that nesting costs no recursion.
    mutating func parse(dotAll: Bool) throws(PythonRegexError) -> PythonRegexNode {
        var flags = Flags(dotAll: dotAll)
        var open = [OpenGroup(kind: .pattern, outerFlags: flags)]
        while let next = peek {
            switch next {
            case "|":
                index += 1
                open[open.count - 1].endBranch()
            case ")":
                guard open.count > 1 else { throw error("unbalanced parenthesis", at: index) }
                index += 1
                var group = open.removeLast()
                group.endBranch()
                flags = group.outerFlags
                if case let .capture(number, reopened) = group.kind, !reopened { openGroups.remove(number) }
                open[open.count - 1].items.append(try parseQuantifiers(group.node))
            case "(":
                let start = index
                index += 1
                switch try parseGroupStart(&flags, start: start) {
                case let .group(kind, scopedFlags):
                    guard open.count <= Self.maximumDepth else {
                        throw error("nesting deeper than \(Self.maximumDepth) levels is not supported", at: start)
                    }
                    open.append(OpenGroup(kind: kind, outerFlags: flags))
                    if let scopedFlags { flags = scopedFlags }
                case let .item(node):
                    open[open.count - 1].items.append(try parseQuantifiers(node))
                case .nothing:
                    // A quantifier after a comment or a flag setting applies to the item before them.
                    if let last = open[open.count - 1].items.popLast() {
                        if case .repetition = last, isQuantifierAhead { throw error("multiple repeat", at: index) }
                        open[open.count - 1].items.append(try parseQuantifiers(last))
                    } else if isQuantifierAhead {
                        throw error("nothing to repeat", at: index)
                    }
                }
            default:
                let atom = try parseAtom(flags)
                open[open.count - 1].items.append(try parseQuantifiers(atom))
            }
        }
        guard open.count == 1 else { throw error("missing )", at: index) }
        open[0].endBranch()
        var tree = open[0].node
        for reference in pendingReferences where reference.group > groupCount {
            throw error("invalid group reference", at: reference.position)
        }
        if !pendingNamedReferences.isEmpty {
            var numbers: [Int: Int] = [:]
            for reference in pendingNamedReferences {
                guard let group = groupNames[reference.name] else { throw error("unknown group", at: reference.position) }
                numbers[reference.placeholder] = group
            }
            tree = Self.resolvingNamedReferences(tree, numbers)
        }
        return tree
    }

    // MARK: Quantifiers

    private mutating func parseQuantifiers(_ atom: PythonRegexNode) throws(PythonRegexError) -> PythonRegexNode {
        guard let (min, max) = try parseQuantifier() else {
            if isFuzzyConstraintAhead { throw unsupported("fuzzy matching constraints {…}", at: index) }
            return atom
        }
        var mode = PythonRegexRepetitionMode.greedy
        if peek == "?" {
            mode = .lazy
            index += 1
        } else if peek == "+" {
            mode = .possessive
            index += 1
        }
        if isQuantifierAhead { throw error("multiple repeat", at: index) }
        return .repetition(atom, min: min, max: max, mode: mode)
    }

    private var isQuantifierAhead: Bool {
        guard let next = peek else { return false }
        if next == "*" || next == "+" || next == "?" { return true }
        var probe = self
        return next == "{" && ((try? probe.parseQuantifier()) ?? nil) != nil
    }

    /// A `{` that the module reads as a fuzzy matching constraint (`{e<=1}`, `{i}`, `{1<=e<=2}`, `{2i+1d<=3}`).
    private var isFuzzyConstraintAhead: Bool {
        guard peek == "{" else { return false }
        var cursor = index + 1
        while cursor < scalars.count, ("0"..."9").contains(scalars[cursor]) { cursor += 1 }
        guard cursor < scalars.count else { return false }
        return "eids<".unicodeScalars.contains(scalars[cursor])
    }

    /// `*`, `+`, `?`, `{n}`, `{n,}`, `{,m}`, `{n,m}`, `{,}`; a `{` that starts none of these is a literal.
    private mutating func parseQuantifier() throws(PythonRegexError) -> (Int, Int?)? {
        guard let next = peek else { return nil }
        switch next {
        case "*": index += 1; return (0, nil)
        case "+": index += 1; return (1, nil)
        case "?": index += 1; return (0, 1)
        case "{":
            let start = index
            var cursor = index + 1
            let minimum = digits(from: &cursor)
            var maximum = minimum
            if cursor < scalars.count, scalars[cursor] == "," {
                cursor += 1
                maximum = digits(from: &cursor)
            } else if minimum == nil {
                return nil
            }
            guard cursor < scalars.count, scalars[cursor] == "}" else { return nil }
            let low = try count(minimum ?? "0", at: start)
            var high: Int? = low
            if scalars[start + 1..<cursor].contains(",") {
                high = nil
                if let maximum { high = try count(maximum, at: start) }
            }
            if let high, high < low { throw error("min repeat greater than max repeat", at: start + 1) }
            index = cursor + 1
            return (low, high)
        default:
            return nil
        }
    }

    private func digits(from cursor: inout Int) -> String? {
        var text = ""
        while cursor < scalars.count, ("0"..."9").contains(scalars[cursor]) {
            text.unicodeScalars.append(scalars[cursor])
            cursor += 1
        }
        return text.isEmpty ? nil : text
    }

    private func count(_ text: String, at position: Int) throws(PythonRegexError) -> Int {
        guard text.count <= 6, let value = Int(text), value <= Self.maximumCount else {
            throw error("repeat count \(text) is above the supported \(Self.maximumCount)", at: position)
        }
        return value
    }

    // MARK: Atoms

    /// One item other than a group.
    private mutating func parseAtom(_ flags: Flags) throws(PythonRegexError) -> PythonRegexNode {
        let start = index
        let scalar = scalars[index]
        index += 1
        switch scalar {
        case "[": return .character(.set(try parseSet(flags)))
        case ".": return .character(flags.dotAll ? .any : .notNewline)
        case "^": return .assertion(flags.multiline ? .startOfLine : .startOfText)
        case "$": return .assertion(flags.multiline ? .endOfLine : .endOfTextOrFinalNewline)
        case "\\": return try parseEscape(flags, start: start)
        case "*", "+", "?": throw error("nothing to repeat", at: start)
        case "{":
            index = start
            if isQuantifierAhead { throw error("nothing to repeat", at: start) }
            if isFuzzyConstraintAhead { throw unsupported("fuzzy matching constraints {…}", at: start) }
            index = start + 1
            return literal(scalar.value, flags)
        default: return literal(scalar.value, flags)
        }
    }

    private func literal(_ value: UInt32, _ flags: Flags) -> PythonRegexNode {
        guard flags.caseless else { return .character(.scalar(value)) }
        let variants = PythonRegexCaseFolding.variants(of: value)
        return .character(variants.count == 1 ? .scalar(value) : .caseless(variants))
    }

    /// What follows a `(` (the index is after it), up to where the group's body starts.
    private mutating func parseGroupStart(_ flags: inout Flags, start: Int) throws(PythonRegexError) -> GroupStart {
        guard peek == "?" else {
            if peek == "*" { throw unsupported("(*VERB) control verbs", at: start) }
            return .group(openCapture(name: nil), scopedFlags: nil)
        }
        index += 1
        guard let kind = peek else { throw error("unknown extension", at: index) }
        switch kind {
        case ":":
            index += 1
            return .group(.plain, scopedFlags: nil)
        case "P":
            index += 1
            switch peek {
            case "<":
                index += 1
                return .group(openCapture(name: try parseGroupName(terminator: ">")), scopedFlags: nil)
            case "=":
                index += 1
                let name = try parseGroupName(terminator: ")", allowingNumbers: true)
                if let number = Int(name) { return .item(try reference(number, caseless: flags.caseless, at: start)) }
                return .item(try namedReference(name, caseless: flags.caseless, at: start))
            case ">": throw unsupported("(?P>name) group calls", at: start)
            default: throw error("unknown extension", at: index)
            }
        case "<":
            index += 1
            switch peek {
            case "=", "!":
                let negative = peek == "!"
                index += 1
                return .group(.lookaround(behind: true, negative: negative), scopedFlags: nil)
            default:
                return .group(openCapture(name: try parseGroupName(terminator: ">")), scopedFlags: nil)
            }
        case "=", "!":
            index += 1
            return .group(.lookaround(behind: false, negative: kind == "!"), scopedFlags: nil)
        case ">":
            index += 1
            return .group(.atomic, scopedFlags: nil)
        case "#":
            while let next = peek, next != ")" { index += 1 }
            guard peek == ")" else { throw error("missing ), unterminated comment", at: start) }
            index += 1
            return .nothing
        case "(": throw unsupported("(?(…)…) conditional groups", at: start)
        case "|": throw unsupported("(?|…) branch reset groups", at: start)
        case "R", "&", "0"..."9": throw unsupported("(?R), (?n) and (?&name) group calls", at: start)
        case "+", "-":
            if index + 1 < scalars.count, ("0"..."9").contains(scalars[index + 1]) {
                throw unsupported("(?+n) and (?-n) group calls", at: start)
            }
            return try parseFlags(&flags)
        default:
            return try parseFlags(&flags)
        }
    }

    /// Numbers a capture group (a name used before keeps its number) and marks it open.
    private mutating func openCapture(name: String?) -> OpenGroup.Kind {
        let number: Int
        if let name, let existing = groupNames[name] {
            number = existing
        } else {
            groupCount += 1
            number = groupCount
            if let name { groupNames[name] = number }
        }
        let reopened = openGroups.contains(number)
        openGroups.insert(number)
        return .capture(number, reopened: reopened)
    }

    /// A group name up to `terminator` (which is consumed); a positive number where a reference allows one.
    private mutating func parseGroupName(terminator: Unicode.Scalar, allowingNumbers: Bool = false) throws(PythonRegexError) -> String {
        let start = index
        var name = ""
        while let next = peek, next != ")", next != ">" {
            name.unicodeScalars.append(next)
            index += 1
        }
        guard !name.isEmpty else { throw error("missing group name", at: index) }
        let isNumber = name.unicodeScalars.allSatisfy { ("0"..."9").contains($0) }
        guard isNumber ? allowingNumbers && Int(name).map({ $0 > 0 }) == true : Self.isIdentifier(name) else {
            throw error("bad character in group name", at: start)
        }
        guard peek == terminator else { throw error("missing \(Character(terminator))", at: index) }
        index += 1
        return name
    }

    /// The reference after `\g`, or nil when what follows is not a well-formed reference to a closed group.
    private mutating func groupReference(caseless: Bool, start: Int) throws(PythonRegexError) -> PythonRegexNode? {
        let resume = index
        guard peek == "<" else { return nil }
        index += 1
        guard let name = try? parseGroupName(terminator: ">", allowingNumbers: true) else {
            index = resume
            return nil
        }
        if let number = Int(name) {
            guard !openGroups.contains(number) else {
                index = resume
                return nil
            }
            return try reference(number, caseless: caseless, at: start)
        }
        if let group = groupNames[name], openGroups.contains(group) {
            index = resume
            return nil
        }
        return try namedReference(name, caseless: caseless, at: start)
    }

    static func isIdentifier(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first == "_" || first.properties.isXIDStart else { return false }
        return name.unicodeScalars.dropFirst().allSatisfy { $0 == "_" || $0.properties.isXIDContinue }
    }

    /// `(?ims-ims)`, flags for the rest of the enclosing group (even past a `|`), or `(?ims-ims:`, a group with flags
    /// of its own.
    private mutating func parseFlags(_ flags: inout Flags) throws(PythonRegexError) -> GroupStart {
        var on: Set<Unicode.Scalar> = []
        var off: Set<Unicode.Scalar> = []
        var turningOff = false
        while let next = peek, next != ")", next != ":" {
            if next == "-", !turningOff {
                turningOff = true
                index += 1
                continue
            }
            switch next {
            case "i", "m", "s", "u":
                break
            case "a", "L", "x", "f", "w", "b", "e", "r", "p":
                throw unsupported("the inline flag (?\(Character(next)))", at: index)
            case "V":
                throw unsupported("the inline flags (?V0) and (?V1)", at: index)
            default:
                throw error("unknown extension", at: index)
            }
            if turningOff { off.insert(next) } else { on.insert(next) }
            index += 1
        }
        guard let end = peek else { throw error("missing )", at: index) }
        if turningOff, off.isEmpty { throw error("bad inline flags: no flags after '-'", at: index) }
        if !on.isDisjoint(with: off) { throw error("bad inline flags: flag turned on and off", at: index) }
        index += 1
        var changed = flags
        for flag in on { Self.set(flag, true, in: &changed) }
        for flag in off { Self.set(flag, false, in: &changed) }
        if end == ")" {
            flags = changed
            return .nothing
        }
        return .group(.plain, scopedFlags: changed)
    }

    private static func set(_ flag: Unicode.Scalar, _ value: Bool, in flags: inout Flags) {
        switch flag {
        case "i": flags.caseless = value
        case "m": flags.multiline = value
        case "s": flags.dotAll = value
        default: break  // "u": str patterns are Unicode already
        }
    }

    // MARK: Escapes

    private mutating func parseEscape(_ flags: Flags, start: Int) throws(PythonRegexError) -> PythonRegexNode {
        guard let scalar = peek else { throw error("bad escape (end of pattern)", at: start) }
        index += 1
        switch scalar {
        case "A": return .assertion(.startOfText)
        case "Z", "z": return .assertion(.endOfText)
        case "b": return .assertion(.wordBoundary)
        case "B": return .assertion(.notWordBoundary)
        case "d", "D", "w", "W", "s", "S", "p", "P":
            index -= 1
            let set = PythonRegexCharacterSet(classes: [try parseClassEscape(flags, start: start)])
            return .character(.set(set))
        case "g":
            // `\g<name>` or `\g<number>`; anything else (even `\g<0>`) makes the "g" a literal.
            guard let reference = try groupReference(caseless: flags.caseless, start: start) else {
                return literal(scalar.value, flags)
            }
            return reference
        case "1"..."9":
            // Three octal digits make a character; otherwise one or two digits are a group reference.
            if let octal = octalTriple(startingAt: index - 1) {
                index += 2
                return literal(octal, flags)
            }
            var number = Int(scalar.value - 0x30)
            if let next = peek, ("0"..."9").contains(next) {
                number = number * 10 + Int(next.value - 0x30)
                index += 1
            }
            return try reference(number, caseless: flags.caseless, at: start)
        default:
            index -= 1
            return literal(try parseCharacterEscape(inSet: false, start: start), flags)
        }
    }

    /// `\d \D \w \W \s \S \p{…} \P{…}` (the index is at the letter).
    private mutating func parseClassEscape(_ flags: Flags, start: Int) throws(PythonRegexError) -> PythonRegexCharacterClass {
        let letter = scalars[index]
        index += 1
        switch letter {
        case "d": return .digit(negated: false)
        case "D": return .digit(negated: true)
        case "w": return .word(negated: false)
        case "W": return .word(negated: true)
        case "s": return .space(negated: false)
        case "S": return .space(negated: true)
        default:
            var negated = letter == "P"
            var name = ""
            if peek == "{" {
                index += 1
                while let next = peek, next != "}" {
                    name.unicodeScalars.append(next)
                    index += 1
                }
                guard peek == "}" else { throw error("missing }", at: index) }
                index += 1
            } else if let next = peek {
                name.unicodeScalars.append(next)
                index += 1
            }
            if name.hasPrefix("^") {
                negated.toggle()
                name.removeFirst()
            }
            guard let categories = PythonRegexCharacterClass.categories(named: name) else {
                throw unsupported("the property \\\(Character(letter)){\(name)} (only general categories such as L, Lu, Nd are)", at: start)
            }
            if flags.caseless, !categories.isDisjoint(with: [.uppercaseLetter, .lowercaseLetter, .titlecaseLetter]),
               !categories.isSuperset(of: [.uppercaseLetter, .lowercaseLetter, .titlecaseLetter]) {
                throw unsupported("a case-sensitive property under (?i)", at: start)
            }
            return .categories(categories, negated: negated)
        }
    }

    /// A character written as an escape (the index is at the character after the backslash); `\b` is a backspace
    /// in a set.
    private mutating func parseCharacterEscape(inSet: Bool, start: Int) throws(PythonRegexError) -> UInt32 {
        let scalar = scalars[index]
        index += 1
        switch scalar {
        case "a": return 0x07
        case "b" where inSet: return 0x08
        case "f": return 0x0C
        case "n": return 0x0A
        case "r": return 0x0D
        case "t": return 0x09
        case "v": return 0x0B
        case "x": return try hexEscape(digits: 2, start: start)
        case "u": return try hexEscape(digits: 4, start: start)
        case "U": return try hexEscape(digits: 8, start: start)
        case "0"..."7":
            // Up to three octal digits; outside a set only `\0` reaches here.
            var value = scalar.value - 0x30
            var taken = 1
            while taken < 3, let next = peek, ("0"..."7").contains(next) {
                value = value * 8 + (next.value - 0x30)
                index += 1
                taken += 1
            }
            return value
        case "N", "G", "K", "X", "m", "M", "h", "R":
            throw unsupported("the escape \\\(Character(scalar))", at: start)
        default:
            if scalar.isASCII, scalar.properties.isAlphabetic || ("0"..."9").contains(scalar) {
                throw error("bad escape \\\(Character(scalar))", at: start)
            }
            return scalar.value
        }
    }

    private mutating func hexEscape(digits: Int, start: Int) throws(PythonRegexError) -> UInt32 {
        var value: UInt32 = 0
        for _ in 0..<digits {
            guard let next = peek, let digit = hexValue(next) else {
                throw error("incomplete escape \\\(Character(scalars[start + 1]))", at: start)
            }
            value = value * 16 + digit
            index += 1
        }
        guard value <= 0x10FFFF, Unicode.Scalar(value) != nil else { throw error("bad hex escape", at: start) }
        return value
    }

    private func hexValue(_ scalar: Unicode.Scalar) -> UInt32? {
        switch scalar {
        case "0"..."9": scalar.value - 0x30
        case "a"..."f": scalar.value - 0x61 + 10
        case "A"..."F": scalar.value - 0x41 + 10
        default: nil
        }
    }

    private func octalTriple(startingAt position: Int) -> UInt32? {
        guard position + 2 < scalars.count else { return nil }
        let triple = scalars[position...position + 2]
        guard triple.allSatisfy({ ("0"..."7").contains($0) }) else { return nil }
        return triple.reduce(0) { $0 * 8 + ($1.value - 0x30) }
    }

    private mutating func reference(_ group: Int, caseless: Bool, at position: Int) throws(PythonRegexError) -> PythonRegexNode {
        if openGroups.contains(group) { throw error("cannot refer to an open group", at: position) }
        pendingReferences.append((group, position))
        return .backreference(group, caseless: caseless)
    }

    /// A reference by name, whose number is settled once the whole pattern is read (the group may come later).
    private mutating func namedReference(_ name: String, caseless: Bool, at position: Int) throws(PythonRegexError) -> PythonRegexNode {
        if let group = groupNames[name] {
            if openGroups.contains(group) { throw error("cannot refer to an open group", at: position) }
            return .backreference(group, caseless: caseless)
        }
        let placeholder = -(pendingNamedReferences.count + 1)
        pendingNamedReferences.append((name, position, placeholder))
        return .backreference(placeholder, caseless: caseless)
    }

    private static func resolvingNamedReferences(_ node: PythonRegexNode, _ numbers: [Int: Int]) -> PythonRegexNode {
        switch node {
        case let .backreference(group, caseless) where group < 0:
            return .backreference(numbers[group] ?? group, caseless: caseless)
        case let .sequence(items): return .sequence(items.map { resolvingNamedReferences($0, numbers) })
        case let .alternation(items): return .alternation(items.map { resolvingNamedReferences($0, numbers) })
        case let .capture(group, body): return .capture(group, resolvingNamedReferences(body, numbers))
        case let .repetition(body, min, max, mode):
            return .repetition(resolvingNamedReferences(body, numbers), min: min, max: max, mode: mode)
        case let .lookaround(body, behind, negative):
            return .lookaround(resolvingNamedReferences(body, numbers), behind: behind, negative: negative)
        case let .atomic(body): return .atomic(resolvingNamedReferences(body, numbers))
        default: return node
        }
    }

    // MARK: Sets

    /// A `[…]` set (the index is after the `[`).
    private mutating func parseSet(_ flags: Flags) throws(PythonRegexError) -> PythonRegexCharacterSet {
        let start = index - 1
        var set = PythonRegexCharacterSet(caseless: flags.caseless)
        if peek == "^" {
            set.negated = true
            index += 1
        }
        var first = true
        while true {
            guard let scalar = peek else { throw error("unterminated character set", at: start) }
            if scalar == "]", !first { break }
            first = false
            if scalar == "[", isPOSIXClassAhead {
                throw unsupported("POSIX classes ([:name:]) in a set", at: index)
            }
            let itemStart = index
            guard let low = try parseSetItem(into: &set, flags) else { continue }
            // A range needs a character on both sides of the "-"; otherwise the "-" is a literal.
            if peek == "-", index + 1 < scalars.count, scalars[index + 1] != "]" {
                let dash = index
                index += 1
                var probe = set
                if let high = try parseSetItem(into: &probe, flags) {
                    guard low <= high else { throw error("bad character range", at: itemStart) }
                    set.ranges.append(low...high)
                    continue
                }
                // `[a-\d]`: the class is a member, and so are the "a" and the "-".
                set = probe
                set.ranges.append(low...low)
                set.ranges.append(scalars[dash].value...scalars[dash].value)
                continue
            }
            set.ranges.append(low...low)
        }
        index += 1
        return set
    }

    /// Whether `[:name:]` (or `[:^name:]`) starts here; other `[` in a set are literals.
    private var isPOSIXClassAhead: Bool {
        var cursor = index + 1
        guard cursor < scalars.count, scalars[cursor] == ":" else { return false }
        cursor += 1
        if cursor < scalars.count, scalars[cursor] == "^" { cursor += 1 }
        while cursor < scalars.count, scalars[cursor].isASCII,
              scalars[cursor].properties.isAlphabetic || " &_-./0123456789".unicodeScalars.contains(scalars[cursor]) {
            cursor += 1
        }
        return cursor + 1 < scalars.count && scalars[cursor] == ":" && scalars[cursor + 1] == "]"
    }

    /// Reads one member; returns its scalar when it is a single character (which may start a range), or adds a
    /// class escape to the set and returns nil.
    private mutating func parseSetItem(into set: inout PythonRegexCharacterSet, _ flags: Flags) throws(PythonRegexError) -> UInt32? {
        guard let scalar = peek else { throw error("unterminated character set", at: index) }
        let start = index
        index += 1
        guard scalar == "\\" else { return scalar.value }
        guard let escaped = peek else { throw error("unterminated character set", at: start) }
        switch escaped {
        case "d", "D", "w", "W", "s", "S", "p", "P":
            set.classes.append(try parseClassEscape(flags, start: start))
            return nil
        case "8", "9", "A", "B", "Z", "z", "g", "G", "K", "X", "m", "M", "R":
            throw error("bad escape \\\(Character(escaped))", at: start)
        default:
            return try parseCharacterEscape(inSet: true, start: start)
        }
    }

    // MARK: Helpers

    private var peek: Unicode.Scalar? { index < scalars.count ? scalars[index] : nil }

    private func error(_ problem: String, at position: Int) -> PythonRegexError {
        PythonRegexError(pattern: pattern, problem: "\(problem) at position \(position)")
    }

    private func unsupported(_ construct: String, at position: Int) -> PythonRegexError {
        PythonRegexError(pattern: pattern, problem: "\(construct) not supported (at position \(position))")
    }
}
