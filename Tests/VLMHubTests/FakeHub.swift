import Foundation

/// The package's Tests/Fixtures/hub, found from this file's path.
let hubFixtures: URL = {
    var url = URL(fileURLWithPath: #filePath)
    while url.path != "/" {
        url.deleteLastPathComponent()
        if FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) { break }
    }
    return url.appendingPathComponent("Tests/Fixtures/hub")
}()

/// The cache huggingface_hub wrote (oracle/hub_cache.py).
let pythonCache = hubFixtures.appendingPathComponent("python-cache")

/// One file of the oracle's repo manifest (repo.json).
struct ManifestFile: Decodable, Sendable {
    let path: String
    let size: Int
    let blob_id: String
    let sha256: String?

    /// The Hub's etag: the sha256 for LFS files, the git blob id otherwise; also the blob's name in the cache.
    var etag: String { sha256 ?? blob_id }
}

struct Manifest: Decodable, Sendable {
    let repo_id: String
    let commit: String
    let files: [ManifestFile]

    static func load() throws -> Manifest {
        try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: hubFixtures.appendingPathComponent("repo.json")))
    }

    /// The bytes of a file, read from the blob huggingface_hub stored.
    func contents(of file: ManifestFile) throws -> Data {
        try Data(contentsOf: pythonCache.appendingPathComponent(
            "models--\(repo_id.replacingOccurrences(of: "/", with: "--"))/blobs/\(file.etag)"))
    }
}

/// Serves the oracle's repo in the Hub's URL layout, with the faults the tests need. The same repo is published
/// under several ids: its own, a gated one, an old name that redirects to it, and one whose listing names a file
/// outside the repository.
final class FakeHub: @unchecked Sendable {
    static let gatedID = "tiny-org/gated-clip"
    static let renamedID = "old-org/tiny-clip"
    static let evilID = "tiny-org/evil-clip"
    static let token = "hf_testtoken"

    let manifest: Manifest
    private let contents: [String: Data]
    private let lock = NSLock()
    /// Files whose next GET closes the connection halfway.
    private var dropNext: Set<String> = []
    /// Files served with a flipped byte, and how many more times.
    private var corruptCount: [String: Int] = [:]
    private(set) var server: TestHTTPServer!

    init() throws {
        manifest = try Manifest.load()
        var contents: [String: Data] = [:]
        for file in manifest.files { contents[file.path] = try manifest.contents(of: file) }
        self.contents = contents
        server = try TestHTTPServer { [weak self] in self?.respond($0) ?? ServedResponse(status: 503) }
    }

    deinit { server.stop() }

    var endpoint: URL { server.endpoint }

    func dropConnectionOnce(_ path: String) { lock.withLock { _ = dropNext.insert(path) } }
    func corrupt(_ path: String, times: Int) { lock.withLock { corruptCount[path] = times } }

    /// GET requests that fetched file bytes (the resolve endpoint for git files, the CDN path for LFS files).
    func contentRequests(for path: String) -> [ServedRequest] {
        guard let file = manifest.files.first(where: { $0.path == path }) else { return [] }
        return server.log.filter {
            $0.method == "GET" && ($0.path == "/cdn-lfs/\(file.etag)" || $0.path.hasSuffix("/resolve/\(manifest.commit)/\(path)"))
        }
    }

    private func respond(_ request: ServedRequest) -> ServedResponse {
        let path = request.path
        if path.hasPrefix("/cdn-lfs/") {
            let sha = String(path.dropFirst("/cdn-lfs/".count))
            guard let file = manifest.files.first(where: { $0.sha256 == sha }) else { return ServedResponse(status: 404) }
            return fileBody(file, request: request)
        }
        for (prefix, isAPI) in [("/api/models/", true), ("/", false)] where path.hasPrefix(prefix) {
            let rest = path.dropFirst(prefix.count).split(separator: "/", maxSplits: 2).map(String.init)
            guard rest.count >= 2 else { continue }
            let id = rest[0] + "/" + rest[1]
            let tail = rest.count > 2 ? rest[2] : ""
            if id == Self.renamedID {
                // The Hub answers an old repo name with a relative redirect to the new one.
                let query = request.query.isEmpty ? "" : "?" + request.query
                return ServedResponse(status: 307, headers: [("Location", "\(prefix)\(manifest.repo_id)/\(tail)\(query)")])
            }
            guard [manifest.repo_id, Self.gatedID, Self.evilID].contains(id) else {
                return ServedResponse(status: 401, headers: [("X-Error-Code", "RepoNotFound"),
                                                             ("X-Error-Message", "Repository not found")])
            }
            if id == Self.gatedID, request.headers["authorization"] != "Bearer \(Self.token)" {
                let status = request.headers["authorization"] == nil ? 401 : 403
                return ServedResponse(status: status, headers: [
                    ("X-Error-Code", "GatedRepo"),
                    ("X-Error-Message", "Access to model \(id) is restricted. You must have access to it and be authenticated to access it. Please log in."),
                ])
            }
            return isAPI ? modelInfo(id: id, tail: tail) : resolve(tail: tail, request: request)
        }
        return ServedResponse(status: 404)
    }

    private func modelInfo(id: String, tail: String) -> ServedResponse {
        guard tail == "revision/main" || tail == "revision/\(manifest.commit)" else {
            return ServedResponse(status: 404, headers: [("X-Error-Code", "RevisionNotFound")])
        }
        var siblings: [[String: Any]] = manifest.files.map { file in
            var sibling: [String: Any] = ["rfilename": file.path, "size": file.size, "blobId": file.blob_id]
            if let sha = file.sha256 { sibling["lfs"] = ["sha256": sha, "size": file.size, "pointerSize": 134] }
            return sibling
        }
        if id == Self.evilID { siblings.append(["rfilename": "../../../escaped.json", "size": 2]) }
        let body = try! JSONSerialization.data(withJSONObject: ["id": id, "sha": manifest.commit, "siblings": siblings])
        return ServedResponse(status: 200, headers: [("Content-Type", "application/json")], body: body)
    }

    private func resolve(tail: String, request: ServedRequest) -> ServedResponse {
        let parts = tail.split(separator: "/", maxSplits: 2).map(String.init)
        guard parts.count == 3, parts[0] == "resolve" else { return ServedResponse(status: 404) }
        guard parts[1] == "main" || parts[1] == manifest.commit else {
            return ServedResponse(status: 404, headers: [("X-Error-Code", "RevisionNotFound")])
        }
        guard let file = manifest.files.first(where: { $0.path == parts[2] }) else {
            return ServedResponse(status: 404, headers: [("X-Error-Code", "EntryNotFound"),
                                                         ("X-Repo-Commit", manifest.commit)])
        }
        if let sha = file.sha256 {
            return ServedResponse(status: 302, headers: [
                ("Location", "/cdn-lfs/\(sha)"), ("X-Repo-Commit", manifest.commit),
                ("X-Linked-Etag", "\"\(sha)\""), ("X-Linked-Size", "\(file.size)"), ("ETag", "\"\(file.blob_id)\""),
            ])
        }
        var response = fileBody(file, request: request)
        response.headers += [("ETag", "W/\"\(file.blob_id)\""), ("X-Repo-Commit", manifest.commit)]
        return response
    }

    /// The file's bytes, honouring `Range: bytes=N-`, with the injected faults.
    private func fileBody(_ file: ManifestFile, request: ServedRequest) -> ServedResponse {
        var data = contents[file.path]!
        let (drop, corrupt): (Bool, Bool) = lock.withLock {
            guard request.method == "GET" else { return (false, false) }
            let drop = dropNext.remove(file.path) != nil
            let corrupt = (corruptCount[file.path] ?? 0) > 0
            if corrupt { corruptCount[file.path]! -= 1 }
            return (drop, corrupt)
        }
        if corrupt { data[data.count / 2] ^= 0xFF }
        var response = ServedResponse(status: 200, headers: [("Accept-Ranges", "bytes")], body: data)
        if let range = request.headers["range"], range.hasPrefix("bytes="), range.hasSuffix("-"),
           let start = Int(range.dropFirst(6).dropLast()) {
            guard start < data.count else { return ServedResponse(status: 416) }
            response.status = 206
            response.headers.append(("Content-Range", "bytes \(start)-\(data.count - 1)/\(data.count)"))
            response.body = data.subdata(in: start..<data.count)
        }
        if drop { response.dropAfter = response.body.count / 2 }
        return response
    }
}
