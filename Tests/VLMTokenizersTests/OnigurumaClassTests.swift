import Foundation
import Testing
@testable import VLMTokenizers

/// The Unicode classes of GGUF split regexes, run on Swift's regex engine, against the code points Hugging Face
/// tokenizers' Oniguruma matches for each (Tests/Fixtures/gguf-tokenizers/onig_classes.json, by
/// oracle/onig_unicode_classes.py), over all of Unicode but the surrogates.
@Suite struct OnigurumaClassTests {
    static let expected: [String: [[UInt32]]] = {
        let url = fixturesDirectory.deletingLastPathComponent().appendingPathComponent("gguf-tokenizers/onig_classes.json")
        return (try? JSONDecoder().decode([String: [[UInt32]]].self, from: Data(contentsOf: url))) ?? [:]
    }()

    static let scalars: [Unicode.Scalar] = (0..<0x110000).compactMap { Unicode.Scalar(UInt32($0)) }

    @Test(arguments: [#"\p{L}"#, #"\p{N}"#, #"\p{M}"#, #"\p{P}"#, #"\p{S}"#, #"\p{Lu}"#, #"\p{Ll}"#, #"\p{Lt}"#,
                      #"\p{Lm}"#, #"\p{Lo}"#, #"\p{Han}"#, #"\s"#])
    func classMatchesOniguruma(_ source: String) throws {
        let ranges = try #require(Self.expected[source])
        var want = Set<UInt32>()
        for range in ranges { want.formUnion(range[0]...range[1]) }
        let pattern = try RegexPattern(source, file: "onig_classes.json")
        var got = Set<UInt32>()
        for match in pattern.matches(in: Self.scalars) {
            for index in match { got.insert(Self.scalars[index].value) }
        }
        let missing = want.subtracting(got).sorted(), extra = got.subtracting(want).sorted()
        let hex = { (values: [UInt32]) in values.prefix(12).map { String($0, radix: 16, uppercase: true) }.joined(separator: " ") }
        #expect(missing.isEmpty && extra.isEmpty,
                "\(source): \(missing.count) code points only Oniguruma matches (\(hex(missing))), \(extra.count) only Swift matches (\(hex(extra)))")
    }

    /// The hand-compiled GPT-2 split classifies scalars by the same tables: it splits as the regex does around every
    /// code point whose letter or number class differs between Swift's and Oniguruma's Unicode data, and every 97th
    /// other one (each between two letters and before a digit and a space).
    @Test func alternationPatternClassifiesAsOniguruma() throws {
        let source = #"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"#
        let fast = try #require(AlternationPattern.known(source))
        let regex = try RegexPattern(source, file: "test")
        var text: [Unicode.Scalar] = []
        for (index, scalar) in Self.scalars.enumerated() where scalar.value >= 0x80 && !scalar.isRegexWhitespace {
            let differs = scalar.isLetter != OnigurumaClasses.letters.contains(scalar.value)
                || scalar.isNumber != OnigurumaClasses.numbers.contains(scalar.value)
            if differs || index % 97 == 0 { text += ["a", scalar, "b", "1", " "] }
        }
        #expect(fast.matches(in: text) == regex.matches(in: text))
    }
}
