import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels

/// transformers' `labels=` loss (oracle/language_model_loss.py): a right-padded batch whose prompts and padding are
/// labelled -100, as supervised fine-tuning masks them, and an unpadded row whose every label counts.
@Suite struct LanguageModelLossTests {
    struct Expected: Decodable {
        struct Case: Decodable {
            let checkpoint: String
            let input_ids: [[Int]]
            let attention_mask: [[Int]]
            let labels: [[Int]]
            let loss: Float
            let single_ids: [Int]
            let single_loss: Float
        }
        let ignored_label: Int
        let cases: [Case]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let expected = Result {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: fixtures.appendingPathComponent("decoders/loss.json")))
    }
    static let checkpoints = ["decoders/qwen2", "decoders/qwen3", "decoders/smollm3", "decoders/gemma3", "decoders/mistral-sliding",
                              "decoders/opt-pre", "decoders/gpt2", "llama/gqa-untied", "llama/llama3-tied"]

    static func model(_ checkpoint: String) throws -> any CausalLanguageModel {
        try ModelRegistry.causalLanguageModel(ModelDirectory(url: fixtures.appendingPathComponent(checkpoint)))
    }

    @Test(arguments: checkpoints)
    func lossMatchesTransformers(_ checkpoint: String) throws {
        let expected = try Self.expected.get()
        #expect(expected.ignored_label == ignoredLabel)
        let test = try #require(expected.cases.first { $0.checkpoint == checkpoint })
        let model = try Self.model(checkpoint)
        let loss = try model.loss(inputIds: test.input_ids, attentionMask: test.attention_mask, labels: test.labels)
        #expect(abs(loss - test.loss) < 1e-4, "\(loss) against \(test.loss)")
        let single = try model.loss(inputIds: [test.single_ids], labels: [test.single_ids])
        #expect(abs(single - test.single_loss) < 1e-4, "\(single) against \(test.single_loss)")
        // Each row's first label is never scored (it has no position before it), and padding counts for nothing.
        let counted = try model.negativeLogLikelihood(inputIds: test.input_ids, attentionMask: test.attention_mask,
                                                      labels: test.labels).count
        #expect(counted == test.labels.map { $0.dropFirst().filter { $0 != ignoredLabel }.count }.reduce(0, +))
    }

    @Test func labelsOfAnotherShapeOrOutsideTheVocabularyAreRefused() throws {
        let model = try Self.model("llama/gqa-untied")
        let ids = [[5, 6, 7]]
        #expect(throws: ModelError.self) { try model.loss(inputIds: ids, labels: [[5, 6]]) }
        #expect(throws: ModelError.self) { try model.loss(inputIds: ids, labels: [[5, 6, 7], [5, 6, 7]]) }
        #expect(throws: ModelError.self) { try model.loss(inputIds: ids, labels: [[5, model.vocabularySize, 7]]) }
        #expect(throws: ModelError.self) { try model.loss(inputIds: ids, labels: [[5, -1, 7]]) }
        // torch's mean over no labels.
        #expect(try model.loss(inputIds: ids, labels: [[5, ignoredLabel, ignoredLabel]]).isNaN)
    }

    /// A long sequence's logits come a chunk at a time over a KV cache: the same numbers as one pass.
    @Test func chunkedLogitsAreOnePassesLogits() throws {
        let model = try Self.model("llama/gqa-untied")
        let ids = Array((0..<40).map { 3 + ($0 * 37) % 150 })
        let whole = try model.promptLogprobs(ids, top: 3, chunk: 1000)
        let chunked = try model.promptLogprobs(ids, top: 3, chunk: 7)
        #expect(whole.count == 39 && chunked.count == 39)
        #expect(zip(whole, chunked).allSatisfy { $0.id == $1.id && abs(($0.logprob ?? .nan) - ($1.logprob ?? .nan)) < 1e-5 })
        #expect(zip(whole, chunked).allSatisfy { $0.topLogprobs.map(\.id) == $1.topLogprobs.map(\.id) })
        let direct = try model.negativeLogLikelihood(inputIds: [ids], labels: [ids])
        #expect(abs(Double(whole.compactMap(\.logprob).reduce(0, +)) + direct.sum) < 1e-3)
        let perplexity = try model.perplexity(of: ids, context: 32, stride: 16, chunk: 1000)
        let chunkedPerplexity = try model.perplexity(of: ids, context: 32, stride: 16, chunk: 5)
        #expect(abs(perplexity.negativeLogLikelihood.sum - chunkedPerplexity.negativeLogLikelihood.sum) < 1e-4)
        #expect(perplexity.negativeLogLikelihood.count == chunkedPerplexity.negativeLogLikelihood.count)
    }

    /// One window over the whole sequence scores what one pass scores; overlapping windows score every token after
    /// the first exactly once too.
    @Test func perplexityScoresEveryTokenAfterTheFirstOnce() throws {
        let model = try Self.model("llama/gqa-untied")
        let ids = Array((0..<40).map { 3 + ($0 * 37) % 150 })
        let whole = try model.negativeLogLikelihood(inputIds: [ids], labels: [ids])
        let one = try model.perplexity(of: ids, context: 40, stride: 39)
        #expect(one.windows == 1 && one.negativeLogLikelihood.count == 39)
        #expect(abs(one.negativeLogLikelihood.sum - whole.sum) < 1e-9)
        for (context, stride) in [(16, 8), (16, 15), (10, 3), (2, 1)] {
            let windowed = try model.perplexity(of: ids, context: context, stride: stride)
            #expect(windowed.negativeLogLikelihood.count == 39, "context \(context), stride \(stride)")
            #expect(windowed.tokens == 40)
        }
        #expect(throws: ModelError.self) { try model.perplexity(of: [5], context: 16, stride: 8) }
        #expect(throws: ModelError.self) { try model.perplexity(of: ids, context: 16, stride: 16) }
        #expect(throws: ModelError.self) { try model.perplexity(of: ids, context: 16, stride: 0) }
        #expect(throws: ModelError.self) { try model.perplexity(of: ids, context: 1, stride: 1) }
        // Past the model's 64 positions.
        #expect(throws: ModelError.self) { try model.perplexity(of: ids, context: 65, stride: 8) }
    }
}
