import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// A tiny random-init decoder checkpoint written by oracle/decoders.py, with what transformers computed on it.
struct DecoderFixture {
    struct Expected: Decodable {
        typealias Forward = LlamaFixture.Expected.Forward
        typealias Generation = LlamaFixture.Expected.Generation
        struct Encoder: Decodable {
            let hidden_states: [Float]
            let shape: [Int]
            let attention_mask: [[Int]]
        }
        let single: Forward
        let batch: Forward
        let embeds: Forward
        let generations: [Generation]
        let max_new_tokens: Int
        let encoder: Encoder?
        let beam: [Beam]
    }
    /// transformers' beam search on a left-padded batch: `sequences` hold the prompt, then the new tokens padded
    /// after a finished hypothesis' eos.
    struct Beam: Decodable {
        let length_penalty: Double
        let early_stopping: Bool
        let num_beams: Int
        let num_return_sequences: Int
        let max_new_tokens: Int
        let eos: [Int]
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let sequences: [[Int]]
        let sequences_scores: [Float]
    }

    static let names = ["qwen2", "qwen3", "smollm3", "gemma3", "mistral-sliding", "llama-dynamic", "opt-pre", "opt-post-proj", "opt-plain", "gpt2", "gpt2-cross"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/decoders")

    let directory: ModelDirectory
    let model: any CausalLanguageModel
    let expected: Expected

    init(_ name: String) throws {
        directory = try ModelDirectory(url: Self.root.appendingPathComponent(name))
        model = try ModelRegistry.causalLanguageModel(directory)
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.url.appendingPathComponent("expected.json")))
    }

    /// The model a pass over `rows` rows runs: the decoder itself, or for the cross-attention case the decoder
    /// attending to the first `rows` encoder outputs, as the oracle did.
    func model(rows: Int) throws -> any CausalLanguageModel {
        guard let encoder = expected.encoder else { return model }
        let gpt2 = try #require(model as? GPT2LMHeadModel)
        let rowSize = encoder.shape[1] * encoder.shape[2]
        let states = Tensor(shape: [rows, encoder.shape[1], encoder.shape[2]], scalars: Array(encoder.hidden_states[..<(rows * rowSize)]))
        return try gpt2.attending(to: states, attentionMask: Array(encoder.attention_mask[..<rows]))
    }
}

/// The logits at the unpadded positions of each row, in order (what the oracle keeps of a padded batch).
func unpaddedRows(_ logits: Tensor, mask: [[Int]]) -> [[Float]] {
    let (length, vocabulary) = (logits.shape[1], logits.shape[2])
    let scalars = logits.scalars
    var rows: [[Float]] = []
    for (row, flags) in mask.enumerated() {
        var kept: [Float] = []
        for position in 0..<length where flags[position] != 0 {
            let start: Int = (row * length + position) * vocabulary
            kept += scalars[start..<(start + vocabulary)]
        }
        rows.append(kept)
    }
    return rows
}

@Suite struct DecoderTests {
    static let tolerance: Float = 1e-4

    @Test(arguments: DecoderFixture.names)
    func logitsMatchTransformers(_ name: String) throws {
        let fixture = try DecoderFixture(name)
        let single = fixture.expected.single
        let logits = try fixture.model(rows: 1).logits(inputIds: try #require(single.input_ids))
        #expect(maxDifference(logits.scalars, single.logits.rows[0]) < Self.tolerance, "\(name)")
    }

    @Test(arguments: DecoderFixture.names)
    func leftPaddedBatchMatchesTransformers(_ name: String) throws {
        let fixture = try DecoderFixture(name)
        let batch = fixture.expected.batch
        let (ids, mask) = (try #require(batch.input_ids), try #require(batch.attention_mask))
        // OPT's fixture leaves the positions to the model, which counts them from the mask.
        let logits = try fixture.model(rows: ids.count).logits(inputIds: ids, attentionMask: mask, positionIds: batch.position_ids)
        for (row, (actual, expected)) in zip(unpaddedRows(logits, mask: mask), batch.logits.rows).enumerated() {
            #expect(maxDifference(actual, expected) < Self.tolerance, "\(name) row \(row)")
        }
    }

    @Test(arguments: DecoderFixture.names)
    func inputsEmbedsMatchTransformers(_ name: String) throws {
        let fixture = try DecoderFixture(name)
        let embeds = try #require(fixture.expected.embeds.inputs_embeds)
        let width = embeds.count / 5
        let logits = try fixture.model(rows: 1).logits(inputsEmbeds: Tensor(shape: [1, 5, width], scalars: embeds), attentionMask: nil,
                                                       positionIds: nil, cache: nil, lastPositionOnly: false)
        #expect(maxDifference(logits.scalars, fixture.expected.embeds.logits.rows[0]) < Self.tolerance, "\(name)")
    }

    @Test(arguments: DecoderFixture.names)
    func greedyGenerationMatchesTransformers(_ name: String) throws {
        let fixture = try DecoderFixture(name)
        for generation in fixture.expected.generations {
            let (ids, mask) = leftPadded(generation.prompts)
            let output = try fixture.model(rows: ids.count).generate(
                inputIds: ids, attentionMask: mask,
                options: GenerationOptions(maxNewTokens: fixture.expected.max_new_tokens, eosTokenIds: generation.eos))
            #expect(output == generation.new_tokens, "\(name), eos \(generation.eos)")
        }
    }

    /// OPT and GPT-2 with their caches in fp16 (`--cache-type f16`) against transformers with its cache layers
    /// rounding every stored key and value to fp16 (oracle/half_cache_decoders.py): the prompt's last logits within
    /// twice what the oracle's own logits move by when keys and values move by 3e-7 of themselves before rounding,
    /// and the greedy continuation identical.
    @Test func halfCachesMatchTransformersRoundingItsCache() throws {
        struct Expected: Decodable {
            struct Case: Decodable {
                let `case`: String
                let input_ids: [Int]
                let logits: [Float]
                let rounding_sensitivity: Float
                let change_from_fp32: Float
                let new_tokens: [Int]
            }
            let max_new_tokens: Int
            let cases: [Case]
        }
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: DecoderFixture.root.appendingPathComponent("f16-cache.json")))
        #expect(expected.cases.count == 3)
        for testCase in expected.cases {
            let model = try KVCache.ElementType.$forNewModels.withValue(.float16) {
                try ModelRegistry.causalLanguageModel(ModelDirectory(url: DecoderFixture.root.appendingPathComponent(testCase.case)))
            }
            #expect(model.cacheElementType == .float16)
            let cache = try model.makeCache(batch: 1, capacity: testCase.input_ids.count)
            let logits = try model.logits(inputIds: [testCase.input_ids], cache: cache, lastPositionOnly: true)
            let difference = maxDifference(logits.scalars, testCase.logits)
            #expect(difference <= 2 * testCase.rounding_sensitivity + 1e-6, "\(testCase.case): \(difference)")
            #expect(difference < testCase.change_from_fp32 / 4, "\(testCase.case): as far from transformers as an fp32 cache is")
            let output = try model.generate(inputIds: [testCase.input_ids], attentionMask: nil,
                                            options: GenerationOptions(maxNewTokens: expected.max_new_tokens, eosTokenIds: []))
            #expect(output == [testCase.new_tokens], "\(testCase.case)")
        }
    }

    /// A prefill longer than Mistral's window (per-query windows), then single steps, against full recomputation;
    /// likewise for OPT's and GPT-2's caches.
    @Test(arguments: ["mistral-sliding", "qwen2", "qwen3", "smollm3", "gemma3", "opt-post-proj", "gpt2"])
    func cachedDecodingEqualsFullRecomputation(_ name: String) throws {
        let model = try DecoderFixture(name).model
        let prompt = [1, 17, 45, 99, 3, 150, 12]
        let cache = try model.makeCache(batch: 1, capacity: 9)
        _ = try model.logits(inputIds: [prompt], cache: cache)
        _ = try model.logits(inputIds: [[7]], cache: cache)
        let stepped = try model.logits(inputIds: [[9]], cache: cache)
        let full = try model.logits(inputIds: [prompt + [7, 9]], lastPositionOnly: true)
        #expect(cache.length == 9)
        #expect(maxDifference(stepped.scalars, full.scalars) < 1e-5, "\(name)")
    }

    /// Rows repeated for beams attend to their own encoder row: the batch, each row twice, against the oracle.
    @Test func crossAttentionRowsMayRepeatEncoderRows() throws {
        let fixture = try DecoderFixture("gpt2-cross")
        let batch = fixture.expected.batch
        let (ids, mask) = (try #require(batch.input_ids), try #require(batch.attention_mask))
        let model = try fixture.model(rows: ids.count)
        let doubled = { (rows: [[Int]]) in rows.flatMap { [$0, $0] } }
        let logits = try model.logits(inputIds: doubled(ids), attentionMask: doubled(mask),
                                      positionIds: batch.position_ids.map(doubled))
        for (row, actual) in unpaddedRows(logits, mask: doubled(mask)).enumerated() {
            #expect(maxDifference(actual, batch.logits.rows[row / 2]) < Self.tolerance, "row \(row)")
        }
        #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2], [3, 4]]) }
    }

    @Test func crossAttentionNeedsACheckpointWithIt() throws {
        let gpt2 = try #require(try DecoderFixture("gpt2").model as? GPT2LMHeadModel)
        #expect(throws: ModelError.self) { try gpt2.attending(to: Tensor(zeros: [1, 2, 64])) }
        let cross = try #require(try DecoderFixture("gpt2-cross").model as? GPT2LMHeadModel)
        #expect(throws: ModelError.self) { try cross.attending(to: Tensor(zeros: [1, 2, 32])) }
        #expect(throws: ModelError.self) { try cross.attending(to: Tensor(zeros: [1, 2, 64]), attentionMask: [[1]]) }
    }

    @Test func loaderDispatchesOnModelType() throws {
        #expect(try DecoderFixture("qwen2").model is LlamaForCausalLM)
        #expect(try DecoderFixture("qwen3").model is LlamaForCausalLM)
        #expect(try DecoderFixture("smollm3").model is LlamaForCausalLM)
        #expect(try DecoderFixture("gemma3").model is Gemma3ForCausalLM)
        #expect(try DecoderFixture("mistral-sliding").model is LlamaForCausalLM)
        #expect(try DecoderFixture("opt-pre").model is OPTForCausalLM)
        #expect(try DecoderFixture("gpt2").model is GPT2LMHeadModel)
        let llama = try ModelRegistry.causalLanguageModel(ModelDirectory(url: LlamaFixture.root.appendingPathComponent("gqa-untied")))
        #expect(llama is LlamaForCausalLM)
    }

    @Test func unknownModelTypeNamesTheSupportedOnes() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("decoder-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(#"{"model_type": "bert"}"#.utf8).write(to: directory.appendingPathComponent("config.json"))
        let error = try #require(throws: ModelError.self) { try ModelRegistry.causalLanguageModel(ModelDirectory(url: directory)) }
        // Every family `vlm generate` runs is named, the image chat models among them.
        let supported = ModelRegistry.modelTypes(serving: .generate)
        #expect(Set(["gpt2", "llama", "llava", "mistral", "opt", "qwen2", "qwen3"]).isSubset(of: supported))
        #expect(error.description.contains("config.json") && error.description.contains("\"bert\"")
                && error.description.contains(supported.joined(separator: ", ")))
        try Data(#"{"n_embd": 64}"#.utf8).write(to: directory.appendingPathComponent("config.json"))
        #expect(throws: CheckpointError.self) { try ModelRegistry.causalLanguageModel(ModelDirectory(url: directory)) }
    }

    /// What the Gemma 3 decoder does not compute is refused in one line naming the config, not computed wrongly.
    @Test func gemmaConfigsItCannotRunAreRefused() throws {
        let source = DecoderFixture.root.appendingPathComponent("gemma3")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gemma3-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createSymbolicLink(at: directory.appendingPathComponent("model.safetensors"),
                                                   withDestinationURL: source.appendingPathComponent("model.safetensors"))
        let original = try #require(JSONSerialization.jsonObject(with: Data(contentsOf: source.appendingPathComponent("config.json"))) as? [String: Any])
        func write(_ changes: [String: Any]) throws {
            try JSONSerialization.data(withJSONObject: original.merging(changes) { $1 })
                .write(to: directory.appendingPathComponent("config.json"))
        }
        for (key, value, message) in [("attn_logit_softcapping", 50.0 as Any, "soft-capped attention scores are not supported"),
                                      ("use_bidirectional_attention", true as Any, "only causal Gemma 3 decoders are supported")] {
            try write([key: value])
            let error = try #require(throws: ModelError.self) { try Gemma3ForCausalLM(directory: ModelDirectory(url: directory)) }
            #expect(error.description.contains("config.json") && error.description.contains(message), "\(error)")
        }
        try write(["final_logit_softcapping": NSNull()])
        #expect(try Gemma3ForCausalLM(directory: ModelDirectory(url: directory)).config.finalLogitSoftcapping == nil)
    }

    @Test func badInputsAreErrors() throws {
        for name in ["opt-pre", "gpt2"] {
            let model = try DecoderFixture(name).model
            #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 500]]) }
            #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2], [3]]) }
            #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2]], attentionMask: [[1]]) }
            #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2]], positionIds: [[0, 64]]) }
            let cache = try model.makeCache(batch: 1, capacity: 2)
            #expect(throws: ModelError.self) { try model.logits(inputIds: [[1, 2, 3]], cache: cache) }
            #expect(throws: ModelError.self) { try model.makeCache(batch: 1 << 40, capacity: 1 << 40) }
        }
        // Past the learned position table: an error, not an out-of-range read.
        let gpt2 = try DecoderFixture("gpt2").model
        #expect(throws: ModelError.self) { try gpt2.logits(inputIds: [Array(repeating: 5, count: 65)]) }
    }

    @Test func configsReadTheirClassDefaults() throws {
        let qwen2 = try DecoderFixture("qwen2").directory.decode(LlamaConfig.self)
        #expect(qwen2.modelType == "qwen2" && qwen2.attentionBias && !qwen2.mlpBias)
        #expect(qwen2.slidingWindow == 4 && qwen2.layerTypes == ["full_attention", "sliding_attention"])
        let qwen3 = try DecoderFixture("qwen3").directory.decode(LlamaConfig.self)
        #expect(qwen3.attentionBias && qwen3.outputProjectionBias && qwen3.normalizesQueryKeyHeads && qwen3.headDim == 24)
        #expect(qwen3.slidingWindow == 4 && qwen3.layerTypes == ["full_attention", "sliding_attention"])
        let smolLM3 = try DecoderFixture("smollm3").directory.decode(LlamaConfig.self)
        #expect(smolLM3.ropeLayers == [true, false] && smolLM3.slidingWindow == 4 && smolLM3.attentionWindow(layer: 0) == nil
                && smolLM3.attentionWindow(layer: 1) == 4 && smolLM3.outputProjectionBias && smolLM3.mlpBias)
        let mistral = try DecoderFixture("mistral-sliding").directory.decode(LlamaConfig.self)
        #expect(mistral.slidingWindow == 5 && !mistral.attentionBias && mistral.numKeyValueHeads == 2)
        let dynamic = try DecoderFixture("llama-dynamic").directory.decode(LlamaConfig.self)
        #expect(dynamic.rope == RopeParameters(ropeType: "dynamic", theta: 10000, factor: 2))
        #expect(dynamic.slidingWindow == nil && dynamic.maxPositionEmbeddings == 6)

        let bare = { (json: String) in try JSONDecoder().decode(LlamaConfig.self, from: Data(json.utf8)) }
        let mistralDefaults = try bare(#"{"model_type": "mistral"}"#)
        #expect(mistralDefaults.slidingWindow == 4096 && mistralDefaults.numKeyValueHeads == 8 && mistralDefaults.eosTokenIds == [2])
        #expect(try bare(#"{"model_type": "mistral", "sliding_window": null}"#).slidingWindow == nil)
        let qwenDefaults = try bare(#"{"model_type": "qwen2", "num_hidden_layers": 30, "use_sliding_window": true}"#)
        #expect(qwenDefaults.vocabSize == 151936 && qwenDefaults.eosTokenIds == [] && qwenDefaults.bosTokenId == nil)
        #expect(qwenDefaults.slidingWindow == 4096 && qwenDefaults.layerTypes.filter { $0 == "sliding_attention" }.count == 2)
        #expect(qwenDefaults.numKeyValueHeads == 32 && !qwenDefaults.normalizesQueryKeyHeads)
        // Qwen3Config: head_dim 128 whatever the hidden size, no biases unless attention_bias.
        let qwen3Defaults = try bare(#"{"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16}"#)
        #expect(qwen3Defaults.headDim == 128 && !qwen3Defaults.attentionBias && !qwen3Defaults.outputProjectionBias)
        #expect(qwen3Defaults.vocabSize == 151936 && qwen3Defaults.slidingWindow == nil && qwen3Defaults.eosTokenIds == [])
        // SmolLM3Config: every fourth layer keeps no positions; SmolLM3-3B's shape and token ids.
        let smolDefaults = try bare(#"{"model_type": "smollm3"}"#)
        #expect(smolDefaults.ropeLayers.count == 36 && smolDefaults.ropeLayers.enumerated().allSatisfy { $0.element == (($0.offset + 1) % 4 != 0) })
        #expect(smolDefaults.hiddenSize == 2048 && smolDefaults.numAttentionHeads == 16 && smolDefaults.numKeyValueHeads == 4
                && smolDefaults.tieWordEmbeddings && smolDefaults.padTokenId == 128004 && smolDefaults.eosTokenIds == [128001]
                && smolDefaults.slidingWindow == nil)
        #expect(throws: DecodingError.self) { try bare(#"{"model_type": "smollm3", "no_rope_layers": [1, 2]}"#) }
        // A corrupt layer count is an error, not per-layer tables of that size.
        for type in ["qwen2", "smollm3"] {
            #expect(throws: DecodingError.self) { try bare(#"{"model_type": "\#(type)", "num_hidden_layers": 100000000000}"#) }
        }
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(Gemma3TextConfig.self, from: Data(#"{"num_hidden_layers": 100000000000}"#.utf8))
        }

        // Gemma3TextConfig: five sliding layers of every six, each kind with its own rotary base; the legacy keys.
        let gemma = try JSONDecoder().decode(Gemma3TextConfig.self, from: Data(#"{"model_type": "gemma3_text"}"#.utf8))
        #expect(gemma.layerTypes.count == 26 && gemma.layerTypes.enumerated().allSatisfy {
            $0.element == (($0.offset + 1) % 6 == 0 ? "full_attention" : "sliding_attention") })
        #expect(gemma.fullAttentionRope == RopeParameters(theta: 1_000_000) && gemma.slidingAttentionRope == RopeParameters(theta: 10_000))
        #expect(gemma.headDim == 256 && gemma.slidingWindow == 4096 && gemma.tieWordEmbeddings && gemma.eosTokenIds == [1]
                && gemma.finalLogitSoftcapping == nil && gemma.queryPreAttnScalar == 256)
        let legacy = try JSONDecoder().decode(Gemma3TextConfig.self, from: Data(#"""
            {"model_type": "gemma3_text", "num_hidden_layers": 4, "sliding_window_pattern": 2, "rope_theta": 500000,
             "rope_local_base_freq": 20000, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
            """#.utf8))
        #expect(legacy.layerTypes == ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
        #expect(legacy.fullAttentionRope == RopeParameters(ropeType: "linear", theta: 500_000, factor: 8)
                && legacy.slidingAttentionRope == RopeParameters(theta: 20_000))
        let gemmaFixture = try DecoderFixture("gemma3").directory.decode(Gemma3TextConfig.self)
        #expect(gemmaFixture.fullAttentionRope == RopeParameters(ropeType: "linear", theta: 1_000_000, factor: 2)
                && gemmaFixture.attentionWindow(layer: 0) == 4 && gemmaFixture.attentionWindow(layer: 1) == nil)

        let opt = try DecoderFixture("opt-post-proj").directory.decode(OPTConfig.self)
        #expect(!opt.doLayerNormBefore && opt.wordEmbedProjDim == 32 && opt.hiddenSize == 64 && opt.tieWordEmbeddings)
        let optDefaults = try JSONDecoder().decode(OPTConfig.self, from: Data("{}".utf8))
        #expect(optDefaults.wordEmbedProjDim == 768 && optDefaults.activationFunction == "relu" && optDefaults.padTokenId == 1)
        let gpt2 = try DecoderFixture("gpt2-cross").directory.decode(GPT2Config.self)
        #expect(gpt2.addCrossAttention && gpt2.scaleAttnByInverseLayerIdx && !gpt2.tieWordEmbeddings && gpt2.innerSize == 64)
        let gpt2Defaults = try JSONDecoder().decode(GPT2Config.self, from: Data("{}".utf8))
        #expect(gpt2Defaults.innerSize == 3072 && gpt2Defaults.eosTokenIds == [50256] && gpt2Defaults.activationFunction == "gelu_new")
    }
}

@Suite struct DecoderBeamSearchTests {
    @Test(arguments: DecoderFixture.names)
    func beamSearchMatchesTransformers(_ name: String) throws {
        let fixture = try DecoderFixture(name)
        for beam in fixture.expected.beam {
            var config = GenerationConfig()
            config.numBeams = beam.num_beams
            config.numReturnSequences = beam.num_return_sequences
            config.maxNewTokens = beam.max_new_tokens
            config.lengthPenalty = beam.length_penalty
            config.earlyStopping = beam.early_stopping ? .always : .heuristic
            config.eosTokenIds = beam.eos
            config.padTokenId = 0
            let model = try fixture.model(rows: beam.input_ids.count)
            let output = try model.generate(inputIds: beam.input_ids, attentionMask: beam.attention_mask, config: config)
            // A hypothesis ends at its first eos; what follows is padding.
            let promptLength = beam.input_ids[0].count
            let expected = beam.sequences.map { row -> [Int] in
                let new = Array(row[promptLength...])
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
}
