import CVLMKernels
import Foundation
import Testing
@testable import VLMTensor

/// Linear layers built in bf16 or int8: what they compute is the sum of products of the rounded (bf16) or quantized
/// (int8) inputs and weights, to fp32 rounding.
@Suite struct MatrixPrecisionTests {
    let fixtures = OpFixtures.shared

    /// `value` rounded to the nearest bf16, ties to even, as oneDNN's and PyTorch's conversions round.
    static func bfloat16(_ value: Float) -> Double {
        let bits = value.bitPattern
        let rounded = (bits &+ 0x7FFF &+ ((bits >> 16) & 1)) & 0xFFFF_0000
        return Double(Float(bitPattern: rounded))
    }

    @Test func bfloat16RoundsNearestEven() {
        let step = 1.0 / 128  // bf16's spacing between 1 and 2
        #expect(Self.bfloat16(Float(1 + step / 2)) == 1)  // halfway between 1 and 1 + step: to the even 1
        #expect(Self.bfloat16(Float(1 + 3 * step / 2)) == 1 + 2 * step)  // halfway, to the even 1 + 2·step
        #expect(Self.bfloat16(Float(1 + 0.51 * step)) == 1 + step)
    }

    /// An embedding table beside bf16 layers is held in bf16 (rows of whole 32-value blocks), its rows the table's
    /// values rounded to nearest even; beside fp32 layers, or with rows of another length, it stays the fp32 tensor.
    @Test func embeddingTablesFollowTheLayersPrecision() {
        let values = (0..<(5 * 64)).map { Float(sin(Double($0) * 0.37)) * 3 }
        let table = Tensor(shape: [5, 64], scalars: values)
        let lowered = MatrixPrecision.$forNewLayers.withValue(.bfloat16) { WeightMatrix.embeddingTable(table) }
        if MatrixPrecision.bfloat16.available == .bfloat16 {
            guard case let .quantized(matrix) = lowered else { Issue.record("a bf16 table stayed fp32"); return }
            #expect(matrix.format == .bf16)
        }
        let rows = lowered.rows([4, 0, 2]).scalars
        for (index, source) in [4, 0, 2].enumerated() {
            for column in 0..<64 {
                let value = values[source * 64 + column]
                let expected = MatrixPrecision.bfloat16.available == .bfloat16 ? Self.bfloat16(value) : Double(value)
                #expect(Double(rows[index * 64 + column]) == expected, "row \(source) column \(column)")
            }
        }
        if case .quantized = WeightMatrix.embeddingTable(table) { Issue.record("an fp32 table was lowered") }
        let narrow = Tensor(shape: [2, 16], scalars: Array(values[0..<32]))
        if case .quantized = MatrixPrecision.$forNewLayers.withValue(.bfloat16, operation: { WeightMatrix.embeddingTable(narrow) }) {
            Issue.record("a table with 16-value rows was lowered")
        }
    }

    /// All rows at once (oneDNN's bf16 matmul) and each row alone (on AVX512-BF16 machines our own product over
    /// oneDNN's packed weight, `vlm_panel_matvec_bf16`; an odd input width leaves half a row pair).
    @Test(arguments: ["linear_gelu_residual", "linear_odd_sizes_gelu_residual"])
    func bfloat16LayersMultiplyRoundedOperands(name: String) throws {
        let c = try #require(fixtures.cases[name])
        let (weight, bias, x, residual) = (c.input("weight"), c.input("bias"), c.input("x"), c.input("residual"))
        let layer = try MatrixPrecision.$forNewLayers.withValue(.bfloat16) { try Linear(weight: weight, bias: bias) }
        let fp32 = try Linear(weight: weight, bias: bias)
        #expect(fp32.precision == .float32)
        #expect(layer.precision == MatrixPrecision.bfloat16.available)
        let y = layer(x, activation: .gelu, residual: residual)
        guard layer.precision == .bfloat16 else {
            // No bf16 instructions here: the layer is the fp32 one.
            expectClose(y, fp32(x, activation: .gelu, residual: residual), "fp32 fallback")
            return
        }
        let (n, k) = (layer.outFeatures, layer.inFeatures)
        let rows = x.count / k
        let (xs, ws, bs, rs) = (x.scalars, weight.scalars, bias.scalars, residual.scalars)
        var expected = [Float](repeating: 0, count: rows * n)
        for row in 0..<rows {
            for column in 0..<n {
                var sum = Double(bs[column])
                for i in 0..<k { sum += Self.bfloat16(xs[row * k + i]) * Self.bfloat16(ws[column * k + i]) }
                let gelu = 0.5 * sum * (1 + erf(sum / 2.0.squareRoot()))
                expected[row * n + column] = Float(gelu) + rs[row * n + column]
            }
        }
        expectClose(y, Tensor(shape: y.shape, scalars: expected), "bf16 linear against bf16-rounded operands", tolerance: 2e-5)
        for row in 0..<rows {
            let alone = layer(Tensor(shape: [1, k], scalars: Array(xs[(row * k)..<((row + 1) * k)])), activation: .gelu,
                              residual: Tensor(shape: [1, n], scalars: Array(rs[(row * n)..<((row + 1) * n)])))
            expectClose(alone, Tensor(shape: [1, n], scalars: Array(expected[(row * n)..<((row + 1) * n)])),
                        "\(name) row \(row) alone in bf16", tolerance: 2e-5)
        }
        // And the rounding is real: fp32 products differ from these by far more than fp32's own error.
        let difference = zip(y.scalars, fp32(x, activation: .gelu, residual: residual).scalars).map { abs($0 - $1) }.max() ?? 0
        #expect(difference > 1e-4)
    }

    /// `values` in rows of `width`, each quantized as the int8 layers do: q = round(x·127/max|x|), scale max|x|/127.
    static func quantizedRows(_ values: [Float], width: Int) -> (q: [Int], scales: [Double]) {
        var q: [Int] = [], scales: [Double] = []
        for row in 0..<(values.count / width) {
            let slice = values[(row * width)..<((row + 1) * width)]
            let largest = slice.map(abs).max() ?? 0
            let inverse: Float = largest > 0 ? 127 / largest : 1
            scales.append(largest > 0 ? Double(largest / 127) : 1)
            q += slice.map { Int(($0 * inverse).rounded(.toNearestOrEven)) }
        }
        return (q, scales)
    }

    /// Widths: a tail after two vectors of 16; two blocks of four vectors (each with a running maximum of its own in
    /// the AVX-512 kernel) and a tail.
    @Test(arguments: [KernelPath.vector, .scalar], [37, 133])
    func rowQuantizationRoundsToNearestEvenOnTheRowsScale(path: KernelPath, width: Int) {
        let x: [Float] = (0..<(3 * width)).map { Float(sin(Double($0) * 0.7)) * Float($0 % 5) } + [Float](repeating: 0, count: width)
        var q = [CChar](repeating: 0, count: x.count)
        var scales = [Float](repeating: 0, count: 4)
        vlm_quantize_rows_int8(x, 4, width, &q, &scales, path.isa)
        let expected = Self.quantizedRows(x, width: width)
        #expect(q.map(Int.init) == expected.q)
        #expect(scales.map(Double.init) == expected.scales)
        #expect(scales[3] == 1 && q[(3 * width)...].allSatisfy { $0 == 0 })
        // A row with NaN or infinity: zeros and a NaN scale, so that the products it enters are NaN as in fp32.
        for bad in [Float.nan, .infinity] {
            for at in [0, 17, 33, 49, width - 1] where at < width {
                var row = [Float](repeating: 0.5, count: width)
                row[at] = bad
                var rowQ = [CChar](repeating: 1, count: width)
                var rowScale: Float = 0
                vlm_quantize_rows_int8(row, 1, width, &rowQ, &rowScale, path.isa)
                #expect(rowScale.isNaN && rowQ.allSatisfy { $0 == 0 }, "\(bad) at \(at)")
            }
        }
    }

    /// All rows at once (oneDNN's int8 matmul) and each row alone (on VNNI machines `vlm_int8_matvec` over oneDNN's
    /// plain weight; an odd input width leaves a group of rows short, an odd output width a panel).
    @Test(arguments: ["linear_gelu_residual", "linear_odd_sizes_gelu_residual"])
    func int8LayersMultiplyQuantizedOperandsExactly(name: String) throws {
        let c = try #require(fixtures.cases[name])
        let (weight, bias, x, residual) = (c.input("weight"), c.input("bias"), c.input("x"), c.input("residual"))
        let layer = try MatrixPrecision.$forNewLayers.withValue(.int8) { try Linear(weight: weight, bias: bias) }
        #expect(layer.precision == MatrixPrecision.int8.available)
        let y = layer(x, activation: .gelu, residual: residual)
        let fp32 = try Linear(weight: weight, bias: bias)(x, activation: .gelu, residual: residual)
        guard layer.precision == .int8 else {
            expectClose(y, fp32, "fp32 fallback")
            return
        }
        let (n, k) = (layer.outFeatures, layer.inFeatures)
        let rows = x.count / k
        let (qx, sx) = Self.quantizedRows(x.scalars, width: k)
        let (qw, sw) = Self.quantizedRows(weight.scalars, width: k)
        let (bs, rs) = (bias.scalars, residual.scalars)
        var expected = [Float](repeating: 0, count: rows * n)
        for row in 0..<rows {
            for column in 0..<n {
                var sum = 0
                for i in 0..<k { sum += qx[row * k + i] * qw[column * k + i] }
                let value = Double(sum) * sx[row] * sw[column] + Double(bs[column])
                expected[row * n + column] = Float(0.5 * value * (1 + erf(value / 2.0.squareRoot()))) + rs[row * n + column]
            }
        }
        expectClose(y, Tensor(shape: y.shape, scalars: expected), "int8 linear against quantized operands", tolerance: 2e-5)
        let difference = zip(y.scalars, fp32.scalars).map { abs($0 - $1) }.max() ?? 0
        #expect(difference > 1e-4)
        var poisoned = x.scalars
        poisoned[0] = .nan
        let poisonedRow = layer(Tensor(shape: x.shape, scalars: poisoned)).scalars[..<n]
        #expect(poisonedRow.allSatisfy { $0.isNaN })
        // Each row on its own scale: a row's result does not depend on the other rows of the batch, to the bit where
        // no activation follows (the same int32 sums, then the same scale and bias arithmetic), and within an ulp or
        // two through GELU (oneDNN's polynomial on the batch, Swift's erf on a row alone).
        let linear = layer(x, residual: residual)
        for row in 0..<rows {
            let input = Tensor(shape: [1, k], scalars: Array(x.scalars[(row * k)..<((row + 1) * k)]))
            let added = Tensor(shape: [1, n], scalars: Array(residual.scalars[(row * n)..<((row + 1) * n)]))
            #expect(layer(input, residual: added).scalars == Array(linear.scalars[(row * n)..<((row + 1) * n)]), "\(name) row \(row)")
            expectClose(layer(input, activation: .gelu, residual: added),
                        Tensor(shape: [1, n], scalars: Array(y.scalars[(row * n)..<((row + 1) * n)])), "\(name) row \(row) through GELU",
                        tolerance: 1e-6)
        }
    }

    @Test func layersBuiltOutsideTheScopeStayFP32() throws {
        let c = try #require(fixtures.cases["linear_bias"])
        _ = try MatrixPrecision.$forNewLayers.withValue(.bfloat16) { try Linear(weight: c.input("weight"), bias: nil) }
        #expect(try Linear(weight: c.input("weight"), bias: nil).precision == .float32)
    }
}
