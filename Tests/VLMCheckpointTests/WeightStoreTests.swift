import Foundation
import Testing
import VLMCheckpoint
import VLMTensor

@Suite struct WeightStoreTests {
    @Test(arguments: ["single", "sharded"])
    func loadsEveryTensorAsTorchDoes(directory: String) throws {
        let store = try WeightStore(directory: fixtures.appendingPathComponent(directory))
        let expected = try expectedTensors("\(directory)/expected.json")
        #expect(store.names == expected.keys.sorted())
        for (name, want) in expected {
            #expect(store.contains(name))
            guard let bits = want.bits else { continue }
            #expect(bitPatterns(try store.tensor(name, shape: want.shape)) == bits, "\(name)")
            #expect(bitPatterns(try store.tensor(name)) == bits, "\(name)")
        }
    }

    /// The sharded fixture also holds model-stray.safetensors, which is not a safetensors file: opening the store
    /// proves that only shards the index names are opened.
    @Test func opensOnlyIndexedShards() throws {
        let store = try WeightStore(directory: fixtures.appendingPathComponent("sharded"))
        #expect(store.info("logit_scale")?.dtype == "F32")
        #expect(store.info("vision_model.pre_layrnorm.weight")?.dtype == "BF16")
    }

    @Test func singleFileWinsOverIndexAsInTransformers() throws {
        let store = try WeightStore(directory: fixtures.appendingPathComponent("both"))
        #expect(store.names == (try expectedTensors("single/expected.json")).keys.sorted())
    }

    @Test func shapeMismatchNamesShardTensorAndBothShapes() throws {
        let store = try WeightStore(directory: fixtures.appendingPathComponent("sharded"))
        let error = try #require(throws: CheckpointError.self) {
            try store.tensor("text_model.final_layer_norm.weight", shape: [3, 2])
        }
        guard case let .shapeMismatch(file, tensor, expected, actual) = error else {
            Issue.record("wrong case: \(error)")
            return
        }
        #expect(file.hasSuffix("sharded/model-00002-of-00002.safetensors"))
        #expect(tensor == "text_model.final_layer_norm.weight" && expected == [3, 2] && actual == [2, 3])
        #expect(error.description.contains("model-00002-of-00002.safetensors"))
    }

    @Test(arguments: [("single", "model.safetensors"), ("sharded", "model.safetensors.index.json")])
    func missingTensorNamesWhereItWasLookedFor(directory: String, file: String) throws {
        let store = try WeightStore(directory: fixtures.appendingPathComponent(directory))
        #expect(!store.contains("vision_model.post_layernorm.bias"))
        let error = try #require(throws: CheckpointError.self) { try store.tensor("vision_model.post_layernorm.bias", shape: [6]) }
        #expect(caseName(error) == "missingTensor")
        #expect(error.description.contains("\(directory)/\(file)"))
        #expect(error.description.contains("vision_model.post_layernorm.bias"))
    }

    @Test(arguments: [
        ("missing_shard", "missingShard", "model-00002-of-00002.safetensors"),
        ("escaping_shard", "unsafeShardName", "../sharded/model-00002-of-00002.safetensors"),
        ("absolute_shard", "unsafeShardName", "/etc/passwd"),
        ("tensor_not_in_shard", "missingTensor", "vision_model.extra.weight"),
        ("index_not_a_map", "invalidIndex", "weight_map"),
        ("index_invalid_json", "invalidJSON", "model.safetensors.index.json"),
        ("no_weights", "noWeights", "no_weights"),
    ])
    func refusesBrokenDirectory(name: String, expectedCase: String, detail: String) throws {
        let error = try #require(throws: CheckpointError.self) {
            try WeightStore(directory: fixtures.appendingPathComponent("bad_dirs/\(name)"))
        }
        #expect(caseName(error) == expectedCase, "\(error)")
        #expect(error.description.contains("bad_dirs/\(name)"), "\(error)")
        #expect(error.description.contains(detail), "\(error)")
    }

    @Test func missingDirectoryIsNamed() throws {
        let error = try #require(throws: CheckpointError.self) {
            try WeightStore(directory: fixtures.appendingPathComponent("no_such_checkpoint"))
        }
        #expect(caseName(error) == "missingFile")
        #expect(error.description.contains("no_such_checkpoint"))
    }
}

@Suite struct WeightsTests {
    let store: WeightStore

    init() throws {
        store = try WeightStore(directory: fixtures.appendingPathComponent("single"))
    }

    @Test func scopesJoinWithDots() throws {
        let layer = Weights(store).scoped("vision_model").scoped("encoder.layers.0")
        #expect(layer.prefix == "vision_model.encoder.layers.0")
        #expect(layer.contains("mlp.fc1.bias"))
        #expect(!layer.contains("fc1.bias"))
        let bias = try layer("mlp.fc1.bias", shape: [12])
        #expect(bitPatterns(bias) == bitPatterns(try store.tensor("vision_model.encoder.layers.0.mlp.fc1.bias")))
        #expect(try layer.scoped("mlp")("fc1.weight").shape == [2, 8])
    }

    @Test func emptyComponentsAddNoDots() throws {
        let root = Weights(store)
        #expect(root.prefix == "")
        #expect(root.scoped("").prefix == "")
        #expect(root.contains("logit_scale"))
        #expect(try root("logit_scale", shape: []).shape == [])
        #expect(root.scoped("text_model").scoped("").prefix == "text_model")
        #expect(root.scoped("text_model").fullName("") == "text_model")
    }

    @Test func errorsCarryTheFullName() throws {
        let error = try #require(throws: CheckpointError.self) {
            try Weights(store).scoped("vision_model.embeddings")("patch_embedding.weight", shape: [4, 3, 4, 4])
        }
        #expect(caseName(error) == "shapeMismatch")
        #expect(error.description.contains("vision_model.embeddings.patch_embedding.weight"))
    }
}
