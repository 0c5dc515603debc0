import Foundation

/// Tests/Fixtures/tokenizers, found from this file's path.
let fixturesDirectory: URL = {
    var url = URL(fileURLWithPath: #filePath)
    while !FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) {
        url.deleteLastPathComponent()
    }
    return url.appendingPathComponent("Tests/Fixtures/tokenizers")
}()

/// The input strings every tokenizer fixture shares (oracle/tokenizer_strings.py).
let sharedStrings: [String] = {
    let url = fixturesDirectory.appendingPathComponent("real/strings.json")
    return (try? JSONDecoder().decode([String].self, from: Data(contentsOf: url))) ?? []
}()

/// A scratch directory with the given files, removed by the caller.
func temporaryDirectory(files: [String: String]) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-tokenizers-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    for (name, contents) in files {
        try contents.write(to: url.appendingPathComponent(name), atomically: true, encoding: .utf8)
    }
    return url
}
