import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels
import VLMTensor

/// Decoding steps of fully quantized Llama-family models run as one fused parallel region (FusedDecoderStep); these
/// check it against transformers and, bit for bit, against the layer-by-layer path it replaces.
@Suite(.enabled(if: FusedDecoderStep.isSupported, "this CPU has no packed quantized products: no fused decoding step"))
struct FusedDecodingTests {
    /// qwen2-mixed.gguf (oracle/llama.py): every projection quantized, each in another block format, q/k/v biases, an
    /// untied F16 head (the step ends at the final norm and the head runs after it).
    struct Expected: Decodable {
        let input_ids: [[Int]]
        let new_tokens: [Int]
        let sequence: [Int]
        let positions: [Int]
        let position_logits: [[Float]]
    }

    static let url = LlamaFixture.root.appendingPathComponent("qwen2-mixed.gguf")
    /// qwen3-mixed.gguf (oracle/llama.py): the same for Qwen3, each query and key head normalized before the
    /// rotation (q_norm, k_norm drawn around 1), heads of 128.
    static let qwen3 = LlamaFixture.root.appendingPathComponent("qwen3-mixed.gguf")
    /// smollm3-mixed.gguf (oracle/llama.py): SmolLM3 as llama.cpp writes it (Q/K rows interleaved), four layers, the
    /// fourth keeping no positions, tied Q8_0 embeddings (the step runs the head); transformers' expectations from the
    /// checkpoint the file holds, since transformers reads no smollm3 GGUF.
    static let smolLM3 = LlamaFixture.root.appendingPathComponent("smollm3-mixed.gguf")
    static let fixtures = [url, qwen3, smolLM3]

    static func expected(_ file: URL = url) throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: file.appendingPathExtension("json")))
    }

    @Test func everyQuantizedModelFuses() throws {
        #expect(try #require(LlamaForCausalLM(gguf: Self.url).fusedStep).vocabularySize == nil)
        #expect(try #require(LlamaForCausalLM(gguf: Self.qwen3).fusedStep).vocabularySize == nil)
        #expect(try #require(LlamaForCausalLM(gguf: Self.smolLM3).fusedStep).vocabularySize == 160)
        if let smolLM2 = SmolLM2.url {
            #expect(try #require(LlamaForCausalLM(gguf: smolLM2).fusedStep).vocabularySize == 49152)
        }
        // F32 MLP: the layer-by-layer path.
        #expect(try LlamaForCausalLM(gguf: LlamaFixture.root.appendingPathComponent("qwen2-tiny.gguf")).fusedStep == nil)
    }

    /// One token at a time after the prompt: the logits transformers computes for those positions of the sequence in
    /// one forward pass, before and after each head's keys split into two parts (128 keys).
    @Test(arguments: fixtures)
    func decodingStepsMatchTransformers(_ file: URL) throws {
        let expected = try Self.expected(file)
        try Self.expectDecodingSteps(of: try LlamaForCausalLM(gguf: file), prompt: expected.input_ids[0],
                                     sequence: expected.sequence, positions: expected.positions,
                                     logits: expected.position_logits, name: file.lastPathComponent)
    }

    /// `model` run one token at a time after `prompt` over `sequence`: at `positions`, within 1e-4 of `logits`.
    static func expectDecodingSteps(of model: any CausalLanguageModel, prompt: [Int], sequence: [Int], positions: [Int],
                                    logits expected: [[Float]], name: String) throws {
        let cache = try model.makeCache(batch: 1, capacity: sequence.count)
        var logits = try model.logits(inputIds: [prompt], cache: cache, lastPositionOnly: true)
        var checked = 0
        for position in (prompt.count - 1)..<sequence.count {
            if position >= prompt.count { logits = try model.logits(inputIds: [[sequence[position]]], cache: cache) }
            guard let index = positions.firstIndex(of: position) else { continue }
            #expect(maxDifference(logits.scalars, expected[index]) < 1e-4, "\(name) position \(position)")
            checked += 1
        }
        #expect(checked == positions.count)
    }

    @Test(arguments: fixtures)
    func greedyContinuationMatchesTransformers(_ file: URL) throws {
        let expected = try Self.expected(file)
        try Qwen2GGUFTests.expectGreedyContinuation(of: file, inputIds: expected.input_ids, newTokens: expected.new_tokens)
    }

    /// Each step's logits and the keys and values it stores, fused and layer by layer, are the same floats.
    static func expectFusedStepsEqualLayerByLayer(_ model: LlamaForCausalLM, tokens: [Int], promptLength: Int) throws {
        #expect(model.fusedStep != nil)
        try expectFusedStepsEqualLayerByLayer(model, tokens: tokens, promptLength: promptLength) {
            try model.logits(inputsEmbeds: $0, attentionMask: nil, positionIds: nil, cache: $1, lastPositionOnly: false, fusing: $2)
        }
    }

    /// The same for any model, `logits(embedding, cache, fusing)` one step of it.
    static func expectFusedStepsEqualLayerByLayer(_ model: any CausalLanguageModel, tokens: [Int], promptLength: Int,
                                                  logits: (Tensor, KVCache, Bool) throws -> Tensor) throws {
        let caches = try (0..<2).map { _ in try model.makeCache(batch: 1, capacity: tokens.count) }
        for cache in caches {
            _ = try model.logits(inputIds: [Array(tokens[..<promptLength])], cache: cache, lastPositionOnly: true)
        }
        for position in promptLength..<tokens.count {
            let embedding = try model.embed([[tokens[position]]])
            let (fused, layered) = try (logits(embedding, caches[0], true), logits(embedding, caches[1], false))
            #expect(fused.shape == layered.shape)
            guard fused.scalars == layered.scalars else {
                Issue.record("position \(position): fused logits differ by up to \(maxDifference(fused.scalars, layered.scalars))")
                return
            }
        }
        for (fused, layered) in zip(caches[0].layers, caches[1].layers) {
            switch (fused, layered) {
            case let (.floats(fusedKey, fusedValue), .floats(key, value)):
                #expect(fusedKey.scalars == key.scalars && fusedValue.scalars == value.scalars)
            case let (.halves(fusedKey, fusedValue), .halves(key, value)):
                #expect(Array(UnsafeBufferPointer(start: fusedKey.pointer, count: fusedKey.count))
                        == Array(UnsafeBufferPointer(start: key.pointer, count: key.count)))
                #expect(Array(UnsafeBufferPointer(start: fusedValue.pointer, count: fusedValue.count))
                        == Array(UnsafeBufferPointer(start: value.pointer, count: value.count)))
            default:
                Issue.record("the two caches hold different element types")
            }
        }
    }

    @Test(arguments: fixtures)
    func fusedStepsEqualTheLayerByLayerPath(_ file: URL) throws {
        let expected = try Self.expected(file)
        try Self.expectFusedStepsEqualLayerByLayer(try LlamaForCausalLM(gguf: file), tokens: expected.sequence,
                                                   promptLength: expected.input_ids[0].count)
    }

    /// Built in int8, the fused step multiplies the int8 activation rows too, as the layer-by-layer path does: the
    /// same floats, and not the fixed point's.
    @Test(arguments: fixtures)
    func int8FusedStepsEqualTheLayerByLayerPath(_ file: URL) throws {
        let expected = try Self.expected(file)
        let model = try MatrixPrecision.$forNewLayers.withValue(.int8) { try LlamaForCausalLM(gguf: file) }
        #expect(try #require(model.fusedStep).int8 == (model.layers[0].down.precision == .int8))
        try Self.expectFusedStepsEqualLayerByLayer(model, tokens: expected.sequence,
                                                   promptLength: expected.input_ids[0].count)
    }

    /// SmolLM2's q/k/v and gate/up stack (one format), its head is its Q4_1 embedding table: the step runs the head.
    @Test(.enabled(if: SmolLM2.url != nil, Comment(rawValue: SmolLM2.skipMessage)))
    func smolLM2FusedStepsEqualTheLayerByLayerPath() throws {
        let expected = try Self.expected()
        // From 120 positions to 160: its three key heads' keys split into two parts from 128 on.
        let tokens = expected.sequence.map { $0 * 97 % 49152 }
        try Self.expectFusedStepsEqualLayerByLayer(try LlamaForCausalLM(gguf: try #require(SmolLM2.url)), tokens: tokens,
                                                   promptLength: 120)
    }
}

extension FusedDecodingTests {
    /// With its cache in fp16 the fused step rounds each key and value as the layer-by-layer path stores them and
    /// reads them as it does: the same logits and the same cached halves.
    @Test(arguments: fixtures)
    func halfCacheFusedStepsEqualTheLayerByLayerPath(_ file: URL) throws {
        let expected = try Self.expected(file)
        let model = try KVCache.ElementType.$forNewModels.withValue(.float16) { try LlamaForCausalLM(gguf: file) }
        #expect(try model.makeCache(batch: 1, capacity: 1).elementType == .float16)
        try Self.expectFusedStepsEqualLayerByLayer(model, tokens: expected.sequence, promptLength: expected.input_ids[0].count)
    }
}

extension FusedDecodingTests {
    /// A step by `logits(nextToken:cache:)`, through the cache's workspace, gives the floats a step by token ids gives,
    /// and leaves the cache as that leaves it.
    @Test(arguments: fixtures)
    func nextTokenStepsEqualTokenIdSteps(_ file: URL) throws {
        let expected = try Self.expected(file)
        let model = try LlamaForCausalLM(gguf: file)
        try Self.expectNextTokenStepsEqualTokenIdSteps(model, tokens: expected.sequence, promptLength: expected.input_ids[0].count,
                                                       workspaceRows: model.fusedStep?.vocabularySize != nil)
    }

    /// The same for any model; that a caller who keeps every step's logits finds them unchanged by the steps after;
    /// and with `workspaceRows` (the step writes the logits into the workspace's two rows) that a caller who keeps
    /// the last step's while it takes the next, as a decoding loop does, gets the two rows in turn.
    static func expectNextTokenStepsEqualTokenIdSteps(_ model: any CausalLanguageModel, tokens: [Int], promptLength: Int,
                                                      workspaceRows: Bool) throws {
        let caches = try (0..<3).map { _ in try model.makeCache(batch: 1, capacity: tokens.count) }
        for cache in caches {
            _ = try model.logits(inputIds: [Array(tokens[..<promptLength])], cache: cache, lastPositionOnly: true)
        }
        var kept: [(logits: Tensor, scalars: [Float])] = [], rows: [UnsafeMutablePointer<Float>] = []
        var last: Tensor?
        for position in promptLength..<tokens.count {
            let next = try model.logits(nextToken: tokens[position], cache: caches[0])
            let byIds = try model.logits(inputIds: [[tokens[position]]], cache: caches[1])
            #expect(next.shape == byIds.shape)
            guard next.scalars == byIds.scalars else {
                Issue.record("position \(position): logits differ by up to \(maxDifference(next.scalars, byIds.scalars))")
                return
            }
            kept.append((next, next.scalars))
            last = try model.logits(nextToken: tokens[position], cache: caches[2])
            rows.append(try #require(last).storage.pointer)
        }
        #expect(kept.allSatisfy { $0.logits.scalars == $0.scalars }, "a later step wrote over logits a caller holds")
        for (next, byIds) in zip(caches[0].layers, caches[1].layers) {
            guard case let (.floats(nextKey, nextValue), .floats(key, value)) = (next, byIds) else {
                Issue.record("float caches expected")
                return
            }
            #expect(nextKey.scalars == key.scalars && nextValue.scalars == value.scalars)
        }
        if workspaceRows {
            #expect(Set(rows).count == 2, "a decoding loop's logits should take the workspace's two rows in turn")
        }
    }

    /// SmolLM2 (its step runs the head, the logits in the workspace's rows), past its keys' split at 128 positions.
    @Test(.enabled(if: SmolLM2.url != nil, Comment(rawValue: SmolLM2.skipMessage)))
    func smolLM2NextTokenStepsEqualTokenIdSteps() throws {
        let tokens = try Self.expected().sequence.map { $0 * 97 % 49152 }
        try Self.expectNextTokenStepsEqualTokenIdSteps(try LlamaForCausalLM(gguf: try #require(SmolLM2.url)), tokens: tokens,
                                                       promptLength: 120, workspaceRows: true)
    }

    /// A model without a fused step takes the token-id path.
    @Test func nextTokenStepsWithoutAFusedStepEqualTokenIdSteps() throws {
        let model = try LlamaForCausalLM(gguf: LlamaFixture.root.appendingPathComponent("qwen2-tiny.gguf"))
        #expect(model.fusedStep == nil)
        try Self.expectNextTokenStepsEqualTokenIdSteps(model, tokens: try Self.expected().sequence.map { $0 % model.vocabularySize },
                                                       promptLength: 3, workspaceRows: false)
    }
}
