import Foundation
import Testing
@testable import VLMHub

/// What huggingface_hub and hashlib give on the same inputs (oracle/hub_cache.py writes cases.json).
struct OracleCases: Decodable {
    struct PatternCase: Decodable {
        let include: [String]?
        let exclude: [String]?
        let expected: [String]
    }
    struct SHACase: Decodable {
        let length: Int
        let sha256: String
    }
    struct ETagCase: Decodable {
        let header: String
        let normalized: String
    }
    let listing: [String]
    let patterns: [PatternCase]
    let sha256_of_pattern_bytes: [SHACase]
    let etags: [ETagCase]

    static func load() throws -> OracleCases {
        try JSONDecoder().decode(OracleCases.self, from: Data(contentsOf: hubFixtures.appendingPathComponent("cases.json")))
    }
}

@Suite struct UnitTests {
    @Test func patternsMatchHuggingFaceHub() throws {
        let cases = try OracleCases.load()
        for test in cases.patterns {
            let selection = FileSelection.matching(include: test.include ?? [], exclude: test.exclude ?? [])
            #expect(selection.select(from: cases.listing, shards: nil) == test.expected,
                    "include \(test.include ?? []) exclude \(test.exclude ?? [])")
        }
    }

    @Test func sha256MatchesHashlib() throws {
        for test in try OracleCases.load().sha256_of_pattern_bytes {
            let bytes = (0..<test.length).map { UInt8($0 * 7 % 251) }
            var hasher = SHA256()
            // Uneven chunks cross block boundaries the way network reads do.
            var offset = 0
            var chunk = 1
            while offset < bytes.count {
                let end = min(bytes.count, offset + chunk)
                bytes[offset..<end].withUnsafeBytes { hasher.update($0) }
                offset = end
                chunk = chunk * 3 + 1
            }
            #expect(hasher.finalizeHex() == test.sha256, "length \(test.length)")
        }
        let manifest = try Manifest.load()
        for file in manifest.files where file.sha256 != nil {
            let url = pythonCache.appendingPathComponent("models--tiny-org--tiny-clip/blobs/\(file.etag)")
            #expect(try SHA256.hexDigest(ofFile: url) == file.sha256)
        }
    }

    @Test func etagsAreNormalizedLikeHuggingFaceHub() throws {
        for test in try OracleCases.load().etags {
            #expect(CachePaths.normalizeETag(test.header) == test.normalized)
        }
    }

    @Test func modelFilesSelection() throws {
        let listing = try OracleCases.load().listing
        let single = FileSelection.modelFiles.select(from: listing, shards: nil)
        #expect(single.contains("model.safetensors") && single.contains("config.json"))
        #expect(!single.contains { $0.hasSuffix(".bin") || $0.hasSuffix(".h5") || $0.hasPrefix("onnx/") || $0 == "README.md" })
        #expect(!single.contains("model-00001-of-00002.safetensors"))
        let shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        let sharded = FileSelection.modelFiles.select(from: listing, shards: shards)
        #expect(sharded.filter { $0.hasSuffix(".safetensors") } == shards)
        #expect(FileSelection.modelFiles.indexFiles(in: listing) == ["model.safetensors.index.json"])
    }

    @Test func unsafeNamesAreRecognized() {
        for name in ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\\..\\b", "", "a/b/..", "x\0y"] {
            #expect(!CachePaths.isSafeRelativePath(name), "\(name)")
        }
        for name in ["config.json", "onnx/model.onnx", "a/b/c.txt", "..a", "a.."] {
            #expect(CachePaths.isSafeRelativePath(name), "\(name)")
        }
        #expect(!CachePaths.isSafeBlobName("../etc") && !CachePaths.isSafeBlobName("a/b") && !CachePaths.isSafeBlobName(".."))
        #expect(CachePaths.relativeBlobTarget(path: "onnx/deep/x.json", etag: "e") == "../../../../blobs/e")
    }

    @Test func repoReferences() throws {
        let pinned = try RepoReference(parsing: "openai/clip-vit-base-patch32@refs/pr/1")
        #expect(pinned.id == "openai/clip-vit-base-patch32" && pinned.revision == "refs/pr/1")
        #expect(pinned.folderName == "models--openai--clip-vit-base-patch32")
        #expect(try RepoReference(parsing: "gpt2").revision == "main")
        for bad in ["a/b/c", "a--b/c", "-a/b", "a/b.git", "a/b@", "a/b@../x", "a b/c", "a/b@/abs"] {
            #expect(throws: HubError.self, "\(bad)") { _ = try RepoReference(parsing: bad) }
        }
    }

    @Test func localPathsWinAndMissingPathsSaySo() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let options = HubOptions(endpoint: URL(string: "http://127.0.0.1:9")!, cacheDirectory: directory, offline: true)
        #expect(try await resolveModel(directory.path, options: options).path == directory.standardizedFileURL.path)
        let gguf = directory.appendingPathComponent("model.gguf")
        #expect(FileManager.default.createFile(atPath: gguf.path, contents: Data()))
        #expect(try await resolveModel(gguf.path, options: options).path == gguf.path)
        let missing = await #expect(throws: HubError.self) {
            _ = try await resolveModel("./no/such/model.gguf", options: options)
        }
        #expect(missing.map { "\($0)" } == "./no/such/model.gguf: no such file or directory")
    }

    @Test func environmentLikeHuggingFaceHub() throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data("  hf_fromfile\n".utf8).write(to: directory.appendingPathComponent("token"))
        let fromHome = HubOptions(environment: ["HOME": "/home/u", "HF_HOME": directory.path, "HF_HUB_OFFLINE": "yes"])
        #expect(fromHome.cacheDirectory.path == directory.appendingPathComponent("hub").path)
        #expect(fromHome.token == "hf_fromfile" && fromHome.offline)
        #expect(fromHome.endpoint.absoluteString == "https://huggingface.co")
        let explicit = HubOptions(environment: [
            "HOME": "/home/u", "HF_HOME": directory.path, "HF_HUB_CACHE": "~/c", "HF_TOKEN": "hf_env",
            "HF_ENDPOINT": "http://mirror.local:8080/", "HF_HUB_OFFLINE": "0",
        ])
        #expect(explicit.cacheDirectory.path == "/home/u/c" && explicit.token == "hf_env" && !explicit.offline)
        #expect(explicit.endpoint.absoluteString == "http://mirror.local:8080")
        let defaults = HubOptions(environment: ["HOME": "/home/u"])
        #expect(defaults.cacheDirectory.path == "/home/u/.cache/huggingface/hub" && !defaults.offline)
        #expect(HubOptions(environment: ["HOME": "/home/u", "XDG_CACHE_HOME": "/x"]).cacheDirectory.path == "/x/huggingface/hub")
    }

    @Test func progressLine() {
        #expect(TerminalProgressBar.format(done: 4000, total: 10000, bytesPerSecond: 1000, width: 10)
            == "[####------]  40% 4.0 kB / 10.0 kB  1.0 kB/s  0:06 left")
        #expect(TerminalProgressBar.format(done: 0, total: 0, bytesPerSecond: nil, width: 4) == "[----]   0% 0 B / 0 B")
        #expect(TerminalProgressBar.formatBytes(267_800_000) == "267.8 MB")
        #expect(TerminalProgressBar.formatBytes(999_960) == "1.0 MB")
        #expect(TerminalProgressBar.formatDuration(3725) == "1:02:05")
    }
}
