import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// A tiny random-init Llama checkpoint written by oracle/llama.py, with what transformers computed on it.
struct LlamaFixture {
    struct Expected: Decodable {
        struct Forward: Decodable {
            let input_ids: [[Int]]?
            let attention_mask: [[Int]]?
            let position_ids: [[Int]]?
            let inputs_embeds: [Float]?
            let logits: FlexibleLogits
        }
        struct Generation: Decodable {
            let prompts: [[Int]]
            let eos: [Int]
            let new_tokens: [[Int]]
        }
        let single: Forward
        let batch: Forward
        let embeds: Forward
        let generations: [Generation]
        let max_new_tokens: Int
    }

    /// One row of logits, or one per batch row (the batch case keeps only unpadded positions).
    enum FlexibleLogits: Decodable {
        case flat([Float]), rows([[Float]])
        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let rows = try? container.decode([[Float]].self) { self = .rows(rows) } else { self = .flat(try container.decode([Float].self)) }
        }
        var rows: [[Float]] {
            switch self {
            case let .flat(values): [values]
            case let .rows(rows): rows
            }
        }
    }

    static let names = ["gqa-untied", "llama3-tied", "linear-bias-mqa"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/llama")

    let model: LlamaForCausalLM
    let expected: Expected

    init(_ name: String) throws {
        let directory = Self.root.appendingPathComponent(name)
        model = try LlamaForCausalLM(directory: ModelDirectory(url: directory))
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
    }
}

func maxDifference(_ actual: [Float], _ expected: [Float]) -> Float {
    precondition(actual.count == expected.count, "\(actual.count) values, expected \(expected.count)")
    return zip(actual, expected).reduce(0) { max($0, abs($1.0 - $1.1)) }
}

@Suite struct LlamaTests {
    static let tolerance: Float = 1e-4

    @Test(arguments: LlamaFixture.names)
    func logitsMatchTransformers(_ name: String) throws {
        let fixture = try LlamaFixture(name)
        let single = fixture.expected.single
        let logits = try fixture.model.logits(inputIds: try #require(single.input_ids))
        #expect(maxDifference(logits.scalars, single.logits.rows[0]) < Self.tolerance, "\(name)")
    }

    @Test(arguments: LlamaFixture.names)
    func leftPaddedBatchMatchesTransformers(_ name: String) throws {
        let fixture = try LlamaFixture(name)
        let batch = fixture.expected.batch
        let mask = try #require(batch.attention_mask)
        let logits = try fixture.model.logits(inputIds: try #require(batch.input_ids), attentionMask: mask,
                                              positionIds: batch.position_ids)
        for (row, (kept, expected)) in zip(unpaddedRows(logits, mask: mask), batch.logits.rows).enumerated() {
            #expect(maxDifference(kept, expected) < Self.tolerance, "\(name) row \(row)")
        }
    }

    @Test(arguments: LlamaFixture.names)
    func inputsEmbedsMatchTransformers(_ name: String) throws {
        let fixture = try LlamaFixture(name)
        let embeds = try #require(fixture.expected.embeds.inputs_embeds)
        let hidden = fixture.model.config.hiddenSize
        let logits = try fixture.model.logits(inputsEmbeds: Tensor(shape: [1, embeds.count / hidden, hidden], scalars: embeds))
        #expect(maxDifference(logits.scalars, fixture.expected.embeds.logits.rows[0]) < Self.tolerance, "\(name)")
    }

    @Test(arguments: LlamaFixture.names)
    func greedyGenerationMatchesTransformers(_ name: String) throws {
        let fixture = try LlamaFixture(name)
        for generation in fixture.expected.generations {
            let (ids, mask) = leftPadded(generation.prompts)
            let output = try fixture.model.generate(
                inputIds: ids, attentionMask: mask,
                options: GenerationOptions(maxNewTokens: fixture.expected.max_new_tokens, eosTokenIds: generation.eos))
            #expect(output == generation.new_tokens, "\(name), eos \(generation.eos)")
        }
    }

    /// gqa-untied converted as llama.cpp does: permuted Q/K rows, F16 embeddings, Q8_0 MLP.
    @Test func ggufConversionMatchesTransformersLoadingIt() throws {
        struct Expected: Decodable {
            let input_ids: [[Int]]
            let logits: [Float]
        }
        let url = LlamaFixture.root.appendingPathComponent("gqa-untied.gguf")
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: url.appendingPathExtension("json")))
        let model = try LlamaForCausalLM(gguf: url)
        #expect(!model.config.tieWordEmbeddings && model.config.numKeyValueHeads == 2)
        let logits = try model.logits(inputIds: expected.input_ids)
        #expect(maxDifference(logits.scalars, expected.logits) < Self.tolerance)
    }

    @Test func cachedDecodingEqualsFullRecomputation() throws {
        let model = try LlamaFixture("gqa-untied").model
        let prompt = [[1, 17, 45, 99, 3]]
        let cache = try model.makeCache(batch: 1, capacity: 8)
        _ = try model.logits(inputIds: prompt, cache: cache)
        let stepped = try model.logits(inputIds: [[7]], cache: cache)
        let full = try model.logits(inputIds: [prompt[0] + [7]], lastPositionOnly: true)
        #expect(cache.length == 6)
        #expect(maxDifference(stepped.scalars, full.scalars) < 1e-5)
    }

    @Test func badInputsAreErrors() throws {
        let model = try LlamaFixture("gqa-untied").model
        #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 500]]) }
        #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2], [3]]) }
        #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2]], attentionMask: [[1]]) }
        #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2]], positionIds: [[0, -1]]) }
        let cache = try model.makeCache(batch: 1, capacity: 2)
        #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2, 3]], cache: cache) }
        #expect(throws: ModelError.self) { try model.makeCache(batch: 1 << 40, capacity: 1 << 40) }
        #expect(throws: ModelError.self) {
            try model.generate(inputIds: [[1]], options: GenerationOptions(maxNewTokens: Int.max))
        }
        #expect(throws: ModelError.self) { try model.generate(inputIds: [[0]], attentionMask: [[0]], options: GenerationOptions()) }
    }

    @Test func configDefaultsAndLegacyRopeAreRead() throws {
        let linear = try LlamaFixture("linear-bias-mqa").model.config
        #expect(linear.rope == RopeParameters(ropeType: "linear", theta: 1000, factor: 2, lowFrequencyFactor: nil,
                                              highFrequencyFactor: nil, originalMaxPositionEmbeddings: nil))
        #expect(linear.headDim == 8 && linear.numKeyValueHeads == 1 && linear.attentionBias && linear.mlpBias)
        let llama3 = try LlamaFixture("llama3-tied").model.config
        #expect(llama3.rope.ropeType == "llama3" && llama3.rope.originalMaxPositionEmbeddings == 16)
        #expect(llama3.tieWordEmbeddings && llama3.eosTokenIds == [2] && llama3.rmsNormEps == 1e-6)
    }
}
