import CVLMKernels
import Testing
@testable import VLMTensor

@Suite struct DecoderOpsTests {
    /// The SiLU kernels against the scalar definition x / (1 + e^-x) in Swift's fp32, from -100 to 100 (where e^-x
    /// overflows a float) and through zero.
    @Test(arguments: [KernelPath.best, .scalar])
    func gatedSiluMatchesItsDefinition(path: KernelPath) {
        let width = 37, rows = 3
        let gates = (0..<(rows * width)).map { Float($0) / Float(rows * width - 1) * 200 - 100 }
        let ups = (0..<(rows * width)).map { Float($0 % 11) * 0.37 - 1.5 }
        var stacked: [Float] = []
        for row in 0..<rows {
            let columns = (row * width)..<((row + 1) * width)
            stacked += gates[columns]
            stacked += ups[columns]
        }
        let output = gatedActivation(Tensor(shape: [rows, 2 * width], scalars: stacked), activation: .silu, path: path)
        #expect(output.shape == [rows, width])
        for (index, actual) in output.scalars.enumerated() {
            let expected = Activation.silu(gates[index]) * ups[index]
            #expect(abs(actual - expected) <= 4 * Float.ulpOfOne * abs(expected) + 1e-30, "\(gates[index]): \(actual) vs \(expected)")
        }
    }

    /// A prompt's many rows of SiLU gating, split among the cores, are the floats the kernel gives over all of them at
    /// once.
    @Test(arguments: [3, 70])
    func gatedSiluOfManyRowsIsTheKernelsOverAllOfThem(rows: Int) {
        let width = 1024
        let stacked = (0..<(rows * 2 * width)).map { Float(($0 * 7919) % 2003) / 2003 * 12 - 6 }
        let input = Tensor(shape: [rows, 2 * width], scalars: stacked)
        let output = gatedActivation(input, activation: .silu)
        var expected = [Float](repeating: .nan, count: rows * width)
        vlm_gated_silu(input.storage.pointer, rows, width, &expected, KernelPath.best.isa)
        #expect(output.shape == [rows, width])
        #expect(zip(output.scalars, expected).filter { $0.bitPattern != $1.bitPattern }.count == 0)
    }

    /// A prompt's many rows of RMS norm, split among the cores, are the floats the kernel gives over all of them at
    /// once.
    @Test(arguments: [3, 300])
    func rmsNormOfManyRowsIsTheKernelsOverAllOfThem(rows: Int) {
        let features = 576
        let x = Tensor(shape: [rows, features], scalars: (0..<(rows * features)).map { Float(($0 * 7919) % 2003) / 2003 * 12 - 6 })
        let weight = Tensor(shape: [features], scalars: (0..<features).map { Float($0 % 13) * 0.1 + 0.5 })
        let output = rmsNorm(x, weight: weight, eps: 1e-5)
        var expected = [Float](repeating: .nan, count: rows * features)
        vlm_rms_norm(x.storage.pointer, weight.storage.pointer, rows, features, 1e-5, &expected)
        #expect(zip(output.scalars, expected).filter { $0.bitPattern != $1.bitPattern }.count == 0)
    }

    /// Other activations (GELU's tanh form for Gemma) are the scalar definition exactly, in one thread for a few rows
    /// and split among the cores for a prompt's many.
    @Test(arguments: [3, 70])
    func gatedGeluIsItsDefinitionElementByElement(rows: Int) {
        let width = 1024
        let stacked = (0..<(rows * 2 * width)).map { Float(($0 * 7919) % 2003) / 2003 * 12 - 6 }
        let output = gatedActivation(Tensor(shape: [rows, 2 * width], scalars: stacked), activation: .geluTanh)
        #expect(output.shape == [rows, width])
        let expected = (0..<(rows * width)).map { index in
            let (row, column) = index.quotientAndRemainder(dividingBy: width)
            return Activation.geluTanh(stacked[row * 2 * width + column]) * stacked[row * 2 * width + width + column]
        }
        #expect(output.scalars.map(\.bitPattern) == expected.map(\.bitPattern))
    }

    /// torch.argmax's answers: the first of tied largest values (+0 and -0 tie), and the first NaN over any number.
    /// Lengths around the vector widths, so that each appears in the main loops and in the tails.
    @Test(arguments: [KernelPath.best, .scalar])
    func argmaxTakesTheFirstLargestOrTheFirstNaN(path: KernelPath) {
        func argmax(_ values: [Float]) -> Int { values.withUnsafeBufferPointer { VLMTensor.argmax($0, path: path) } }
        for count in [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 49_152] {
            let ramp = (0..<count).map { Float($0 % 5) - 4 }
            #expect(argmax(ramp) == min(4, count - 1), "\(count)")
            #expect(argmax(Array(repeating: -.infinity, count: count)) == 0, "\(count)")
            var zeros = Array(repeating: Float(-3), count: count)
            zeros[count - 1] = 0
            if count > 2 { zeros[count / 2] = -0.0 }
            #expect(argmax(zeros) == (count > 2 ? count / 2 : count - 1), "\(count)")
            var withNaN = ramp
            withNaN[count - 1] = .nan
            if count > 3 { withNaN[count - 3] = .nan }
            #expect(argmax(withNaN) == (count > 3 ? count - 3 : count - 1), "\(count)")
        }
        let tensor = Tensor(shape: [2, 3], scalars: [1, 5, 5, 7, -1, .nan])
        #expect(argmaxLastDimension(tensor) == [1, 2])
    }

    @Test func splitLastDimensionCutsEveryRow() {
        let x = Tensor(shape: [2, 5], scalars: (0..<10).map(Float.init))
        let parts = splitLastDimension(x, widths: [2, 3])
        #expect(parts.map(\.shape) == [[2, 2], [2, 3]])
        #expect(parts[0].scalars == [0, 1, 5, 6] && parts[1].scalars == [2, 3, 4, 7, 8, 9])
    }
}
