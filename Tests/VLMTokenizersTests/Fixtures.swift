import Foundation

/// Tests/Fixtures/tokenizers, found from this file's path.
let fixturesDirectory: URL = {
    var url = URL(fileURLWithPath: #filePath)
    while !FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) {
        url.deleteLastPathComponent()
    }
    return url.appendingPathComponent("Tests/Fixtures/tokenizers")
}()

/// What oracle/tokenizer_fixtures.py recorded from transformers.
struct OracleCases: Decodable {
    struct Single: Decodable {
        let text: String
        let ids: [Int]
        let tokens: [String]
        let ids_without_special: [Int]
        let decoded: String
        let decoded_skip_special: String
    }
    struct Padded: Decodable {
        let ids: [[Int]]
        let attention_mask: [[Int]]
    }
    struct Batch: Decodable {
        let texts: [String]
        let longest_77: Padded
        let max_length_16: Padded
    }
    struct Decode: Decodable {
        let ids: [Int]
        let decoded: String
        let decoded_skip_special: String
    }
    let single: [Single]
    /// Absent for pipelines recorded from tokenizers directly.
    let batches: [Batch]?
    let decode_ids: [Decode]

    static func load(_ name: String) throws -> OracleCases {
        try JSONDecoder().decode(OracleCases.self, from: Data(contentsOf: fixturesDirectory.appendingPathComponent(name)))
    }
}

/// A scratch directory with the given files, removed by the caller.
func temporaryDirectory(files: [String: String]) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-tokenizers-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    for (name, contents) in files {
        try contents.write(to: url.appendingPathComponent(name), atomically: true, encoding: .utf8)
    }
    return url
}
