import Foundation
import Testing
import VLMGrammar
import VLMTemplates

/// llama.cpp's `tests/test-json-schema-to-grammar.cpp` (located by `LlamaCppGrammarCorpus`): JSON schemas with the
/// GBNF llama.cpp writes for them, or with the expectation that it refuses them.
private enum SchemaCorpus {
    struct Case {
        var succeeds: Bool
        var name: String
        var schema: String
        var grammar: String
    }

    /// Every `test({ SUCCESS|FAILURE, "name", schema, expected_grammar })` of the suite, and how many `test({` the
    /// source holds (the scanner must find them all).
    static func cases() throws -> (cases: [Case], written: Int) {
        let source = try LlamaCppGrammarCorpus.read("tests/test-json-schema-to-grammar.cpp")
        var cases: [Case] = []
        for arguments in CppTestSource.calls(named: "test", in: source) {
            guard arguments.count == 1, case let .list(fields) = arguments[0], fields.count == 4,
                  case let .identifier(status) = fields[0], status == "SUCCESS" || status == "FAILURE",
                  case let .string(name) = fields[1], case let .string(schema) = fields[2],
                  case let .string(grammar) = fields[3] else { continue }
            cases.append(Case(succeeds: status == "SUCCESS", name: name, schema: schema, grammar: grammar))
        }
        return (cases, source.components(separatedBy: "test({").count - 1)
    }

    /// The suite's `trim`, on bytes as it works: " \n\r\t" off both ends, then the spaces and tabs after each "\n".
    static func trim(_ text: String) -> [UInt8] {
        let blank: Set<UInt8> = [0x20, 0x0A, 0x0D, 0x09]
        let bytes = Array(text.utf8)
        guard let first = bytes.firstIndex(where: { !blank.contains($0) }),
              let last = bytes.lastIndex(where: { !blank.contains($0) }) else { return [] }
        var trimmed: [UInt8] = []
        var lineStart = true
        for byte in bytes[first...last] where !(lineStart && (byte == 0x20 || byte == 0x09)) {
            trimmed.append(byte)
            lineStart = byte == 0x0A
        }
        return trimmed
    }
}

@Suite(.enabled(if: LlamaCppGrammarCorpus.available, Comment(rawValue: LlamaCppGrammarCorpus.skipMessage)))
struct LlamaCppSchemaCorpusTests {
    /// Each SUCCESS case converts to llama.cpp's grammar, byte for byte after the suite's `trim`; each FAILURE case
    /// throws. No case is exempt.
    @Test func everyCaseOfTheSuite() throws {
        let (cases, written) = try SchemaCorpus.cases()
        #expect(cases.count == written, "\(written) test({ in the source, \(cases.count) read")
        var failures: [String] = []
        var passed = (success: 0, failure: 0)
        for testCase in cases {
            let schema = try JSONValue(parsing: Data(testCase.schema.utf8), file: testCase.name)
            switch (testCase.succeeds, Result { () throws(GrammarError) in try JSONSchemaGrammar.convert(schema) }) {
            case let (true, .success(conversion)):
                if SchemaCorpus.trim(conversion.grammar) == SchemaCorpus.trim(testCase.grammar) {
                    passed.success += 1
                } else {
                    failures.append("\(testCase.name): expected\n\(testCase.grammar)\ngot\n\(conversion.grammar)")
                }
            case let (true, .failure(error)):
                failures.append("\(testCase.name): \(error)")
            case (false, .failure):
                passed.failure += 1
            case let (false, .success(conversion)):
                failures.append("\(testCase.name): expected a failure, got\n\(conversion.grammar)")
            }
        }
        let successes = cases.filter(\.succeeds).count
        print("llama.cpp test-json-schema-to-grammar: \(passed.success)/\(successes) SUCCESS cases identical, "
              + "\(passed.failure)/\(cases.count - successes) FAILURE cases refused")
        #expect(cases.count > 60)
        #expect(failures.isEmpty, "\(failures.count) of \(cases.count) differ:\n\(failures.joined(separator: "\n\n"))")
    }
}

/// Cases of the C++ semantics outside the corpus's `test({...})` calls, each expected value read off llama.cpp's
/// code (json-schema.cpp, json-schema-to-grammar.cpp) or nlohmann's serializer.
struct JSONSchemaGrammarTests {
    private func grammar(_ schema: String) throws -> JSONSchemaConversion {
        try JSONSchemaGrammar.convert(try JSONValue(parsing: Data(schema.utf8)))
    }

    private func rules(_ schema: String) throws -> [String] {
        try grammar(schema).grammar.split(separator: "\n").map(String.init)
    }

    private static let space = #"space ::= | " " | "\n"{1,2} [ \t]{0,20}"#

    /// A `const` is quoted as nlohmann's `dump()` writes it: `"`, `\` and the named controls escaped, other
    /// controls as lowercase `\u00xx`, non-ASCII left as it is; then GBNF escapes the quotes and backslashes again.
    @Test func constantsAreNlohmannsCompactJSON() throws {
        let escaped = try rules(#"{"const": "\u0001\u001fé\t\b\f€\u007f"}"#)
        #expect(escaped == [#"root ::= "\"\\u0001\\u001fé\\t\\b\\f€\#u{7F}\"""#, Self.space])
        #expect(try rules(#"{"const": {"b": [1, true, null], "a": "x"}}"#)
            == [#"root ::= "{\"b\":[1,true,null],\"a\":\"x\"}""#, Self.space])
        // nlohmann's float layout: fixed-point with a decimal from 1e-4 to below 1e15, else two-digit exponents.
        #expect(try rules(#"{"enum": [1.0, 100e0, 0.5, -0.0, 1e15, 1e14, 0.0001, 0.00001, 1.5e300, 123.456]}"#)
            == [#"root ::= ("1.0" | "100.0" | "0.5" | "-0.0" | "1e+15" | "100000000000000.0" | "0.0001" | "1e-05" | "1.5e+300" | "123.456")"#,
                Self.space])
        // nlohmann's digits are Grisu2's, not always the shortest or closest that read back (Swift's description
        // writes -1.3218434828581538e+15, 4.02899779922867e+16, 1.9805236391288218e+15); these are the texts the
        // compiled llama.cpp converter writes for them.
        #expect(try rules(#"{"enum": [-1321843482858153.8, 4.02899779922867e+16, 1980523639128821.8]}"#)
            == [#"root ::= ("-1.3218434828581537e+15" | "4.0289977992286704e+16" | "1.9805236391288217e+15")"#, Self.space])
    }

    /// `_add_rule`: a name taken by another body gets the first free numeric suffix, the same body shares the rule;
    /// names are escaped first (a run of other characters is one "-"), so "a!", "a?" and "a!?" all want "a-". Suffixes
    /// follow the order rules are added in: a "-rest" rule after the ones it refers to.
    @Test func clashingRuleNamesTakeSuffixes() throws {
        #expect(try rules(#"{"properties": {"a!": {"const": 1}, "a?": {"const": 2}, "a!?": {"const": 1}}}"#) == [
            #"a- ::= "1""#,
            #"a--kv ::= "\"a!\"" space ":" space a-"#,
            #"a--kv0 ::= "\"a?\"" space ":" space a-0"#,
            #"a--kv1 ::= "\"a!?\"" space ":" space a-"#,
            #"a--rest ::= ( "," space a--kv1 )?"#,
            #"a--rest0 ::= ( "," space a--kv0 )? a--rest"#,
            #"a-0 ::= "2""#,
            #"root ::= "{" space  (a--kv a--rest0 | a--kv0 a--rest | a--kv1 )? space "}""#,
            Self.space,
        ])
    }

    /// A `$ref` back to the definition being converted names its rule instead of converting it again (the
    /// corpus's "parsed document" check, whose grammar it only compares with itself).
    @Test func recursiveReference() throws {
        let lines = try rules(#"""
            {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
             "properties": {"next": {"$ref": "#/$defs/node"}, "leaf": {}}, "additionalProperties": false}}}
            """#)
        #expect(lines.filter { $0.hasPrefix("r") } == [
            #"ref-defs-node ::= "{" space  (ref-defs-node-next-kv ref-defs-node-next-rest | ref-defs-node-leaf-kv )? space "}""#,
            #"ref-defs-node-leaf ::= value"#,
            #"ref-defs-node-leaf-kv ::= "\"leaf\"" space ":" space ref-defs-node-leaf"#,
            #"ref-defs-node-next ::= ref-defs-node"#,
            #"ref-defs-node-next-kv ::= "\"next\"" space ":" space ref-defs-node-next"#,
            #"ref-defs-node-next-rest ::= ( "," space ref-defs-node-leaf-kv )?"#,
            #"root ::= ref-defs-node"#,
        ])
        #expect(lines.map { $0.prefix { $0 != " " } } == [
            "array", "boolean", "char", "decimal-part", "integral-part", "null", "number", "object", "ref-defs-node",
            "ref-defs-node-leaf", "ref-defs-node-leaf-kv", "ref-defs-node-next", "ref-defs-node-next-kv",
            "ref-defs-node-next-rest", "root", "space", "string", "value",
        ])
    }

    /// A `$ref` whose target is itself, inside `allOf`: llama.cpp follows it until its stack overflows (SIGSEGV);
    /// here the cycle contributes nothing.
    @Test func selfReferenceInAllOfEnds() throws {
        _ = try grammar(##"{"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}}"##)
    }

    /// A pattern the grammar cannot express accepts any string, with llama.cpp's warning; an invalid one, and a
    /// schema outside the subset, fail with llama.cpp's message.
    @Test func warningsAndErrorsCarryLlamaCppsMessages() throws {
        let loose = try grammar(#"{"type": "string", "pattern": "^\\d+$"}"#)
        #expect(loose.warnings == [#"pattern ^\d+$ is not supported (unsupported escape: \d), accepting any string"#])
        #expect(try grammar(#"{"type": "string", "pattern": "^[0-9]+$"}"#).warnings.isEmpty)
        let failures: [(String, String)] = [
            (#"{"type": "string", "pattern": "^(a$"}"#, "Invalid pattern ^(a$: unbalanced parentheses"),
            (#"{"type": "kaboom"}"#, "JSON schema error at #: unrecognized type kaboom"),
            (#"{"properties": {"a": {"items": 3}}}"#, "JSON schema error at #/properties/a/items: schema must be an object"),
            (##"{"$ref": "#/$defs/missing"}"##, "JSON schema error at #: cannot resolve $ref #/$defs/missing, $defs not found"),
            (#"{"$ref": "other.json#/a"}"#,
             "JSON schema error at #: unsupported $ref other.json#/a, only references into the same document are supported"),
            (#"{"type": "array", "minItems": -1}"#, "JSON schema error at #: minItems must be a non-negative integer"),
        ]
        for (schema, message) in failures {
            #expect(throws: GrammarError.invalidSchema(message)) { try grammar(schema) }
        }
    }

    /// Fractional bounds round inwards, exclusive ones move by one (json-schema.cpp's `get_bound`).
    @Test func integerBoundsFoldExclusiveAndFractionalOnes() throws {
        #expect(try rules(#"{"type": "integer", "exclusiveMinimum": 0, "maximum": 9.5}"#)
            == ["root ::= ([1-9])", Self.space])
        #expect(try rules(#"{"type": "integer", "minimum": 2.5, "exclusiveMaximum": 10}"#)
            == ["root ::= ([3-9])", Self.space])
    }
}

/// The scanner reads C++ literals as the compiler does.
struct CppTestSourceTests {
    @Test func literalsAndArguments() {
        let source = #"""
            #include "json.h"
            // test("commented out", {});
            static void test(const std::string & name, const std::vector<std::string> & passing) {}
            /* test("also commented out") */
            int main() {
                test("a" "b\n\t\"\\\'\x41\xc3\xa9\u00e9\U0001F600\0", R"""(raw "text" \n)""", {
                    "x", // comment
                    token(10) + "y",
                }, SUCCESS);
                test({ FAILURE, u8"z", R"x(a)b)x" }, 'c', "paren ) in a literal");
                test(name + " more", grammar);
            }
            """#
        #expect(CppTestSource.calls(named: "test", in: source) == [
            [
                .string("ab\n\t\"\\'A\u{E9}\u{E9}\u{1F600}\0"), .string(#"raw "text" \n"#),
                .list([.string("x"), .expression(#"token(10) + "y""#)]), .identifier("SUCCESS"),
            ],
            [.list([.identifier("FAILURE"), .string("z"), .string("a)b")]), .expression("'c'"),
             .string("paren ) in a literal")],
        ])
    }
}
