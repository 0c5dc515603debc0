import Foundation
import Testing
import VLMTensor

@Suite struct NumPyFormatTests {
    /// Byte for byte what numpy.save wrote for the same values (oracle/tensor_ops.py).
    @Test(arguments: OpFixtures.names(op: "npy"))
    func npyBytesAreWhatNumPySaves(name: String) throws {
        let c = try #require(OpFixtures.shared.cases[name])
        var directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path) {
            directory.deleteLastPathComponent()
        }
        let saved = try Data(contentsOf: directory.appendingPathComponent("Tests/Fixtures/tensor/npy/\(name).npy"))
        let bytes = c.input("x").npyBytes
        #expect(bytes.count == saved.count)
        #expect(bytes == [UInt8](saved))
    }
}
