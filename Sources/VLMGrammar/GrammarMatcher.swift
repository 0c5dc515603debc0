import Foundation
import Synchronization
import VLMModels

/// Where matching a grammar stands: the ways the text so far can continue, and the start of a UTF-8 sequence the
/// last piece of text cut short (a token may end inside a character).
public struct GrammarState: Hashable, Sendable {
    var stacks: [[Int32]]
    /// The bits of the cut sequence read so far, and how many continuation bytes it still needs (0: none).
    var partialValue: UInt32 = 0
    var partialRemaining = 0

    /// Whether no text can be read from here: the grammar refused what came.
    public var isDead: Bool { stacks.isEmpty }
}

extension Grammar {
    /// The state before any text.
    public var initialState: GrammarState { GrammarState(stacks: initialStacks) }

    /// Whether the text read so far is a whole match (generation may end here).
    public func isComplete(_ state: GrammarState) -> Bool {
        state.partialRemaining == 0 && state.stacks.contains { $0.isEmpty }
    }

    /// The state after one byte of UTF-8 text, or nil when the grammar cannot read it: its code point, once whole,
    /// must continue some stack, and a cut one must be able to.
    func accept(byte: UInt8, _ state: GrammarState) -> GrammarState? {
        var next = state
        if state.partialRemaining > 0 {
            guard byte & 0xC0 == 0x80 else { return nil }
            next.partialValue = state.partialValue << 6 | UInt32(byte & 0x3F)
            next.partialRemaining -= 1
        } else {
            // llama.cpp's reading of a lead byte: 0x80–0xBF cannot start a character.
            let length = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4][Int(byte >> 4)]
            guard length > 0 else { return nil }
            next.partialValue = UInt32(byte) & ((1 << (8 - UInt32(length))) - 1)
            next.partialRemaining = length - 1
        }
        if next.partialRemaining == 0 {
            next.stacks = accept(next.partialValue, state.stacks)
            next.partialValue = 0
            return next.stacks.isEmpty ? nil : next
        }
        return allowsPartial(next) ? next : nil
    }

    /// Whether the cut sequence of `state` can still become a code point some stack reads (llama.cpp's check of a
    /// token that ends inside a character).
    private func allowsPartial(_ state: GrammarState) -> Bool {
        let remaining = UInt32(state.partialRemaining)
        // Two-byte sequences whose bits so far give a code point below 0x80 are overlong: never valid.
        if remaining == 1 && state.partialValue < 2 { return false }
        var low = state.partialValue << (remaining * 6)
        let high = low | ((1 << (remaining * 6)) - 1)
        if low == 0 {
            if remaining == 2 { low = 1 << 11 } else if remaining == 3 { low = 1 << 16 }
        }
        return allowsPartial(low, high, state.stacks)
    }

    /// The state after `bytes` (a piece of text, possibly cutting a character), or nil when the grammar refuses it.
    public func accept<Bytes: Sequence<UInt8>>(bytes: Bytes, from state: GrammarState) -> GrammarState? {
        var current = state
        for byte in bytes {
            guard let next = accept(byte: byte, current) else { return nil }
            current = next
        }
        return current
    }

    /// The state after the token `id` whose text is `bytes`: stacks waiting for a token element take it by id,
    /// the others read its text (llama.cpp's `llama_grammar_accept_token`); nil when no stack can.
    public func accept(token id: Int, bytes: [UInt8], from state: GrammarState) -> GrammarState? {
        var stacks = waitsForToken(state.stacks) ? accept(token: id, state.stacks) : []
        var partial = (value: state.partialValue, remaining: state.partialRemaining)
        if !bytes.isEmpty, let read = accept(bytes: bytes, from: state) {
            for stack in read.stacks where !stacks.contains(stack) { stacks.append(stack) }
            partial = (read.partialValue, read.partialRemaining)
        }
        guard !stacks.isEmpty else { return nil }
        return GrammarState(stacks: stacks, partialValue: partial.value, partialRemaining: partial.remaining)
    }
}

/// A vocabulary's token texts as a trie of their bytes, for finding every token a grammar allows in one walk: the
/// tokens that share a prefix share the work of matching it. Build once per tokenizer and share it.
public final class GrammarVocabulary: Sendable {
    /// Trie nodes: each node's children as (byte, node) pairs and the tokens whose text ends there.
    private let children: [[(UInt8, Int32)]]
    private let endings: [[Int32]]
    /// Each token's text (empty for tokens that are not text, which only token elements match).
    let tokenBytes: [[UInt8]]

    /// - Parameters:
    ///   - tokenBytes: the UTF-8 bytes each token id contributes to the text (`Tokenizer.tokenBytes(count:)`).
    ///   - specialTokens: ids that are not text (control tokens): no grammar reads them as characters.
    public init(tokenBytes: [[UInt8]], specialTokens: Set<Int>) {
        var children: [[(UInt8, Int32)]] = [[]]
        var endings: [[Int32]] = [[]]
        var texts = tokenBytes
        for id in specialTokens where id >= 0 && id < texts.count { texts[id] = [] }
        for (id, bytes) in texts.enumerated() where !bytes.isEmpty {
            var node = 0
            for byte in bytes {
                if let child = children[node].first(where: { $0.0 == byte }) {
                    node = Int(child.1)
                } else {
                    children.append([])
                    endings.append([])
                    children[node].append((byte, Int32(children.count - 1)))
                    node = children.count - 1
                }
            }
            endings[node].append(Int32(id))
        }
        self.children = children
        self.endings = endings
        self.tokenBytes = texts
    }

    /// Every token whose text the automaton reads from `state` (marked in `allowed`).
    func markTextTokens(_ automaton: inout ByteAutomaton, from state: Int32, in allowed: inout [Bool]) {
        func visit(_ node: Int, _ state: Int32) {
            // A token may end here: its text left the grammar alive (a cut character was checked on the way).
            for id in endings[node] { allowed[Int(id)] = true }
            for (byte, child) in children[node] {
                let next = automaton.next(state, byte)
                if next >= 0 { visit(Int(child), next) }
            }
        }
        visit(0, state)
    }
}

/// A grammar read byte by byte as a lazily built automaton: each state met gets a number, and each (state, byte)
/// transition is worked out by the grammar's stacks once and then looked up. Constrained output keeps coming back
/// to the same few states (inside a string, after a comma, …), so the walk over a vocabulary's trie that finds the
/// allowed tokens becomes mostly lookups.
struct ByteAutomaton {
    let grammar: Grammar
    private(set) var states: [GrammarState] = []
    private var numbers: [GrammarState: Int32] = [:]
    /// 256 entries per state: the next state, -1 for a byte the grammar refuses, -2 not yet worked out.
    private var transitions: [Int32] = []
    /// States past which the tables are started afresh (a grammar whose stacks keep growing, such as deeply nested
    /// arrays, would otherwise grow them without bound; 20,000 states take 20 MB of transitions).
    static let stateLimit = 20_000

    init(grammar: Grammar) { self.grammar = grammar }

    /// Starts the tables afresh once they hold more than ``stateLimit`` states; state numbers from before are void,
    /// so only between walks.
    mutating func trim() {
        guard states.count > Self.stateLimit else { return }
        states.removeAll(keepingCapacity: true)
        numbers.removeAll(keepingCapacity: true)
        transitions.removeAll(keepingCapacity: true)
    }

    /// The number of `state`, numbering it if new.
    mutating func number(_ state: GrammarState) -> Int32 {
        if let known = numbers[state] { return known }
        let number = Int32(states.count)
        states.append(state)
        numbers[state] = number
        transitions.append(contentsOf: repeatElement(-2, count: 256))
        return number
    }

    /// The state after `byte` from state `source`, or -1.
    mutating func next(_ source: Int32, _ byte: UInt8) -> Int32 {
        let slot = Int(source) << 8 | Int(byte)
        let known = transitions[slot]
        if known != -2 { return known }
        let target = grammar.accept(byte: byte, states[Int(source)]).map { number($0) } ?? -1
        transitions[slot] = target
        return target
    }
}

/// A compiled grammar over a vocabulary: what generation is constrained by (``GenerationConstraint``). Sequences
/// constrained by the same grammar share its automaton and a cache of which tokens each state allows.
public final class GrammarConstraint: GenerationConstraint {
    public let grammar: Grammar
    let vocabulary: GrammarVocabulary
    /// Tokens that end generation: allowed exactly where the grammar has matched a whole text.
    let endTokens: Set<Int>
    private let tables: Mutex<(automaton: ByteAutomaton, masks: [GrammarState: [Bool]])>
    private static let cachedMasks = 512

    public init(grammar: Grammar, vocabulary: GrammarVocabulary, endTokens: Set<Int>) {
        self.grammar = grammar
        self.vocabulary = vocabulary
        self.endTokens = endTokens
        tables = Mutex((ByteAutomaton(grammar: grammar), [:]))
    }

    public func start() -> any TokenConstraint { GrammarTokenConstraint(self) }

    /// Which tokens may follow `state` (indexed by token id).
    public func allowedTokens(_ state: GrammarState) -> [Bool] {
        tables.withLock { tables in
            if let known = tables.masks[state] { return known }
            var allowed = Array(repeating: false, count: vocabulary.tokenBytes.count)
            tables.automaton.trim()
            let start = tables.automaton.number(state)
            vocabulary.markTextTokens(&tables.automaton, from: start, in: &allowed)
            if grammar.waitsForToken(state.stacks) {
                for id in allowed.indices where !allowed[id] && grammar.accept(token: id, bytes: [], from: state) != nil {
                    allowed[id] = true
                }
            }
            let complete = grammar.isComplete(state)
            for id in endTokens where id >= 0 && id < allowed.count { allowed[id] = complete }
            if tables.masks.count >= Self.cachedMasks { tables.masks.removeAll(keepingCapacity: true) }
            tables.masks[state] = allowed
            return allowed
        }
    }

    /// Whether `token` may follow `state` (without building the whole mask).
    public func allows(_ token: Int, after state: GrammarState) -> Bool {
        if endTokens.contains(token) { return grammar.isComplete(state) }
        guard token >= 0 && token < vocabulary.tokenBytes.count else { return false }
        let bytes = vocabulary.tokenBytes[token]
        if grammar.waitsForToken(state.stacks) { return grammar.accept(token: token, bytes: bytes, from: state) != nil }
        guard !bytes.isEmpty else { return false }
        return tables.withLock { tables in
            tables.automaton.trim()
            var current = tables.automaton.number(state)
            for byte in bytes {
                current = tables.automaton.next(current, byte)
                if current < 0 { return false }
            }
            return true
        }
    }

    /// Sets the score of every token that may not follow `state` to -infinity; false when none may.
    public func restrict(_ scores: inout [Float], after state: GrammarState) -> Bool {
        let allowed = allowedTokens(state)
        var any = false
        for index in scores.indices {
            if index >= allowed.count || !allowed[index] { scores[index] = -.infinity } else { any = true }
        }
        return any
    }

    /// The state after `token`; a dead one (nothing may follow) after an end token or a refused one.
    public func state(after token: Int, from state: GrammarState) -> GrammarState {
        guard !endTokens.contains(token), token >= 0, token < vocabulary.tokenBytes.count,
              let next = grammar.accept(token: token, bytes: vocabulary.tokenBytes[token], from: state) else {
            return GrammarState(stacks: [])
        }
        return next
    }
}

/// One sequence's progress through a ``GrammarConstraint``.
final class GrammarTokenConstraint: TokenConstraint {
    private let constraint: GrammarConstraint
    private var state: GrammarState

    init(_ constraint: GrammarConstraint) {
        self.constraint = constraint
        state = constraint.grammar.initialState
    }

    func allows(_ token: Int) -> Bool { constraint.allows(token, after: state) }

    func restrict(_ scores: inout [Float]) -> Bool { constraint.restrict(&scores, after: state) }

    func accept(_ token: Int) { state = constraint.state(after: token, from: state) }
}
