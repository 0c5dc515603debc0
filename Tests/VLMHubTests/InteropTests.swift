import Foundation
import Testing
import VLMCheckpoint
@testable import VLMHub

/// The cache is shared with Python: SwiftVLM reads what huggingface_hub wrote, and writes what it reads
/// (oracle/hub_cache.py check-swift-cache checks the second direction by hand).
@Suite struct InteropTests {
    @Test func loadsTheCacheHuggingFaceHubWroteOffline() async throws {
        let manifest = try Manifest.load()
        // Port 9 (discard) is never contacted: offline means no network at all.
        let options = HubOptions(endpoint: URL(string: "http://127.0.0.1:9")!, cacheDirectory: pythonCache, offline: true)
        for spec in ["tiny-org/tiny-clip", "tiny-org/tiny-clip@main", "tiny-org/tiny-clip@\(manifest.commit)"] {
            let snapshot = try await resolveModel(spec, options: options)
            #expect(snapshot.lastPathComponent == manifest.commit, "\(spec)")
        }
        let snapshot = try await resolveModel("tiny-org/tiny-clip", options: options)
        // Every file of a snapshot is a symlink into blobs/.
        #expect(try ModelDirectory(url: snapshot).modelType == "clip")
        let weights = try WeightStore(directory: snapshot)
        let index = try #require(try JSONSerialization.jsonObject(
            with: Data(contentsOf: snapshot.appendingPathComponent("model.safetensors.index.json"))) as? [String: Any])
        let names = try #require(index["weight_map"] as? [String: String]).keys.sorted()
        #expect(weights.names.sorted() == names)
        let tensor = try weights.tensor(try #require(names.first))
        #expect(tensor.scalars.count == tensor.shape.reduce(1, *))
        let shard = try SafetensorsFile(url: snapshot.appendingPathComponent("model-00001-of-00004.safetensors"))
        let name = try #require(shard.tensorNames.first)
        let shardTensor = try shard.tensor(name)
        #expect(shardTensor.scalars.count == shardTensor.shape.reduce(1, *) && shardTensor.scalars.count > 0)
    }

    @Test func listsThePythonCache() throws {
        let manifest = try Manifest.load()
        let repos = try HubCache(directory: pythonCache).repositories()
        #expect(repos.map(\.id) == ["tiny-org/tiny-clip"])
        let repo = try #require(repos.first)
        #expect(repo.sizeOnDisk == Int64(manifest.files.reduce(0) { $0 + $1.size }))
        #expect(repo.revisions.map(\.commit) == [manifest.commit])
        #expect(repo.revisions.first?.refs == ["main"])
        #expect(repo.revisions.first?.files == manifest.files.map(\.path).sorted())
    }

    @Test func reusesWhatPythonDownloaded() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        try FileManager.default.removeItem(at: cache)
        try FileManager.default.copyItem(at: pythonCache, to: cache)
        _ = try await HubClient(options: testOptions(hub, cache: cache)).snapshot(try RepoReference(id: "tiny-org/tiny-clip"))
        #expect(hub.server.log.map(\.path) == ["/api/models/tiny-org/tiny-clip/revision/main"])
    }

    /// Writes into $VLMHUB_EXPORT_CACHE when set, for `oracle/hub_cache.py check-swift-cache`.
    @Test func writesACacheHuggingFaceHubCanRead() async throws {
        let hub = try FakeHub()
        let export = ProcessInfo.processInfo.environment["VLMHUB_EXPORT_CACHE"].map { URL(fileURLWithPath: $0) }
        let cache = try export ?? temporaryDirectory()
        defer { if export == nil { try? FileManager.default.removeItem(at: cache) } }
        _ = try await HubClient(options: testOptions(hub, cache: cache)).snapshot(try RepoReference(id: "tiny-org/tiny-clip"))
        try expectPythonLayout(cache: cache, repoID: "tiny-org/tiny-clip", manifest: hub.manifest,
                               files: modelFiles(hub.manifest))
        let lock = cache.appendingPathComponent(".locks/models--tiny-org--tiny-clip/\(modelFiles(hub.manifest)[0].etag).lock")
        #expect(FileManager.default.fileExists(atPath: lock.path))
    }

    @Test func removesARepo() async throws {
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        try FileManager.default.removeItem(at: cache)
        try FileManager.default.copyItem(at: pythonCache, to: cache)
        let hubCache = HubCache(directory: cache)
        let size = try hubCache.remove(repoID: "tiny-org/tiny-clip")
        #expect(size == Int64(try Manifest.load().files.reduce(0) { $0 + $1.size }))
        #expect(try hubCache.repositories().isEmpty)
        #expect(throws: HubError.self) { try hubCache.remove(repoID: "tiny-org/tiny-clip") }
    }
}
