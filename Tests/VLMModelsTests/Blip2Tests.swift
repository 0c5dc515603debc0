import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// A tiny random-init BLIP-2 checkpoint written by oracle/blip2.py, with what transformers computed on it.
struct Blip2Fixture {
    struct Expected: Decodable {
        struct Greedy: Decodable {
            let prompted: Bool
            /// transformers' `sequences`: the prompt (the one generate made up when not `prompted`), then new tokens.
            let sequences: [[Int]]
            let prompt_length: Int
        }
        struct Beam: Decodable {
            let num_beams: Int
            let num_return_sequences: Int
            let max_new_tokens: Int
            let eos: [Int]
            let pad: Int
            let sequences: [[Int]]
            let sequences_scores: [Float]
        }
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let image_token_index: Int
        let max_new_tokens: Int
        let greedy: [Greedy]
        let beam: Beam
    }

    static let names = ["cross1-fp16", "hub-layout-bf16", "no-qkv-bias-fp32"]
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/blip2")

    let model: Blip2ForConditionalGeneration
    let expected: Expected
    let tensors: SafetensorsFile

    init(_ name: String) throws {
        let directory = Self.root.appendingPathComponent(name)
        model = try Blip2ForConditionalGeneration(directory: ModelDirectory(url: directory))
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
        tensors = try SafetensorsFile(url: directory.appendingPathComponent("expected.safetensors"))
    }

    var pixelValues: Tensor { get throws { try tensors.tensor("pixel_values") } }
}

@Suite struct Blip2Tests {
    static let tolerance: Float = 1e-4

    @Test(arguments: Blip2Fixture.names)
    func everyStageMatchesTransformers(_ name: String) throws {
        let fixture = try Blip2Fixture(name)
        let vision = try fixture.model.visionModel(pixelValues: fixture.pixelValues)
        #expect(maxAbsDifference(vision.lastHiddenState, try fixture.tensors.tensor("vision_last_hidden_state")) < Self.tolerance, "\(name)")
        #expect(maxAbsDifference(vision.pooledOutput, try fixture.tensors.tensor("vision_pooler_output")) < Self.tolerance, "\(name)")
        let queries = try fixture.model.queryOutput(imageHiddenStates: vision.lastHiddenState)
        #expect(maxAbsDifference(queries, try fixture.tensors.tensor("qformer_last_hidden_state")) < Self.tolerance, "\(name)")
        let embeddings = try fixture.model.imageEmbeddings(pixelValues: fixture.pixelValues)
        #expect(maxAbsDifference(embeddings, try fixture.tensors.tensor("image_embeds")) < Self.tolerance, "\(name)")
    }

    @Test(arguments: Blip2Fixture.names)
    func logitsMatchTransformers(_ name: String) throws {
        let fixture = try Blip2Fixture(name)
        let mask = fixture.expected.attention_mask
        let logits = try fixture.model.logits(pixelValues: fixture.pixelValues, inputIds: fixture.expected.input_ids,
                                              attentionMask: mask)
        let expected = try fixture.tensors.tensor("logits")
        #expect(logits.shape == expected.shape)
        // Padding positions' logits are whatever each implementation's fully masked attention row gives.
        for (row, (actual, wanted)) in zip(unpaddedRows(logits, mask: mask), unpaddedRows(expected, mask: mask)).enumerated() {
            #expect(maxDifference(actual, wanted) < Self.tolerance, "\(name) row \(row)")
        }
    }

    /// bf16 layers (bf16 weights, each layer's input rounded to bf16, fp32 sums) keep the first generated step's
    /// logits at cosine ≥ 0.999 to fp32's for every prompt, the bound the image-to-text issue sets for bf16 captioning.
    @Test(arguments: Blip2Fixture.names)
    func bfloat16LayersKeepTheFirstStepLogitsOfFP32(_ name: String) throws {
        let fixture = try Blip2Fixture(name)
        let directory = try ModelDirectory(url: Blip2Fixture.root.appendingPathComponent(name))
        let bf16 = try MatrixPrecision.$forNewLayers.withValue(.bfloat16) { try Blip2ForConditionalGeneration(directory: directory) }
        let (ids, mask) = (fixture.expected.input_ids, fixture.expected.attention_mask)
        let reference = try fixture.model.logits(pixelValues: fixture.pixelValues, inputIds: ids, attentionMask: mask)
        let lowered = try bf16.logits(pixelValues: fixture.pixelValues, inputIds: ids, attentionMask: mask)
        #expect(maxAbsDifference(reference, lowered) > 0 || MatrixPrecision.bfloat16.available == .float32, "\(name): bf16 changed nothing")
        let (length, vocabulary) = (reference.shape[1], reference.shape[2])
        for row in ids.indices {
            // Prompts are left-padded: the last position is every row's first step.
            let start = (row * length + length - 1) * vocabulary
            let a = Array(reference.scalars[start..<(start + vocabulary)]), b = Array(lowered.scalars[start..<(start + vocabulary)])
            let dot = zip(a, b).reduce(0) { $0 + Double($1.0) * Double($1.1) }
            let cosine = dot / (a.reduce(0) { $0 + Double($1) * Double($1) }.squareRoot() * b.reduce(0) { $0 + Double($1) * Double($1) }.squareRoot())
            #expect(cosine >= 0.999, "\(name) row \(row): cosine \(cosine)")
        }
    }

    @Test(arguments: Blip2Fixture.names)
    func greedyGenerationMatchesTransformers(_ name: String) throws {
        let fixture = try Blip2Fixture(name)
        var config = GenerationConfig()
        config.maxNewTokens = fixture.expected.max_new_tokens
        for greedy in fixture.expected.greedy {
            let output = try fixture.model.generate(
                pixelValues: fixture.pixelValues, inputIds: greedy.prompted ? fixture.expected.input_ids : nil,
                attentionMask: greedy.prompted ? fixture.expected.attention_mask : nil, config: config)
            #expect(output.sequences == greedy.sequences.map { Array($0[greedy.prompt_length...]) }, "\(name) prompted \(greedy.prompted)")
        }
    }

    @Test(arguments: Blip2Fixture.names)
    func beamSearchMatchesTransformers(_ name: String) throws {
        let fixture = try Blip2Fixture(name)
        let beam = fixture.expected.beam
        var config = GenerationConfig()
        config.numBeams = beam.num_beams
        config.numReturnSequences = beam.num_return_sequences
        config.maxNewTokens = beam.max_new_tokens
        config.eosTokenIds = beam.eos
        config.padTokenId = beam.pad
        let output = try fixture.model.generate(pixelValues: fixture.pixelValues, inputIds: fixture.expected.input_ids,
                                                attentionMask: fixture.expected.attention_mask, config: config)
        // A hypothesis ends at its first eos; what follows is padding.
        let promptLength = fixture.expected.input_ids[0].count
        let expected = beam.sequences.map { row -> [Int] in
            let new = Array(row[promptLength...])
            guard let end = new.firstIndex(where: beam.eos.contains) else { return new }
            return Array(new[...end])
        }
        #expect(output.sequences == expected, "\(name)")
        #expect(output.scores.count == beam.sequences_scores.count && maxDifference(output.scores, beam.sequences_scores) < Self.tolerance,
                "\(name): \(output.scores) vs \(beam.sequences_scores)")
    }

    /// Features computed once give what the pixels give.
    @Test func generationFromImageEmbeddingsEqualsFromPixels() throws {
        let fixture = try Blip2Fixture("cross1-fp16")
        var config = GenerationConfig()
        config.maxNewTokens = 4
        let embeddings = try fixture.model.imageEmbeddings(pixelValues: fixture.pixelValues)
        let fromEmbeddings = try fixture.model.generate(imageEmbeddings: embeddings, config: config)
        let fromPixels = try fixture.model.generate(pixelValues: fixture.pixelValues, config: config)
        #expect(fromEmbeddings == fromPixels)
    }

    @Test func imageTokensMustMatchTheFeatures() throws {
        let fixture = try Blip2Fixture("cross1-fp16")
        let embeddings = try fixture.model.imageEmbeddings(pixelValues: fixture.pixelValues)
        let image = fixture.expected.image_token_index
        // Two images of 4 query tokens each need 8 image tokens.
        #expect(throws: ModelError.self) {
            try fixture.model.inputsEmbeds(inputIds: [[image, image, image, 2], [image, image, image, image]], imageEmbeddings: embeddings)
        }
        #expect(throws: ModelError.self) {
            try fixture.model.inputsEmbeds(inputIds: [[image, image, image, image, 2]], imageEmbeddings: embeddings)
        }
        #expect(throws: ModelError.self) { try fixture.model.imageEmbeddings(pixelValues: Tensor(zeros: [1, 3, 16, 16])) }
        let spliced = try fixture.model.inputsEmbeds(inputIds: fixture.expected.input_ids, imageEmbeddings: embeddings)
        #expect(spliced.shape == [2, fixture.expected.input_ids[0].count, 32])
    }

    /// BLIP's own tower (`blip_vision_model`, saved alone): the same type with BLIP's config and a fully biased qkv.
    @Test func blipVisionModelMatchesTransformers() throws {
        let directory = try ModelDirectory(url: Blip2Fixture.root.appendingPathComponent("blip-vision"))
        let config = try directory.decode(BlipVisionConfig.self)
        #expect(config.layerNormEps == 1e-5 && config.qkvBias)
        let model = try BlipVisionModel(config, weights: Weights(WeightStore(directory: directory.url)), file: "blip-vision/config.json")
        let expected = try SafetensorsFile(url: directory.url.appendingPathComponent("expected.safetensors"))
        let output = try model(pixelValues: expected.tensor("pixel_values"))
        #expect(maxAbsDifference(output.lastHiddenState, try expected.tensor("last_hidden_state")) < Self.tolerance)
        #expect(maxAbsDifference(output.pooledOutput, try expected.tensor("pooler_output")) < Self.tolerance)
    }

    @Test func configDefaultsFollowTransformers() throws {
        let config = try JSONDecoder().decode(Blip2Config.self, from: Data("{}".utf8))
        let vision = config.visionConfig
        #expect(vision.hiddenSize == 1408 && vision.numHiddenLayers == 39 && vision.imageSize == 224 && vision.patchSize == 14)
        #expect(vision.layerNormEps == 1e-6 && vision.qkvBias)
        #expect(config.qformerConfig.crossAttentionFrequency == 2 && config.qformerConfig.layerNormEps == 1e-12)
        #expect(config.qformerConfig.encoderHiddenSize == 1408)
        #expect(!config.qformerConfig.useQformerTextInput && config.qformerConfig.vocabSize == 30522)
        #expect(config.qformerConfig.maxPositionEmbeddings == 512 && config.imageTextHiddenSize == 256)
        #expect(config.numQueryTokens == 32 && config.imageTokenIndex == nil)
        guard case .opt = config.textConfig else { Issue.record("text_config defaults to OPT"); return }
        let named = try JSONDecoder().decode(Blip2Config.self, from: Data(#"{"image_token_id": 50265, "vision_config": {"hidden_size": 64}}"#.utf8))
        #expect(named.imageTokenIndex == 50265 && named.qformerConfig.encoderHiddenSize == 64)
        let blip = try JSONDecoder().decode(BlipVisionConfig.self, from: Data(#"{"model_type": "blip_vision_model"}"#.utf8))
        #expect(blip.hiddenSize == 768 && blip.imageSize == 384 && blip.patchSize == 16 && blip.layerNormEps == 1e-5 && blip.qkvBias)
    }

    /// `Blip2ForImageTextRetrieval` (oracle/blip2.py's "retrieval"): both images against every text, as
    /// `vlm match` pairs them (the texts repeated per image, image by image).
    @Test func retrievalMatchesTransformers() throws {
        struct Expected: Decodable {
            let input_ids: [[Int]]
            let attention_mask: [[Int]]
            let itm_probabilities: [[Float]]
            let itc_similarities: [[Float]]
        }
        let directory = try ModelDirectory(url: Blip2Fixture.root.appendingPathComponent("retrieval"))
        #expect(try ModelRegistry.family(of: directory, for: .match).name == "BLIP-2 retrieval")
        let model = try ModelRegistry.imageTextMatchingModel(directory)
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.url.appendingPathComponent("expected.json")))
        let tensors = try SafetensorsFile(url: directory.url.appendingPathComponent("expected.safetensors"))
        let embeds = try model.imageEmbeddings(pixelValues: tensors.tensor("pixel_values"))
        #expect(maxAbsDifference(embeds, try tensors.tensor("vision_last_hidden_state")) < Self.tolerance)
        let (ids, mask) = (expected.input_ids, expected.attention_mask)
        let pairs = (Array(repeating: ids, count: 2).flatMap { $0 }, Array(repeating: mask, count: 2).flatMap { $0 })
        let retrieval = try #require(model as? Blip2ForImageTextRetrieval)
        let logits = try retrieval.matchLogits(imageEmbeds: embeds, inputIds: pairs.0, attentionMask: pairs.1)
        let expectedLogits = concatenate([try tensors.tensor("itm_logits_0"), try tensors.tensor("itm_logits_1")], axis: 0)
        #expect(maxAbsDifference(logits, expectedLogits) < Self.tolerance)
        let probabilities = try model.matchProbabilities(imageEmbeds: embeds, inputIds: pairs.0, attentionMask: pairs.1)
        #expect(maxDifference(probabilities, expected.itm_probabilities.flatMap { $0 }) < Self.tolerance)
        let similarities = try model.cosineSimilarities(imageEmbeds: embeds, inputIds: ids, attentionMask: mask)
        #expect(similarities.shape == [2, 3])
        #expect(maxDifference(similarities.scalars, expected.itc_similarities.flatMap { $0 }) < Self.tolerance)
        #expect(maxAbsDifference(try retrieval.imageFeatures(imageEmbeds: embeds), try tensors.tensor("itc_image_embeds")) < Self.tolerance)
        #expect(maxAbsDifference(try retrieval.textFeatures(inputIds: ids, attentionMask: mask), try tensors.tensor("itc_text_embeds")) < Self.tolerance)
        #expect(throws: ModelError.self) { try retrieval.matchLogits(imageEmbeds: embeds, inputIds: Array(ids.prefix(3)), attentionMask: nil) }
    }

    /// The captioning checkpoints stay BLIP-2's generation family; a retrieval checkpoint whose Q-Former has no text
    /// feed-forward is refused by name.
    @Test func retrievalNeedsTheQFormerTextInput() throws {
        let captioning = try ModelDirectory(url: Blip2Fixture.root.appendingPathComponent("cross1-fp16"))
        #expect(try ModelRegistry.family(of: captioning).name == "BLIP-2")
        let directory = try ModelDirectory(url: Blip2Fixture.root.appendingPathComponent("retrieval"))
        var config = try directory.decode(Blip2Config.self)
        #expect(config.qformerConfig.useQformerTextInput && config.imageTextHiddenSize == 16)
        config.qformerConfig.useQformerTextInput = false
        let error = try #require(throws: ModelError.self) {
            try Blip2ForImageTextRetrieval(config: config, weights: Weights(WeightStore(directory: directory.url)))
        }
        #expect("\(error)".contains("use_qformer_text_input"))
    }

    @Test func otherLanguageModelsAreNamedErrors() throws {
        let error = try #require(throws: DecodingError.self) {
            try JSONDecoder().decode(Blip2Config.self, from: Data(#"{"text_config": {"model_type": "llama"}}"#.utf8))
        }
        #expect("\(error)".contains("\"llama\"") && "\(error)".contains("opt, t5"))
    }
}
