import Foundation
import Testing
import VLMTensor

/// Cases written by oracle/tensor_ops.py, oracle/segmentation_ops.py and oracle/detection_ops.py: inputs and
/// PyTorch's outputs.
struct OpFixtures {
    struct Entry: Decodable {
        let shape: [Int]
        let offset: Int
    }

    struct Parameters: Decodable {
        let eps: Float?
        let activation: String?
        let factor: Float?
        let transposeB: Bool?
        let stride: Int?
        let padding: Int?
        let heads: Int?
        let causal: Bool?
        let scale: Float?
        let ids: [Int]?
        let axis: Int?
        let positions: [Int]?
        let mode: String?
        let height: Int?
        let width: Int?
    }

    struct Case: Decodable {
        let name: String
        let op: String
        let params: Parameters
        let inputs: [String: Entry]
        let outputs: [String: Entry]

        /// The same case with its data found `floats` further on.
        func shifted(by floats: Int) -> Case {
            let move = { (entries: [String: Entry]) in entries.mapValues { Entry(shape: $0.shape, offset: $0.offset + floats) } }
            return Case(name: name, op: op, params: params, inputs: move(inputs), outputs: move(outputs))
        }
    }

    private struct Manifest: Decodable {
        let cases: [Case]
    }

    static let shared = OpFixtures()

    let cases: [String: Case]
    private let data: [Float]

    /// Each manifest's blob is appended to `data`, its cases' offsets moved along with it.
    private init() {
        var directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path) {
            directory.deleteLastPathComponent()
        }
        let folder = directory.appendingPathComponent("Tests/Fixtures/tensor")
        var cases: [String: Case] = [:]
        var data: [Float] = []
        for name in ["tensor_ops", "segmentation_ops", "detection_ops"] {
            do {
                let manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: folder.appendingPathComponent("\(name).json")))
                let bytes = try Data(contentsOf: folder.appendingPathComponent("\(name).bin"))
                let base = data.count
                data += bytes.withUnsafeBytes { raw in
                    (0..<bytes.count / 4).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) }
                }
                for entry in manifest.cases { cases[entry.name] = entry.shifted(by: base) }
            } catch {
                fatalError("cannot read tensor fixtures \(name) in \(folder.path): \(error)")
            }
        }
        self.cases = cases
        self.data = data
    }

    static func names(op: String) -> [String] {
        shared.cases.values.filter { $0.op == op }.map(\.name).sorted()
    }

    func tensor(_ entry: Entry) -> Tensor {
        Tensor(shape: entry.shape, scalars: Array(data[entry.offset..<entry.offset + Tensor.elementCount(entry.shape)]))
    }
}

extension OpFixtures.Case {
    func input(_ name: String) -> Tensor { OpFixtures.shared.tensor(inputs[name]!) }
    func optionalInput(_ name: String) -> Tensor? { inputs[name].map { OpFixtures.shared.tensor($0) } }
    func output(_ name: String = "y") -> Tensor { OpFixtures.shared.tensor(outputs[name]!) }
}

func activationNamed(_ name: String) -> Activation {
    switch name {
    case "identity": .identity
    case "gelu": .gelu
    case "geluTanh": .geluTanh
    case "quickGelu": .quickGelu
    case "relu": .relu
    case "silu": .silu
    case "sigmoid": .sigmoid
    case "elu": .elu
    default: fatalError("unknown activation \(name) in fixtures")
    }
}

/// Expects equal shapes and every element within `tolerance`, relative to the expected value's magnitude when that
/// exceeds 1.
func expectClose(_ actual: Tensor, _ expected: Tensor, _ what: String, tolerance: Float = 1e-5,
                 sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(actual.shape == expected.shape, "\(what): shape \(actual.shape) vs \(expected.shape)", sourceLocation: sourceLocation)
    guard actual.shape == expected.shape else { return }
    var worst: Float = 0
    var worstIndex = 0
    let a = actual.scalars, e = expected.scalars
    for index in e.indices {
        let error = abs(a[index] - e[index]) / max(1, abs(e[index]))
        if !(error <= worst) { worst = error; worstIndex = index }
    }
    #expect(worst <= tolerance, "\(what): element \(worstIndex) is \(a.isEmpty ? 0 : a[worstIndex]), expected \(e.isEmpty ? 0 : e[worstIndex]) (error \(worst))",
            sourceLocation: sourceLocation)
}
