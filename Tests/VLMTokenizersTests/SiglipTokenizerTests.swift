import Foundation
import Testing
import VLMTokenizers

/// SigLIP's tokenizer, from spiece.model ("tiny-tanh-fp16", as published checkpoints store it) and from the
/// tokenizer.json oracle/siglip.py converts it to ("tiny-gelu-bf16"): SiglipTokenizer is slow-only in transformers
/// 5.23; the oracle records its ids for the shared strings over sentencepiece's English Unigram model, and the
/// converted tokenizer's where the two differ (texts with "</s>" or "<unk>" in them, a few combining marks).
@Suite struct SiglipTokenizerTests {
    struct Cases: Decodable {
        struct Difference: Decodable { let index: Int; let converted_ids: [Int]; let reason: String }
        let ids: [[Int]]
        let converted_differs: [Difference]
    }

    static let siglip = fixturesDirectory.deletingLastPathComponent().appendingPathComponent("siglip")

    @Test(arguments: ["tiny-tanh-fp16", "tiny-gelu-bf16"])
    func idsAreTheSlowTokenizersWhereTokenizerJSONCanSayThem(_ checkpoint: String) throws {
        let tokenizer = try Tokenizer(directory: Self.siglip.appendingPathComponent(checkpoint))
        let cases = try JSONDecoder().decode(Cases.self, from: Data(contentsOf: Self.siglip.appendingPathComponent("tokenizer-strings.json")))
        try #require(cases.ids.count == sharedStrings.count && sharedStrings.count >= 5000)
        let converted = Dictionary(uniqueKeysWithValues: cases.converted_differs.map { ($0.index, $0.converted_ids) })
        // Only in-text special tokens and combining marks separate the two, and those are few.
        #expect(cases.converted_differs.allSatisfy { ["special token text", "combining marks"].contains($0.reason) })
        #expect(cases.converted_differs.filter { $0.reason == "combining marks" }.count <= 4)
        var failures: [String] = []
        for (index, text) in sharedStrings.enumerated() {
            let ids = tokenizer.encode(text).ids
            let want = converted[index] ?? cases.ids[index]
            if ids != want && failures.count < 10 { failures.append("\(text.debugDescription): \(ids) != \(want)") }
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }

    /// The zero-shot pipeline's prompts, as transformers pads them: `padding="max_length", max_length=64`.
    @Test(arguments: ["tiny-tanh-fp16", "tiny-gelu-bf16"])
    func promptsArePaddedLikeThePipelineAndTextsLikeTheProcessor(_ checkpoint: String) throws {
        struct Expected: Decodable {
            let labels: [String]
            let template: String
            let prompt_ids: [[Int]]
            let prompt_mask: [[Int]]?
            let texts: [String]
            let input_ids: [[Int]]
            let attention_mask: [[Int]]?
        }
        let directory = Self.siglip.appendingPathComponent(checkpoint)
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        let tokenizer = try Tokenizer(directory: directory)
        let prompts = tokenizer.encode(expected.labels.map { expected.template.replacingOccurrences(of: "{}", with: $0) },
                                       padding: .maxLength, maxLength: 64)
        #expect(prompts.map(\.ids) == expected.prompt_ids)
        // padding="max_length" without a length: tokenizer_config.json's model_max_length (64, or 48 for "tiny-gelu-bf16").
        let texts = tokenizer.encode(expected.texts, padding: .maxLength)
        #expect(texts.map(\.ids) == expected.input_ids)
        if let mask = expected.prompt_mask, let textMask = expected.attention_mask {
            #expect(tokenizer.modelInputNames == nil)
            #expect(prompts.map(\.attentionMask) == mask && texts.map(\.attentionMask) == textMask)
        } else {
            #expect(tokenizer.modelInputNames == ["input_ids"])
        }
    }

    @Test func aBrokenSentencePieceFileIsOneLineNamingIt() throws {
        let source = Self.siglip.appendingPathComponent("tiny-tanh-fp16")
        let bytes = try Data(contentsOf: source.appendingPathComponent("spiece.model"))
        let config = try String(contentsOf: source.appendingPathComponent("tokenizer_config.json"), encoding: .utf8)
        for broken in [bytes.prefix(bytes.count / 2), Data([0x0A, 0xFF])] {
            let directory = try temporaryDirectory(files: ["tokenizer_config.json": config])
            defer { try? FileManager.default.removeItem(at: directory) }
            try broken.write(to: directory.appendingPathComponent("spiece.model"))
            let error = try #require(throws: TokenizerError.self) { try Tokenizer(directory: directory) }
            #expect(error.description.contains(directory.appendingPathComponent("spiece.model").path))
            #expect(!error.description.contains("\n"))
        }
    }
}
