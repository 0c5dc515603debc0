import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels
import VLMTensor

/// A tiny random-init T5 checkpoint written by oracle/t5.py, with what transformers computed on it.
struct T5Fixture {
    struct Expected: Decodable {
        struct Buckets: Decodable {
            let num_buckets: Int
            let max_distance: Int
            let bidirectional: [Int]
            let causal: [Int]
        }
        struct Encoder: Decodable {
            let input_ids: [[Int]]
            let attention_mask: [[Int]]
            let shape: [Int]
            let last_hidden_state: [Float]
        }
        struct Decoder: Decodable {
            let decoder_input_ids: [[Int]]
            let logits: [Float]
        }
        struct Embeds: Decodable {
            let inputs_embeds: [Float]
            let shape: [Int]
            let decoder_input_ids: [[Int]]
            let logits: [Float]
        }
        struct Generation: Decodable {
            /// The first `rows` prompts of the encoder batch.
            let rows: Int
            let eos: [Int]
            let new_tokens: [[Int]]
        }
        /// transformers' beam search: `sequences` start with the decoder start token, then the new tokens padded
        /// after a finished hypothesis' eos.
        struct Beam: Decodable {
            let length_penalty: Double
            let early_stopping: Bool
            let num_beams: Int
            let num_return_sequences: Int
            let max_new_tokens: Int
            let eos: [Int]
            let sequences: [[Int]]
            let sequences_scores: [Float]
        }
        let buckets: [Buckets]
        let encoder: Encoder
        let decoder: Decoder
        let embeds: Embeds
        let generations: [Generation]
        let max_new_tokens: Int
        let beam: [Beam]
    }

    static let names = ["flan-t5", "t5"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/t5")

    let directory: ModelDirectory
    let model: T5ForConditionalGeneration
    let expected: Expected

    init(_ name: String) throws {
        directory = try ModelDirectory(url: Self.root.appendingPathComponent(name))
        model = try T5ForConditionalGeneration(directory: directory)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.url.appendingPathComponent("expected.json")))
    }

    /// The encoder's output for the first `rows` prompts, with their mask.
    func encoded(rows: Int) throws -> (states: Tensor, mask: [[Int]]) {
        let encoder = expected.encoder
        let mask = Array(encoder.attention_mask[..<rows])
        return (try model.encode(inputIds: Array(encoder.input_ids[..<rows]), attentionMask: mask), mask)
    }
}

@Suite struct T5Tests {
    static let tolerance: Float = 1e-4

    @Test(arguments: T5Fixture.names)
    func relativePositionBucketsMatchTransformers(_ name: String) throws {
        for table in try T5Fixture(name).expected.buckets {
            for (bidirectional, expected) in [(true, table.bidirectional), (false, table.causal)] {
                let actual = (-300...300).map {
                    relativePositionBucket($0, bidirectional: bidirectional, buckets: table.num_buckets,
                                           maxDistance: table.max_distance)
                }
                #expect(actual == expected, "\(table.num_buckets) buckets to \(table.max_distance), bidirectional \(bidirectional)")
            }
        }
    }

    @Test(arguments: T5Fixture.names)
    func paddedEncoderBatchMatchesTransformers(_ name: String) throws {
        let fixture = try T5Fixture(name)
        let (states, _) = try fixture.encoded(rows: 2)
        #expect(states.shape == fixture.expected.encoder.shape)
        #expect(maxDifference(states.scalars, fixture.expected.encoder.last_hidden_state) < Self.tolerance, "\(name)")
    }

    @Test(arguments: T5Fixture.names)
    func teacherForcedLogitsMatchTransformers(_ name: String) throws {
        let fixture = try T5Fixture(name)
        let (states, mask) = try fixture.encoded(rows: 2)
        let logits = try fixture.model.attending(to: states, attentionMask: mask)
            .logits(inputIds: fixture.expected.decoder.decoder_input_ids)
        #expect(maxDifference(logits.scalars, fixture.expected.decoder.logits) < Self.tolerance, "\(name)")
    }

    @Test(arguments: T5Fixture.names)
    func encoderInputsEmbedsMatchTransformers(_ name: String) throws {
        let fixture = try T5Fixture(name)
        let embeds = fixture.expected.embeds
        let states = try fixture.model.encode(inputsEmbeds: Tensor(shape: embeds.shape, scalars: embeds.inputs_embeds))
        let logits = try fixture.model.attending(to: states).logits(inputIds: embeds.decoder_input_ids)
        #expect(maxDifference(logits.scalars, embeds.logits) < Self.tolerance, "\(name)")
    }

    @Test(arguments: T5Fixture.names)
    func greedyGenerationMatchesTransformers(_ name: String) throws {
        let fixture = try T5Fixture(name)
        let encoder = fixture.expected.encoder
        for generation in fixture.expected.generations {
            var config = GenerationConfig()
            config.maxNewTokens = fixture.expected.max_new_tokens
            config.eosTokenIds = generation.eos
            let output = try fixture.model.generate(inputIds: Array(encoder.input_ids[..<generation.rows]),
                                                    attentionMask: Array(encoder.attention_mask[..<generation.rows]),
                                                    config: config)
            #expect(output.sequences == generation.new_tokens, "\(name), eos \(generation.eos)")
        }
    }

    @Test(arguments: T5Fixture.names)
    func beamSearchMatchesTransformers(_ name: String) throws {
        let fixture = try T5Fixture(name)
        let encoder = fixture.expected.encoder
        for beam in fixture.expected.beam {
            var config = GenerationConfig()
            config.numBeams = beam.num_beams
            config.numReturnSequences = beam.num_return_sequences
            config.maxNewTokens = beam.max_new_tokens
            config.lengthPenalty = beam.length_penalty
            config.earlyStopping = beam.early_stopping ? .always : .heuristic
            config.eosTokenIds = beam.eos
            config.padTokenId = 0
            let output = try fixture.model.generate(inputIds: encoder.input_ids, attentionMask: encoder.attention_mask,
                                                    config: config)
            // Without the decoder start token; a hypothesis ends at its first eos, and what follows is padding.
            let expected = beam.sequences.map { row -> [Int] in
                let new = Array(row.dropFirst())
                guard let end = new.firstIndex(where: beam.eos.contains) else { return new }
                return Array(new[...end])
            }
            let label = "\(name) length_penalty \(beam.length_penalty) early_stopping \(beam.early_stopping)"
            #expect(output.sequences == expected, "\(label)")
            #expect(output.scores.count == beam.sequences_scores.count, "\(label)")
            for (actual, wanted) in zip(output.scores, beam.sequences_scores) {
                #expect(abs(actual - wanted) < 1e-4, "\(label): \(output.scores) vs \(beam.sequences_scores)")
            }
        }
    }

    /// Decoding step by step through the KV cache (the self-attention bias counted from the cached length) gives
    /// the logits of a full pass.
    @Test(arguments: T5Fixture.names)
    func cachedDecodingEqualsFullRecomputation(_ name: String) throws {
        let fixture = try T5Fixture(name)
        let (states, mask) = try fixture.encoded(rows: 2)
        let decoder = try fixture.model.attending(to: states, attentionMask: mask)
        let ids = fixture.expected.decoder.decoder_input_ids
        let cache = try decoder.makeCache(batch: 2, capacity: ids[0].count)
        _ = try decoder.logits(inputIds: ids.map { Array($0[..<3]) }, cache: cache)
        _ = try decoder.logits(inputIds: ids.map { Array($0[3..<5]) }, cache: cache)
        let stepped = try decoder.logits(inputIds: ids.map { [$0[5]] }, cache: cache)
        let full = try decoder.logits(inputIds: ids, lastPositionOnly: true)
        #expect(cache.length == 6)
        #expect(maxDifference(stepped.scalars, full.scalars) < 1e-5, "\(name)")
    }

    /// Rows repeated for beams attend to their own encoder row.
    @Test func decoderRowsMayRepeatEncoderRows() throws {
        let fixture = try T5Fixture("flan-t5")
        let (states, mask) = try fixture.encoded(rows: 2)
        let decoder = try fixture.model.attending(to: states, attentionMask: mask)
        let ids = fixture.expected.decoder.decoder_input_ids
        let doubled = try decoder.logits(inputIds: ids.flatMap { [$0, $0] })
        let rowSize = doubled.count / 4
        for row in 0..<4 {
            let expected = fixture.expected.decoder.logits[((row / 2) * rowSize)..<((row / 2 + 1) * rowSize)]
            #expect(maxDifference(Array(doubled.scalars[(row * rowSize)..<((row + 1) * rowSize)]), Array(expected)) < Self.tolerance)
        }
        #expect(throws: ModelError.self) { try decoder.logits(inputIds: [[0], [0], [0]]) }
    }

    @Test func configsReadTransformersDefaults() throws {
        let flan = try T5Fixture("flan-t5").directory.decode(T5Config.self)
        #expect(flan.isGatedAct && flan.denseActFn == "gelu_new" && !flan.scaleDecoderOutputs && flan.numDecoderLayers == 2)
        let t5 = try T5Fixture("t5").directory.decode(T5Config.self)
        #expect(!t5.isGatedAct && t5.denseActFn == "relu" && t5.scaleDecoderOutputs && t5.numDecoderLayers == 3 && t5.dKv == 6)

        let bare = { (json: String) in try JSONDecoder().decode(T5Config.self, from: Data(json.utf8)) }
        let defaults = try bare("{}")
        #expect(defaults.vocabSize == 32128 && defaults.dModel == 512 && defaults.numDecoderLayers == 6)
        #expect(defaults.relativeAttentionNumBuckets == 32 && defaults.relativeAttentionMaxDistance == 128)
        #expect(defaults.scaleDecoderOutputs && defaults.eosTokenIds == [1] && defaults.padTokenId == 0)
        #expect(defaults.decoderStartTokenId == nil && defaults.denseActFn == "relu" && !defaults.isGatedAct)
        let flanHub = try bare(#"{"feed_forward_proj": "gated-gelu", "tie_word_embeddings": false, "num_layers": 4}"#)
        #expect(flanHub.denseActFn == "gelu_new" && flanHub.isGatedAct && !flanHub.scaleDecoderOutputs && flanHub.numDecoderLayers == 4)
        let silu = try bare(#"{"feed_forward_proj": "gated-silu", "scale_decoder_outputs": true, "tie_word_embeddings": false}"#)
        #expect(silu.denseActFn == "silu" && silu.isGatedAct && silu.scaleDecoderOutputs)
    }

    @Test func badCheckpointsAndInputsAreErrors() throws {
        let fixture = try T5Fixture("t5")
        #expect(throws: ModelError.self) { try fixture.model.encode(inputsEmbeds: Tensor(zeros: [1, 2, 16])) }
        #expect(throws: ModelError.self) { try fixture.model.encode(inputIds: [[1, 2]], attentionMask: [[1]]) }
        #expect(throws: ModelError.self) { try fixture.model.encode(inputIds: [[1, 800]]) }
        #expect(throws: ModelError.self) { try fixture.model.attending(to: Tensor(zeros: [1, 2, 16])) }
        #expect(throws: ModelError.self) { try fixture.model.attending(to: Tensor(zeros: [1, 2, 32]), attentionMask: [[1]]) }
        // The decoder directory of another family is refused by name.
        let other = try ModelDirectory(url: DecoderFixture.root.appendingPathComponent("gpt2"))
        let error = try #require(throws: ModelError.self) { try T5ForConditionalGeneration(directory: other) }
        #expect(error.description.contains("\"gpt2\"") && error.description.contains("config.json"))

        let file = "config.json"
        let config = { (json: String) in try JSONDecoder().decode(T5Config.self, from: Data(json.utf8)) }
        #expect(throws: ModelError.self) { try config(#"{"feed_forward_proj": "gated-gelu-new"}"#).validate(file: file) }
        #expect(throws: ModelError.self) { try config(#"{"num_heads": 0}"#).validate(file: file) }
        #expect(throws: ModelError.self) { try config(#"{"relative_attention_max_distance": 16}"#).validate(file: file) }
    }
}
