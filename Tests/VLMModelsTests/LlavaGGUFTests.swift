import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// LlavaForConditionalGeneration from llama.cpp's GGUF pair of oracle/llava_gguf.py (mmproj by llava_surgery_v2.py and
/// convert_image_encoder_to_gguf.py, the language model by convert_hf_to_gguf.py at q8_0), fed transformers' own pixel
/// values and prompt ids, against transformers' projector output and logits from the source checkpoint.
@Suite struct LlavaGGUFModelTests {
    struct Expected: Decodable {
        struct Request: Decodable {
            let input_ids: [Int]
            let last_top_ids: [Int]
            let last_top_logits: [Float]
            let pixel_values: [[[[Float]]]]?
            let image_features: [[Float]]?
        }
        let image_token_index: Int
        let requests: [Request]
    }

    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/llava-gguf")

    static func pair() throws -> (GGUFFile, GGUFFile) {
        (try GGUFFile(url: directory.appendingPathComponent("lm-q8_0.gguf")),
         try GGUFFile(url: directory.appendingPathComponent("mmproj-f32.gguf")))
    }

    @Test func imageFeaturesAndLogitsMatchTransformers() throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.directory.appendingPathComponent("expected.json")))
        let (languageModel, mmproj) = try Self.pair()
        let model = try LlavaForConditionalGeneration(gguf: languageModel, mmproj: mmproj)
        #expect(model.config.imageTokenIndex == expected.image_token_index)
        let request = expected.requests[0]
        let pixels = try #require(request.pixel_values), features = try #require(request.image_features)
        let pixelValues = Tensor(shape: [1, 3, pixels[0][0].count, pixels[0][0][0].count],
                                 scalars: pixels.flatMap { $0.flatMap { $0.flatMap { $0 } } })
        let embeddings = try model.imageEmbeddings(pixelValues: pixelValues)
        #expect(embeddings.shape == [1, features.count, features[0].count])
        #expect(zip(embeddings.scalars, features.flatMap { $0 }).allSatisfy { abs($0 - $1) < 1e-5 })
        let logits = try model.logits(pixelValues: pixelValues, inputIds: [request.input_ids])
        let last = Array(logits.scalars.suffix(logits.shape[2]))
        #expect(zip(request.last_top_ids.map { last[$0] }, request.last_top_logits).allSatisfy { abs($0 - $1) < 1e-4 })
    }

    /// The mmproj's metadata, as llama.cpp's clip.cpp reads it: quick GELU without `clip.use_gelu`, the feature layer
    /// as a hidden-state index into the layers the converter kept, and CLIP's fc1 under the legacy name ffn_down.
    @Test func mmprojMetadataReadsAsLlamaCppReadsIt() throws {
        let (_, mmproj) = try Self.pair()
        let config = try LlavaMMProjConfig(mmproj)
        #expect(config.visionConfig.hiddenAct == "quick_gelu")
        #expect(config.visionConfig.numHiddenLayers == mmproj.metadata["clip.vision.block_count"]?.integer)
        #expect(config.featureLayers == mmproj.metadata["clip.vision.feature_layer"]?.array?.compactMap(\.integer))
        #expect(config.projectorWidth == mmproj.info("mm.2.weight")?.shape[0])
        #expect(config.imageMean.count == 3 && config.imageStd.count == 3 && config.projectorBias)
    }

    @Test func eachClassRefusesTheOtherKindOfMmproj() throws {
        let (languageModel, mmproj) = try Self.pair()
        let next = try GGUFFile(url: Self.directory.appendingPathComponent("mmproj-next-f32.gguf"))
        #expect(try LlavaMMProjConfig(next).imageGridPinpoints?.count == 5)
        #expect { try LlavaForConditionalGeneration(gguf: languageModel, mmproj: next) } throws: { error in
            "\(error)".contains("mmproj-next-f32.gguf") && "\(error)".contains("LLaVA-NeXT (anyres) mmproj")
        }
        #expect { try LlavaNextForConditionalGeneration(gguf: languageModel, mmproj: mmproj) } throws: { error in
            "\(error)".contains("mmproj-f32.gguf") && "\(error)".contains("image_grid_pinpoints is missing")
        }
    }

    /// Without `clip.vision.feature_layer` the converter has dropped the tower's last layer, so the last layer the
    /// file holds is `hidden_states[-2]` of the source model, which its `vision_feature_layer` -2 reads.
    @Test func anMmprojWithoutFeatureLayersReadsItsLastLayer() throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.directory.appendingPathComponent("expected.json")))
        let (languageModel, _) = try Self.pair()
        let mmproj = try GGUFFile(url: Self.directory.appendingPathComponent("mmproj-no-feature-layer-f32.gguf"))
        #expect(mmproj.metadata["clip.vision.feature_layer"] == nil)
        let model = try LlavaForConditionalGeneration(gguf: languageModel, mmproj: mmproj)
        let request = expected.requests[0]
        let pixels = try #require(request.pixel_values), features = try #require(request.image_features)
        let pixelValues = Tensor(shape: [1, 3, pixels[0][0].count, pixels[0][0][0].count],
                                 scalars: pixels.flatMap { $0.flatMap { $0.flatMap { $0 } } })
        let embeddings = try model.imageEmbeddings(pixelValues: pixelValues)
        #expect(zip(embeddings.scalars, features.flatMap { $0 }).allSatisfy { abs($0 - $1) < 1e-5 })
    }
}
