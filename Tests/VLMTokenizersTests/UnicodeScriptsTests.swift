import Foundation
import Testing
@testable import VLMTokenizers

/// What oracle/tokenizer_scripts.py recorded from tokenizers' UnicodeScripts pre-tokenizer: each string's words as
/// flattened (start, end) scalar offsets.
private struct ScriptSplits: Decodable {
    let probes: [String]
    let probe_splits: [[Int]]
    let splits: [[Int]]
}

private func splits(_ text: String) -> [Int] {
    let word = NormalizedText(Array(text.unicodeScalars)[...], start: 0)
    return UnicodeScripts().preTokenize([word]).flatMap { [$0.originalRange(0..<$0.scalars.count).lowerBound,
                                                           $0.originalRange(0..<$0.scalars.count).upperBound] }
}

@Suite struct UnicodeScriptsTests {
    @Test func splitsLikeTokenizers() throws {
        let cases = try JSONDecoder().decode(ScriptSplits.self, from: Data(contentsOf: fixturesDirectory.appendingPathComponent("unicode_scripts.json")))
        let texts = try JSONDecoder().decode([String].self, from: Data(contentsOf: fixturesDirectory.appendingPathComponent("real/strings.json")))
        try #require(texts.count == cases.splits.count && cases.probes.count == cases.probe_splits.count)
        #expect(cases.probes.count > 100)
        var failures: [String] = []
        for (text, expected) in zip(texts + cases.probes, cases.splits + cases.probe_splits) where splits(text) != expected {
            if failures.count < 10 { failures.append("\(text.debugDescription): \(splits(text)) != \(expected)") }
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }

    /// tokenizers' own unit tests (pre_tokenizers/unicode_scripts/pre_tokenizer.rs).
    @Test func tokenizersExamples() {
        #expect(splits("どこで生れ。Yes") == [0, 5, 5, 6, 6, 9])
        #expect(splits("Apples are りんご 林檎") == [0, 11, 11, 17])
        #expect(splits("  a") == [2, 3])
        #expect(splits("   ") == [])
    }

    @Test func loadsFromTokenizerJSON() throws {
        let json = #"{"pre_tokenizer": {"type": "UnicodeScripts"}, "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "[UNK]": 2}, "unk_token": "[UNK]"}}"#
        let directory = try temporaryDirectory(files: ["tokenizer.json": json])
        defer { try? FileManager.default.removeItem(at: directory) }
        let tokenizer = try Tokenizer(directory: directory)
        #expect(tokenizer.encode("aカb").ids == [0, 2, 1])
    }
}
