import Foundation
import Testing
import VLMGrammar
import VLMTemplates

/// llama.cpp's grammar integration suite (tests/test-grammar-integration.cpp as llama-cpp-python 0.3.36 vendors it),
/// run as it runs there: each `test_grammar` and `test_schema` case's grammar (or the grammar of its JSON schema) must
/// match every passing string and none of the failing ones, the strings fed piece by piece as its `match_string`
/// feeds them (each character its own piece, `token(N)` markers as token N with the text `<[N]>`), a string matching
/// when some stack is empty at its end. The grammars llama.cpp refuses (an undefined rule, left recursion, a missing
/// root) are refused.
@Suite(.enabled(if: LlamaCppGrammarCorpus.available, "\(LlamaCppGrammarCorpus.skipMessage)"))
struct GrammarIntegrationTests {
    enum Piece { case text(String), token(Int) }

    /// The pieces `match_string` feeds: `token(N)` markers and the characters of the literals between them.
    static func pieces(_ argument: CppArgument) throws -> [Piece] {
        switch argument {
        case .string(let text):
            return text.unicodeScalars.map { .text(String($0)) }
        case .expression(let source):
            var pieces: [Piece] = []
            for part in try splitConcatenation(source) {
                if part.hasPrefix("token("), part.hasSuffix(")"), let id = Int(part.dropFirst(6).dropLast()) {
                    pieces.append(.token(id))
                } else {
                    let literal = CppTestSource.calls(named: "literal", in: "literal(\(part))").first?.first
                    guard case .string(let text)? = literal else { throw CorpusError("cannot read \(part)") }
                    pieces += text.unicodeScalars.map { .text(String($0)) }
                }
            }
            return pieces
        default:
            throw CorpusError("unexpected argument \(argument)")
        }
    }

    /// The operands of `a + b + c`, split outside string literals.
    static func splitConcatenation(_ source: String) throws -> [String] {
        var parts: [String] = []
        var current = ""
        var inString = false
        var escaped = false
        for character in source {
            if inString {
                current.append(character)
                if escaped { escaped = false } else if character == "\\" { escaped = true } else if character == "\"" { inString = false }
            } else if character == "\"" {
                inString = true
                current.append(character)
            } else if character == "+" {
                parts.append(current.trimmingCharacters(in: .whitespacesAndNewlines))
                current = ""
            } else {
                current.append(character)
            }
        }
        parts.append(current.trimmingCharacters(in: .whitespacesAndNewlines))
        return parts
    }

    /// `match_string`: whether the grammar reads the pieces and ends with an empty stack.
    static func matches(_ grammar: Grammar, _ pieces: [Piece]) -> Bool {
        var state = grammar.initialState
        for piece in pieces {
            let next: GrammarState?
            switch piece {
            case .text(let text): next = grammar.accept(token: 0, bytes: Array(text.utf8), from: state)
            case .token(let id): next = grammar.accept(token: id, bytes: Array("<[\(id)]>".utf8), from: state)
            }
            guard let next else { return false }
            state = next
        }
        return grammar.isComplete(state)
    }

    struct Case {
        var name: String
        var grammar: Grammar
        var passing: [[Piece]]
        var failing: [[Piece]]
    }

    static func cases() throws -> [Case] {
        let source = try LlamaCppGrammarCorpus.read("tests/test-grammar-integration.cpp")
        var cases: [Case] = []
        for kind in ["test_grammar", "test_schema"] {
            for arguments in CppTestSource.calls(named: kind, in: source) {
                guard arguments.count == 4, case .string(let name) = arguments[0], case .string(let text) = arguments[1],
                      case .list(let passing) = arguments[2], case .list(let failing) = arguments[3] else {
                    throw CorpusError("\(kind): unexpected arguments \(arguments)")
                }
                let gbnf = kind == "test_grammar"
                    ? text : try JSONSchemaGrammar.convert(JSONValue(parsing: Data(text.utf8))).grammar
                cases.append(Case(name: "\(kind) \(name)", grammar: try Grammar(gbnf: gbnf),
                                  passing: try passing.map(pieces), failing: try failing.map(pieces)))
            }
        }
        return cases
    }

    @Test func everyCaseMatchesAsInLlamaCpp() throws {
        let cases = try Self.cases()
        // 14 test_grammar and 33 test_schema calls in this version of the suite, 387 strings in their lists.
        #expect(cases.count == 47)
        var strings = 0
        for testCase in cases {
            for (index, pieces) in testCase.passing.enumerated() {
                #expect(Self.matches(testCase.grammar, pieces), "\(testCase.name): passing string \(index) refused")
            }
            for (index, pieces) in testCase.failing.enumerated() {
                #expect(!Self.matches(testCase.grammar, pieces), "\(testCase.name): failing string \(index) matched")
            }
            strings += testCase.passing.count + testCase.failing.count
        }
        #expect(strings == 387)
    }

    /// The string literal assigned to `const std::string NAME` in the body of `function`.
    static func variable(_ name: String, in function: String, of source: String) throws -> String {
        guard let head = source.range(of: "static void \(function)()") else { throw CorpusError("no \(function)") }
        let body = source[head.upperBound...]
        let bodyEnd = body.range(of: "\nstatic void ")?.lowerBound ?? body.endIndex
        let text = body[..<bodyEnd]
        guard let assignment = text.range(of: "const std::string \(name) =") else { throw CorpusError("no \(name) in \(function)") }
        let rest = text[assignment.upperBound...]
        guard let end = rest.range(of: ";\n") else { throw CorpusError("\(name) in \(function) does not end") }
        guard case .string(let value)? = CppTestSource.calls(named: "literal", in: "literal(\(rest[..<end.lowerBound]))").first?.first else {
            throw CorpusError("\(name) in \(function) is not a string literal")
        }
        return value
    }

    /// The grammars the suite expects llama.cpp to refuse: a missing reference, four left recursions, a start rule
    /// that does not exist; and the two that parse but have no `root` (refused unless named as the start).
    @Test func refusedGrammarsAreRefused() throws {
        let source = try LlamaCppGrammarCorpus.read("tests/test-grammar-integration.cpp")
        let missingReference = try Self.variable("grammar_str", in: "test_failure_missing_reference", of: source)
        #expect(throws: GrammarError.self) { try Grammar(gbnf: missingReference) }
        for name in ["simple_str", "medium_str", "hard_str", "hardest_str"] {
            let grammar = try Self.variable(name, in: "test_failure_left_recursion", of: source)
            #expect(throws: GrammarError.self, "\(name) recurses on the left") { try Grammar(gbnf: grammar) }
        }
        let missingRoot = try Self.variable("grammar_str", in: "test_failure_missing_root", of: source)
        #expect(throws: GrammarError.self) { try Grammar(gbnf: missingRoot) }
        _ = try Grammar(gbnf: missingRoot, root: "rot")
        let foobar = try Self.variable("grammar_str", in: "test_failure_missing_root_symbol", of: source)
        #expect(throws: GrammarError.self) { try Grammar(gbnf: foobar, root: "nonexistent") }
        let custom = try Self.variable("custom_root_grammar_str", in: "test_custom_root_symbol_check", of: source)
        #expect(throws: GrammarError.self) { try Grammar(gbnf: custom) }
        _ = try Grammar(gbnf: custom, root: "foobar")
    }
}

struct CorpusError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Grammars and schemas from strangers (a server's requests) end in a grammar or a one-line error, never in a
/// recursion that overflows a thread's stack: llama.cpp's limits where it has them, bounds of our own where it
/// would crash.
struct GrammarLimitTests {
    @Test func deepAndLongGrammars() throws {
        let nested = "root ::= " + String(repeating: "(", count: 201) + "\"a\"" + String(repeating: ")", count: 201)
        #expect(throws: GrammarError.self) { try Grammar(gbnf: nested) }
        let chain = "root ::= r0\n" + (0..<50_000).map { "r\($0) ::= r\($0 + 1)\n" }.joined() + "r50000 ::= \"a\"\n"
        let grammar = try Grammar(gbnf: chain)
        #expect(grammar.accept(bytes: Array("a".utf8), from: grammar.initialState).map(grammar.isComplete) == true)
        // llama.cpp's repetition limits: more than 2,000 required repetitions, or rules that would multiply past it.
        #expect(throws: GrammarError.self) { try Grammar(gbnf: "root ::= \"a\"{2001}") }
        #expect(throws: GrammarError.self) { try Grammar(gbnf: "root ::= (\"a\"{0,100}){0,100}") }
    }

    @Test func deepSchemasAreRefused() throws {
        var definitions: [(String, JSONValue)] = (0..<600).map { ("d\($0)", ["$ref": .string("#/$defs/d\($0 + 1)")]) }
        definitions.append(("d600", ["type": "integer"]))
        let chain: JSONValue = ["$ref": "#/$defs/d0", "$defs": .object(definitions)]
        #expect(throws: GrammarError.self) { try JSONSchemaGrammar.convert(chain) }
        var nested: JSONValue = ["type": "string"]
        for _ in 0..<300 { nested = ["type": "array", "items": nested] }
        _ = try Grammar(gbnf: JSONSchemaGrammar.convert(nested).grammar)
    }
}
