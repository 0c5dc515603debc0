import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels
import VLMTensor

/// gemma3-mixed.gguf (oracle/llama.py): a tiny random Gemma 3 written as llama.cpp's converter writes one (norms
/// stored plus one, six layers of which the sixth attends fully, a 4-token window, every projection quantized in
/// another block format, tied Q8_0 embeddings), against what transformers computes after loading the same file.
@Suite struct Gemma3GGUFTests {
    struct Expected: Decodable {
        let input_ids: [[Int]]
        let logits: [Float]
        let new_tokens: [Int]
        let sequence: [Int]
        let positions: [Int]
        let position_logits: [[Float]]
    }

    static let url = LlamaFixture.root.appendingPathComponent("gemma3-mixed.gguf")
    static let expected = Result {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: url.appendingPathExtension("json")))
    }

    @Test func configComesFromTheMetadata() throws {
        let file = try GGUFFile(url: Self.url)
        let loaded = try ModelRegistry.causalLanguageModel(gguf: file)
        let model = try #require(loaded.model as? Gemma3ForCausalLM)
        #expect(model.config.layerTypes == Array(repeating: "sliding_attention", count: 5) + ["full_attention"])
        #expect(model.config.headDim == 256 && model.config.slidingWindow == 4 && model.config.tieWordEmbeddings)
        #expect(model.config.fullAttentionRope == RopeParameters(theta: 1_000_000) && model.config.slidingAttentionRope == RopeParameters(theta: 10_000))
        #expect(loaded.bosTokenId == 1 && loaded.eosTokenIds == [2])
    }

    @Test func promptLogitsMatchTransformers() throws {
        let expected = try Self.expected.get()
        let model = try Gemma3ForCausalLM(gguf: GGUFFile(url: Self.url))
        let logits = try model.logits(inputIds: expected.input_ids)
        #expect(maxDifference(logits.scalars, expected.logits) < 1e-4)
    }

    /// One token at a time over the cache: the sliding layers' window moves past the prompt, the full layer sees all.
    @Test func decodingStepsMatchTransformers() throws {
        let expected = try Self.expected.get()
        try FusedDecodingTests.expectDecodingSteps(of: try Gemma3ForCausalLM(gguf: GGUFFile(url: Self.url)),
                                                   prompt: expected.input_ids[0], sequence: expected.sequence,
                                                   positions: expected.positions, logits: expected.position_logits,
                                                   name: "gemma3-mixed.gguf")
    }

    @Test func greedyContinuationMatchesTransformers() throws {
        let expected = try Self.expected.get()
        let model = try Gemma3ForCausalLM(gguf: GGUFFile(url: Self.url))
        let output = try model.generate(inputIds: expected.input_ids,
                                        options: GenerationOptions(maxNewTokens: expected.new_tokens.count, eosTokenIds: []))
        #expect(output == [expected.new_tokens])
    }

    /// Its decoding steps run fused (every projection and the tied head packed): the same floats as layer by layer,
    /// logits and cache, over the whole sequence, far past the sliding layers' 4-token window (their attention in
    /// one part, the full layer's split in parts from 128 positions on where the cores call for it).
    /// The same built in int8, its products on int8 activations, and with the cache in fp16 (the windows read from
    /// the halves' offsets).
    @Test(.enabled(if: FusedDecoderStep.isSupported, "this CPU has no packed quantized products: no fused decoding step"),
          arguments: zip([MatrixPrecision.float32, .int8, .float32], [KVCache.ElementType.float32, .float32, .float16]))
    func fusedStepsEqualTheLayerByLayerPath(precision: MatrixPrecision, cacheType: KVCache.ElementType) throws {
        let expected = try Self.expected.get()
        let model = try KVCache.ElementType.$forNewModels.withValue(cacheType) {
            try MatrixPrecision.$forNewLayers.withValue(precision) { try Gemma3ForCausalLM(gguf: GGUFFile(url: Self.url)) }
        }
        #expect(model.cacheElementType == cacheType)
        #expect(model.fusedStep?.vocabularySize == 160)
        #expect(model.fusedStep?.int8 == (model.layers[0].down.precision == .int8))
        try FusedDecodingTests.expectFusedStepsEqualLayerByLayer(model, tokens: expected.sequence, promptLength: 1) {
            try model.logits(inputsEmbeds: $0, attentionMask: nil, positionIds: nil, cache: $1, lastPositionOnly: false, fusing: $2)
        }
    }

    /// Steps by `logits(nextToken:cache:)` (its scaled embedding row and both rotary tables written into the
    /// cache's workspace) give the floats steps by token ids give.
    @Test(.enabled(if: FusedDecoderStep.isSupported, "this CPU has no packed quantized products: no fused decoding step"))
    func nextTokenStepsEqualTokenIdSteps() throws {
        let model = try Gemma3ForCausalLM(gguf: GGUFFile(url: Self.url))
        try FusedDecodingTests.expectNextTokenStepsEqualTokenIdSteps(model, tokens: try Self.expected.get().sequence,
                                                                     promptLength: 1, workspaceRows: true)
    }
}
