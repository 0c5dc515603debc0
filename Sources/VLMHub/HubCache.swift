import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Names and checks of huggingface_hub's cache layout:
///
///     <cache>/models--org--name/refs/<branch or tag>          the commit it points to
///     <cache>/models--org--name/blobs/<etag>                   file contents, named by etag
///     <cache>/models--org--name/snapshots/<commit>/<path>      relative symlink to ../../blobs/<etag>
///     <cache>/.locks/models--org--name/<etag>.lock             flock held while the blob is written
enum CachePaths {
    static func folderName(repoID: String) -> String {
        (["models"] + repoID.split(separator: "/").map(String.init)).joined(separator: "--")
    }

    /// A `/`-separated relative path that stays below the directory it is joined to: no empty, `.` or `..` segment,
    /// not absolute, no backslash or NUL (Windows separators and C-string truncation).
    static func isSafeRelativePath(_ path: String) -> Bool {
        guard !path.isEmpty, !path.contains("\\"), !path.contains("\0") else { return false }
        return path.split(separator: "/", omittingEmptySubsequences: false).allSatisfy {
            !$0.isEmpty && $0 != "." && $0 != ".."
        }
    }

    /// A git commit id, which the cache uses as a directory name.
    static func isCommitHash(_ string: String) -> Bool {
        string.utf8.count == 40 && string.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }

    /// An LFS etag is the file's sha256.
    static func isSHA256(_ string: String) -> Bool {
        string.utf8.count == 64 && string.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }

    /// An etag becomes a file name under blobs/: it must be one harmless path component.
    static func isSafeBlobName(_ string: String) -> Bool {
        !string.isEmpty && string.count <= 200 && string != "." && string != ".."
            && string.utf8.allSatisfy { $0.isASCIIAlphanumeric || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: ".") }
    }

    /// huggingface_hub's `_normalize_etag`: `W/"abc"` and `"abc"` both become `abc`.
    static func normalizeETag(_ etag: String) -> String {
        var value = Substring(etag)
        while let first = value.first, first == "W" || first == "/" { value = value.dropFirst() }
        while value.first == "\"" { value = value.dropFirst() }
        while value.last == "\"" { value = value.dropLast() }
        return String(value)
    }

    /// The symlink target from `snapshots/<commit>/<path>` to `blobs/<etag>`.
    static func relativeBlobTarget(path: String, etag: String) -> String {
        let depth = path.split(separator: "/").count
        return String(repeating: "../", count: depth + 1) + "blobs/" + etag
    }
}

extension UInt8 {
    fileprivate var isASCIIAlphanumeric: Bool {
        (48...57).contains(self) || (65...90).contains(self) || (97...122).contains(self)
    }
}

/// The Hub cache on disk, shared with Python (`huggingface_hub`, `transformers`): look-ups that need no network,
/// listing and removal.
public struct HubCache: Sendable {
    /// The cache root holding `models--org--name` folders.
    public let directory: URL

    public init(directory: URL) {
        self.directory = directory
    }

    /// The folder of one repository, whether or not it exists.
    public func repoDirectory(_ repoID: String) -> URL {
        directory.appendingPathComponent(CachePaths.folderName(repoID: repoID))
    }

    /// The commit a revision names in the cache: the revision itself when it is a commit hash, else the content of
    /// `refs/<revision>`; nil when the cache has no such ref.
    public func commit(for repo: RepoReference) -> String? {
        if CachePaths.isCommitHash(repo.revision) { return repo.revision }
        let refFile = repoDirectory(repo.id).appendingPathComponent("refs").appendingPathComponent(repo.revision)
        guard let data = try? Data(contentsOf: refFile), data.count <= 256 else { return nil }
        let commit = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return CachePaths.isCommitHash(commit) ? commit : nil
    }

    /// The snapshot directory of `repo` at its revision, when the cache has it (what Python's
    /// `snapshot_download(repo, revision=..., local_files_only=True)` returns).
    public func snapshotDirectory(for repo: RepoReference) -> URL? {
        guard let commit = commit(for: repo) else { return nil }
        let snapshot = snapshotDirectory(repoID: repo.id, commit: commit)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: snapshot.path, isDirectory: &isDirectory), isDirectory.boolValue
        else { return nil }
        return snapshot
    }

    func snapshotDirectory(repoID: String, commit: String) -> URL {
        repoDirectory(repoID).appendingPathComponent("snapshots").appendingPathComponent(commit)
    }

    func blobURL(repoID: String, etag: String) -> URL {
        repoDirectory(repoID).appendingPathComponent("blobs").appendingPathComponent(etag)
    }

    func lockURL(repoID: String, etag: String) -> URL {
        directory.appendingPathComponent(".locks").appendingPathComponent(CachePaths.folderName(repoID: repoID))
            .appendingPathComponent("\(etag).lock")
    }

    /// Points `refs/<revision>` at `commit`, atomically (a temporary file renamed over it), as huggingface_hub does.
    func writeRef(repo: RepoReference, commit: String) throws {
        guard repo.revision != commit else { return }
        let refFile = repoDirectory(repo.id).appendingPathComponent("refs").appendingPathComponent(repo.revision)
        if let existing = try? String(contentsOf: refFile, encoding: .utf8), existing == commit { return }
        try createDirectory(refFile.deletingLastPathComponent())
        let temporary = refFile.deletingLastPathComponent()
            .appendingPathComponent("\(refFile.lastPathComponent).\(UUID().uuidString.prefix(8)).tmp")
        do {
            try Data(commit.utf8).write(to: temporary)
            guard rename(temporary.path, refFile.path) == 0 else { throw posixError(refFile.path) }
        } catch let error as HubError {
            try? FileManager.default.removeItem(at: temporary)
            throw error
        } catch {
            try? FileManager.default.removeItem(at: temporary)
            throw HubError.fileSystem(path: refFile.path, reason: "\(error)")
        }
    }

    /// Creates `snapshots/<commit>/<path>` as a relative symlink to `blobs/<etag>`. Directories between the snapshot
    /// and the file are created as needed and must be real directories: a symlink there could lead the link out of
    /// the cache.
    func linkSnapshotFile(repoID: String, commit: String, path: String, etag: String) throws -> URL {
        let snapshot = snapshotDirectory(repoID: repoID, commit: commit)
        try createDirectory(snapshot)
        var parent = snapshot
        let components = path.split(separator: "/").map(String.init)
        for component in components.dropLast() {
            parent.appendPathComponent(component)
            var info = stat()
            if lstat(parent.path, &info) == 0 {
                guard info.st_mode & S_IFMT == S_IFDIR else {
                    throw HubError.unsafeName(repo: repoID, name: path, reason: "\(parent.path) is not a real directory")
                }
            } else {
                try createDirectory(parent)
            }
        }
        let pointer = parent.appendingPathComponent(components.last!)
        let target = CachePaths.relativeBlobTarget(path: path, etag: etag)
        if let existing = try? FileManager.default.destinationOfSymbolicLink(atPath: pointer.path), existing == target {
            return pointer
        }
        // A stale pointer (another etag, or a copy) is replaced; the blob it named stays for other snapshots.
        unlink(pointer.path)
        guard symlink(target, pointer.path) == 0 else {
            if errno == EEXIST, (try? FileManager.default.destinationOfSymbolicLink(atPath: pointer.path)) == target {
                return pointer  // a concurrent process made the same link
            }
            throw posixError(pointer.path)
        }
        return pointer
    }

    /// Every model repository in the cache, sorted by id. Dataset and space folders are skipped.
    public func repositories() throws -> [CachedRepository] {
        guard FileManager.default.fileExists(atPath: directory.path) else { return [] }
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        } catch {
            throw HubError.fileSystem(path: directory.path, reason: "cannot list: \(error.localizedDescription)")
        }
        return names.filter { $0.hasPrefix("models--") }.sorted().map { name in
            let id = name.dropFirst("models--".count).replacingOccurrences(of: "--", with: "/")
            return describeRepository(id: id, folder: directory.appendingPathComponent(name))
        }
    }

    private func describeRepository(id: String, folder: URL) -> CachedRepository {
        let fileManager = FileManager.default
        var size: Int64 = 0
        var lastModified = Date.distantPast
        let blobs = folder.appendingPathComponent("blobs")
        for blob in (try? fileManager.contentsOfDirectory(atPath: blobs.path)) ?? [] {
            guard let attributes = try? fileManager.attributesOfItem(atPath: blobs.appendingPathComponent(blob).path)
            else { continue }
            size += (attributes[.size] as? NSNumber)?.int64Value ?? 0
            if let modified = attributes[.modificationDate] as? Date, modified > lastModified { lastModified = modified }
        }
        var refsByCommit: [String: [String]] = [:]
        let refs = folder.appendingPathComponent("refs")
        if let enumerator = fileManager.enumerator(atPath: refs.path) {
            for case let ref as String in enumerator {
                if let reference = try? RepoReference(id: id, revision: ref), let commit = commit(for: reference),
                   !CachePaths.isCommitHash(ref) {
                    refsByCommit[commit, default: []].append(ref)
                }
            }
        }
        let snapshots = folder.appendingPathComponent("snapshots")
        let commits = ((try? fileManager.contentsOfDirectory(atPath: snapshots.path)) ?? []).sorted()
        let revisions = commits.map { commit in
            let files = (fileManager.enumerator(atPath: snapshots.appendingPathComponent(commit).path)?
                .compactMap { $0 as? String } ?? [])
                .filter { !isDirectory(snapshots.appendingPathComponent(commit).appendingPathComponent($0)) }
                .sorted()
            return CachedRevision(commit: commit, refs: (refsByCommit[commit] ?? []).sorted(), files: files)
        }
        return CachedRepository(id: id, directory: folder, sizeOnDisk: size, lastModified: lastModified,
                                revisions: revisions)
    }

    /// Deletes a repository's folder and its lock folder; returns the bytes its blobs took. Removing a repo that is
    /// not cached throws ``HubError/notCached(repo:revision:cacheDirectory:)``.
    @discardableResult
    public func remove(repoID: String) throws -> Int64 {
        let repo = try RepoReference(id: repoID)
        let folder = repoDirectory(repo.id)
        guard FileManager.default.fileExists(atPath: folder.path) else {
            throw HubError.notCached(repo: repo.id, revision: "any", cacheDirectory: directory.path)
        }
        let size = describeRepository(id: repo.id, folder: folder).sizeOnDisk
        do {
            try FileManager.default.removeItem(at: folder)
        } catch {
            throw HubError.fileSystem(path: folder.path, reason: "cannot remove: \(error.localizedDescription)")
        }
        let locks = directory.appendingPathComponent(".locks").appendingPathComponent(repo.folderName)
        try? FileManager.default.removeItem(at: locks)
        return size
    }

    /// Throws unless `url` (with every link on its way resolved) lies inside the cache. A path that does not resolve
    /// (a dangling link, a missing file) cannot be read and passes.
    func checkInside(_ url: URL) throws {
        guard let resolved = Self.realPath(url.path) else { return }
        let root = Self.realPath(directory.path) ?? directory.path
        guard resolved.hasPrefix(root.hasSuffix("/") ? root : root + "/") else {
            throw HubError.outsideCache(path: url.path, target: resolved)
        }
    }

    /// Throws unless the snapshot folder and everything in it lie inside the cache: a model is read from the
    /// snapshot as from any local folder, so a link there could make it read any file on the machine.
    func checkInside(snapshot: URL) throws {
        try checkInside(snapshot)
        guard let entries = FileManager.default.enumerator(at: snapshot, includingPropertiesForKeys: nil) else { return }
        for case let entry as URL in entries { try checkInside(entry) }
    }

    private static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    private func isDirectory(_ url: URL) -> Bool {
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) && isDirectory.boolValue
    }
}

/// One repository of the cache, for `vlm cache list`.
public struct CachedRepository: Sendable {
    /// `org/name`.
    public let id: String
    /// `<cache>/models--org--name`.
    public let directory: URL
    /// The bytes of its blobs (shared between revisions, so counted once).
    public let sizeOnDisk: Int64
    /// The newest blob's modification date.
    public let lastModified: Date
    /// Its snapshots, sorted by commit.
    public let revisions: [CachedRevision]
}

/// One snapshot of a cached repository.
public struct CachedRevision: Sendable {
    /// The commit hash, the snapshot folder's name.
    public let commit: String
    /// The branches and tags in `refs/` that point at it.
    public let refs: [String]
    /// The repo-relative paths of the files it holds.
    public let files: [String]
}

func createDirectory(_ url: URL) throws {
    do {
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    } catch {
        throw HubError.fileSystem(path: url.path, reason: "cannot create directory: \(error.localizedDescription)")
    }
}

func posixError(_ path: String) -> HubError {
    .fileSystem(path: path, reason: String(cString: strerror(errno)))
}
