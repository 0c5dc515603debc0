import Foundation
import Testing
@testable import VLMHub

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

func temporaryDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("vlmhub-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

func testOptions(_ hub: FakeHub, cache: URL, token: String? = nil) -> HubOptions {
    var options = HubOptions(endpoint: hub.endpoint, cacheDirectory: cache, token: token)
    options.retryBaseDelay = .milliseconds(20)
    options.maxRetries = 3
    options.requestTimeout = 10
    return options
}

/// Records progress reports from concurrent downloads.
final class ProgressLog: @unchecked Sendable {
    private let lock = NSLock()
    private var reports: [HubProgress] = []
    func record(_ progress: HubProgress) { lock.withLock { reports.append(progress) } }
    var all: [HubProgress] { lock.withLock { reports } }
}

/// What SwiftVLM needs of the oracle's repo: everything but the README.
func modelFiles(_ manifest: Manifest) -> [ManifestFile] {
    manifest.files.filter { $0.path != "README.md" }
}

/// Checks the huggingface_hub layout: refs/main, one relative symlink per file into blobs/<etag>, right bytes.
func expectPythonLayout(cache: URL, repoID: String, manifest: Manifest, files: [ManifestFile]) throws {
    let repo = cache.appendingPathComponent("models--" + repoID.replacingOccurrences(of: "/", with: "--"))
    #expect(try String(contentsOf: repo.appendingPathComponent("refs/main"), encoding: .utf8) == manifest.commit)
    let snapshot = repo.appendingPathComponent("snapshots/\(manifest.commit)")
    let listed = try FileManager.default.contentsOfDirectory(atPath: snapshot.path).sorted()
    #expect(listed == files.map(\.path).sorted())
    for file in files {
        let pointer = snapshot.appendingPathComponent(file.path)
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: pointer.path) == "../../blobs/\(file.etag)")
        #expect(try Data(contentsOf: pointer) == manifest.contents(of: file), "\(file.path)")
    }
    let leftovers = try FileManager.default.contentsOfDirectory(atPath: repo.appendingPathComponent("blobs").path)
        .filter { $0.hasSuffix(".incomplete") }
    #expect(leftovers.isEmpty)
}

@Suite struct DownloadTests {
    @Test func downloadsWhatAModelNeedsInPythonsLayout() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let log = ProgressLog()
        let client = HubClient(options: testOptions(hub, cache: cache))
        let repo = try RepoReference(parsing: hub.manifest.repo_id)
        let snapshot = try await client.snapshot(repo, progress: log.record)
        #expect(snapshot.lastPathComponent == hub.manifest.commit)
        try expectPythonLayout(cache: cache, repoID: repo.id, manifest: hub.manifest, files: modelFiles(hub.manifest))
        #expect(hub.contentRequests(for: "README.md").isEmpty)

        let finished = log.all.filter(\.isFinished)
        #expect(Set(finished.map(\.file)) == Set(modelFiles(hub.manifest).map(\.path)))
        for file in modelFiles(hub.manifest) {
            #expect(finished.contains { $0.file == file.path && $0.completedBytes == Int64(file.size) })
        }

        // A second call finds everything in the cache and fetches no file again.
        let requestsBefore = hub.server.log.count
        #expect(try await client.snapshot(repo) == snapshot)
        #expect(hub.server.log.dropFirst(requestsBefore).map(\.path) == ["/api/models/\(repo.id)/revision/main"])
    }

    @Test func includePatternsSelectFiles() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let client = HubClient(options: testOptions(hub, cache: cache))
        let repo = try RepoReference(id: hub.manifest.repo_id)
        let snapshot = try await client.snapshot(repo, files: .matching(include: ["*.md", "config.json"]))
        #expect(try FileManager.default.contentsOfDirectory(atPath: snapshot.path).sorted() == ["README.md", "config.json"])
        let all = try await client.snapshot(repo, files: .all)
        #expect(try FileManager.default.contentsOfDirectory(atPath: all.path).count == hub.manifest.files.count)
    }

    @Test func resumesAfterADroppedConnection() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let shard = try #require(hub.manifest.files.first { $0.path == "model-00001-of-00004.safetensors" })
        hub.dropConnectionOnce(shard.path)
        hub.dropConnectionOnce("vocab.json")
        let client = HubClient(options: testOptions(hub, cache: cache))
        _ = try await client.snapshot(try RepoReference(id: hub.manifest.repo_id))
        try expectPythonLayout(cache: cache, repoID: hub.manifest.repo_id, manifest: hub.manifest,
                               files: modelFiles(hub.manifest))
        for path in [shard.path, "vocab.json"] {
            let requests = hub.contentRequests(for: path)
            #expect(requests.count == 2, "\(path)")
            #expect(requests.first?.headers["range"] == nil)
            // The retry asks only for what is missing: the first attempt got half the file.
            let size = try #require(hub.manifest.files.first { $0.path == path }?.size)
            #expect(requests.last?.headers["range"] == "bytes=\(size / 2)-", "\(path)")
        }
    }

    @Test func resumesAnIncompleteFileLeftByAnEarlierRun() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let shard = try #require(hub.manifest.files.first { $0.path == "model-00002-of-00004.safetensors" })
        let blobs = cache.appendingPathComponent("models--tiny-org--tiny-clip/blobs")
        try FileManager.default.createDirectory(at: blobs, withIntermediateDirectories: true)
        try hub.manifest.contents(of: shard).prefix(1000)
            .write(to: blobs.appendingPathComponent("\(shard.etag).incomplete"))
        let client = HubClient(options: testOptions(hub, cache: cache))
        let url = try await client.file(shard.path, of: try RepoReference(id: hub.manifest.repo_id))
        #expect(try Data(contentsOf: url) == hub.manifest.contents(of: shard))
        #expect(hub.contentRequests(for: shard.path).map { $0.headers["range"] } == ["bytes=1000-"])
    }

    @Test func refetchesACorruptDownload() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let shard = "model-00003-of-00004.safetensors"
        hub.corrupt(shard, times: 1)
        let client = HubClient(options: testOptions(hub, cache: cache))
        _ = try await client.snapshot(try RepoReference(id: hub.manifest.repo_id))
        try expectPythonLayout(cache: cache, repoID: hub.manifest.repo_id, manifest: hub.manifest,
                               files: modelFiles(hub.manifest))
        #expect(hub.contentRequests(for: shard).count == 2)
    }

    @Test func refusesAFileThatStaysCorrupt() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let shard = try #require(hub.manifest.files.first { $0.path == "model-00004-of-00004.safetensors" })
        hub.corrupt(shard.path, times: 100)
        let client = HubClient(options: testOptions(hub, cache: cache))
        let error = await #expect(throws: HubError.self) {
            _ = try await client.file(shard.path, of: try RepoReference(id: hub.manifest.repo_id))
        }
        guard case let .checksumMismatch(file, expected, _) = error else {
            Issue.record("expected a checksum mismatch, got \(String(describing: error))")
            return
        }
        #expect(file == shard.path && expected == shard.sha256)
        let repo = cache.appendingPathComponent("models--tiny-org--tiny-clip")
        #expect(try FileManager.default.contentsOfDirectory(atPath: repo.appendingPathComponent("blobs").path).isEmpty)
        #expect(!FileManager.default.fileExists(
            atPath: repo.appendingPathComponent("snapshots/\(hub.manifest.commit)/\(shard.path)").path))
    }

    @Test func gatedRepoNeedsAToken() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let repo = try RepoReference(id: FakeHub.gatedID)
        for (token, status) in [(nil, 401), ("hf_wrong", 403)] as [(String?, Int)] {
            let error = await #expect(throws: HubError.self) {
                _ = try await HubClient(options: testOptions(hub, cache: cache, token: token)).snapshot(repo)
            }
            guard case let .accessDenied(_, _, actual, message, tokenSent) = error else {
                Issue.record("expected access denied, got \(String(describing: error))")
                continue
            }
            #expect(actual == status && tokenSent == (token != nil))
            #expect(message?.contains("restricted") == true)
            #expect(error.map { "\($0)" }?.contains(token == nil ? "set HF_TOKEN" : "HF_TOKEN") == true)
        }
        let snapshot = try await HubClient(options: testOptions(hub, cache: cache, token: FakeHub.token)).snapshot(repo)
        #expect(FileManager.default.fileExists(atPath: snapshot.appendingPathComponent("config.json").path))
    }

    @Test func followsARenamedRepo() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let client = HubClient(options: testOptions(hub, cache: cache))
        _ = try await client.snapshot(try RepoReference(id: FakeHub.renamedID))
        // Like huggingface_hub, the cache folder is named after the id that was asked for.
        try expectPythonLayout(cache: cache, repoID: FakeHub.renamedID, manifest: hub.manifest,
                               files: modelFiles(hub.manifest))
        #expect(hub.server.log.contains { $0.status307Source(FakeHub.renamedID) })
    }

    @Test func refusesFileNamesThatLeaveTheCache() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let client = HubClient(options: testOptions(hub, cache: cache))
        let error = await #expect(throws: HubError.self) {
            _ = try await client.snapshot(try RepoReference(id: FakeHub.evilID), files: .all)
        }
        guard case let .unsafeName(_, name, _) = error else {
            Issue.record("expected an unsafe name error, got \(String(describing: error))")
            return
        }
        #expect(name == "../../../escaped.json")
        #expect(!FileManager.default.fileExists(atPath: cache.appendingPathComponent("escaped.json").path))
        #expect(!FileManager.default.fileExists(atPath: cache.deletingLastPathComponent()
            .appendingPathComponent("escaped.json").path))
    }

    @Test func missingRepoRevisionAndFileHaveClearErrors() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let client = HubClient(options: testOptions(hub, cache: cache))
        let missingRepo = await #expect(throws: HubError.self) {
            _ = try await client.snapshot(try RepoReference(id: "nobody/nothing"))
        }
        #expect(missingRepo.map { "\($0)" }?.contains("repository not found") == true)
        #expect(missingRepo.map { "\($0)" }?.contains("HF_TOKEN") == true)
        let missingRevision = await #expect(throws: HubError.self) {
            _ = try await client.snapshot(try RepoReference(id: hub.manifest.repo_id, revision: "v9"))
        }
        #expect(missingRevision.map { "\($0)" } == "tiny-org/tiny-clip: revision 'v9' not found")
        let missingFile = await #expect(throws: HubError.self) {
            _ = try await client.file("nope.json", of: try RepoReference(id: hub.manifest.repo_id))
        }
        #expect(missingFile.map { "\($0)" } == "tiny-org/tiny-clip@main: no file 'nope.json'")
    }

    @Test func concurrentDownloadsOfTheSameRepoShareTheWork() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let repo = try RepoReference(id: hub.manifest.repo_id)
        // Two clients stand for two processes: each takes the flock on its own descriptor.
        async let first = HubClient(options: testOptions(hub, cache: cache)).snapshot(repo)
        async let second = HubClient(options: testOptions(hub, cache: cache)).snapshot(repo)
        #expect(try await first == second)
        try expectPythonLayout(cache: cache, repoID: repo.id, manifest: hub.manifest, files: modelFiles(hub.manifest))
        for file in modelFiles(hub.manifest) {
            #expect(hub.contentRequests(for: file.path).count == 1, "\(file.path)")
        }
    }

    @Test func waitsForTheLockAnotherProcessHolds() async throws {
        let hub = try FakeHub()
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let shard = try #require(hub.manifest.files.first { $0.sha256 != nil })
        let lockFile = cache.appendingPathComponent(".locks/models--tiny-org--tiny-clip/\(shard.etag).lock")
        try FileManager.default.createDirectory(at: lockFile.deletingLastPathComponent(),
                                                withIntermediateDirectories: true)
        let descriptor = open(lockFile.path, O_RDWR | O_CREAT, 0o664)
        defer { close(descriptor) }
        #expect(flock(descriptor, LOCK_EX) == 0)
        var options = testOptions(hub, cache: cache)
        options.lockTimeout = 0.3
        let error = await #expect(throws: HubError.self) {
            _ = try await HubClient(options: options).file(shard.path, of: try RepoReference(id: hub.manifest.repo_id))
        }
        guard case .lockTimeout = error else {
            Issue.record("expected a lock timeout, got \(String(describing: error))")
            return
        }
        #expect(hub.contentRequests(for: shard.path).isEmpty)
    }

    /// A cached snapshot holding a link that leads outside the cache (to a file, or the snapshot folder itself linked
    /// elsewhere) is refused with a line naming it, offline and online, before the model reads anything there.
    @Test func refusesCacheEntriesLeadingOutsideTheCache() async throws {
        let cache = try temporaryDirectory(), outside = try temporaryDirectory()
        defer { for url in [cache, outside] { try? FileManager.default.removeItem(at: url) } }
        let secret = outside.appendingPathComponent("secret.json")
        try Data("{}".utf8).write(to: secret)
        let commit = String(repeating: "ab", count: 20)
        let repo = cache.appendingPathComponent("models--tiny-org--tiny-clip")
        let snapshot = repo.appendingPathComponent("snapshots/\(commit)")
        try FileManager.default.createDirectory(at: snapshot, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: repo.appendingPathComponent("refs"), withIntermediateDirectories: true)
        try Data(commit.utf8).write(to: repo.appendingPathComponent("refs/main"))
        try Data("{}".utf8).write(to: snapshot.appendingPathComponent("config.json"))
        let offline = HubOptions(endpoint: URL(string: "http://127.0.0.1:9")!, cacheDirectory: cache, offline: true)
        // Inside the cache: loads.
        #expect(try await resolveModel("tiny-org/tiny-clip", options: offline).path == snapshot.path)

        try FileManager.default.createSymbolicLink(atPath: snapshot.appendingPathComponent("tokenizer.json").path,
                                                   withDestinationPath: secret.path)
        for options in [offline, { var online = offline; online.offline = false; online.maxRetries = 0; return online }()] {
            let error = await #expect(throws: HubError.self) { _ = try await resolveModel("tiny-org/tiny-clip", options: options) }
            guard case let .outsideCache(path, target) = error else {
                Issue.record("expected an outside-the-cache error, got \(String(describing: error))")
                continue
            }
            #expect(path.hasSuffix("snapshots/\(commit)/tokenizer.json") && target.hasSuffix("secret.json"))
        }
        let file = await #expect(throws: HubError.self) {
            _ = try await HubClient(options: offline).file("tokenizer.json", of: try RepoReference(id: "tiny-org/tiny-clip"))
        }
        #expect(file.map { "\($0)" }?.contains("leads outside the Hugging Face cache") == true)

        // The snapshot folder itself linked to a folder outside.
        try FileManager.default.removeItem(at: snapshot)
        try FileManager.default.createSymbolicLink(atPath: snapshot.path, withDestinationPath: outside.path)
        await #expect(throws: HubError.self) { _ = try await resolveModel("tiny-org/tiny-clip", options: offline) }
    }

    @Test func offlineUsesOnlyTheCache() async throws {
        let cache = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: cache) }
        let repo = try RepoReference(id: "tiny-org/tiny-clip")
        let endpoint: URL
        do {
            let hub = try FakeHub()
            endpoint = hub.endpoint
            _ = try await HubClient(options: testOptions(hub, cache: cache)).snapshot(repo)
            hub.server.stop()
        }
        // Offline: nothing is contacted; an uncached repo says so.
        var offline = HubOptions(endpoint: endpoint, cacheDirectory: cache, offline: true)
        let snapshot = try await resolveModel("tiny-org/tiny-clip", options: offline)
        #expect(FileManager.default.fileExists(atPath: snapshot.appendingPathComponent("config.json").path))
        let error = await #expect(throws: HubError.self) {
            _ = try await resolveModel("tiny-org/other", options: offline)
        }
        #expect(error.map { "\($0)" }?.contains("HF_HUB_OFFLINE") == true)
        // Online with the server gone: the cached revision is used after the request fails.
        offline.offline = false
        offline.maxRetries = 0
        #expect(try await resolveModel("tiny-org/tiny-clip", options: offline) == snapshot)
    }
}

extension ServedRequest {
    /// A request under the old name, which the fake Hub answers with a redirect.
    func status307Source(_ oldID: String) -> Bool {
        path.hasPrefix("/api/models/\(oldID)/") || path.hasPrefix("/\(oldID)/resolve/")
    }
}
