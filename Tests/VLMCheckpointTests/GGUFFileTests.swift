import Foundation
import Testing
import VLMCheckpoint
import VLMTensor

/// Tests/Fixtures/gguf, written by oracle/gguf_files.py with gguf-py.
private let ggufFixtures = fixtures.deletingLastPathComponent().appendingPathComponent("gguf")

private func jsonObject(_ name: String) throws -> [String: Any] {
    let data = try Data(contentsOf: ggufFixtures.appendingPathComponent(name))
    return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
}

/// The oracle's `{"type": …, "value": …}` description of a metadata value, as the reader should return it.
private func expectedValue(_ entry: [String: Any]) throws -> GGUFValue {
    let type = try #require(entry["type"] as? String)
    if type == "ARRAY" {
        let elements = try #require(entry["elements"] as? [[String: Any]])
        return .array(try elements.map(expectedValue))
    }
    let value = entry["value"]
    let number = value as? NSNumber
    switch type {
    case "UINT8": return .uint8(try #require(number).uint8Value)
    case "INT8": return .int8(try #require(number).int8Value)
    case "UINT16": return .uint16(try #require(number).uint16Value)
    case "INT16": return .int16(try #require(number).int16Value)
    case "UINT32": return .uint32(try #require(number).uint32Value)
    case "INT32": return .int32(try #require(number).int32Value)
    case "UINT64": return .uint64(try #require(number).uint64Value)
    case "INT64": return .int64(try #require(number).int64Value)
    case "FLOAT32": return .float32(Float(try #require(number).doubleValue))
    case "FLOAT64": return .float64(try #require(number).doubleValue)
    case "BOOL": return .bool(try #require(value as? Bool))
    case "STRING": return .string(try #require(value as? String))
    default: throw CheckpointError.invalidJSON(file: "expected.json", reason: "unknown type \(type)")
    }
}

@Suite struct GGUFFileTests {
    @Test func readsEveryMetadataTypeAsGGUFPyWroteIt() throws {
        let file = try GGUFFile(url: ggufFixtures.appendingPathComponent("every_type.gguf"))
        let expected = try jsonObject("expected.json")
        let metadata = try #require(expected["metadata"] as? [String: [String: Any]])
        #expect(file.version == 3)
        #expect(file.alignment == 32)
        #expect(file.metadataKeys == (try #require(expected["metadata_keys"] as? [String])))
        for (key, entry) in metadata {
            #expect(file.metadata[key] == (try expectedValue(entry)), "\(key)")
        }
        #expect(file.metadata["test.uint64"]?.integer == nil, "2^64-range values do not fit Int")
        #expect(file.metadata["test.uint32"]?.integer == 4_000_000_000)
        #expect(file.metadata["test.float32"]?.number == Double(Float(0.1)))
        #expect(file.metadata["test.array_string"]?.array?.compactMap(\.string) == ["a", "", "<|im_end|>"])
    }

    @Test func dequantizesEveryTypeBitForBitAsGGUFPy() throws {
        let file = try GGUFFile(url: ggufFixtures.appendingPathComponent("every_type.gguf"))
        let tensors = try #require(try jsonObject("expected.json")["tensors"] as? [String: [String: Any]])
        #expect(Set(file.tensorInfos.map(\.name)) == Set(tensors.keys))
        for (name, entry) in tensors {
            let info = try #require(file.info(name))
            #expect(info.type.description == entry["type"] as? String, "\(name)")
            #expect(info.shape == entry["shape"] as? [Int], "\(name)")
            #expect(info.dimensions == entry["dims"] as? [Int], "\(name)")
            #expect(info.byteRange.lowerBound == entry["data_offset"] as? Int, "\(name)")
            guard let bits = entry["bits"] as? [UInt32] else { continue }
            let tensor = try file.tensor(name)
            #expect(tensor.shape == info.shape, "\(name)")
            #expect(bitPatterns(tensor) == bits, "\(name)")
        }
    }

    @Test func unsupportedTypeIsRefusedNamingTheTensorAndType() throws {
        let file = try GGUFFile(url: ggufFixtures.appendingPathComponent("every_type.gguf"))
        let error = try #require(throws: CheckpointError.self) { try file.tensor("quant.q2_k") }
        #expect(caseName(error) == "invalidGGUF")
        #expect(error.description.contains("every_type.gguf"))
        #expect(error.description.contains("'quant.q2_k'"))
        #expect(error.description.contains("Q2_K"))
    }

    @Test func quantizedMatricesStayQuantizedAndDequantizeAsGGUFPy() throws {
        let file = try GGUFFile(url: ggufFixtures.appendingPathComponent("every_type.gguf"))
        let tensors = try #require(try jsonObject("expected.json")["tensors"] as? [String: [String: Any]])
        for format in QuantizationFormat.allCases where !format.isHalfPrecisionFloat {
            let name = "quant.\(format.description.lowercased())"
            let entry = try #require(tensors[name], "\(name)")
            let shape = try #require(entry["shape"] as? [Int])
            guard case let .quantized(matrix) = try file.matrix(name, shape: shape) else {
                Issue.record("\(name) was not kept quantized")
                continue
            }
            #expect(matrix.format == format && matrix.rows == shape[0] && matrix.columns == shape[1], "\(name)")
            #expect(bitPatterns(matrix.dequantized()) == entry["bits"] as? [UInt32], "\(name)")
            let rows = bitPatterns(try file.tensor(name)).chunked(shape[1])
            #expect(bitPatterns(matrix.rows([1, 0, 1])) == rows[1] + rows[0] + rows[1], "\(name): embedding rows")
        }
        guard case let .dense(plain) = try file.matrix("plain.f32", shape: [3, 5]) else {
            Issue.record("plain.f32 should be a dense matrix")
            return
        }
        #expect(plain.shape == [3, 5])
        // BF16 rows of 6 are not whole 32-value blocks: widened like F32.
        guard case let .dense(widened) = try file.matrix("plain.bf16", shape: [4, 6]) else {
            Issue.record("plain.bf16 (rows of 6) should be widened to a dense matrix")
            return
        }
        #expect(bitPatterns(widened) == bitPatterns(try file.tensor("plain.bf16")))
        let shape = try #require(throws: CheckpointError.self) { try file.matrix("quant.q4_1", shape: [64, 3]) }
        #expect(caseName(shape) == "shapeMismatch")
        let refused = try #require(throws: CheckpointError.self) { try file.matrix("quant.q2_k", shape: [1, 256]) }
        #expect(refused.description.contains("'quant.q2_k'") && refused.description.contains("Q2_K"))
    }

    @Test func missingTensorAndWrongShapeAreNamed() throws {
        let file = try GGUFFile(url: ggufFixtures.appendingPathComponent("every_type.gguf"))
        let missing = try #require(throws: CheckpointError.self) { try file.tensor("nowhere") }
        #expect(caseName(missing) == "missingTensor")
        let shape = try #require(throws: CheckpointError.self) { try file.tensor("plain.f32", shape: [5, 3]) }
        #expect(caseName(shape) == "shapeMismatch")
        #expect(try file.tensor("plain.f32", shape: [3, 5]).shape == [3, 5])
    }

    @Test func honoursGeneralAlignment() throws {
        let file = try GGUFFile(url: ggufFixtures.appendingPathComponent("aligned64.gguf"))
        let expected = try #require(try jsonObject("expected.json")["aligned64"] as? [String: Any])
        let tensors = try #require(expected["tensors"] as? [String: [UInt32]])
        #expect(file.alignment == 64)
        #expect(file.dataOffset % 64 == 0)
        for (name, bits) in tensors {
            let info = try #require(file.info(name))
            #expect(info.byteRange.lowerBound % 64 == 0, "\(name)")
            #expect(bitPatterns(try file.tensor(name)) == bits, "\(name)")
        }
    }

    @Test func brokenFilesAreErrorsNamingFileAndTensor() throws {
        let cases = try #require(try jsonObject("broken.json") as? [String: [String: Any]])
        #expect(cases.count >= 20)
        for (name, entry) in cases.sorted(by: { $0.key < $1.key }) {
            let message = try #require(entry["message"] as? String)
            let path = ggufFixtures.appendingPathComponent("broken/\(name).gguf").path
            do {
                _ = try GGUFFile(url: URL(fileURLWithPath: path))
                Issue.record("\(name): opened without error")
            } catch let error as CheckpointError {
                #expect(caseName(error) == "invalidGGUF", "\(name): \(error)")
                #expect(error.description.hasPrefix(path), "\(name): \(error)")
                #expect(error.description.contains(message), "\(name): \(error)")
                if let tensor = entry["tensor"] as? String {
                    #expect(error.description.contains("tensor '\(tensor)'"), "\(name): \(error)")
                }
            }
        }
    }

    @Test func validBaseOfTheBrokenFilesOpens() throws {
        let file = try GGUFFile(url: ggufFixtures.appendingPathComponent("broken/valid.gguf"))
        #expect(try file.tensor("weight").scalars == [0, 1, 2, 3, 4, 5, 6, 7])
        #expect(file.info("weight")?.shape == [2, 4])
    }

    @Test func truncatedQuantizedTensorIsNamed() throws {
        let path = ggufFixtures.appendingPathComponent("broken/truncated_q4_1.gguf").path
        let error = try #require(throws: CheckpointError.self) { try GGUFFile(url: URL(fileURLWithPath: path)) }
        #expect(error.description.contains("tensor 'blk.0.ffn_up.weight'"), "\(error)")
    }

    @Test func missingFileIsReported() throws {
        let error = try #require(throws: CheckpointError.self) {
            try GGUFFile(url: ggufFixtures.appendingPathComponent("nowhere.gguf"))
        }
        #expect(caseName(error) == "missingFile")
    }
}

private extension Array {
    func chunked(_ size: Int) -> [[Element]] {
        stride(from: 0, to: count, by: size).map { Array(self[$0..<Swift.min($0 + size, count)]) }
    }
}
