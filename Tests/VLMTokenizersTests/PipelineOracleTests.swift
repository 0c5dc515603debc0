import Foundation
import Testing
@testable import VLMTokenizers

/// What oracle/tokenizer_fixtures.py recorded in cases/<name>.json for the shared strings (by index); nulls stand
/// for values derivable from others (see the oracle's docstring).
private struct PipelineCases: Decodable {
    struct Single: Decodable {
        let ids: [[Int]]
        let ids_without_special: [[Int]?]
        let tokens: [[String]?]
        let offsets: [[Int]]
        let type_ids: [[Int]?]
        let decoded: [String?]
        let decoded_skip_special: [String?]
    }
    struct Recorded: Decodable {
        let ids: [Int]
        let offsets: [Int]
        let type_ids: [Int]?
        let tokens: [String]?
    }
    struct Pair: Decodable {
        let a: Int
        let b: Int
        let encoding: Recorded

        init(from decoder: any Swift.Decoder) throws {
            enum Keys: String, CodingKey { case a, b }
            let container = try decoder.container(keyedBy: Keys.self)
            a = try container.decode(Int.self, forKey: .a)
            b = try container.decode(Int.self, forKey: .b)
            encoding = try Recorded(from: decoder)
        }
    }
    struct Truncation: Decodable {
        let a: Int
        let b: Int?
        let strategy: String
        let side: String
        let max_length: Int
        let stride: Int
        let ids: [Int]?
        let offsets: [Int]?
        let type_ids: [Int]?
        let tokens: [String]?
        let overflowing: [Recorded]?
        let error: String?
    }
    struct Decode: Decodable {
        let ids: [Int]
        let decoded: String
        let decoded_skip_special: String?
    }
    struct Padded: Decodable {
        let ids: [[Int]]
        let attention_mask: [[Int]]
    }
    struct Batch: Decodable {
        let texts: [Int]
        let longest_77: Padded
        let max_length_16: Padded
    }
    let single: Single
    let pairs: [Pair]
    let truncation: [Truncation]
    let decode_ids: [Decode]
    /// Only where a transformers class exists (CLIP): padded batches.
    let batches: [Batch]?
}

/// Offsets as the oracle writes them: each token's length, preceded by -1 - start where the token does not start
/// at the previous one's end.
private func flat(_ offsets: [Range<Int>]) -> [Int] {
    var previous = 0
    return offsets.flatMap { range -> [Int] in
        defer { previous = range.upperBound }
        return range.lowerBound == previous ? [range.count] : [-1 - range.lowerBound, range.count]
    }
}

/// Collects the first disagreements instead of stopping at one.
private struct Failures {
    var messages: [String] = []
    mutating func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition && messages.count < 15 { messages.append(message()) }
    }
}

private func check(_ tokenizer: Tokenizer, _ encoding: Encoding, _ expected: PipelineCases.Recorded, _ name: String,
                   _ failures: inout Failures) {
    failures.check(encoding.ids == expected.ids, "ids of \(name): \(encoding.ids) != \(expected.ids)")
    failures.check(encoding.tokens == (expected.tokens ?? expected.ids.map { tokenizer.token($0) ?? "" }), "tokens of \(name): \(encoding.tokens)")
    failures.check(flat(encoding.offsets) == expected.offsets, "offsets of \(name): \(flat(encoding.offsets)) != \(expected.offsets)")
    let typeIds = expected.type_ids ?? [Int](repeating: 0, count: expected.ids.count)
    failures.check(encoding.typeIds == typeIds, "type ids of \(name): \(encoding.typeIds) != \(typeIds)")
}

private func checkPipeline(_ directory: String, minimumStrings: Int = 5000) throws {
    let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent(directory))
    let cases = try JSONDecoder().decode(PipelineCases.self, from: Data(contentsOf: fixturesDirectory.appendingPathComponent("cases/\(directory).json")))
    let texts = sharedStrings
    let single = cases.single
    try #require(single.ids.count >= minimumStrings && single.ids.count <= texts.count)
    try #require([single.ids_without_special.count, single.tokens.count, single.offsets.count, single.type_ids.count,
                  single.decoded.count, single.decoded_skip_special.count].allSatisfy { $0 == single.ids.count })
    var failures = Failures()
    for index in single.ids.indices {
        let text = texts[index], name = texts[index].debugDescription
        let expected = PipelineCases.Recorded(ids: single.ids[index], offsets: single.offsets[index],
                                              type_ids: single.type_ids[index], tokens: single.tokens[index])
        let encoding = tokenizer.encode(text)
        check(tokenizer, encoding, expected, name, &failures)
        failures.check(encoding.attentionMask == [Int](repeating: 1, count: expected.ids.count), "mask of \(name)")
        let unmarked = zip(encoding.ids, encoding.specialTokensMask).filter { $0.1 == 0 }.map(\.0)
        let plain = single.ids_without_special[index] ?? unmarked
        failures.check(tokenizer.encode(text, addSpecialTokens: false).ids == plain, "ids without special tokens of \(name)")
        let decoded = tokenizer.decode(single.ids[index])
        let expectedDecoded = single.decoded[index] ?? text
        failures.check(decoded == expectedDecoded, "decode of \(name): \(decoded.debugDescription) != \(expectedDecoded.debugDescription)")
        let skipped = tokenizer.decode(single.ids[index], skipSpecialTokens: true)
        let expectedSkipped = single.decoded_skip_special[index] ?? expectedDecoded
        failures.check(skipped == expectedSkipped, "decode skipping special tokens of \(name): \(skipped.debugDescription) != \(expectedSkipped.debugDescription)")
    }
    for pair in cases.pairs {
        let encoding = tokenizer.encode(texts[pair.a], pair: texts[pair.b])
        check(tokenizer, encoding, pair.encoding, "pair \(texts[pair.a].debugDescription) + \(texts[pair.b].debugDescription)", &failures)
    }
    var overflowed = 0
    for item in cases.truncation {
        let strategy: TruncationStrategy = switch item.strategy {
        case "only_first": .onlyFirst
        case "only_second": .onlySecond
        default: .longestFirst
        }
        let options = EncodingOptions(truncation: strategy, maxLength: item.max_length,
                                      truncationSide: item.side == "left" ? .left : .right, stride: item.stride)
        let name = "\(item.strategy) \(item.side) \(item.max_length) stride \(item.stride) of \(texts[item.a].debugDescription) + \(item.b.map { texts[$0].debugDescription } ?? "nil")"
        do {
            let encoding = try #require(try tokenizer.encode([texts[item.a]], pairs: item.b.map { [texts[$0]] }, options: options).first)
            guard let ids = item.ids, let offsets = item.offsets, let overflowing = item.overflowing else {
                failures.check(false, "\(name) should fail with \(item.error ?? "")")
                continue
            }
            check(tokenizer, encoding, .init(ids: ids, offsets: offsets, type_ids: item.type_ids, tokens: item.tokens), "truncated \(name)", &failures)
            failures.check(encoding.overflowing.count == overflowing.count, "overflowing count of \(name): \(encoding.overflowing.map(\.ids)) != \(overflowing.map(\.ids))")
            for (got, expected) in zip(encoding.overflowing, overflowing) { check(tokenizer, got, expected, "overflowing of \(name)", &failures) }
            overflowed += overflowing.isEmpty ? 0 : 1
        } catch is TruncationError {
            failures.check(item.error != nil, "\(name) failed, tokenizers did not")
        }
    }
    #expect(overflowed > 50)
    for item in cases.decode_ids {
        let decoded = tokenizer.decode(item.ids)
        failures.check(decoded == item.decoded, "decode \(item.ids): \(decoded.debugDescription) != \(item.decoded.debugDescription)")
        let skipped = tokenizer.decode(item.ids, skipSpecialTokens: true)
        failures.check(skipped == item.decoded_skip_special ?? item.decoded, "decode skipping special tokens \(item.ids): \(skipped.debugDescription)")
    }
    for batch in cases.batches ?? [] {
        let batchTexts = batch.texts.map { texts[$0] }
        let longest = tokenizer.encode(batchTexts, padding: .longest, truncation: true, maxLength: 77)
        failures.check(longest.map(\.ids) == batch.longest_77.ids, "padded ids of \(batchTexts)")
        failures.check(longest.map(\.attentionMask) == batch.longest_77.attention_mask, "attention mask of \(batchTexts)")
        let fixed = tokenizer.encode(batchTexts, padding: .maxLength, truncation: true, maxLength: 16)
        failures.check(fixed.map(\.ids) == batch.max_length_16.ids, "max_length 16 ids of \(batchTexts)")
        failures.check(fixed.map(\.attentionMask) == batch.max_length_16.attention_mask, "max_length 16 mask of \(batchTexts)")
    }
    #expect(failures.messages.isEmpty, "\(failures.messages.joined(separator: "\n"))")
}

@Suite struct PipelineOracleTests {
    /// The full OpenAI CLIP vocabulary from tokenizer.json, decoded and padded as transformers' CLIPTokenizer does.
    @Test func clip() throws {
        try checkPipeline("clip")
        let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent("clip"))
        #expect(tokenizer.modelMaxLength == 77)
        #expect(tokenizer.bosTokenId == 49406)
        #expect(tokenizer.eosTokenId == 49407)
        #expect(tokenizer.padTokenId == 49407)
        #expect(tokenizer.tokenId("<|endoftext|>") == 49407)
        #expect(tokenizer.tokenId("photo</w>") == 1125)
    }

    /// CLIP's first 1,000 merges from vocab.json + merges.txt only.
    @Test func clipSmallFromVocabAndMergesOnly() throws {
        let directory = fixturesDirectory.appendingPathComponent("clip-small-legacy")
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("tokenizer.json").path))
        try checkPipeline("clip-small-legacy", minimumStrings: 1000)
        let tokenizer = try Tokenizer(directory: directory)
        #expect(tokenizer.bosTokenId == 1512)
        #expect(tokenizer.eosTokenId == 1513)
    }

    /// GPT-2's pipeline: byte-level pre-tokenizer with its own regex on whole texts (spaces kept), no suffix.
    @Test func gpt2StyleByteLevelBPE() throws { try checkPipeline("gpt2-style") }

    /// BERT's pipeline: BertNormalizer (lowercase, accents stripped), BertPreTokenizer, WordPiece, template.
    @Test func bertStyleWordPiece() throws { try checkPipeline("bert-style") }

    /// Cased WordPiece: BertNormalizer with lowercase and strip_accents off.
    @Test func bertCasedStyleWordPiece() throws { try checkPipeline("bert-cased-style") }

    /// Llama 3's pipeline: its split regex, byte-level BPE with ignore_merges, `<|begin_of_text|> $A` template.
    @Test func llama3StyleIgnoreMerges() throws { try checkPipeline("llama3-style") }

    /// Unigram + Precompiled + Metaspace, converted by transformers' T5Converter.
    @Test func t5StyleUnigramPrecompiledMetaspace() throws { try checkPipeline("t5-style") }

    /// BPE with byte fallback and fused unknowns, Metaspace, Llama 2's decoders.
    @Test func llamaStyleByteFallbackMetaspace() throws { try checkPipeline("llama-style") }
}
