import Foundation
import Testing
import VLMCheckpoint
import VLMImages
import VLMModels
import VLMPipelines
import VLMTemplates
import VLMTensor

/// LLaVA-1.5 from llama.cpp's GGUF pair (oracle/llava_gguf.py: the mmproj from llava_surgery_v2.py and
/// convert_image_encoder_to_gguf.py, the language model from convert_hf_to_gguf.py at q8_0) against what transformers
/// computes from the safetensors checkpoint they were made from (its ffn_down rounded through q8_0, as the file holds
/// it), on real photos.
@Suite struct LlavaGGUFPipelineTests {
    struct Expected: Decodable {
        struct Request: Decodable {
            let image: String
            let prompt: String
            let input_ids: [Int]
            let last_top_ids: [Int]
            let last_top_logits: [Float]
            let greedy_ids: [Int]
            let greedy_text: String
            let pixel_values: [[[[Float]]]]?
            let image_features: [[Float]]?
        }
        struct Chat: Decodable {
            let image: String
            let question: String
            let input_ids: [Int]
            let greedy_ids: [Int]
            let greedy_text: String
        }
        struct NextRequest: Decodable {
            let image: String
            let prompt: String
            let input_ids: [Int]
            let image_sizes: [Int]
            let last_top_ids: [Int]
            let last_top_logits: [Float]
            let greedy_ids: [Int]
            let image_features: [[Float]]?
        }
        let max_new_tokens: Int
        let image_token_index: Int
        let requests: [Request]
        let chat: Chat
        let next: [NextRequest]
    }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let directory = fixtures.appendingPathComponent("llava-gguf")
    static let languageModel = directory.appendingPathComponent("lm-q8_0.gguf")
    static let mmproj = directory.appendingPathComponent("mmproj-f32.gguf")

    static func expected() throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("expected.json")))
    }

    static func maxDifference(_ a: [Float], _ b: [Float]) -> Float {
        zip(a, b).map { abs($0 - $1) }.max() ?? .infinity
    }

    @Test func pairAnswersLikeTransformers() throws {
        let expected = try Self.expected()
        let pipeline = try ImageTextToTextPipeline(gguf: Self.languageModel, mmproj: Self.mmproj)
        let model = try #require(pipeline.model as? LlavaForConditionalGeneration)
        #expect(model.imageTokenId == expected.image_token_index)
        #expect(model.config.visionFeatureLayers == [2] && model.config.visionConfig.numHiddenLayers == 2)
        for request in expected.requests {
            let image = try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent("photos/\(request.image)"))
            let processed = try pipeline.processor.preprocess([image], conversationImageCount: 1)
            let ids = try pipeline.processor.promptIds(request.prompt, images: processed)
            #expect(ids == request.input_ids, "\(request.prompt)")
            if let pixels = request.pixel_values {
                #expect(Self.maxDifference(processed.pixelValues.scalars, pixels.flatMap { $0.flatMap { $0.flatMap { $0 } } }) < 1e-5)
            }
            let embeddings = try model.imageEmbeddings(pixelValues: processed.pixelValues)
            if let features = request.image_features {
                #expect(embeddings.shape == [1, features.count, 4])
                #expect(Self.maxDifference(embeddings.scalars, features.flatMap { $0 }) < 1e-5)
            }
            let logits = try model.logits(pixelValues: processed.pixelValues, inputIds: [ids])
            let vocabulary = logits.shape[2], last = Array(logits.scalars.suffix(vocabulary))
            let difference = Self.maxDifference(request.last_top_ids.map { last[$0] }, request.last_top_logits)
            #expect(difference < 1e-4, "\(request.image): last-position logits differ by \(difference)")
            var settings = pipeline.text.config
            settings.maxNewTokens = expected.max_new_tokens
            settings.doSample = false
            let output = try model.generate(imageEmbeddings: embeddings, inputIds: [ids], config: settings)
            #expect(output.sequences[0] == request.greedy_ids, "\(request.image)")
        }
    }

    /// LLaVA-NeXT from an mmproj made by llama.cpp's LLaVA-1.6 recipe (pinpoints and image_newline in it) beside the
    /// same language model file: tiles, unpadding and newlines as transformers' LlavaNextForConditionalGeneration.
    @Test func nextPairAnswersLikeTransformers() throws {
        let expected = try Self.expected()
        let pipeline = try ImageTextToTextPipeline(gguf: Self.languageModel, mmproj: Self.directory.appendingPathComponent("mmproj-next-f32.gguf"))
        let model = try #require(pipeline.model as? LlavaNextForConditionalGeneration)
        for request in expected.next {
            let image = try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent("photos/\(request.image)"))
            let processed = try pipeline.processor.preprocess([image], conversationImageCount: 1)
            #expect(processed.imageSizes.map { [$0.height, $0.width] } == [request.image_sizes])
            let ids = try pipeline.processor.promptIds(request.prompt, images: processed)
            #expect(ids == request.input_ids, "\(request.image)")
            let features = try model.imageFeatures(processed)
            if let reference = request.image_features {
                #expect(features[0].shape == [reference.count, 4])
                #expect(Self.maxDifference(features[0].scalars, reference.flatMap { $0 }) < 1e-5)
            }
            let logits = try model.logits(images: processed, inputIds: [ids])
            let last = Array(logits.scalars.suffix(logits.shape[2]))
            let difference = Self.maxDifference(request.last_top_ids.map { last[$0] }, request.last_top_logits)
            #expect(difference < 1e-4, "\(request.image): last-position logits differ by \(difference)")
            var settings = pipeline.text.config
            settings.maxNewTokens = expected.max_new_tokens
            settings.doSample = false
            let output = try model.generate(imageEmbeddings: model.imageEmbeddings(processed), inputIds: [ids], config: settings)
            #expect(output.sequences[0] == request.greedy_ids, "\(request.image)")
        }
    }

    /// A user turn of an image and a question reaches the language model's own template as llama.cpp lays it out
    /// (the image's marker, then the text), tokenized and answered as transformers does with that rendering.
    @Test func chatsThroughTheTemplateFromTheLanguageModel() throws {
        let expected = try Self.expected().chat
        let pipeline = try ImageTextToTextPipeline(gguf: Self.languageModel, mmproj: Self.mmproj)
        var settings = pipeline.text.config
        settings.maxNewTokens = try Self.expected().max_new_tokens
        settings.doSample = false
        let photo = Self.fixtures.appendingPathComponent("photos/\(expected.image)").path
        let messages: [JSONValue] = [["role": "user", "content": [["type": "image", "path": .string(photo)],
                                                                  ["type": "text", "text": .string(expected.question)]]]]
        #expect(try pipeline.prompt(messages: messages).ids == expected.input_ids)
        let result = try pipeline.generate(messages: messages, settings: settings)
        #expect(result.ids == expected.greedy_ids)
        #expect(result.text == expected.greedy_text)
    }

    @Test func refusesFilesThatAreNotAPair() throws {
        let qwen2 = Self.fixtures.appendingPathComponent("llama/qwen2-tiny.gguf")
        #expect { try ImageTextToTextPipeline(gguf: qwen2, mmproj: Self.mmproj) } throws: { error in
            "\(error)".contains("mmproj-f32.gguf") && "\(error)".contains("width 4 is not the hidden size 64")
        }
        #expect { try ImageTextToTextPipeline(gguf: Self.languageModel, mmproj: Self.languageModel) } throws: { error in
            "\(error)".contains("not an mmproj file") && "\(error)".contains("\"llama\"")
        }
        #expect { try ImageTextToTextPipeline(gguf: Self.languageModel, mmproj: Self.directory.appendingPathComponent("mmproj-no-image-size.gguf")) } throws: { error in
            "\(error)".contains("mmproj-no-image-size.gguf") && "\(error)".contains("clip.vision.image_size is missing")
        }
        #expect { try LlavaMMProjConfig(GGUFFile(url: Self.fixtures.appendingPathComponent("gguf/aligned64.gguf"))) } throws: { error in
            "\(error)".contains("aligned64.gguf") && "\(error)".contains("not an mmproj file")
        }
    }
}
