import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How far one file's download has come. Sent when a file starts, as bytes arrive, and when it is done (also for a
/// file that was already cached, with `completedBytes == totalBytes`).
public struct HubProgress: Sendable, Equatable {
    /// The repo-relative path of the file.
    public let file: String
    /// Bytes of the file on disk, counting what an earlier, interrupted download left.
    public let completedBytes: Int64
    /// The file's size, when the server announced it.
    public let totalBytes: Int64?
    /// The file is complete and in the cache.
    public let isFinished: Bool

    public init(file: String, completedBytes: Int64, totalBytes: Int64?, isFinished: Bool) {
        self.file = file
        self.completedBytes = completedBytes
        self.totalBytes = totalBytes
        self.isFinished = isFinished
    }
}

/// Receives ``HubProgress`` reports, possibly from several downloads at once.
public typealias HubProgressHandler = @Sendable (HubProgress) -> Void

/// A repository at one commit, as the Hub's model-info API lists it.
public struct RepoInfo: Sendable {
    /// The repo id that was asked for.
    public let id: String
    /// The commit the requested revision points to.
    public let commit: String
    /// Every file of the repository at that commit.
    public let files: [RepoFile]
}

/// One file of a repository.
public struct RepoFile: Sendable, Equatable {
    /// The `/`-separated path in the repository.
    public let path: String
    /// The size in bytes, when listed.
    public let size: Int64?
    /// The sha256 of an LFS file, nil for a file stored in git.
    public let sha256: String?
}

/// Where a file's bytes are and what they must be: the result of `HEAD /{repo}/resolve/{revision}/{path}`.
struct FileMetadata: Sendable {
    let commit: String
    let etag: String
    let size: Int64?
    let downloadURL: URL
}

/// Downloads repositories from the Hub into the cache huggingface_hub uses.
public struct HubClient: Sendable {
    public let options: HubOptions
    private let transport: HTTPTransport
    private static let maximumRedirects = 10
    /// The model-info JSON of a repo with thousands of files is a few megabytes.
    private static let maximumAPIResponse = 64 << 20

    public init(options: HubOptions) {
        self.options = options
        transport = HTTPTransport(timeout: options.requestTimeout)
    }

    /// The cache this client downloads into.
    public var cache: HubCache { HubCache(directory: options.cacheDirectory) }

    /// Downloads the selected files of `repo` (those not cached yet) and returns its snapshot directory,
    /// `<cache>/models--org--name/snapshots/<commit>`, which loads like a local checkpoint directory.
    ///
    /// Offline, returns the cached snapshot or throws ``HubError/notCached(repo:revision:cacheDirectory:)``. When the
    /// Hub cannot be reached or refuses access and the revision is cached, the cached snapshot is returned, as
    /// huggingface_hub does.
    public func snapshot(
        _ repo: RepoReference, files selection: FileSelection = .modelFiles, progress: HubProgressHandler? = nil
    ) async throws -> URL {
        if options.offline { return try cachedSnapshot(repo) }
        let info: RepoInfo
        do {
            info = try await repoInfo(repo)
        } catch let error as HubError {
            if case .revisionNotFound = error { throw error }
            if let cached = cache.snapshotDirectory(for: repo) {
                try cache.checkInside(snapshot: cached)
                return cached
            }
            throw error
        }
        try cache.writeRef(repo: repo, commit: info.commit)
        let names = info.files.map(\.path)
        for name in names where !CachePaths.isSafeRelativePath(name) {
            throw HubError.unsafeName(repo: repo.id, name: name, reason: "not a relative path inside the repository")
        }
        var shards: [String]?
        let indexes = selection.indexFiles(in: names)
        for index in indexes {
            let url = try await fetchFile(repo: repo, commit: info.commit, path: index, progress: progress)
            shards = try Self.shardNames(indexFile: url, repo: repo.id, index: index)
        }
        for shard in shards ?? [] where !names.contains(shard) {
            throw HubError.missingShard(repo: repo.id, index: FileSelection.shardIndexName, shard: shard)
        }
        let remaining = selection.select(from: names, shards: shards).filter { !indexes.contains($0) }
        let snapshot = cache.snapshotDirectory(repoID: repo.id, commit: info.commit)
        try createDirectory(snapshot)
        try await withThrowingTaskGroup(of: Void.self) { group in
            var pending = remaining[...]
            for _ in 0..<max(1, options.maxConcurrentDownloads) {
                guard let path = pending.popFirst() else { break }
                group.addTask { _ = try await fetchFile(repo: repo, commit: info.commit, path: path, progress: progress) }
            }
            while try await group.next() != nil {
                guard let path = pending.popFirst() else { continue }
                group.addTask { _ = try await fetchFile(repo: repo, commit: info.commit, path: path, progress: progress) }
            }
        }
        // The files fetched are this client's own links; anything else found there is checked too.
        try cache.checkInside(snapshot: snapshot)
        return snapshot
    }

    /// Downloads one file of `repo` (unless cached) and returns its path in the snapshot directory.
    public func file(_ path: String, of repo: RepoReference, progress: HubProgressHandler? = nil) async throws -> URL {
        guard CachePaths.isSafeRelativePath(path) else {
            throw HubError.unsafeName(repo: repo.id, name: path, reason: "not a relative path inside the repository")
        }
        if options.offline {
            let pointer = try cachedSnapshot(repo).appendingPathComponent(path)
            guard FileManager.default.fileExists(atPath: pointer.path) else {
                throw HubError.notCached(repo: repo.id, revision: repo.revision, cacheDirectory: cache.directory.path)
            }
            return pointer
        }
        if CachePaths.isCommitHash(repo.revision) {
            return try await fetchFile(repo: repo, commit: repo.revision, path: path, progress: progress)
        }
        let metadata = try await fileMetadata(repo: repo, revision: repo.revision, path: path)
        try cache.writeRef(repo: repo, commit: metadata.commit)
        return try await fetchFile(repo: repo, commit: metadata.commit, path: path, metadata: metadata,
                                   progress: progress)
    }

    /// The commit a revision points to and the files it has: `GET /api/models/{repo}/revision/{revision}?blobs=true`.
    public func repoInfo(_ repo: RepoReference) async throws -> RepoInfo {
        let url = try makeURL("api/models/\(repo.id)/revision/\(Self.percentEncode(repo.revision, keepSlash: false))",
                              query: "blobs=true")
        let response = try await followingRedirects(method: "GET", url: url, bodyLimit: Self.maximumAPIResponse) { _ in
            false
        }
        guard (200..<300).contains(response.status) else {
            throw Self.error(for: response, repo: repo.id, revision: repo.revision, file: nil,
                             tokenSent: options.token != nil)
        }
        guard let object = try? JSONSerialization.jsonObject(with: response.body) as? [String: Any] else {
            throw HubError.invalidResponse(url: response.url.absoluteString, reason: "the body is not a JSON object")
        }
        guard let commit = object["sha"] as? String, CachePaths.isCommitHash(commit) else {
            throw HubError.invalidResponse(url: response.url.absoluteString, reason: "no commit hash in 'sha'")
        }
        guard let siblings = object["siblings"] as? [[String: Any]] else {
            throw HubError.invalidResponse(url: response.url.absoluteString, reason: "no 'siblings' file list")
        }
        let files = try siblings.map { sibling -> RepoFile in
            guard let path = sibling["rfilename"] as? String else {
                throw HubError.invalidResponse(url: response.url.absoluteString, reason: "a sibling has no 'rfilename'")
            }
            let lfs = sibling["lfs"] as? [String: Any]
            return RepoFile(path: path, size: (sibling["size"] as? NSNumber)?.int64Value,
                            sha256: lfs?["sha256"] as? String)
        }
        return RepoInfo(id: repo.id, commit: commit, files: files)
    }

    private func cachedSnapshot(_ repo: RepoReference) throws -> URL {
        guard let snapshot = cache.snapshotDirectory(for: repo) else {
            throw HubError.notCached(repo: repo.id, revision: repo.revision, cacheDirectory: cache.directory.path)
        }
        try cache.checkInside(snapshot: snapshot)
        return snapshot
    }

    // MARK: One file

    /// Makes `snapshots/<commit>/<path>` exist: from the cache when possible, else downloading the blob under its
    /// lock, then linking it.
    private func fetchFile(repo: RepoReference, commit: String, path: String, metadata known: FileMetadata? = nil,
                           progress: HubProgressHandler?) async throws -> URL {
        let pointer = cache.snapshotDirectory(repoID: repo.id, commit: commit).appendingPathComponent(path)
        if let size = Self.regularFileSize(pointer.path) {
            try cache.checkInside(pointer)
            progress?(HubProgress(file: path, completedBytes: size, totalBytes: size, isFinished: true))
            return pointer
        }
        let metadata: FileMetadata
        if let known {
            metadata = known
        } else {
            metadata = try await fileMetadata(repo: repo, revision: commit, path: path)
        }
        guard CachePaths.isSafeBlobName(metadata.etag) else {
            throw HubError.unsafeName(repo: repo.id, name: metadata.etag, reason: "an etag that is not a plain file name")
        }
        let blob = cache.blobURL(repoID: repo.id, etag: metadata.etag)
        let lock = try await FileLock.acquire(cache.lockURL(repoID: repo.id, etag: metadata.etag),
                                              timeout: options.lockTimeout)
        defer { withExtendedLifetime(lock) {} }
        if let size = Self.regularFileSize(blob.path), metadata.size == nil || metadata.size == size {
            progress?(HubProgress(file: path, completedBytes: size, totalBytes: size, isFinished: true))
        } else {
            try createDirectory(blob.deletingLastPathComponent())
            try await downloadBlob(metadata, to: blob, path: path, progress: progress)
        }
        return try cache.linkSnapshotFile(repoID: repo.id, commit: commit, path: path, etag: metadata.etag)
    }

    /// `HEAD /{repo}/resolve/{revision}/{path}`, following the redirects that carry no file metadata (a renamed
    /// repo) and stopping at the one that does (an LFS file redirected to its CDN), like huggingface_hub.
    func fileMetadata(repo: RepoReference, revision: String, path: String) async throws -> FileMetadata {
        let url = try makeURL("\(repo.id)/resolve/\(Self.percentEncode(revision, keepSlash: false))/"
            + Self.percentEncode(path, keepSlash: true))
        let response = try await followingRedirects(method: "HEAD", url: url, bodyLimit: 0) { redirect in
            redirect.header("X-Repo-Commit") != nil
                && (redirect.header("X-Linked-Etag") ?? redirect.header("ETag")) != nil
        }
        if (300..<400).contains(response.status) || (200..<300).contains(response.status) {
            let where_ = response.url.absoluteString
            guard let commit = response.header("X-Repo-Commit") else {
                throw HubError.invalidResponse(url: where_, reason: "no X-Repo-Commit header")
            }
            guard CachePaths.isCommitHash(commit) else {
                throw HubError.unsafeName(repo: repo.id, name: commit, reason: "X-Repo-Commit is not a commit hash")
            }
            guard let rawETag = response.header("X-Linked-Etag") ?? response.header("ETag") else {
                throw HubError.invalidResponse(url: where_, reason: "no ETag header")
            }
            let isRedirect = (300..<400).contains(response.status)
            let sizeHeader = response.header("X-Linked-Size") ?? (isRedirect ? nil : response.header("Content-Length"))
            var downloadURL = response.url
            if isRedirect, let location = response.header("Location") {
                guard let target = URL(string: location, relativeTo: response.url)?.absoluteURL else {
                    throw HubError.invalidResponse(url: where_, reason: "unusable Location '\(location)'")
                }
                downloadURL = target
            }
            return FileMetadata(commit: commit, etag: CachePaths.normalizeETag(rawETag),
                                size: sizeHeader.flatMap { Int64($0) }, downloadURL: downloadURL)
        }
        throw Self.error(for: response, repo: repo.id, revision: revision, file: path, tokenSent: options.token != nil)
    }

    /// Sends the request, following redirects on which `isFinal` is false, retrying transient failures.
    private func followingRedirects(method: String, url: URL, bodyLimit: Int,
                                    isFinal: @Sendable (HTTPResponse) -> Bool) async throws -> HTTPResponse {
        var url = url
        for _ in 0..<Self.maximumRedirects {
            var request = makeRequest(url)
            request.httpMethod = method
            let response = try await withRetries(url: url.absoluteString) {
                let response = try await transport.send(request, bodyLimit: bodyLimit)
                if Self.isTransient(status: response.status) {
                    throw HubError.httpStatus(url: url.absoluteString, status: response.status,
                                              serverMessage: response.header("X-Error-Message"))
                }
                return response
            }
            guard (300..<400).contains(response.status), let location = response.header("Location"),
                  !isFinal(response) else { return response }
            guard let target = URL(string: location, relativeTo: url)?.absoluteURL else {
                throw HubError.invalidResponse(url: url.absoluteString, reason: "unusable Location '\(location)'")
            }
            url = target
        }
        throw HubError.tooManyRedirects(url: url.absoluteString)
    }

    /// Downloads to `<blob>.incomplete` (resuming what is there), checks size and, for LFS files, sha256, then renames
    /// it to `blob`. A checksum mismatch discards the file and downloads it once more before giving up.
    private func downloadBlob(_ metadata: FileMetadata, to blob: URL, path: String,
                              progress: HubProgressHandler?) async throws {
        let incomplete = URL(fileURLWithPath: blob.path + ".incomplete")
        var refetched = false
        while true {
            let size = try await transfer(metadata, to: incomplete, path: path, progress: progress)
            if let expected = metadata.size, size != expected {
                throw HubError.sizeMismatch(file: path, expected: expected, actual: size)
            }
            if CachePaths.isSHA256(metadata.etag) {
                let digest = try SHA256.hexDigest(ofFile: incomplete)
                if digest != metadata.etag {
                    unlink(incomplete.path)
                    if refetched { throw HubError.checksumMismatch(file: path, expected: metadata.etag, actual: digest) }
                    refetched = true
                    continue
                }
            }
            guard rename(incomplete.path, blob.path) == 0 else { throw posixError(blob.path) }
            progress?(HubProgress(file: path, completedBytes: size, totalBytes: size, isFinished: true))
            return
        }
    }

    /// Fills `incomplete` with the file, with Range requests from where it stops; returns its final size.
    private func transfer(_ metadata: FileMetadata, to incomplete: URL, path: String,
                          progress: HubProgressHandler?) async throws -> Int64 {
        var failures = 0
        while true {
            let sink = try BlobSink(url: incomplete, expectedSize: metadata.size)
            let start = sink.position
            if let expected = metadata.size, start == expected { return start }
            var request = makeRequest(metadata.downloadURL)
            if start > 0 { request.setValue("bytes=\(start)-", forHTTPHeaderField: "Range") }
            progress?(HubProgress(file: path, completedBytes: start, totalBytes: metadata.size, isFinished: false))
            let url = metadata.downloadURL.absoluteString
            let repoForErrors = metadata.downloadURL.host ?? url
            do {
                _ = try await transport.stream(request, onResponse: { response in
                    switch response.status {
                    case 206:
                        guard Self.contentRangeStart(response.header("Content-Range")) == start else {
                            try sink.restart()
                            throw TransferAborted(error: .network(url: url, reason: "unexpected Content-Range"))
                        }
                    case 200:
                        if start > 0 { try sink.restart() }  // the server ignored Range: start over
                    case 416:
                        try sink.restart()
                        throw TransferAborted(error: .network(url: url, reason: "range not satisfiable"))
                    default:
                        throw TransferAborted(error: Self.error(
                            for: response, repo: repoForErrors, revision: metadata.commit, file: path,
                            tokenSent: options.token != nil))
                    }
                }, onData: { data in
                    let done = try sink.write(data)
                    progress?(HubProgress(file: path, completedBytes: done, totalBytes: metadata.size,
                                          isFinished: false))
                })
                let size = sink.position
                sink.close()
                if let expected = metadata.size, size < expected {
                    throw HubError.network(url: url, reason: "connection closed after \(size) of \(expected) bytes")
                }
                return size
            } catch let error as HubError where Self.isTransient(error) {
                let advanced = sink.position > start
                sink.close()
                failures = advanced ? 1 : failures + 1
                guard failures <= options.maxRetries else { throw error }
                try await Task.sleep(for: backoff(failures))
            } catch {
                sink.close()
                throw error
            }
        }
    }

    // MARK: Requests and errors

    private func makeURL(_ path: String, query: String? = nil) throws -> URL {
        var string = options.endpoint.absoluteString
        while string.hasSuffix("/") { string.removeLast() }
        string += "/" + path + (query.map { "?" + $0 } ?? "")
        guard let url = URL(string: string) else {
            throw HubError.invalidResponse(url: string, reason: "not a valid URL")
        }
        return url
    }

    /// The token goes only to the Hub's own host, never to a CDN a redirect points at.
    private func makeRequest(_ url: URL) -> URLRequest {
        var request = URLRequest(url: url)
        request.setValue("identity", forHTTPHeaderField: "Accept-Encoding")
        request.setValue("swiftvlm; hf_hub-compatible", forHTTPHeaderField: "User-Agent")
        if let token = options.token, url.host == options.endpoint.host, url.port == options.endpoint.port {
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        }
        return request
    }

    private func withRetries<T: Sendable>(url: String, _ body: () async throws -> T) async throws -> T {
        var failures = 0
        while true {
            do {
                return try await body()
            } catch let error as HubError where Self.isTransient(error) {
                failures += 1
                guard failures <= options.maxRetries else { throw error }
                try await Task.sleep(for: backoff(failures))
            }
        }
    }

    private func backoff(_ failures: Int) -> Duration {
        min(options.retryBaseDelay * (1 << min(failures - 1, 16)), .seconds(30))
    }

    static func isTransient(status: Int) -> Bool {
        [408, 429, 500, 502, 503, 504].contains(status)
    }

    static func isTransient(_ error: HubError) -> Bool {
        switch error {
        case .network: return true
        case let .httpStatus(_, status, _): return isTransient(status: status)
        default: return false
        }
    }

    /// The Hub says what went wrong in `X-Error-Code` (`GatedRepo`, `RepoNotFound`, `RevisionNotFound`,
    /// `EntryNotFound`) and `X-Error-Message`.
    static func error(for response: HTTPResponse, repo: String, revision: String, file: String?,
                      tokenSent: Bool) -> HubError {
        let code = response.header("X-Error-Code")
        let message = response.header("X-Error-Message") ?? Self.errorText(response.body)
        let url = response.url.absoluteString
        switch (response.status, code) {
        case (_, "GatedRepo"), (401, nil), (403, _):
            return .accessDenied(repo: repo, url: url, status: response.status, serverMessage: message,
                                 tokenSent: tokenSent)
        case (_, "RepoNotFound"):
            return .repositoryNotFound(repo: repo, url: url, tokenSent: tokenSent)
        case (_, "RevisionNotFound"):
            return .revisionNotFound(repo: repo, revision: revision)
        case (_, "EntryNotFound"):
            return .fileNotFound(repo: repo, revision: revision, file: file ?? "?")
        case (404, _):
            if let file { return .fileNotFound(repo: repo, revision: revision, file: file) }
            return .repositoryNotFound(repo: repo, url: url, tokenSent: tokenSent)
        default:
            return .httpStatus(url: url, status: response.status, serverMessage: message)
        }
    }

    /// The `error` field of a JSON error body, or a short plain-text body.
    private static func errorText(_ body: Data) -> String? {
        if let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any],
           let error = object["error"] as? String { return error }
        let text = String(decoding: body.prefix(200), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return text.isEmpty ? nil : text
    }

    static func contentRangeStart(_ header: String?) -> Int64? {
        guard let header, header.hasPrefix("bytes ") else { return nil }
        return Int64(header.dropFirst(6).prefix { $0 != "-" })
    }

    static func percentEncode(_ string: String, keepSlash: Bool) -> String {
        var allowed = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")
        if keepSlash { allowed.insert("/") }
        return string.addingPercentEncoding(withAllowedCharacters: allowed) ?? string
    }

    static func regularFileSize(_ path: String) -> Int64? {
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { return nil }
        return Int64(info.st_size)
    }

    /// The weight shards a `model.safetensors.index.json` names in its `weight_map`.
    static func shardNames(indexFile: URL, repo: String, index: String) throws -> [String] {
        guard let size = regularFileSize(indexFile.path), size <= 64 << 20,
              let data = FileManager.default.contents(atPath: indexFile.path),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
              let weightMap = object["weight_map"] as? [String: String] else {
            throw HubError.invalidResponse(url: indexFile.path, reason: "\(index) has no 'weight_map' object")
        }
        let shards = Array(Set(weightMap.values)).sorted()
        for shard in shards where !CachePaths.isSafeRelativePath(shard) {
            throw HubError.unsafeName(repo: repo, name: shard, reason: "a shard outside the repository")
        }
        return shards
    }
}

/// The `.incomplete` file a download appends to. Opened without following symlinks, so a planted link cannot
/// redirect the write.
private final class BlobSink: @unchecked Sendable {
    private let lock = NSLock()
    private let url: URL
    private var descriptor: Int32
    private var offset: Int64

    init(url: URL, expectedSize: Int64?) throws {
        self.url = url
        descriptor = open(url.path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else { throw posixError(url.path) }
        let end = lseek(descriptor, 0, SEEK_END)
        guard end >= 0 else {
            posixClose(descriptor)
            throw posixError(url.path)
        }
        offset = Int64(end)
        if let expectedSize, offset > expectedSize { try restart() }
    }

    var position: Int64 { lock.withLock { offset } }

    /// Drops what is there: the server sends the whole file again.
    func restart() throws {
        try lock.withLock {
            guard ftruncate(descriptor, 0) == 0, lseek(descriptor, 0, SEEK_SET) == 0 else {
                throw TransferAborted(error: posixError(url.path))
            }
            offset = 0
        }
    }

    func write(_ data: Data) throws -> Int64 {
        try lock.withLock {
            try data.withUnsafeBytes { bytes in
                var written = 0
                while written < bytes.count {
                    let result = posixWrite(descriptor, bytes.baseAddress! + written, bytes.count - written)
                    if result < 0 {
                        if errno == EINTR { continue }
                        throw TransferAborted(error: posixError(url.path))
                    }
                    written += result
                }
            }
            offset += Int64(data.count)
            return offset
        }
    }

    func close() {
        lock.withLock {
            if descriptor >= 0 {
                posixClose(descriptor)
                descriptor = -1
            }
        }
    }

    deinit { close() }
}

// Free functions, because inside BlobSink the names `write` and `close` are its own methods.
private func posixWrite(_ descriptor: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int {
    write(descriptor, buffer, count)
}

private func posixClose(_ descriptor: Int32) {
    close(descriptor)
}
