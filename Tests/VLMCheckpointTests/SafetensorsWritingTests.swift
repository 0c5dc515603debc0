import Foundation
import Testing
import VLMCheckpoint
import VLMTensor

@Suite struct SafetensorsWritingTests {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("safetensors-\(UUID().uuidString)")

    @Test func writtenTensorsReadBackBitForBit() throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let tensors: [String: Tensor] = [
            "text_model.layer.weight": Tensor(shape: [2, 3], scalars: [1, -2.5, .pi, 0, -0.0, 1e-30]),
            "logit_scale": Tensor(shape: [], scalars: [2.6592]),
            "a \"quoted\" name\\": Tensor(shape: [1], scalars: [.infinity]),
            "empty": Tensor(zeros: [0, 4]),
        ]
        let url = directory.appendingPathComponent("model.safetensors")
        try SafetensorsFile.write(tensors, to: url)
        let file = try SafetensorsFile(url: url)
        #expect(file.tensorNames == tensors.keys.sorted())
        for (name, tensor) in tensors {
            let read = try file.tensor(name)
            #expect(read.shape == tensor.shape, "\(name)")
            #expect(read.scalars.map(\.bitPattern) == tensor.scalars.map(\.bitPattern), "\(name)")
            #expect(file.info(name)?.dtype == "F32")
        }
        let bytes = try Data(contentsOf: url)
        let headerLength = bytes.prefix(8).enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
        #expect(headerLength % 8 == 0)
        #expect(bytes.count == 8 + headerLength + 4 * (6 + 1 + 1))
        #expect(String(decoding: bytes[8..<(8 + headerLength)], as: UTF8.self).hasPrefix(#"{"__metadata__":{"format":"pt"}"#))
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["model.safetensors"])
    }

    @Test func anUnwritablePlaceIsOneError() throws {
        let url = directory.appendingPathComponent("missing/model.safetensors")
        let error = try #require(throws: CheckpointError.self) {
            try SafetensorsFile.write(["x": Tensor(zeros: [1])], to: url)
        }
        #expect(error.description.hasPrefix("\(url.path): cannot write: "), "\(error)")
    }
}
