import Foundation
import Testing
@testable import VLMTensor

/// Linear layers built in bf16: what they compute is the fp32 sum of products of bf16-rounded inputs and weights.
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

    @Test func bfloat16LayersMultiplyRoundedOperands() throws {
        let c = try #require(fixtures.cases["linear_gelu_residual"])
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
        // And the rounding is real: fp32 products differ from these by far more than fp32's own error.
        let difference = zip(y.scalars, fp32(x, activation: .gelu, residual: residual).scalars).map { abs($0 - $1) }.max() ?? 0
        #expect(difference > 1e-4)
    }

    @Test func layersBuiltOutsideTheScopeStayFP32() throws {
        let c = try #require(fixtures.cases["linear_bias"])
        _ = try MatrixPrecision.$forNewLayers.withValue(.bfloat16) { try Linear(weight: c.input("weight"), bias: nil) }
        #expect(try Linear(weight: c.input("weight"), bias: nil).precision == .float32)
    }
}
