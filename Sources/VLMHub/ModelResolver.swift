import Foundation

/// Turns whatever names a model into something to load: a local checkpoint directory or `.gguf` file (an existing
/// path always wins), or a Hub repo id `org/name[@revision]`, which is looked up in the shared cache and downloaded
/// when missing (unless offline).
///
/// - Returns: the local path as given, or the repo's snapshot directory in the cache.
public func resolveModel(
    _ spec: String, options: HubOptions = HubOptions(), files: FileSelection = .modelFiles,
    progress: HubProgressHandler? = nil
) async throws -> URL {
    let local = expandTilde(spec)
    if FileManager.default.fileExists(atPath: local) {
        return URL(fileURLWithPath: local).standardizedFileURL
    }
    if looksLikePath(spec) { throw HubError.noSuchLocalPath(path: local) }
    let repo = try RepoReference(parsing: spec)
    return try await HubClient(options: options).snapshot(repo, files: files, progress: progress)
}

/// A spec that can only mean a path, so that a typo is reported as a missing file rather than a missing repo.
private func looksLikePath(_ spec: String) -> Bool {
    spec.hasPrefix("/") || spec.hasPrefix("./") || spec.hasPrefix("../") || spec.hasPrefix("~") || spec == "."
        || spec == ".." || spec.lowercased().hasSuffix(".gguf") || spec.lowercased().hasSuffix(".safetensors")
}

private func expandTilde(_ path: String) -> String {
    guard path == "~" || path.hasPrefix("~/") else { return path }
    let home = ProcessInfo.processInfo.environment["HOME"] ?? FileManager.default.homeDirectoryForCurrentUser.path
    return home + path.dropFirst()
}
