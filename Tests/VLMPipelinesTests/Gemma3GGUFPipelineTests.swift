import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTemplates
import VLMTensor

/// Gemma 3 image chat from llama.cpp's GGUF pair (oracle/gemma3_gguf.py: both files made by convert_hf_to_gguf.py from
/// a tiny checkpoint with a SentencePiece tokenizer.model, the language model at q8_0) against what transformers
/// computes from that checkpoint with the weights the files hold, on real photos.
@Suite struct Gemma3GGUFPipelineTests {
    struct Expected: Decodable {
        struct Generated: Decodable { let ids: [Int]; let text: String }
        struct Encoding: Decodable { let text: String; let ids: [Int] }
        struct Pixels: Decodable { let image: String; let shape: [Int]; let values: [Float] }
        struct Request: Decodable {
            let prompt: String
            let images: [String]
            let input_ids: [Int]
            let image_features: [[[Float]]]
            let logits_positions: [Int]
            let logits: [[Float]]
            let greedy: Generated
        }
        struct Answer: Decodable { let prompt: String; let input_ids: [Int]; let ids: [Int]; let text: String }
        let image_token_index: Int
        let max_new_tokens: Int
        let chat_tokens: Int
        let tokenizer: [Encoding]
        let pixel_values: Pixels
        let requests: [Request]
        let chat: [Answer]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let directory = fixtures.appendingPathComponent("gemma3-gguf")
    static let languageModel = directory.appendingPathComponent("lm-q8_0.gguf")
    static let mmproj = directory.appendingPathComponent("mmproj-f32.gguf")
    static let pipeline = Result { try ImageTextToTextPipeline(gguf: languageModel, mmproj: mmproj) }

    static func load() throws -> (Expected, [[JSONValue]]) {
        let data = try Data(contentsOf: directory.appendingPathComponent("expected.json"))
        return (try JSONDecoder().decode(Expected.self, from: data), try Gemma3PipelineTests.conversations(data))
    }

    static func maxDifference(_ a: [Float], _ b: [Float]) -> Float {
        a.count == b.count ? zip(a, b).map { abs($0 - $1) }.max() ?? 0 : .infinity
    }

    /// The SentencePiece vocabulary as the file stores it, read as transformers' GGUF loader reads Gemma's (checked by
    /// the oracle to give the source tokenizer's ids): markers whole, runs of spaces and newlines, byte fallback.
    @Test func tokenizerGivesTheSourceTokenizersIds() throws {
        let (expected, _) = try Self.load()
        let tokenizer = try Self.pipeline.get().processor.tokenizer
        for encoding in expected.tokenizer {
            #expect(tokenizer.encode(encoding.text).ids == encoding.ids, "\(encoding.text.debugDescription)")
        }
    }

    /// What llama.cpp reads from the files and transformers' GGUF loader does not: the full layers' linear RoPE
    /// scaling, the sliding layers' base, the layer pattern, and the attention scale from the key width.
    @Test func configIsTheSourceCheckpoints() throws {
        let model = try #require(try Self.pipeline.get().model as? Gemma3ForConditionalGeneration)
        let text = model.config.textConfig
        #expect(text.layerTypes == Array(repeating: "sliding_attention", count: 5) + ["full_attention"])
        #expect(text.slidingWindow == 8 && text.headDim == 8 && text.queryPreAttnScalar == 8)
        #expect(text.fullAttentionRope.ropeType == "linear" && text.fullAttentionRope.factor == 8 && text.fullAttentionRope.theta == 1_000_000)
        #expect(text.slidingAttentionRope.ropeType == "default" && text.slidingAttentionRope.theta == 20_000)
        #expect(model.config.mmTokensPerImage == 16 && model.config.visionConfig.hiddenAct == "gelu_pytorch_tanh")
        let pipeline = try Self.pipeline.get()
        let endOfTurn = try #require(pipeline.processor.tokenizer.tokenId("<end_of_turn>"))
        #expect(pipeline.text.config.eosTokenIds == [1, endOfTurn])
    }

    @Test func requestsMatchTransformers() throws {
        let (expected, _) = try Self.load()
        let pipeline = try Self.pipeline.get()
        let model = try #require(pipeline.model as? Gemma3ForConditionalGeneration)
        #expect(model.imageTokenId == expected.image_token_index)
        let chelsea = try pipeline.processor.imageProcessor.preprocess(
            [ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent(expected.pixel_values.image))])
        #expect(chelsea.pixelValues.shape == expected.pixel_values.shape)
        #expect(Self.maxDifference(chelsea.pixelValues.scalars, expected.pixel_values.values) == 0)
        let vocabulary = model.vocabularySize
        for request in expected.requests {
            let images = try pipeline.processor.preprocess(
                request.images.map { try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent($0)) },
                conversationImageCount: request.images.count)
            let ids = try pipeline.processor.promptIds(request.prompt, images: images)
            #expect(ids == request.input_ids, "\(request.prompt)")
            let features = try model.imageFeatures(images)
            for (actual, reference) in zip(features, request.image_features) {
                #expect(Self.maxDifference(actual.scalars, reference.flatMap { $0 }) < 1e-5, "\(request.images)")
            }
            let embeds = try model.inputsEmbeds(inputIds: ids, imageFeatures: features)
            let logits = try model.languageModel.logits(inputsEmbeds: embeds, attentionMask: model.attentionMask(promptIds: ids).map { [$0] },
                                                        positionIds: nil, cache: nil, lastPositionOnly: false).scalars
            for (position, reference) in zip(request.logits_positions, request.logits) {
                let row = Array(logits[(position * vocabulary)..<((position + 1) * vocabulary)])
                #expect(Self.maxDifference(row, reference) < 1e-4, "\(request.images) position \(position)")
            }
            let output = try model.generate(imageEmbeddings: model.imageEmbeddings(pixelValues: images.pixelValues).reshaped([1, -1, model.config.textConfig.hiddenSize]),
                                            inputIds: [ids], attentionMask: nil,
                                            config: Gemma3PipelineTests.greedy(pipeline.text.config, tokens: expected.max_new_tokens),
                                            stoppingCriteria: [], seed: 0, onStep: nil)
            #expect(output.sequences == [request.greedy.ids], "\(request.images)")
            let text = pipeline.processor.tokenizer.decode(output.sequences[0], skipSpecialTokens: true)
            #expect(text.trimmingCharacters(in: .whitespacesAndNewlines) == request.greedy.text)
        }
    }

    /// Conversations through the chat template the language model's file carries, image parts and all.
    @Test func answersConversationsLikeTransformers() throws {
        let (expected, conversations) = try Self.load()
        let pipeline = try Self.pipeline.get()
        for (messages, reference) in zip(conversations, expected.chat) {
            let result = try pipeline.generate(messages: messages, settings: Gemma3PipelineTests.greedy(pipeline.text.config, tokens: expected.chat_tokens))
            #expect(result.promptTokens == reference.input_ids, "\(reference.prompt)")
            #expect(result.ids == reference.ids, "\(reference.prompt)")
            #expect(result.text == reference.text, "\(reference.prompt)")
        }
    }

    @Test func refusesFilesThatAreNotAPair() throws {
        let untyped = Self.directory.appendingPathComponent("mmproj-no-projector-type.gguf")
        #expect { try Gemma3MMProjConfig(GGUFFile(url: untyped)) } throws: { error in
            "\(error)".contains("mmproj-no-projector-type.gguf") && "\(error)".contains("clip.projector_type is missing")
        }
        // Read as LLaVA's, a projector type neither family has is named with the ones that load.
        #expect { try LlavaMMProjConfig(GGUFFile(url: Self.mmproj)) } throws: { error in
            "\(error)".contains("mmproj-f32.gguf") && "\(error)".contains("supported: mlp (LLaVA-1.5, LLaVA-NeXT), gemma3 (Gemma 3)")
        }
        let llava = Self.fixtures.appendingPathComponent("llava-gguf")
        #expect { try Gemma3MMProjConfig(GGUFFile(url: llava.appendingPathComponent("mmproj-f32.gguf"))) } throws: { error in
            "\(error)".contains("clip.projector_type is \"mlp\", not Gemma 3's \"gemma3\"")
        }
        #expect { try ImageTextToTextPipeline(gguf: llava.appendingPathComponent("lm-q8_0.gguf"), mmproj: Self.mmproj) } throws: { error in
            "\(error)".contains("lm-q8_0.gguf") && "\(error)".contains("general.architecture is not \"gemma3\"")
        }
        #expect { try ImageTextToTextPipeline(gguf: Self.languageModel, mmproj: Self.languageModel) } throws: { error in
            "\(error)".contains("not an mmproj file")
        }
    }
}
