import Foundation
import Testing
@testable import VLMTokenizers

/// What oracle/tokenizer_phase2.py recorded from tokenizers: offsets, type ids, pairs and truncation.
private struct Phase2Cases: Decodable {
    struct Single: Decodable {
        let text: String
        let ids: [Int]
        let tokens: [String]
        let offsets: [Int]
        let type_ids: [Int]
        let ids_without_special: [Int]
        let decoded: String
        let decoded_skip_special: String
    }
    struct Pair: Decodable {
        let text: String
        let pair: String
        let ids: [Int]
        let type_ids: [Int]
        let offsets: [Int]
        let tokens: [String]
    }
    struct Truncation: Decodable {
        let text: String
        let pair: String?
        let strategy: String
        let side: String
        let max_length: Int
        let ids: [Int]?
        let type_ids: [Int]?
        let offsets: [Int]?
        let error: String?
    }
    let single: [Single]
    let pairs: [Pair]
    let truncation: [Truncation]
}

private func flat(_ offsets: [Range<Int>]) -> [Int] { offsets.flatMap { [$0.lowerBound, $0.upperBound] } }

/// `checkDecode` is off where tokenizer_config.json makes transformers decode differently from the bare tokenizers
/// pipeline the oracle recorded (CLIP: its decode is checked against transformers in clip_cases.json).
private func checkPhase2(_ directory: String, _ fixture: String, minimumStrings: Int, checkDecode: Bool = true) throws {
    let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent(directory))
    let cases = try JSONDecoder().decode(Phase2Cases.self, from: Data(contentsOf: fixturesDirectory.appendingPathComponent(fixture)))
    #expect(cases.single.count >= minimumStrings)
    var failures: [String] = []
    func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition && failures.count < 15 { failures.append(message()) }
    }
    for item in cases.single {
        let encoding = tokenizer.encode(item.text)
        let name = item.text.debugDescription
        check(encoding.ids == item.ids, "ids of \(name): \(encoding.ids) != \(item.ids)")
        check(encoding.tokens == item.tokens, "tokens of \(name): \(encoding.tokens) != \(item.tokens)")
        check(flat(encoding.offsets) == item.offsets, "offsets of \(name): \(flat(encoding.offsets)) != \(item.offsets)")
        check(encoding.typeIds == item.type_ids, "type ids of \(name)")
        check(tokenizer.encode(item.text, addSpecialTokens: false).ids == item.ids_without_special, "ids without special tokens of \(name)")
        guard checkDecode else { continue }
        let decoded = tokenizer.decode(item.ids)
        check(decoded == item.decoded, "decode of \(name): \(decoded.debugDescription) != \(item.decoded.debugDescription)")
        let skipped = tokenizer.decode(item.ids, skipSpecialTokens: true)
        check(skipped == item.decoded_skip_special, "decode skipping special of \(name): \(skipped.debugDescription) != \(item.decoded_skip_special.debugDescription)")
    }
    for item in cases.pairs {
        let encoding = tokenizer.encode(item.text, pair: item.pair)
        let name = "\(item.text.debugDescription) + \(item.pair.debugDescription)"
        check(encoding.ids == item.ids, "pair ids of \(name): \(encoding.ids) != \(item.ids)")
        check(encoding.tokens == item.tokens, "pair tokens of \(name)")
        check(encoding.typeIds == item.type_ids, "pair type ids of \(name): \(encoding.typeIds) != \(item.type_ids)")
        check(flat(encoding.offsets) == item.offsets, "pair offsets of \(name): \(flat(encoding.offsets)) != \(item.offsets)")
    }
    for item in cases.truncation {
        let strategy: TruncationStrategy = switch item.strategy {
        case "only_first": .onlyFirst
        case "only_second": .onlySecond
        default: .longestFirst
        }
        let options = EncodingOptions(truncation: strategy, maxLength: item.max_length, truncationSide: item.side == "left" ? .left : .right)
        let name = "\(item.strategy) \(item.side) \(item.max_length) of \(item.text.debugDescription) + \(item.pair.debugDescription)"
        do {
            let encoding = try #require(try tokenizer.encode([item.text], pairs: item.pair.map { [$0] }, options: options).first)
            check(item.error == nil, "\(name) should fail with \(item.error ?? "")")
            check(encoding.ids == item.ids, "truncated ids of \(name): \(encoding.ids) != \(item.ids ?? [])")
            check(encoding.typeIds == item.type_ids, "truncated type ids of \(name)")
            check(flat(encoding.offsets) == item.offsets, "truncated offsets of \(name)")
        } catch is TruncationError {
            check(item.error != nil, "\(name) failed, tokenizers did not")
        }
    }
    #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
}

@Suite struct Phase2OracleTests {
    @Test func clipOffsetsPairsTruncation() throws { try checkPhase2("clip", "clip_phase2.json", minimumStrings: 1500, checkDecode: false) }

    @Test func gpt2StyleOffsetsPairsTruncation() throws { try checkPhase2("gpt2-style", "gpt2_style_phase2.json", minimumStrings: 1500) }

    @Test func bertStyleOffsetsPairsTruncation() throws { try checkPhase2("bert-style", "bert_style_phase2.json", minimumStrings: 1500) }

    @Test func t5StyleUnigramPrecompiledMetaspace() throws { try checkPhase2("t5-style", "t5_style_phase2.json", minimumStrings: 5000) }

    @Test func llamaStyleByteFallbackMetaspace() throws { try checkPhase2("llama-style", "llama_style_phase2.json", minimumStrings: 5000) }
}
