import Foundation
import Testing
import VLMCheckpoint
import VLMTensor

/// Tests/Fixtures/checkpoint, found from this file's path so tests run from any working directory.
let fixtures: URL = {
    var url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    while !FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) {
        url.deleteLastPathComponent()
    }
    return url.appendingPathComponent("Tests/Fixtures/checkpoint")
}()

/// One tensor as the oracle saw it: torch's fp32 of it, as bit patterns (absent for dtypes that do not convert).
struct ExpectedTensor: Decodable {
    let dtype: String
    let shape: [Int]
    let bits: [UInt32]?
}

func expectedTensors(_ relativePath: String) throws -> [String: ExpectedTensor] {
    let data = try Data(contentsOf: fixtures.appendingPathComponent(relativePath))
    return try JSONDecoder().decode([String: ExpectedTensor].self, from: data)
}

func bitPatterns(_ tensor: Tensor) -> [UInt32] {
    tensor.scalars.map(\.bitPattern)
}

/// The case of a checkpoint error, e.g. "missingShard", so tests can say which case they expect.
func caseName(_ error: CheckpointError) -> String {
    Mirror(reflecting: error).children.first?.label ?? "\(error)"
}
