import Foundation

/// Where the Hub is, where its cache lives, and how to talk to it. ``init(environment:)`` reads the same environment
/// variables as Python's huggingface_hub, so both share one cache and one login.
public struct HubOptions: Sendable {
    /// The Hub's base URL (`HF_ENDPOINT`, default `https://huggingface.co`).
    public var endpoint: URL
    /// The cache root holding `models--org--name` folders (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`).
    public var cacheDirectory: URL
    /// The bearer token (`HF_TOKEN`, else the token file `hf auth login` writes at `$HF_HOME/token`).
    public var token: String?
    /// Never touch the network; only the cache (`HF_HUB_OFFLINE=1`).
    public var offline: Bool
    /// How many files download at once.
    public var maxConcurrentDownloads: Int = 4
    /// How many times a transient failure (connection lost, timeout, 429, 5xx) is retried; a retry that made progress
    /// does not count.
    public var maxRetries: Int = 5
    /// The first retry waits this long; each next one twice as long, up to 30 s.
    public var retryBaseDelay: Duration = .seconds(1)
    /// Seconds without any byte from the server before a request counts as timed out.
    public var requestTimeout: TimeInterval = 30
    /// Seconds to wait for another process that is downloading the same file.
    public var lockTimeout: TimeInterval = 600

    /// Options read from the environment (by default the process's), the way huggingface_hub reads them.
    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        func value(_ name: String) -> String? {
            guard let value = environment[name], !value.isEmpty else { return nil }
            return value
        }
        let home = environment["HOME"].map { URL(fileURLWithPath: $0) }
            ?? FileManager.default.homeDirectoryForCurrentUser
        func path(_ string: String) -> URL {
            if string == "~" { return home }
            if string.hasPrefix("~/") { return home.appendingPathComponent(String(string.dropFirst(2))) }
            return URL(fileURLWithPath: string)
        }
        let hfHome = value("HF_HOME").map(path)
            ?? (value("XDG_CACHE_HOME").map(path) ?? home.appendingPathComponent(".cache"))
                .appendingPathComponent("huggingface")
        cacheDirectory = (value("HF_HUB_CACHE") ?? value("HUGGINGFACE_HUB_CACHE")).map(path)
            ?? hfHome.appendingPathComponent("hub")

        var endpointString = value("HF_ENDPOINT") ?? "https://huggingface.co"
        while endpointString.hasSuffix("/") { endpointString.removeLast() }
        endpoint = URL(string: endpointString) ?? URL(string: "https://huggingface.co")!

        let tokenFile = value("HF_TOKEN_PATH").map(path) ?? hfHome.appendingPathComponent("token")
        token = Self.cleanToken(value("HF_TOKEN") ?? value("HUGGING_FACE_HUB_TOKEN"))
            ?? Self.cleanToken(Self.readSmallFile(tokenFile))

        let trueValues: Set<String> = ["1", "ON", "YES", "TRUE"]
        offline = [value("HF_HUB_OFFLINE"), value("TRANSFORMERS_OFFLINE")].contains {
            $0.map { trueValues.contains($0.uppercased()) } ?? false
        }
    }

    /// Options with everything given explicitly; nothing is read from the environment.
    public init(endpoint: URL, cacheDirectory: URL, token: String? = nil, offline: Bool = false) {
        self.endpoint = endpoint
        self.cacheDirectory = cacheDirectory
        self.token = token
        self.offline = offline
    }

    /// huggingface_hub strips spaces and newlines and treats an empty token as none.
    static func cleanToken(_ token: String?) -> String? {
        guard let token else { return nil }
        let cleaned = token.replacingOccurrences(of: "\r", with: "").replacingOccurrences(of: "\n", with: "")
            .trimmingCharacters(in: .whitespaces)
        return cleaned.isEmpty ? nil : cleaned
    }

    /// A token file is a line of text; anything larger is not one.
    private static func readSmallFile(_ url: URL) -> String? {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: url.path),
              let size = attributes[.size] as? NSNumber, size.intValue <= 4096,
              let data = FileManager.default.contents(atPath: url.path) else { return nil }
        return String(decoding: data, as: UTF8.self)
    }
}

/// A model repository on the Hub at a revision: `org/name`, `org/name@v1.0`, `org/name@<commit>`.
public struct RepoReference: Sendable, Hashable, CustomStringConvertible {
    /// `org/name` (or a legacy single-segment name such as `gpt2`).
    public let id: String
    /// A branch, tag or commit; `main` by default.
    public let revision: String

    /// Validates `id` with the Hub's rules (letters, digits, `-`, `_`, `.`; no `--` or `..`; at most 96 characters)
    /// and `revision` as a safe relative name.
    public init(id: String, revision: String = "main") throws {
        try Self.validate(id: id)
        guard CachePaths.isSafeRelativePath(revision) else { throw HubError.invalidRevision(revision: revision) }
        self.id = id
        self.revision = revision
    }

    /// Parses `org/name` or `org/name@revision`.
    public init(parsing spec: String) throws {
        if let at = spec.firstIndex(of: "@") {
            let revision = String(spec[spec.index(after: at)...])
            guard !revision.isEmpty else { throw HubError.invalidModelSpec(spec: spec, reason: "empty revision after '@'") }
            try self.init(id: String(spec[..<at]), revision: revision)
        } else {
            try self.init(id: spec)
        }
    }

    public var description: String { revision == "main" ? id : "\(id)@\(revision)" }

    /// The cache folder name huggingface_hub uses: `models--org--name`.
    public var folderName: String { CachePaths.folderName(repoID: id) }

    private static func validate(id: String) throws {
        func fail(_ reason: String) -> HubError { .invalidModelSpec(spec: id, reason: reason) }
        let segments = id.split(separator: "/", omittingEmptySubsequences: false)
        guard segments.count <= 2 else { throw fail("a repo id has at most one '/'") }
        guard id.count <= 96 else { throw fail("longer than 96 characters") }
        for segment in segments {
            guard !segment.isEmpty else { throw fail("empty name") }
            guard segment.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }) else {
                throw fail("only letters, digits, '-', '_' and '.' are allowed")
            }
            guard let first = segment.first, let last = segment.last,
                  !"-.".contains(first), !"-.".contains(last) else {
                throw fail("a name cannot start or end with '-' or '.'")
            }
        }
        guard !id.contains("--"), !id.contains("..") else { throw fail("'--' and '..' are not allowed") }
        guard !id.hasSuffix(".git") else { throw fail("cannot end with .git") }
    }
}
