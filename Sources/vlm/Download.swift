import ArgumentParser
import Foundation
import SwiftVLM

struct Download: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Download a model repository into the Hugging Face cache (shared with Python's huggingface_hub).")

    @Argument(help: "Repo id, org/name[@revision].")
    var repo: String

    @Option(help: "Branch, tag or commit (overrides @revision).")
    var revision: String?

    @Option(parsing: .upToNextOption, help: "Only files matching these glob patterns (default: what loading a model needs).")
    var include: [String] = []

    @Flag(help: "No progress bars.")
    var quiet = false

    func run() async throws {
        var reference = try RepoReference(parsing: repo)
        if let revision { reference = try RepoReference(id: reference.id, revision: revision) }
        let bar = progressBar(quiet: quiet)
        let snapshot = try await HubClient(options: HubOptions()).snapshot(
            reference, files: include.isEmpty ? .modelFiles : .matching(include: include, exclude: []),
            progress: progressHandler(bar))
        bar?.finish()
        print(snapshot.path)
    }
}

struct Cache: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Inspect or prune the Hugging Face cache.", subcommands: [List.self, Remove.self])

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Cached repositories with their size and revisions.")

        @Flag(help: "Print JSON instead of a table.")
        var json = false

        private struct Entry: Encodable {
            let repo: String
            let path: String
            let sizeBytes: Int64
            let revisions: [String]

            enum CodingKeys: String, CodingKey {
                case repo, path, sizeBytes = "size_bytes", revisions
            }
        }

        func run() throws {
            let repositories = try HubCache(directory: HubOptions().cacheDirectory).repositories()
            let entries = repositories.map {
                Entry(repo: $0.id, path: $0.directory.path, sizeBytes: $0.sizeOnDisk, revisions: $0.revisions.map(\.commit))
            }
            if json {
                try printJSON(entries)
                return
            }
            for entry in entries {
                let megabytes = String(format: "%.1f MB", Double(entry.sizeBytes) / 1e6)
                print("\(entry.repo)  \(megabytes)  \(entry.revisions.map { String($0.prefix(8)) }.joined(separator: ", "))")
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a repository from the cache.")

        @Argument(help: "Repo id, org/name.")
        var repo: String

        func run() throws {
            let freed = try HubCache(directory: HubOptions().cacheDirectory).remove(repoID: repo)
            print("removed \(repo) (\(String(format: "%.1f MB", Double(freed) / 1e6)))")
        }
    }
}
