import Foundation
import Testing
@testable import VLMTemplates

/// python-regex.json, written by oracle/python_regex.py from the `regex` module.
struct PythonRegexFixture: Decodable {
    struct Match: Decodable, Equatable {
        let span: [Int]
        let partial: Bool
        let groups: [[Int]?]
    }

    /// What the module answered: no match, a match, `finditer`'s matches, `sub`'s text or its error.
    enum Answer: Decodable, Equatable {
        case none
        case match(Match)
        case matches([Match])
        case text(String)
        case error(String)

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() {
                self = .none
            } else if let matches = try? container.decode([Match].self) {
                self = .matches(matches)
            } else if let match = try? container.decode(Match.self) {
                self = .match(match)
            } else {
                let object = try container.decode([String: String].self)
                if let text = object["text"] { self = .text(text) } else { self = .error(object["error"] ?? "") }
            }
        }
    }

    struct Case: Decodable {
        let op: String
        let text: String
        let pos: Int?
        let partial: Bool?
        let template: String?
        let expected: Answer
    }

    struct Pattern: Decodable, Sendable, CustomTestStringConvertible {
        let pattern: String
        let dotall: Bool
        let groups: Int
        let groupindex: [String: Int]
        let cases: [Case]

        var testDescription: String { dotall ? "\(pattern) (DOTALL)" : pattern }
    }

    struct PythonError: Decodable, Sendable, CustomTestStringConvertible {
        let pattern: String
        let python_error: String

        var testDescription: String { pattern }
    }

    struct Escape: Decodable, Sendable {
        let literal: String
        let expected: String
    }

    struct Divergence: Decodable, Sendable, CustomTestStringConvertible {
        let pattern: String
        let dotall: Bool
        let kind: String
        let `case`: Case

        var testDescription: String { "\(pattern) (\(kind))" }
    }

    let patterns: [Pattern]
    let python_errors: [PythonError]
    let unsupported: [String]
    let escape: [Escape]
    let divergences: [Divergence]
}

extension PythonRegexFixture.Case: Sendable {}
extension PythonRegexFixture.Answer: Sendable {}
extension PythonRegexFixture.Match: Sendable {}

private let loadedFixture = Result {
    try JSONDecoder().decode(PythonRegexFixture.self,
                             from: Data(contentsOf: chatTemplateFixtures.appendingPathComponent("python-regex.json")))
}

private func fixture() throws -> PythonRegexFixture { try loadedFixture.get() }

private func scalars(_ text: String) -> [Unicode.Scalar] { Array(text.unicodeScalars) }

private func answer(_ match: PythonRegexMatch?) -> PythonRegexFixture.Answer {
    guard let match else { return .none }
    return .match(PythonRegexFixture.Match(span: [match.range.lowerBound, match.range.upperBound], partial: match.partial,
                                     groups: match.groups.map { $0.map { [$0.lowerBound, $0.upperBound] } }))
}

/// What PythonRegex answers for a fixture case.
private func run(_ testCase: PythonRegexFixture.Case, on regex: PythonRegex) throws -> PythonRegexFixture.Answer {
    let text = scalars(testCase.text)
    switch testCase.op {
    case "search":
        return answer(try regex.search(text, from: testCase.pos ?? 0, partial: testCase.partial ?? false))
    case "fullmatch":
        return answer(try regex.fullMatch(text))
    case "finditer":
        return .matches(try regex.matches(in: text, from: testCase.pos ?? 0).map { match in
            guard case let .match(found) = answer(match) else { preconditionFailure() }
            return found
        })
    case "sub":
        do {
            return .text(String(String.UnicodeScalarView(try regex.substitute(in: text, template: testCase.template ?? ""))))
        } catch {
            return .error(error.description)
        }
    default:
        return .error("the fixture asks for \(testCase.op), which this test does not know")
    }
}

private func describe(_ testCase: PythonRegexFixture.Case) -> String {
    "\(testCase.op)(\(String(reflecting: testCase.text)), pos: \(testCase.pos ?? 0), partial: \(testCase.partial ?? false))"
}

@Test("Each pattern matches, searches (partially too), iterates and substitutes as the regex module does",
      arguments: try fixture().patterns)
func moduleAnswers(_ entry: PythonRegexFixture.Pattern) throws {
    let regex = try PythonRegex(entry.pattern, dotAll: entry.dotall)
    #expect(regex.groupCount == entry.groups)
    #expect(regex.groupIndex == entry.groupindex)
    for testCase in entry.cases {
        guard case let .error(message) = testCase.expected else {
            #expect(try run(testCase, on: regex) == testCase.expected, "\(describe(testCase))")
            continue
        }
        guard case .error = try run(testCase, on: regex) else {
            Issue.record("\(describe(testCase)): the module raises \(message)")
            continue
        }
    }
}

@Test("What the regex module refuses to compile is refused", arguments: try fixture().python_errors)
func moduleErrors(_ entry: PythonRegexFixture.PythonError) {
    #expect(throws: PythonRegexError.self, "the module says: \(entry.python_error)") {
        try PythonRegex(entry.pattern)
    }
}

@Test("Constructs PythonRegex does not implement are refused with a one-line error naming them",
      arguments: try fixture().unsupported)
func unsupportedConstructs(_ pattern: String) {
    do {
        _ = try PythonRegex(pattern)
        Issue.record("\(pattern) compiled")
    } catch {
        #expect(error.description.contains("not supported"))
        #expect(!error.description.contains("\n"))
    }
}

@Test("escape() writes what regex.escape writes, and the pattern matches the literal")
func escapedLiterals() throws {
    for entry in try fixture().escape {
        #expect(PythonRegex.escape(entry.literal) == entry.expected)
        let regex = try PythonRegex(PythonRegex.escape(entry.literal))
        #expect(try regex.fullMatch(scalars(entry.literal))?.range == 0..<entry.literal.unicodeScalars.count)
    }
}

@Test("Known divergences from the module stay within what the documentation allows", arguments: try fixture().divergences)
func documentedDivergences(_ entry: PythonRegexFixture.Divergence) throws {
    let regex = try PythonRegex(entry.pattern, dotAll: entry.dotall)
    let expected = entry.case.expected
    let actual = try run(entry.case, on: regex)
    if actual == expected { return }
    let end = entry.case.text.unicodeScalars.count
    switch entry.kind {
    case "none_or_empty_partial_at_end":
        let emptyAtEnd = PythonRegexFixture.Answer.match(PythonRegexFixture.Match(span: [end, end], partial: true,
                                                                        groups: Array(repeating: nil, count: regex.groupCount)))
        #expect((actual == .none && expected == emptyAtEnd) || (actual == emptyAtEnd && expected == .none),
                "\(actual) vs \(expected)")
    case "groups_of_partial":
        guard case let .match(ours) = actual, case let .match(theirs) = expected else {
            Issue.record("\(actual) vs \(expected)")
            return
        }
        #expect(ours.span == theirs.span && ours.partial == theirs.partial)
    case "module_bug":
        guard case let .match(theirs) = expected else {
            Issue.record("\(expected)")
            return
        }
        #expect(theirs.span[1] <= theirs.span[0], "the module's answer looks sound: \(theirs)")
    case "empty_iteration_groups":
        switch (actual, expected) {
        case let (.match(ours), .match(theirs)): #expect(ours.span == theirs.span)
        case let (.matches(ours), .matches(theirs)): #expect(ours.map(\.span) == theirs.map(\.span))
        default: Issue.record("\(actual) vs \(expected)")
        }
    default:
        Issue.record("unknown divergence \(entry.kind)")
    }
}

// MARK: Limits

@Test("A catastrophic pattern gives up with an error instead of running for ever")
func stepBudget() throws {
    let regex = try PythonRegex("(a|aa)*b")
    let text = scalars(String(repeating: "a", count: 60))
    let clock = ContinuousClock()
    let elapsed = clock.measure {
        #expect(throws: PythonRegexError.self) { try regex.search(text) }
    }
    #expect(elapsed < .seconds(20))
    do {
        _ = try regex.search(text)
    } catch {
        #expect(error.description.contains("too costly"))
    }
}

@Test("Nesting deeper than 100 groups and counts above 100 000 are refused; up to the limits they compile and match")
func syntaxLimits() async throws {
    // On a cooperative thread, whose stack is smaller than the main thread's (512 KiB on macOS).
    try await Task.detached {
        let deepest = try PythonRegex(String(repeating: "(?:x|(?=a)(", count: 50) + "a" + String(repeating: ")*)", count: 50))
        #expect(try deepest.search(scalars("xa"))?.range == 0..<1)
        #expect(throws: PythonRegexError.self) {
            try PythonRegex(String(repeating: "(?:", count: 101) + "a" + String(repeating: ")", count: 101))
        }
        _ = try PythonRegex("x{100000}")
        #expect(throws: PythonRegexError.self) { try PythonRegex("x{100001}") }
        #expect(throws: PythonRegexError.self) { try PythonRegex("x{1,99999999999999999999}") }
    }.value
}

@Test("Long texts: lazy and greedy repeats over 100k characters neither recurse nor crawl")
func longTexts() throws {
    let body = String(repeating: "The quick brown fox jumps over the lazy dog. ", count: 2300)
    let text = scalars(body)
    let delimiter = try PythonRegex(#"\s*<tool_call>"#, dotAll: true)
    #expect(try delimiter.search(text, partial: false) == nil)
    let tail = try #require(try delimiter.search(text, partial: true))
    #expect(tail.partial && tail.range == text.count - 1..<text.count)

    let open = try PythonRegex("<tool_call>(.*?)</tool_call>", dotAll: true)
    let unterminated = scalars("<tool_call>" + body)
    let pending = try #require(try open.search(unterminated, partial: true))
    #expect(pending.partial && pending.range == 0..<unterminated.count)
    let closed = scalars("<tool_call>" + body + "</tool_call>")
    let complete = try #require(try open.search(closed))
    #expect(complete.groups == [11..<(11 + text.count)])

    let spaces = scalars(String(repeating: " ", count: 100_000))
    #expect(try delimiter.search(spaces, partial: true)?.range == 0..<100_000)
    #expect(try delimiter.search(spaces) == nil)
}

// MARK: API

@Test("Named groups, group spans and error descriptions")
func matchAPI() throws {
    let regex = try PythonRegex(#"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>"#, dotAll: true)
    #expect(regex.groupIndex == ["key": 1, "value": 2])
    let text = scalars("<parameter=city>\n Paris \n</parameter>")
    let match = try #require(try regex.search(text))
    #expect(match.named("key") == 11..<15)
    #expect(match.named("value") == 18..<23)
    #expect(match.named("missing") == nil)
    #expect(try PythonRegex("(a)|(?P<b>b)").search(scalars("a"))?.named("b") == nil)

    do {
        _ = try PythonRegex("a\n(")
        Issue.record("compiled")
    } catch {
        #expect(error.description == #"regex 'a\n(': missing ) at position 3"#)
    }
}

@Test("A compiled pattern can be shared between tasks")
func concurrentUse() async throws {
    let regex = try PythonRegex(#"\s*<tool_call>"#)
    let found = try await withThrowingTaskGroup(of: Int?.self) { group in
        for index in 0..<8 {
            group.addTask { try regex.search(scalars(String(repeating: "x", count: index) + " <tool_call>"))?.range.lowerBound }
        }
        return try await group.reduce(into: Set<Int?>()) { $0.insert($1) }
    }
    #expect(found == Set((0..<8).map { $0 }))
}
