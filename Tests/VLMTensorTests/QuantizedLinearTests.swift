import CVLMKernels
import Foundation
import Testing
@testable import VLMTensor

/// Tests/Fixtures/gguf/matmul.json, written by oracle/gguf_files.py: per format a 37-row matrix of random blocks,
/// 17 activation rows, and their product with gguf-py's dequantization of the blocks, in float64.
private struct MatmulCase {
    let format: QuantizationFormat
    let matrix: QuantizedMatrix
    let x: [Float]
    let y: [Double]

    static let all: [MatmulCase] = {
        var url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) { url.deleteLastPathComponent() }
        let file = url.appendingPathComponent("Tests/Fixtures/gguf/matmul.json")
        guard let data = try? Data(contentsOf: file),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: [String: Any]] else {
            fatalError("cannot read \(file.path)")
        }
        return QuantizationFormat.allCases.map { format in
            guard let entry = object[format.description], let rows = entry["rows"] as? Int, let columns = entry["columns"] as? Int,
                  let blocks = (entry["blocks"] as? String).flatMap({ Data(base64Encoded: $0) }) as NSData?,
                  let xBytes = (entry["x"] as? String).flatMap({ Data(base64Encoded: $0) }), let y = entry["y"] as? [Double],
                  let matrix = try? QuantizedMatrix(format: format, rows: rows, columns: columns,
                                                    bytes: UnsafeRawBufferPointer(start: blocks.bytes, count: blocks.length), owner: blocks)
            else { fatalError("bad \(format) case in \(file.path)") }
            let x = xBytes.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
            return MatmulCase(format: format, matrix: matrix, x: x, y: y)
        }
    }()

    /// The first `rows` activation rows.
    func input(rows: Int) -> Tensor {
        Tensor(shape: [rows, matrix.columns], scalars: Array(x[0..<(rows * matrix.columns)]))
    }

    /// fp32 rounding bound for output (i, j): a small multiple of eps times Σ|x·w|.
    func tolerance(row: Int, column: Int, weight: Tensor) -> Double {
        let k = matrix.columns
        var magnitude = 0.0
        for c in 0..<k { magnitude += abs(Double(x[row * k + c]) * Double(weight.storage.pointer[column * k + c])) }
        return 1e-5 * magnitude + 1e-6
    }

    /// The largest error of a `[rows, matrix.rows]` product against the fixture, in tolerances.
    func worstError(of output: Tensor, rows: Int, weight: Tensor) -> Double {
        let n = matrix.rows
        var worst = 0.0
        for i in 0..<rows {
            for j in 0..<n {
                let error = abs(Double(output.storage.pointer[i * n + j]) - y[i * n + j])
                worst = max(worst, error / tolerance(row: i, column: j, weight: weight))
            }
        }
        return worst
    }
}

/// Every kernel path and backend; on the best path also the fp32 decoding kernels that CPUs without the int8 ones
/// (AVX-512 VNNI) run.
private func pathsAndBackends() -> [(path: KernelPath, backend: Backend, packing: Bool)] {
    [(KernelPath.best, true), (.best, false), (.scalar, true)].flatMap { path, packing in
        Backend.allCases.map { (path, $0, packing) }
    }
}

@Suite struct QuantizedLinearTests {
    /// 1, 3 and 4 rows run the int8 products on packed weights (every format, where the CPU has them), otherwise the
    /// in-register kernel for 1 row and the chunked one for 3 and 4; 5 and 17 the dequantized panels.
    @Test(arguments: QuantizationFormat.allCases)
    func productMatchesTheDequantizedFloat64Product(format: QuantizationFormat) throws {
        let test = try #require(MatmulCase.all.first { $0.format == format })
        let weight = test.matrix.dequantized()
        let n = test.matrix.rows
        for (path, backend, packing) in pathsAndBackends() {
            let layer = QuantizedLinear(weight: test.matrix, bias: nil, backend: backend, packing: packing)
            for rows in [1, 3, 4, 5, 17] {
                let output = Tensor(uninitialized: [rows, n])
                layer.apply(test.input(rows: rows), rows: rows, activation: .identity, residual: nil, into: output, path: path)
                let worst = test.worstError(of: output, rows: rows, weight: weight)
                #expect(worst <= 1, "\(format) \(path) \(backend) packing \(packing) rows \(rows): error \(worst) tolerances")
            }
        }
    }

    /// The AVX2 packed products, which CPUs with AVX-512 VNNI never pick for a layer, on the same packed weights and
    /// fixed-point activations.
    @Test(arguments: QuantizationFormat.allCases)
    func avx2PackedProductMatchesTheDequantizedFloat64Product(format: QuantizationFormat) throws {
        let test = try #require(MatmulCase.all.first { $0.format == format })
        var matrix = test.matrix.kernelMatrix
        let (n, k) = (test.matrix.rows, test.matrix.columns)
        let size = vlm_quant_packed_size(matrix.format, n, k)
        guard size > 0, vlm_quant_packed_supported() != 0 else { return }
        let packed = OwnedBytes(count: size)
        vlm_quant_pack(&matrix, packed.pointer)
        let weight = test.matrix.dequantized()
        for rows in [1, 3] {
            let x = test.input(rows: rows), activationBytes = vlm_quant_activation_size(k)
            let activations = OwnedBytes(count: rows * activationBytes)
            for row in 0..<rows { vlm_quant_activation(x.storage.pointer + row * k, k, activations.pointer + row * activationBytes) }
            let output = Tensor(uninitialized: [rows, n])
            vlm_quant_packed_matmul(packed.pointer, matrix.format, n, k, activations.pointer, rows, output.storage.pointer, n,
                                    0, (n + 15) / 16, VLM_ISA_AVX2)
            let worst = test.worstError(of: output, rows: rows, weight: weight)
            #expect(worst <= 1, "\(format) rows \(rows): error \(worst) tolerances")
        }
        withExtendedLifetime(test.matrix) {}
    }

    /// Layers in different formats over one decoding row (q, k and v of a Q4_K_M file) run as one parallel region:
    /// each output as the layer gives it alone, biases included.
    @Test func layersInDifferentFormatsDecodeTogetherAsEachAlone() throws {
        let cases = try [QuantizationFormat.q4_0, .q5_0, .q8_0].map { format in try #require(MatmulCase.all.first { $0.format == format }) }
        let layers = try cases.enumerated().map { index, test in
            try Linear(weight: .quantized(test.matrix),
                       bias: index == 1 ? nil : Tensor(shape: [test.matrix.rows], scalars: (0..<test.matrix.rows).map { Float($0) / 8 }))
        }
        let x = cases[0].input(rows: 1)
        guard let together = Linear.together(layers, x) else {
            #expect(vlm_quant_packed_supported() == 0, "only a CPU without the packed products runs them apart")
            return
        }
        #expect(together.count == 3)
        for (layer, output) in zip(layers, together) {
            #expect(output.shape == [1, layer.outFeatures])
            #expect(output.scalars == layer(x).scalars)
        }
        // More than one row, or a layer that is not quantized: each layer on its own.
        #expect(Linear.together(layers, cases[0].input(rows: 2)) == nil)
        let dense = try Linear(weight: Tensor(shape: [2, 320], scalars: Array(repeating: 0.5, count: 640)), bias: nil)
        #expect(Linear.together([layers[0], dense], x) == nil)
    }

    /// Decoding (one activation row) reads a tall matrix as several streams of groups per thread: the fixture's 37
    /// rows stacked 17 times (629 rows: 40 groups of 16, the last partial) give its product in every copy.
    @Test(arguments: QuantizationFormat.allCases)
    func decodingStreamsEveryGroupOfATallMatrix(format: QuantizationFormat) throws {
        let test = try #require(MatmulCase.all.first { $0.format == format })
        let tall = try #require(QuantizedMatrix.stacking(Array(repeating: test.matrix, count: 17)))
        let weight = test.matrix.dequantized()
        let (n, copies) = (test.matrix.rows, 17)
        for backend in Backend.allCases {
            let layer = QuantizedLinear(weight: tall, bias: nil, backend: backend)
            let output = Tensor(uninitialized: [1, n * copies])
            layer.apply(test.input(rows: 1), rows: 1, activation: .identity, residual: nil, into: output, path: .best)
            var worst = 0.0
            for j in 0..<(n * copies) {
                let error = abs(Double(output.storage.pointer[j]) - test.y[j % n])
                worst = max(worst, error / test.tolerance(row: 0, column: j % n, weight: weight))
            }
            #expect(worst <= 1, "\(format) \(backend): error \(worst) tolerances")
        }
    }

    /// Built in bf16, a prompt's products (17 rows: the dequantized panels) multiply the bf16-rounded input and
    /// dequantized weight, accumulated in fp32; decoding's products (1 row) stay as they are.
    @Test func bfloat16PromptsMultiplyRoundedOperands() throws {
        for test in MatmulCase.all where [.q4_K, .q8_0].contains(test.format) {
            let layer = MatrixPrecision.$forNewLayers.withValue(.bfloat16) {
                QuantizedLinear(weight: test.matrix, bias: nil, backend: .best)
            }
            let fp32 = QuantizedLinear(weight: test.matrix, bias: nil, backend: .best)
            #expect(fp32.precision == .float32)
            #expect(layer.precision == MatrixPrecision.bfloat16.available)
            let (n, k) = (test.matrix.rows, test.matrix.columns)
            let weight = test.matrix.dequantized().scalars
            for rows in [1, 17] {
                let x = test.input(rows: rows)
                let (output, reference) = (Tensor(uninitialized: [rows, n]), Tensor(uninitialized: [rows, n]))
                layer.apply(x, rows: rows, activation: .identity, residual: nil, into: output)
                fp32.apply(x, rows: rows, activation: .identity, residual: nil, into: reference)
                guard layer.precision == .bfloat16, rows > QuantizedLinear.packedRows else {
                    #expect(output.scalars == reference.scalars, "\(test.format) rows \(rows): as the fp32 layer")
                    continue
                }
                var worst = 0.0, largestDifference: Float = 0
                for i in 0..<rows {
                    for j in 0..<n {
                        var sum = 0.0, magnitude = 0.0
                        for c in 0..<k {
                            let product = MatrixPrecisionTests.bfloat16(test.x[i * k + c]) * MatrixPrecisionTests.bfloat16(weight[j * k + c])
                            sum += product
                            magnitude += abs(product)
                        }
                        worst = max(worst, abs(Double(output.storage.pointer[i * n + j]) - sum) / (1e-5 * magnitude + 1e-6))
                        largestDifference = max(largestDifference, abs(output.storage.pointer[i * n + j] - reference.storage.pointer[i * n + j]))
                    }
                }
                #expect(worst <= 1, "\(test.format): error \(worst) tolerances from the bf16-rounded product")
                // The rounding is real: the fp32 layer's products differ by far more than fp32's own error.
                #expect(largestDifference > 1e-3, "\(test.format): \(largestDifference)")
            }
        }
    }

    /// Built in int8, a layer's products multiply the weight's blocks by the input quantized per 32-element block,
    /// `round(x·127/max|x|)` ties to even on the scale max|x|/127, whatever the number of rows, and a row's outputs
    /// are the same bits alone (decoding) as beside others (a prompt, or decoding rows batched). The fixture's 37
    /// weight rows four times over make 10 groups, so one row runs both the four-stream product and single groups;
    /// 1 to 19 rows reach every tile shape (1 to 4 rows by one or two 16-row groups).
    @Test func int8ProductsMultiplyBlockQuantizedActivations() throws {
        for test in MatmulCase.all {
            let matrix = test.matrix.permutingRows((0..<(4 * 37)).map { $0 % 37 })
            let layer = MatrixPrecision.$forNewLayers.withValue(.int8) {
                QuantizedLinear(weight: matrix, bias: nil, backend: .best)
            }
            let fp32 = QuantizedLinear(weight: matrix, bias: nil, backend: .best)
            let packs = vlm_quant_packed_size(test.format.kernelFormat, matrix.rows, matrix.columns) > 0
            let runsInt8 = MatrixPrecision.int8.available == .int8 && packs && vlm_quant_int8_supported() != 0
            #expect(layer.precision == (runsInt8 ? .int8 : .float32), "\(test.format)")
            let (n, k) = (matrix.rows, matrix.columns)
            let weight = matrix.dequantized().scalars
            for rows in [1, 2, 5, 16, 17, 18, 19] {
                // The fixture's 17 rows, then its first ones again; a NaN in row 5 of the longer inputs.
                var scalars = (0..<(rows * k)).map { test.x[$0 % (17 * k)] }
                if rows > 17 { scalars[5 * k + 40] = .nan }
                let x = Tensor(shape: [rows, k], scalars: scalars)
                let (output, reference) = (Tensor(uninitialized: [rows, n]), Tensor(uninitialized: [rows, n]))
                layer.apply(x, rows: rows, activation: .identity, residual: nil, into: output)
                fp32.apply(x, rows: rows, activation: .identity, residual: nil, into: reference)
                guard runsInt8 else {
                    #expect(output.scalars.map(\.bitPattern) == reference.scalars.map(\.bitPattern),
                            "\(test.format) rows \(rows): as the fp32 layer")
                    continue
                }
                var worst = 0.0, largestDifference: Float = 0
                for i in 0..<rows {
                    let row = Array(scalars[(i * k)..<((i + 1) * k)])
                    let alone = Tensor(uninitialized: [1, n])
                    layer.apply(Tensor(shape: [1, k], scalars: row), rows: 1, activation: .identity, residual: nil,
                                into: alone)
                    let differing = (0..<n).filter {
                        alone.storage.pointer[$0].bitPattern != output.storage.pointer[i * n + $0].bitPattern
                    }.count
                    #expect(differing == 0, "\(test.format) rows \(rows): row \(i) alone differs in \(differing) outputs")
                    let quantized = Self.blockQuantized(row)
                    for j in 0..<n {
                        let actual = output.storage.pointer[i * n + j]
                        if i == 5 && rows > 17 {
                            #expect(actual.isNaN, "\(test.format): a NaN input gives NaN outputs")
                            continue
                        }
                        var sum = 0.0, magnitude = 0.0
                        for c in 0..<k {
                            let product = Double(quantized[c]) * Double(weight[j * k + c])
                            sum += product
                            magnitude += abs(product)
                        }
                        worst = max(worst, abs(Double(actual) - sum) / (1e-5 * magnitude + 1e-6))
                        largestDifference = max(largestDifference, abs(actual - reference.storage.pointer[i * n + j]))
                    }
                }
                #expect(worst <= 1, "\(test.format) rows \(rows): error \(worst) tolerances from the int8 product")
                // The quantization is real: the fp32 layer's products differ by far more than fp32's own error.
                #expect(largestDifference > 1e-3, "\(test.format) rows \(rows): \(largestDifference)")
            }
        }
    }

    /// `x` as the int8 products see it: each 32-element block's digits times its scale.
    private static func blockQuantized(_ x: [Float]) -> [Float] {
        stride(from: 0, to: x.count, by: 32).flatMap { start -> [Float] in
            let block = x[start..<(start + 32)]
            let largest = block.map(abs).max()!
            guard largest > 0 else { return Array(repeating: 0, count: 32) }
            let (scale, inverse) = (largest / 127, 127 / largest)
            return block.map { ($0 * inverse).rounded(.toNearestOrEven) * scale }
        }
    }

    @Test func biasActivationAndResidualMatchTheDenseLayer() throws {
        for test in MatmulCase.all where [.q4_1, .q6_K].contains(test.format) {
            let n = test.matrix.rows
            let bias = Tensor(shape: [n], scalars: (0..<n).map { Float($0 % 7) * 0.25 - 0.5 })
            let dense = try Linear(weight: test.matrix.dequantized(), bias: bias)
            let quantized = try Linear(weight: .quantized(test.matrix), bias: bias)
            for rows in [1, 9] {
                let x = test.input(rows: rows)
                let residual = Tensor(shape: [rows, n], scalars: (0..<(rows * n)).map { Float($0 % 5) - 2 })
                let expected = dense(x, activation: .silu, residual: residual)
                let actual = quantized(x, activation: .silu, residual: residual)
                let worst = zip(expected.scalars, actual.scalars).map { abs($0 - $1) / (1 + abs($0)) }.max() ?? 0
                #expect(worst < 1e-4, "\(test.format) rows \(rows): \(worst)")
            }
        }
    }

    @Test func embeddingRowsAndPermutedRowsAreTheDequantizedRows() throws {
        for test in MatmulCase.all {
            let full = test.matrix.dequantized().scalars
            let k = test.matrix.columns
            func row(_ index: Int) -> [Float] { Array(full[(index * k)..<((index + 1) * k)]) }
            #expect(test.matrix.rows([36, 0, 5]).scalars == row(36) + row(0) + row(5), "\(test.format)")
            let permuted = test.matrix.permutingRows([2, 0, 1])
            #expect(permuted.rows == 3 && permuted.dequantized().scalars == row(2) + row(0) + row(1), "\(test.format)")
            #expect(test.matrix.dequantized(path: .scalar).scalars == full, "\(test.format): portable dequantizer")
        }
    }

    @Test func badLayoutsAreRefused() throws {
        let bytes = NSData(data: Data(count: 40))
        let buffer = UnsafeRawBufferPointer(start: bytes.bytes, count: bytes.length)
        #expect(throws: QuantizedMatrixError.self) {
            try QuantizedMatrix(format: .q4_1, rows: 1, columns: 48, bytes: buffer, owner: bytes)
        }
        #expect(throws: QuantizedMatrixError.self) {
            try QuantizedMatrix(format: .q4_1, rows: 3, columns: 32, bytes: buffer, owner: bytes)
        }
        #expect(try QuantizedMatrix(format: .q4_1, rows: 2, columns: 32, bytes: buffer, owner: bytes).rowBytes == 20)
    }
}
