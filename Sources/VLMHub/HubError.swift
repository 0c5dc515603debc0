/// Everything that can go wrong while naming, finding or downloading a model. Each case names the repository, file,
/// URL or path it is about, so that the message alone tells the user what to fix.
public enum HubError: Error, CustomStringConvertible, Sendable {
    /// A string that is neither an existing local path nor a valid `org/name[@revision]` repo id.
    case invalidModelSpec(spec: String, reason: String)
    /// A local path (it looks like one: absolute, `./`, `~`, or `.gguf`) that does not exist.
    case noSuchLocalPath(path: String)
    /// A revision that cannot be stored safely under `refs/` (`..`, absolute, empty segments).
    case invalidRevision(revision: String)
    /// The server named a file (or gave an etag or commit) that would escape the cache directory.
    case unsafeName(repo: String, name: String, reason: String)
    /// 401/403 or a gated repo: the user needs a token with access.
    case accessDenied(repo: String, url: String, status: Int, serverMessage: String?, tokenSent: Bool)
    /// The repository does not exist, or is private and no valid token was sent.
    case repositoryNotFound(repo: String, url: String, tokenSent: Bool)
    /// The repository exists but the branch, tag or commit does not.
    case revisionNotFound(repo: String, revision: String)
    /// The repository and revision exist but not this file.
    case fileNotFound(repo: String, revision: String, file: String)
    /// Any other HTTP failure, after retries when it was transient.
    case httpStatus(url: String, status: Int, serverMessage: String?)
    /// The connection failed, after retries.
    case network(url: String, reason: String)
    /// A redirect chain longer than any the Hub makes.
    case tooManyRedirects(url: String)
    /// The response lacks what every Hub response carries (`X-Repo-Commit`, `ETag`), or its JSON is malformed.
    case invalidResponse(url: String, reason: String)
    /// The downloaded file does not have the size the server announced.
    case sizeMismatch(file: String, expected: Int64, actual: Int64)
    /// The downloaded LFS file's sha256 is not its etag, even after fetching it again.
    case checksumMismatch(file: String, expected: String, actual: String)
    /// The shard index of the repo names a shard the repo does not have.
    case missingShard(repo: String, index: String, shard: String)
    /// Offline (HF_HUB_OFFLINE or a flag) and the revision is not in the cache.
    case notCached(repo: String, revision: String, cacheDirectory: String)
    /// Another process held the download lock longer than the lock timeout.
    case lockTimeout(path: String, seconds: Double)
    /// Creating, writing, renaming or linking a file of the cache failed.
    case fileSystem(path: String, reason: String)
    /// A file or folder of a cached snapshot that leads outside the cache (a link planted there, or the cache moved
    /// under its links): nothing outside the cache is read as part of a model.
    case outsideCache(path: String, target: String)

    public var description: String {
        switch self {
        case let .invalidModelSpec(spec, reason):
            return "'\(spec)' is neither an existing path nor a Hugging Face repo id (org/name[@revision]): \(reason)"
        case let .noSuchLocalPath(path):
            return "\(path): no such file or directory"
        case let .invalidRevision(revision):
            return "'\(revision)' is not a valid revision (branch, tag or commit)"
        case let .unsafeName(repo, name, reason):
            return "\(repo): refusing server-provided name '\(name)': \(reason)"
        case let .accessDenied(repo, url, status, message, tokenSent):
            let advice = tokenSent
                ? "the token in use (HF_TOKEN or the token file) does not grant access; request access on the Hub or use another token"
                : "the repo is gated or private: accept its terms on the Hub and set HF_TOKEN to a token with access"
            return "\(repo): HTTP \(status) for \(url)\(message.map { " (\($0))" } ?? ""): \(advice)"
        case let .repositoryNotFound(repo, url, tokenSent):
            return "\(repo): repository not found (\(url))"
                + (tokenSent ? "" : "; if it is private or gated, set HF_TOKEN to a token with access")
        case let .revisionNotFound(repo, revision):
            return "\(repo): revision '\(revision)' not found"
        case let .fileNotFound(repo, revision, file):
            return "\(repo)@\(revision): no file '\(file)'"
        case let .httpStatus(url, status, message):
            return "\(url): HTTP \(status)\(message.map { " (\($0))" } ?? "")"
        case let .network(url, reason):
            return "\(url): \(reason)"
        case let .tooManyRedirects(url):
            return "\(url): too many redirects"
        case let .invalidResponse(url, reason):
            return "\(url): not a Hugging Face Hub response: \(reason); if HF_ENDPOINT is set, check that it points to a Hub"
        case let .sizeMismatch(file, expected, actual):
            return "\(file): downloaded \(actual) bytes but the server announced \(expected)"
        case let .checksumMismatch(file, expected, actual):
            return "\(file): sha256 \(actual) does not match the expected \(expected), even after downloading it again"
        case let .missingShard(repo, index, shard):
            return "\(repo): \(index) names shard '\(shard)', which the repository does not have"
        case let .notCached(repo, revision, cacheDirectory):
            return "\(repo)@\(revision) is not in the cache \(cacheDirectory) and downloads are disabled"
                + " (offline: HF_HUB_OFFLINE or --offline)"
        case let .lockTimeout(path, seconds):
            return "\(path): another process held this download lock for more than \(Int(seconds)) s"
        case let .fileSystem(path, reason):
            return "\(path): \(reason)"
        case let .outsideCache(path, target):
            return "\(path): leads outside the Hugging Face cache (to \(target)); remove it (vlm cache) or download the model again"
        }
    }
}
