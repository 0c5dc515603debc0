import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// A tiny random-init BLIP head checkpoint written by oracle/blip.py, with the image embeds the oracle fed and what
/// transformers computed from them.
struct BlipFixture {
    struct Logits: Decodable {
        let decoder_input_ids: [[Int]]
        let logits: [Float]
    }
    struct Generated: Decodable {
        let new_tokens: [[Int]]
        let min_margin: Float?
        let num_beams: Int?
    }
    struct Expected: Decodable {
        let image_embeds: [Float]
        let image_embeds_shape: [Int]
        let max_new_tokens: Int
        let bos_token_id: Int
        let sep_token_id: Int
        // Captioning.
        let unconditional_logits: Logits?
        let prompted_logits: Logits?
        let prompt_input_ids: [Int]?
        let greedy: Generated?
        let prompted_greedy: Generated?
        let beam: Generated?
        let prompted_beam: Generated?
        // VQA (questions) and retrieval (texts).
        let input_ids: [[Int]]?
        let attention_mask: [[Int]]?
        let question_states: [Float]?
        let answer_logits: Logits?
        let itm_probabilities: [[Float]]?
        let itc_similarities: [[Float]]?
        let itm_text_states: [Float]?
        let itc_text_states: [Float]?
    }

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/blip")

    let directory: ModelDirectory
    let expected: Expected

    init(_ name: String) throws {
        directory = try ModelDirectory(url: Self.root.appendingPathComponent(name))
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.url.appendingPathComponent("expected.json")))
    }

    /// The stored vision tower output of both photos, `[2, patches + 1, vision]`.
    var imageEmbeds: Tensor { Tensor(shape: expected.image_embeds_shape, scalars: expected.image_embeds) }

    /// Image `index` alone, `[1, patches + 1, vision]`.
    func imageEmbeds(_ index: Int) -> Tensor {
        let shape = expected.image_embeds_shape
        let size = shape[1] * shape[2]
        return Tensor(shape: [1, shape[1], shape[2]], scalars: Array(expected.image_embeds[(index * size)..<((index + 1) * size)]))
    }

    /// Greedy decoding (or `beams`-beam search) of up to the oracle's `max_new_tokens`.
    func generation(beams: Int = 1) -> GenerationConfig {
        var config = GenerationConfig()
        config.maxNewTokens = expected.max_new_tokens
        config.numBeams = beams
        return config
    }
}

@Suite struct BlipTests {
    static let tolerance: Float = 1e-4

    @Test func captioningLogitsMatchTransformers() throws {
        let fixture = try BlipFixture("captioning")
        let model = try BlipForConditionalGeneration(directory: fixture.directory)
        for expected in [fixture.expected.unconditional_logits, fixture.expected.prompted_logits] {
            let expected = try #require(expected)
            let logits = try model.logits(imageEmbeds: fixture.imageEmbeds, decoderInputIds: expected.decoder_input_ids)
            #expect(logits.shape == [2, expected.decoder_input_ids[0].count, model.config.textConfig.vocabSize])
            #expect(maxDifference(logits.scalars, expected.logits) < Self.tolerance, "\(expected.decoder_input_ids)")
        }
    }

    /// Greedy and 3-beam captions of both photos, from `[bos]` and continuing the processor's prompt ids.
    @Test func captionsMatchTransformers() throws {
        let fixture = try BlipFixture("captioning")
        let model = try BlipForConditionalGeneration(directory: fixture.directory)
        let expected = fixture.expected
        let prompt = try #require(expected.prompt_input_ids)
        let prompts = [prompt, prompt]
        let cases: [(BlipFixture.Generated?, [[Int]]?, Int)] = [
            (expected.greedy, nil, 1), (expected.prompted_greedy, prompts, 1),
            (expected.beam, nil, 3), (expected.prompted_beam, prompts, 3),
        ]
        for (generated, inputIds, beams) in cases {
            let generated = try #require(generated)
            let output = try model.generate(imageEmbeds: fixture.imageEmbeds, inputIds: inputIds,
                                            attentionMask: inputIds?.map { $0.map { _ in 1 } }, config: fixture.generation(beams: beams))
            #expect(output.sequences == generated.new_tokens, "prompt \(inputIds != nil), \(beams) beams")
        }
        #expect(try #require(expected.greedy?.min_margin) > 1e-3)
    }

    @Test func captioningPromptIsTheProcessorsIdsStartingAtBos() throws {
        let fixture = try BlipFixture("captioning")
        let model = try BlipForConditionalGeneration(directory: fixture.directory)
        let bos = fixture.expected.bos_token_id
        #expect(try model.decoderPrompt(inputIds: nil, batch: 2).ids == [[bos], [bos]])
        let prompt = try model.decoderPrompt(inputIds: [[101, 17, 45, 103]], attentionMask: [[1, 1, 1, 1]], batch: 1)
        #expect(prompt.ids == [[bos, 17, 45]])
        #expect(prompt.mask == [[1, 1, 1]])
        #expect(throws: ModelError.self) { try model.decoderPrompt(inputIds: [[101, 17, 103]], batch: 2) }
        #expect(throws: ModelError.self) { try model.generate(imageEmbeds: Tensor(zeros: [1, 17, 32])) }
    }

    /// Prefill then single steps through the KV cache, cross-attending to the image, against full recomputation.
    @Test func cachedCaptionDecodingEqualsFullRecomputation() throws {
        let fixture = try BlipFixture("captioning")
        let decoder = try BlipForConditionalGeneration(directory: fixture.directory).textDecoder.attending(to: fixture.imageEmbeds)
        let prompt = [[104, 17, 45], [104, 9, 60]]
        let cache = try decoder.makeCache(batch: 2, capacity: 5)
        _ = try decoder.logits(inputIds: prompt, cache: cache)
        _ = try decoder.logits(inputIds: [[7], [8]], cache: cache)
        let stepped = try decoder.logits(inputIds: [[9], [10]], cache: cache)
        let full = try decoder.logits(inputIds: [prompt[0] + [7, 9], prompt[1] + [8, 10]], lastPositionOnly: true)
        #expect(cache.length == 5)
        #expect(maxDifference(stepped.scalars, full.scalars) < 1e-5)
    }

    @Test func questionEncodingAndAnswerLogitsMatchTransformers() throws {
        let fixture = try BlipFixture("vqa")
        let model = try BlipForQuestionAnswering(directory: fixture.directory)
        let expected = fixture.expected
        let states = try model.questionStates(imageEmbeds: fixture.imageEmbeds, inputIds: try #require(expected.input_ids),
                                              attentionMask: expected.attention_mask)
        #expect(maxDifference(states.scalars, try #require(expected.question_states)) < Self.tolerance)
        let answer = try #require(expected.answer_logits)
        let logits = try model.answerDecoder(questionStates: states).logits(inputIds: answer.decoder_input_ids)
        #expect(maxDifference(logits.scalars, answer.logits) < Self.tolerance)
    }

    @Test func answersMatchTransformers() throws {
        let fixture = try BlipFixture("vqa")
        let model = try BlipForQuestionAnswering(directory: fixture.directory)
        let expected = fixture.expected
        for (generated, beams) in [(expected.greedy, 1), (expected.beam, 3)] {
            let generated = try #require(generated)
            let output = try model.generate(imageEmbeds: fixture.imageEmbeds, inputIds: try #require(expected.input_ids),
                                            attentionMask: expected.attention_mask, config: fixture.generation(beams: beams))
            #expect(output.sequences == generated.new_tokens, "\(beams) beams")
        }
        #expect(try #require(expected.greedy?.min_margin) > 1e-3)
    }

    /// The answer decoder reads the question encoding through keys sized for the image embeds.
    @Test func questionAnsweringNeedsEqualTextAndVisionWidths() throws {
        let config = try JSONDecoder().decode(BlipConfig.self, from: Data(#"{"text_config": {"hidden_size": 32}, "vision_config": {"hidden_size": 48}}"#.utf8))
        #expect(config.textConfig.encoderHiddenSize == 48)
        let fixture = try BlipFixture("vqa")
        let weights = Weights(try WeightStore(directory: fixture.directory.url))
        #expect(throws: ModelError.self) { try BlipForQuestionAnswering(config: config, weights: weights) }
    }

    @Test func imageTextMatchingMatchesTransformers() throws {
        let fixture = try BlipFixture("retrieval")
        let model = try BlipForImageTextRetrieval(directory: fixture.directory)
        let expected = fixture.expected
        let (ids, mask) = (try #require(expected.input_ids), try #require(expected.attention_mask))
        for (image, probabilities) in try #require(expected.itm_probabilities).enumerated() {
            let actual = try model.matchProbabilities(imageEmbeds: fixture.imageEmbeds(image), inputIds: ids, attentionMask: mask)
            #expect(maxDifference(actual, probabilities) < Self.tolerance, "image \(image)")
        }
        let states = try model.textEncoder.lastHiddenState(inputIds: ids, attentionMask: mask, encoderHiddenStates: fixture.imageEmbeds(0))
        #expect(maxDifference(states.scalars, try #require(expected.itm_text_states)) < Self.tolerance)
    }

    @Test func imageTextSimilaritiesMatchTransformers() throws {
        let fixture = try BlipFixture("retrieval")
        let model = try BlipForImageTextRetrieval(directory: fixture.directory)
        let expected = fixture.expected
        let (ids, mask) = (try #require(expected.input_ids), try #require(expected.attention_mask))
        let similarities = try model.cosineSimilarities(imageEmbeds: fixture.imageEmbeds, inputIds: ids, attentionMask: mask)
        #expect(similarities.shape == [2, 3])
        #expect(maxDifference(similarities.scalars, try #require(expected.itc_similarities).flatMap { $0 }) < Self.tolerance)
        let states = try model.textEncoder.lastHiddenState(inputIds: ids, attentionMask: mask)
        #expect(maxDifference(states.scalars, try #require(expected.itc_text_states)) < Self.tolerance)
    }

    /// `BlipConfig()`'s values, as transformers 5.23 fills an empty config.json.
    @Test func configDefaultsAreTransformers() throws {
        let config = try JSONDecoder().decode(BlipConfig.self, from: Data("{}".utf8))
        let text = config.textConfig
        let sizes: [Int] = [text.vocabSize, text.hiddenSize, text.encoderHiddenSize, text.intermediateSize, text.numHiddenLayers,
                            text.numAttentionHeads, text.maxPositionEmbeddings]
        #expect(sizes == [30524, 768, 768, 3072, 12, 8, 512])
        #expect(text.bosTokenId == 30522 && text.sepTokenId == 102 && text.padTokenId == 0 && text.eosTokenIds == [2])
        #expect(text.hiddenAct == "gelu" && text.layerNormEps == 1e-12 && text.isDecoder && text.tieWordEmbeddings)
        #expect(config.visionHiddenSize == 768 && config.projectionDim == 512 && config.imageTextHiddenSize == 256)
        #expect(config.logitScaleInitValue == 2.6592 && config.labelSmoothing == 0 && config.tieWordEmbeddings)
    }

    @Test func checkpointsOfOtherFamiliesAreRefused() throws {
        let gpt2 = try ModelDirectory(url: BlipFixture.root.deletingLastPathComponent().appendingPathComponent("decoders/gpt2"))
        #expect(throws: ModelError.self) { try BlipForConditionalGeneration(directory: gpt2) }
    }
}
