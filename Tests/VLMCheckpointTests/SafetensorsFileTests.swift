import Foundation
import Testing
import VLMCheckpoint
import VLMTensor

@Suite struct SafetensorsFileTests {
    @Test func loadsEveryTensorAsTorchDoes() throws {
        let file = try SafetensorsFile(url: fixtures.appendingPathComponent("single/model.safetensors"))
        let expected = try expectedTensors("single/expected.json")
        #expect(file.tensorNames == expected.keys.sorted())
        for (name, want) in expected {
            let info = try #require(file.info(name))
            #expect(info.dtype == want.dtype, "\(name)")
            #expect(info.shape == want.shape, "\(name)")
            guard let bits = want.bits else { continue }
            let tensor = try file.tensor(name)
            #expect(tensor.shape == want.shape, "\(name)")
            #expect(bitPatterns(tensor) == bits, "\(name)")
        }
    }

    @Test func byteRangeLiesInsideTheFile() throws {
        let url = fixtures.appendingPathComponent("single/model.safetensors")
        let file = try SafetensorsFile(url: url)
        let size = try #require(FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int)
        let info = try #require(file.info("vision_model.embeddings.patch_embedding.weight"))
        #expect(info.byteRange.count == 4 * 3 * 2 * 2 * 4)
        #expect(info.byteRange.upperBound <= size)
        #expect(info.elementCount == 48)
    }

    @Test func integerTensorsAreRefusedByName() throws {
        let file = try SafetensorsFile(url: fixtures.appendingPathComponent("single/model.safetensors"))
        let error = try #require(throws: CheckpointError.self) { try file.tensor("text_model.embeddings.position_ids") }
        #expect(caseName(error) == "unsupportedDType")
        #expect(error.description.contains("single/model.safetensors"))
        #expect(error.description.contains("text_model.embeddings.position_ids"))
        #expect(error.description.contains("I64"))
    }

    @Test func missingTensorNamesFileAndTensor() throws {
        let file = try SafetensorsFile(url: fixtures.appendingPathComponent("single/model.safetensors"))
        #expect(file.info("nope") == nil)
        let error = try #require(throws: CheckpointError.self) { try file.tensor("nope") }
        #expect(caseName(error) == "missingTensor")
        #expect(error.description.contains("model.safetensors") && error.description.contains("'nope'"))
    }

    /// Every f16 and bf16 bit pattern against torch's own widening, bit for bit (NaN payloads included). The
    /// tensors are large enough to take the multi-threaded path.
    @Test(arguments: [("f16", "f16_as_f32"), ("bf16", "bf16_as_f32")])
    func widensEveryHalfPatternExactly(half: String, reference: String) throws {
        let file = try SafetensorsFile(url: fixtures.appendingPathComponent("every_half.safetensors"))
        let widened = try file.tensor(half)
        let expected = try file.tensor(reference)
        #expect(file.info(reference)?.dtype == "F32")
        #expect(widened.shape == [65536])
        let mismatches = zip(bitPatterns(widened), bitPatterns(expected)).enumerated().filter { $0.element.0 != $0.element.1 }
        #expect(mismatches.isEmpty, "first mismatches: \(mismatches.prefix(4).map { (pattern: $0.offset, got: $0.element.0, want: $0.element.1) })")
    }

    @Test func readsMisalignedData() throws {
        let file = try SafetensorsFile(url: fixtures.appendingPathComponent("unaligned.safetensors"))
        let expected = try expectedTensors("unaligned_expected.json")
        for (name, want) in expected {
            #expect(try #require(file.info(name)).byteRange.lowerBound % 2 == 1)
            #expect(bitPatterns(try file.tensor(name)) == want.bits, "\(name)")
        }
    }

    @Test func missingFileIsNamed() throws {
        let url = fixtures.appendingPathComponent("nowhere.safetensors")
        let error = try #require(throws: CheckpointError.self) { try SafetensorsFile(url: url) }
        #expect(caseName(error) == "missingFile")
        #expect(error.description.contains("nowhere.safetensors"))
    }

    @Test func directoryIsNotASafetensorsFile() throws {
        let error = try #require(throws: CheckpointError.self) {
            try SafetensorsFile(url: fixtures.appendingPathComponent("single"))
        }
        #expect(caseName(error) == "unreadable")
    }

    /// Each broken file is refused at open with the case that names what is wrong, and a message naming the file.
    @Test(arguments: [
        ("too_short", "fileTooShort"),
        ("truncated_header", "headerLengthOutOfRange"),
        ("header_length_past_end", "headerLengthOutOfRange"),
        ("header_length_huge", "headerLengthOutOfRange"),
        ("truncated_data", "dataOutOfBounds"),
        ("offsets_past_end", "dataOutOfBounds"),
        ("reversed_offsets", "dataOutOfBounds"),
        ("shape_mismatch", "byteCountMismatch"),
        ("negative_dimension", "byteCountMismatch"),
        ("shape_overflow", "byteCountMismatch"),
        ("huge_tensor", "dataOutOfBounds"),
        ("fractional_dimension", "invalidHeader"),
        ("unknown_dtype", "unknownDType"),
        ("invalid_json", "invalidHeader"),
        ("header_not_object", "invalidHeader"),
        ("missing_offsets", "invalidHeader"),
        ("three_offsets", "invalidHeader"),
        ("overlapping", "overlappingTensors"),
    ])
    func refusesBrokenFile(name: String, expectedCase: String) throws {
        let url = fixtures.appendingPathComponent("bad/\(name).safetensors")
        let error = try #require(throws: CheckpointError.self) { try SafetensorsFile(url: url) }
        #expect(caseName(error) == expectedCase, "\(error)")
        #expect(error.description.contains("bad/\(name).safetensors"), "\(error)")
        #expect(!error.description.contains("\n"))
    }

    /// A header that claims 2^60 floats must be refused from the header alone: allocating would abort the process.
    @Test func refusesHugeTensorWithoutAllocating() throws {
        let url = fixtures.appendingPathComponent("bad/huge_tensor.safetensors")
        let error = try #require(throws: CheckpointError.self) { try SafetensorsFile(url: url) }
        guard case let .dataOutOfBounds(_, tensor, begin, end, dataSize) = error else {
            Issue.record("wrong case: \(error)")
            return
        }
        #expect(tensor == "w" && begin == 0 && end == 1 << 62 && dataSize == 16)
        #expect(error.description.contains("'w'"))
    }

    @Test func errorsNameTheTensor() throws {
        let cases = [("unknown_dtype", "F128"), ("overlapping", "'b'"), ("shape_mismatch", "[3, 3]")]
        for (name, detail) in cases {
            let url = fixtures.appendingPathComponent("bad/\(name).safetensors")
            let error = try #require(throws: CheckpointError.self) { try SafetensorsFile(url: url) }
            #expect(error.description.contains(detail), "\(error)")
        }
    }
}
