import Foundation
import Testing
import VLMCheckpoint

/// The fields of transformers' CLIPVisionConfig the tests look at, with transformers' defaults.
struct VisionConfig: Decodable, Equatable {
    var hiddenSize = 768
    var intermediateSize = 3072
    var numHiddenLayers = 12
    var numAttentionHeads = 12
    var imageSize = 224
    var patchSize = 32
    var hiddenAct = "quick_gelu"
    var layerNormEps: Float = 1e-5

    enum CodingKeys: String, CodingKey {
        case hiddenSize = "hidden_size", intermediateSize = "intermediate_size"
        case numHiddenLayers = "num_hidden_layers", numAttentionHeads = "num_attention_heads"
        case imageSize = "image_size", patchSize = "patch_size", hiddenAct = "hidden_act"
        case layerNormEps = "layer_norm_eps"
    }

    init() {}

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = VisionConfig()
        hiddenSize = try container.value(.hiddenSize, default: defaults.hiddenSize)
        intermediateSize = try container.value(.intermediateSize, default: defaults.intermediateSize)
        numHiddenLayers = try container.value(.numHiddenLayers, default: defaults.numHiddenLayers)
        numAttentionHeads = try container.value(.numAttentionHeads, default: defaults.numAttentionHeads)
        imageSize = try container.value(.imageSize, default: defaults.imageSize)
        patchSize = try container.value(.patchSize, default: defaults.patchSize)
        hiddenAct = try container.value(.hiddenAct, default: defaults.hiddenAct)
        layerNormEps = try container.value(.layerNormEps, default: defaults.layerNormEps)
    }
}

struct ClipConfig: Decodable {
    let projectionDim: Int
    let visionConfig: VisionConfig

    enum CodingKeys: String, CodingKey {
        case projectionDim = "projection_dim", visionConfig = "vision_config"
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        projectionDim = try container.value(.projectionDim, default: 512)
        visionConfig = try container.value(.visionConfig, default: VisionConfig())
    }
}

@Suite struct ModelDirectoryTests {
    let single = fixtures.appendingPathComponent("single")

    @Test func decodesConfigSavedByTransformers() throws {
        let directory = try ModelDirectory(url: single)
        let config = try directory.decode(ClipConfig.self)
        let saved = try #require(try directory.jsonObject("config.json"))
        let vision = try #require(saved["vision_config"] as? [String: Any])
        #expect(config.projectionDim == saved["projection_dim"] as? Int)
        #expect(config.visionConfig.hiddenSize == vision["hidden_size"] as? Int)
        #expect(config.visionConfig.imageSize == vision["image_size"] as? Int)
        #expect(config.visionConfig.hiddenAct == vision["hidden_act"] as? String)
        #expect(try directory.modelType == "clip")
    }

    /// Absent keys take the defaults transformers fills in (the oracle asked CLIPVisionConfig for them).
    @Test func absentKeysTakeTransformersDefaults() throws {
        let directory = try ModelDirectory(url: single)
        let decoded = try directory.decode(VisionConfig.self, from: "vision_config_sparse.json")
        let filled = try JSONDecoder().decode(
            VisionConfig.self, from: Data(contentsOf: single.appendingPathComponent("vision_config_filled.json")))
        let filledObject = try #require(try directory.jsonObject("vision_config_filled.json"))
        #expect(filledObject.count == 8, "every field comes from the oracle, none from the defaults")
        #expect(decoded == filled)
    }

    @Test func nullMeansAbsentAndWrongTypesThrow() throws {
        let json = #"{"hidden_size": null, "patch_size": 14}"#
        let config = try JSONDecoder().decode(VisionConfig.self, from: Data(json.utf8))
        #expect(config.hiddenSize == VisionConfig().hiddenSize)
        #expect(config.patchSize == 14)
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(VisionConfig.self, from: Data(#"{"patch_size": "14"}"#.utf8))
        }
    }

    @Test func wrongTypeNamesFileAndKeyPathOnOneLine() throws {
        let directory = try ModelDirectory(url: fixtures.appendingPathComponent("bad_dirs/bad_config"))
        let error = try #require(throws: CheckpointError.self) { try directory.decode(ClipConfig.self) }
        guard case let .invalidConfig(file, keyPath, _) = error else {
            Issue.record("wrong case: \(error)")
            return
        }
        #expect(file.hasSuffix("bad_config/config.json"))
        #expect(keyPath == "vision_config.hidden_size")
        #expect(error.description.contains("bad_config/config.json"))
        #expect(error.description.contains("vision_config.hidden_size"))
        #expect(!error.description.contains("\n"))
    }

    @Test func missingRequiredKeyIsNamed() throws {
        struct NeedsVocab: Decodable {
            let vocabSize: Int
            enum CodingKeys: String, CodingKey { case vocabSize = "vocab_size" }
        }
        let directory = try ModelDirectory(url: single)
        let error = try #require(throws: CheckpointError.self) { try directory.decode(NeedsVocab.self) }
        #expect(caseName(error) == "invalidConfig")
        #expect(error.description.contains("'vocab_size'") && error.description.contains("missing"), "\(error)")
    }

    @Test func missingModelTypeIsNamed() throws {
        let directory = try ModelDirectory(url: fixtures.appendingPathComponent("bad_dirs/bad_config"))
        let error = try #require(throws: CheckpointError.self) { try directory.modelType }
        #expect(caseName(error) == "invalidConfig")
        #expect(error.description.contains("bad_config/config.json") && error.description.contains("model_type"))
    }

    @Test func malformedJSONIsAJSONError() throws {
        let directory = try ModelDirectory(url: fixtures.appendingPathComponent("bad_dirs/bad_config"))
        for attempt in [{ _ = try directory.jsonObject("broken.json") }, { _ = try directory.decode(ClipConfig.self, from: "broken.json") }] {
            let error = try #require(throws: CheckpointError.self) { try attempt() }
            #expect(caseName(error) == "invalidJSON")
            #expect(error.description.contains("bad_config/broken.json"))
            #expect(!error.description.contains("\n"))
        }
    }

    @Test func filesThatAreAbsent() throws {
        let directory = try ModelDirectory(url: single)
        #expect(directory.fileURL("config.json") == single.appendingPathComponent("config.json"))
        #expect(directory.fileURL("tokenizer.json") == nil)
        #expect(try directory.jsonObject("tokenizer.json") == nil)
        let error = try #require(throws: CheckpointError.self) { try directory.decode(ClipConfig.self, from: "preprocessor_config.json") }
        #expect(caseName(error) == "missingFile")
        #expect(error.description.contains("single/preprocessor_config.json"))
    }

    @Test func refusesWhatIsNotACheckpointDirectory() throws {
        let cases: [(URL, String, String)] = [
            (fixtures.appendingPathComponent("nowhere"), "missingFile", "nowhere"),
            (single.appendingPathComponent("config.json"), "notADirectory", "single/config.json"),
            (fixtures.appendingPathComponent("bad"), "missingFile", "bad/config.json"),
        ]
        for (url, expectedCase, detail) in cases {
            let error = try #require(throws: CheckpointError.self) { try ModelDirectory(url: url) }
            #expect(caseName(error) == expectedCase, "\(error)")
            #expect(error.description.contains(detail), "\(error)")
        }
    }
}
