/// Which files of a repository to download.
public enum FileSelection: Sendable, Equatable {
    /// What SwiftVLM loads: the root-level configs and processor/tokenizer files (`*.json`, `*.txt`, `*.model`,
    /// `*.tiktoken`, `*.jinja`) and the safetensors weights: `model.safetensors`, or the shards that
    /// `model.safetensors.index.json` names. Other weight formats, variants, docs and subfolders are skipped.
    case modelFiles
    /// huggingface_hub's `allow_patterns`/`ignore_patterns`: a file is kept when it matches some `include` pattern
    /// (or `include` is empty) and no `exclude` pattern. Patterns are `fnmatch` globs where `*` also matches `/`, and
    /// a pattern ending in `/` means everything below that folder.
    case matching(include: [String], exclude: [String] = [])

    /// Every file of the repository.
    public static let all = FileSelection.matching(include: [])

    static let shardIndexName = "model.safetensors.index.json"
    static let singleWeightsName = "model.safetensors"
    private static let modelFilePatterns = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]

    /// The files to fetch before any other: the shard index, whose content decides which shards ``modelFiles`` needs.
    func indexFiles(in files: [String]) -> [String] {
        self == .modelFiles && files.contains(Self.shardIndexName) ? [Self.shardIndexName] : []
    }

    /// The selected repo files, in the order `files` lists them. `shards` is what the shard index names (nil without
    /// an index).
    func select(from files: [String], shards: [String]?) -> [String] {
        switch self {
        case .modelFiles:
            let weights: Set<String> = shards.map(Set.init)
                ?? (files.contains(Self.singleWeightsName) ? [Self.singleWeightsName] : [])
            return files.filter { file in
                weights.contains(file)
                    || (!file.contains("/") && Self.modelFilePatterns.contains { fnmatch(pattern: $0, file) })
            }
        case let .matching(include, exclude):
            let include = include.map(Self.expandDirectory)
            let exclude = exclude.map(Self.expandDirectory)
            return files.filter { file in
                (include.isEmpty || include.contains { fnmatch(pattern: $0, file) })
                    && !exclude.contains { fnmatch(pattern: $0, file) }
            }
        }
    }

    private static func expandDirectory(_ pattern: String) -> String {
        let pattern = pattern.replacingOccurrences(of: "\\", with: "/")
        return pattern.hasSuffix("/") ? pattern + "*" : pattern
    }
}

/// Python's `fnmatch.fnmatchcase`: `*` any run of characters (`/` included), `?` one character, `[abc]`, `[a-z]` and
/// `[!abc]` one character of (or not of) a set; a `[` without its `]` is literal. Case-sensitive.
func fnmatch(pattern: String, _ name: String) -> Bool {
    let pattern = Array(pattern.unicodeScalars)
    let name = Array(name.unicodeScalars)
    // Iterative matching with one backtrack point for the last `*`: linear in practice, never exponential.
    var p = 0, n = 0
    var starPattern = -1, starName = 0
    while n < name.count {
        if p < pattern.count {
            switch pattern[p] {
            case "*":
                starPattern = p
                starName = n
                p += 1
                continue
            case "?":
                p += 1
                n += 1
                continue
            case "[":
                if let (matches, next) = matchSet(pattern, from: p, name[n]) {
                    if matches {
                        p = next
                        n += 1
                        continue
                    }
                } else if name[n] == "[" {
                    p += 1
                    n += 1
                    continue
                }
            default:
                if pattern[p] == name[n] {
                    p += 1
                    n += 1
                    continue
                }
            }
        }
        guard starPattern >= 0 else { return false }
        starName += 1
        n = starName
        p = starPattern + 1
    }
    while p < pattern.count, pattern[p] == "*" { p += 1 }
    return p == pattern.count
}

/// Whether `character` is in the set starting at `pattern[start] == "["`, and the index after its `]`; nil when the
/// set is unterminated (then `[` is a literal).
private func matchSet(_ pattern: [Unicode.Scalar], from start: Int, _ character: Unicode.Scalar) -> (Bool, Int)? {
    var index = start + 1
    var negated = false
    if index < pattern.count, pattern[index] == "!" {
        negated = true
        index += 1
    }
    var matched = false
    var first = true
    while index < pattern.count {
        // `]` right after `[` or `[!` is a member, not the end.
        if pattern[index] == "]", !first { return (matched != negated, index + 1) }
        first = false
        if index + 2 < pattern.count, pattern[index + 1] == "-", pattern[index + 2] != "]" {
            if pattern[index] <= character, character <= pattern[index + 2] { matched = true }
            index += 3
        } else {
            if pattern[index] == character { matched = true }
            index += 1
        }
    }
    return nil
}
