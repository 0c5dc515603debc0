import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels

@Suite struct ModelRegistryTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    func directory(_ path: String) throws -> ModelDirectory {
        try ModelDirectory(url: Self.fixtures.appendingPathComponent(path))
    }

    @Test func familiesComeFromTheModelType() throws {
        #expect(try ModelRegistry.family(of: directory("clip/tiny-quickgelu-argmax")).name == "CLIP")
        #expect(try ModelRegistry.family(of: directory("decoders/qwen2")).name == "Llama")
        #expect(try ModelRegistry.family(of: directory("decoders/gpt2")).tasks == [.generate, .chat])
        #expect(try ModelRegistry.dualEncoder(directory("clip/tiny-quickgelu-argmax"), for: .classify) is CLIPModel)
        #expect(try ModelRegistry.family(of: directory("siglip/tiny-tanh-fp16")).name == "SigLIP")
        #expect(try ModelRegistry.dualEncoder(directory("siglip/tiny-tanh-fp16"), for: .embed) is SiglipModel)
        #expect(try ModelRegistry.family(of: directory("clipseg/tiny-fp16")).tasks == [.segment, .classify, .embed, .match])
        // transformers' zero-shot pipeline reads a CLIPSeg checkpoint as CLIPSegModel: its CLIP.
        #expect(try ModelRegistry.dualEncoder(directory("clipseg/tiny-fp16"), for: .classify) is CLIPModel)
        #expect(try ModelRegistry.zeroShotSegmentationModel(directory("clipseg/tiny-refined-bf16")) is CLIPSegForImageSegmentation)
        #expect(throws: ModelError.self) { try ModelRegistry.zeroShotSegmentationModel(directory("clip/tiny-quickgelu-argmax")) }
    }

    /// BLIP's heads share model_type "blip": `architectures[0]` decides.
    @Test func architecturesTellFamiliesOfOneModelTypeApart() throws {
        #expect(try ModelRegistry.family(of: directory("image-to-text/blip-captioning")).tasks == [.caption])
        #expect(try ModelRegistry.family(of: directory("image-to-text/blip-vqa")).tasks == [.ask])
        #expect(try ModelRegistry.family(of: directory("image-to-text/blip-retrieval")).tasks == [.match])
        #expect(try ModelRegistry.family(of: directory("image-to-text/blip2-retrieval")).name == "BLIP-2 retrieval")
        #expect(try ModelRegistry.family(of: directory("image-to-text/blip2-opt")).tasks == [.caption, .ask, .chat])
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("registry-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: temporary, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: temporary) }
        try Data(#"{"model_type": "blip", "architectures": ["BlipModel"]}"#.utf8).write(to: temporary.appendingPathComponent("config.json"))
        let error = try #require(throws: ModelError.self) { try ModelRegistry.family(of: ModelDirectory(url: temporary)) }
        #expect(error.description.contains("\"BlipModel\"") && error.description.contains("BlipForQuestionAnswering"))
    }

    @Test func everyModelTypeHasOneFamilyPerArchitecture() {
        // Two families may share a model type only when both name the architectures they take.
        var seen: [String: [ModelFamily]] = [:]
        for family in ModelRegistry.families {
            for type in family.modelTypes { seen[type, default: []].append(family) }
        }
        for (type, families) in seen where families.count > 1 {
            #expect(families.allSatisfy { $0.architectures != nil }, "model_type \(type)")
        }
    }

    @Test func aTaskTheFamilyDoesNotServeNamesItsCommands() throws {
        let error = try #require(throws: ModelError.self) {
            try ModelRegistry.family(of: directory("decoders/opt-pre"), for: .classify)
        }
        #expect(error.description.hasSuffix("it runs with vlm generate, vlm chat"))
        let unknown = try #require(throws: ModelError.self) {
            try ModelRegistry.family(of: directory("decoders/opt-pre"), for: .detect)
        }
        #expect(unknown.description.contains("cannot run `vlm detect`"))
    }
}
