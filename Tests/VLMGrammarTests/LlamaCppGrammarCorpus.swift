import Foundation

/// llama.cpp's grammar test sources and sample grammars as the llama.cpp that PyPI's llama-cpp-python 0.3.36 source
/// package vendors them (tests/test-json-schema-to-grammar.cpp, tests/test-grammar-integration.cpp, grammars/).
/// Not committed: `.ci/run` extracts them into models/llama-cpp-grammar/ and sets `$SWIFTVLM_LLAMA_CPP_GRAMMAR` to
/// that folder, and then they must be there; without the variable the suites read models/llama-cpp-grammar/ under
/// the package root when it exists and are skipped otherwise.
enum LlamaCppGrammarCorpus {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static let required = ProcessInfo.processInfo.environment["SWIFTVLM_LLAMA_CPP_GRAMMAR"].map { !$0.isEmpty } ?? false

    static let directory: URL = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_LLAMA_CPP_GRAMMAR"], !path.isEmpty {
            return URL(fileURLWithPath: path, relativeTo: packageRoot)
        }
        return packageRoot.appendingPathComponent("models/llama-cpp-grammar")
    }()

    static let available = required || FileManager.default.fileExists(atPath: directory.path)

    static let skipMessage = "llama.cpp's grammar tests not found: run .ci/run's extraction of llama-cpp-python 0.3.36's tests and grammars into models/llama-cpp-grammar/"

    static func read(_ path: String) throws -> String {
        try String(contentsOf: directory.appendingPathComponent(path), encoding: .utf8)
    }
}
