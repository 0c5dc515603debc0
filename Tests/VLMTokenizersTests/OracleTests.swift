import Foundation
import Testing
@testable import VLMTokenizers

/// Compares against everything the oracle recorded, reporting the first few disagreements.
private func checkAgainstOracle(_ tokenizer: Tokenizer, _ cases: OracleCases) {
    var failures: [String] = []
    func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition && failures.count < 15 { failures.append(message()) }
    }
    for item in cases.single {
        let encoding = tokenizer.encode(item.text)
        check(encoding.ids == item.ids, "ids of \(item.text.debugDescription): \(encoding.ids) != \(item.ids)")
        check(encoding.tokens == item.tokens, "tokens of \(item.text.debugDescription): \(encoding.tokens) != \(item.tokens)")
        check(encoding.attentionMask == Array(repeating: 1, count: item.ids.count), "mask of \(item.text.debugDescription)")
        let plain = tokenizer.encode(item.text, addSpecialTokens: false).ids
        check(plain == item.ids_without_special, "ids without special tokens of \(item.text.debugDescription)")
        let decoded = tokenizer.decode(item.ids)
        check(decoded == item.decoded, "decode of \(item.text.debugDescription): \(decoded.debugDescription) != \(item.decoded.debugDescription)")
        let skipped = tokenizer.decode(item.ids, skipSpecialTokens: true)
        check(skipped == item.decoded_skip_special, "decode skipping special of \(item.text.debugDescription): \(skipped.debugDescription)")
    }
    for batch in cases.batches ?? [] {
        let longest = tokenizer.encode(batch.texts, padding: .longest, truncation: true, maxLength: 77)
        check(longest.map(\.ids) == batch.longest_77.ids, "padded ids of \(batch.texts)")
        check(longest.map(\.attentionMask) == batch.longest_77.attention_mask, "attention mask of \(batch.texts)")
        let fixed = tokenizer.encode(batch.texts, padding: .maxLength, truncation: true, maxLength: 16)
        check(fixed.map(\.ids) == batch.max_length_16.ids, "max_length 16 ids of \(batch.texts)")
        check(fixed.map(\.attentionMask) == batch.max_length_16.attention_mask, "max_length 16 mask of \(batch.texts)")
    }
    for item in cases.decode_ids {
        let decoded = tokenizer.decode(item.ids)
        check(decoded == item.decoded, "decode \(item.ids): \(decoded.debugDescription) != \(item.decoded.debugDescription)")
        check(tokenizer.decode(item.ids, skipSpecialTokens: true) == item.decoded_skip_special, "decode skipping special \(item.ids)")
    }
    #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
}

@Suite struct CLIPOracleTests {
    @Test func fullVocabularyFromTokenizerJSON() throws {
        let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent("clip"))
        let cases = try OracleCases.load("clip_cases.json")
        #expect(cases.single.count >= 2000)
        checkAgainstOracle(tokenizer, cases)
        #expect(tokenizer.modelMaxLength == 77)
        #expect(tokenizer.bosTokenId == 49406)
        #expect(tokenizer.eosTokenId == 49407)
        #expect(tokenizer.padTokenId == 49407)
        #expect(tokenizer.tokenId("<|endoftext|>") == 49407)
        #expect(tokenizer.tokenId("photo</w>") == cases.single.first { $0.text == "A photo of a cat" }?.ids[2])
    }

    @Test func smallVocabularyFromVocabAndMergesOnly() throws {
        let directory = fixturesDirectory.appendingPathComponent("clip-small-legacy")
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("tokenizer.json").path))
        let tokenizer = try Tokenizer(directory: directory)
        checkAgainstOracle(tokenizer, try OracleCases.load("clip_small_cases.json"))
        #expect(tokenizer.bosTokenId == 1512)
        #expect(tokenizer.eosTokenId == 1513)
    }
}

@Suite struct OtherPipelineOracleTests {
    /// GPT-2's pipeline: byte-level pre-tokenizer with its own regex on whole texts (spaces kept), no suffix.
    @Test func gpt2StyleByteLevelBPE() throws {
        let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent("gpt2-style"))
        checkAgainstOracle(tokenizer, try OracleCases.load("gpt2_style_cases.json"))
    }

    /// BERT's pipeline: BertNormalizer, BertPreTokenizer, WordPiece, TemplateProcessing, WordPiece decoder.
    @Test func bertStyleWordPiece() throws {
        let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent("bert-style"))
        checkAgainstOracle(tokenizer, try OracleCases.load("bert_style_cases.json"))
    }
}
