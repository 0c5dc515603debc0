import Foundation
import Testing
@testable import VLMTokenizers

/// What oracle/tokenizer_real.py recorded from transformers' AutoTokenizer for real/strings.json; nulls stand for
/// ids without special tokens that are the ids outside the special tokens mask, decoded text that is the input,
/// text decoded skipping special tokens that is the decoded text.
private struct RealCases: Decodable {
    let ids: [[Int]]
    let ids_without_special: [[Int]?]
    let decoded: [String?]
    let decoded_skip_special: [String?]
}

private func checkReal(_ directory: String, _ fixture: String) throws {
    let real = fixturesDirectory.appendingPathComponent("real")
    let tokenizer = try Tokenizer(directory: real.appendingPathComponent(directory))
    let texts = try JSONDecoder().decode([String].self, from: Data(contentsOf: real.appendingPathComponent("strings.json")))
    let cases = try JSONDecoder().decode(RealCases.self, from: Data(contentsOf: real.appendingPathComponent(fixture)))
    #expect(texts.count >= 5000)
    try #require(cases.ids.count == texts.count && cases.decoded.count == texts.count)
    var failures: [String] = []
    func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition && failures.count < 15 { failures.append(message()) }
    }
    for (index, text) in texts.enumerated() {
        let name = text.debugDescription
        let encoding = tokenizer.encode(text)
        check(encoding.ids == cases.ids[index], "ids of \(name): \(encoding.ids) != \(cases.ids[index])")
        let plain = tokenizer.encode(text, addSpecialTokens: false).ids
        let unmarked = zip(encoding.ids, encoding.specialTokensMask).filter { $0.1 == 0 }.map(\.0)
        check(plain == cases.ids_without_special[index] ?? unmarked, "ids without special tokens of \(name)")
        let decoded = tokenizer.decode(cases.ids[index])
        let expectedDecoded = cases.decoded[index] ?? text
        check(decoded == expectedDecoded, "decode of \(name): \(decoded.debugDescription) != \(expectedDecoded.debugDescription)")
        let skipped = tokenizer.decode(cases.ids[index], skipSpecialTokens: true)
        let expected = cases.decoded_skip_special[index] ?? expectedDecoded
        check(skipped == expected, "decode skipping special tokens of \(name): \(skipped.debugDescription) != \(expected.debugDescription)")
    }
    #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
}

@Suite struct RealTokenizerTests {
    @Test func bertUncasedTokenizerJSON() throws { try checkReal("bert-uncased", "bert-uncased.json") }

    @Test func bertUncasedFromVocabTxt() throws { try checkReal("bert-uncased-vocab", "bert-uncased.json") }

    @Test func gpt2FromVocabAndMerges() throws { try checkReal("gpt2", "gpt2.json") }

    @Test func smolLM2FromGGUF() throws { try checkReal("smollm2", "smollm2.json") }
}
