import Synchronization
import Foundation
import Testing
@testable import VLMTensor

@Suite struct LayerTests {
    let fixtures = OpFixtures.shared

    @Test(arguments: OpFixtures.names(op: "linear"), Backend.allCases)
    func linearMatchesTorch(name: String, backend: Backend) throws {
        let c = try #require(fixtures.cases[name])
        let layer = try Linear(weight: c.input("weight"), bias: c.optionalInput("bias"), backend: backend)
        let y = layer(c.input("x"), activation: activationNamed(try #require(c.params.activation)), residual: c.optionalInput("residual"))
        expectClose(y, c.output(), "\(name) \(backend)")
    }

    /// One row and then all rows through the same layer: the weights packed once serve every row count.
    @Test(arguments: Backend.allCases)
    func linearServesEveryRowCount(backend: Backend) throws {
        let c = try #require(fixtures.cases["linear_bias"])
        let layer = try Linear(weight: c.input("weight"), bias: c.input("bias"), backend: backend)
        #expect(layer.inFeatures == 64 && layer.outFeatures == 96)
        let x = c.input("x").reshaped([-1, 64])
        let expected = c.output().reshaped([-1, 96])
        for rows in [1, 5, x.shape[0]] {
            let head = Tensor(shape: [rows, 64], scalars: Array(x.scalars[..<(rows * 64)]))
            let wanted = Tensor(shape: [rows, 96], scalars: Array(expected.scalars[..<(rows * 96)]))
            expectClose(layer(head), wanted, "linear on \(rows) rows, \(backend)")
        }
    }

    /// Each row alone, as a decoding step multiplies it: on AVX-512 machines one fp32 row goes through our own
    /// product over oneDNN's packed weight (`vlm_panel_matvec`), its epilogue ours too.
    @Test(arguments: OpFixtures.names(op: "linear"), Backend.allCases)
    func linearOfOneRowMatchesTorch(name: String, backend: Backend) throws {
        let c = try #require(fixtures.cases[name])
        let weight = c.input("weight")
        let (k, n) = (weight.shape[1], weight.shape[0])
        let layer = try Linear(weight: weight, bias: c.optionalInput("bias"), backend: backend)
        let activation = activationNamed(try #require(c.params.activation))
        let x = c.input("x").reshaped([-1, k]), expected = c.output().reshaped([-1, n])
        let residual = c.optionalInput("residual")?.reshaped([-1, n])
        for row in 0..<x.shape[0] {
            func rowOf(_ t: Tensor, _ width: Int) -> Tensor {
                Tensor(shape: [1, width], scalars: Array(t.scalars[(row * width)..<((row + 1) * width)]))
            }
            let y = layer(rowOf(x, k), activation: activation, residual: residual.map { rowOf($0, n) })
            expectClose(y, rowOf(expected, n), "\(name) row \(row) alone, \(backend)")
        }
    }

    @Test(arguments: Backend.allCases)
    func linearIsSafeToShareBetweenTasks(backend: Backend) async throws {
        let c = try #require(fixtures.cases["linear_gelu_residual"])
        let layer = try Linear(weight: c.input("weight"), bias: c.input("bias"), backend: backend)
        let (x, residual, expected) = (c.input("x"), c.input("residual"), c.output())
        let results = await withTaskGroup(of: Tensor.self) { group in
            for _ in 0..<8 { group.addTask { layer(x, activation: .gelu, residual: residual) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        for result in results { expectClose(result, expected, "concurrent linear, \(backend)") }
    }

    @Test func linearRejectsWrongRanks() {
        #expect(throws: LayerError.self) { try Linear(weight: Tensor(zeros: [4]), bias: nil) }
        #expect(throws: LayerError.self) { try Linear(weight: Tensor(zeros: [4, 3]), bias: Tensor(zeros: [3])) }
    }

    @Test(arguments: OpFixtures.names(op: "conv2d"), Backend.allCases)
    func conv2dMatchesTorch(name: String, backend: Backend) throws {
        let c = try #require(fixtures.cases[name])
        let layer = try Conv2d(weight: c.input("weight"), bias: c.optionalInput("bias"),
                               stride: try #require(c.params.stride), padding: try #require(c.params.padding), backend: backend)
        expectClose(layer(c.input("x")), c.output("y"), "\(name) \(backend)")
        expectClose(layer(c.input("x"), channelsLast: true), c.output("y_channels_last"), "\(name) \(backend) channels last")
    }

    @Test func conv2dRejectsBadWeights() {
        #expect(throws: LayerError.self) { try Conv2d(weight: Tensor(zeros: [4, 3, 3]), bias: nil, stride: 1, padding: 0) }
        #expect(throws: LayerError.self) { try Conv2d(weight: Tensor(zeros: [4, 3, 3, 3]), bias: Tensor(zeros: [3]), stride: 1, padding: 0) }
        #expect(throws: LayerError.self) { try Conv2d(weight: Tensor(zeros: [4, 3, 3, 3]), bias: nil, stride: 0, padding: 0) }
    }

    @Test(arguments: OpFixtures.names(op: "convTranspose2d"), Backend.allCases)
    func convTranspose2dMatchesTorch(name: String, backend: Backend) throws {
        let c = try #require(fixtures.cases[name])
        let layer = try ConvTranspose2d(weight: c.input("weight"), bias: c.optionalInput("bias"),
                                        stride: try #require(c.params.stride), padding: try #require(c.params.padding),
                                        backend: backend)
        expectClose(layer(c.input("x")), c.output(), "\(name) \(backend)")
        // A second batch size reuses the packed weights with a primitive of its own.
        let x = c.input("x"), expected = c.output()
        let first = Tensor(shape: [1] + x.shape.dropFirst(), scalars: Array(x.scalars[..<(x.count / 2)]))
        let wanted = Tensor(shape: [1] + expected.shape.dropFirst(), scalars: Array(expected.scalars[..<(expected.count / 2)]))
        expectClose(layer(first), wanted, "\(name) \(backend), one item")
    }

    @Test func convTranspose2dRejectsBadWeights() {
        #expect(throws: LayerError.self) { try ConvTranspose2d(weight: Tensor(zeros: [4, 3, 3]), bias: nil, stride: 1) }
        #expect(throws: LayerError.self) { try ConvTranspose2d(weight: Tensor(zeros: [4, 3, 3, 3]), bias: Tensor(zeros: [4]), stride: 1) }
        #expect(throws: LayerError.self) { try ConvTranspose2d(weight: Tensor(zeros: [4, 3, 3, 3]), bias: nil, stride: 0) }
    }

    /// A layer first run on one thread and then on a fresh one: oneDNN's own scratchpad belongs to the thread that
    /// created the primitive, so the second thread must not need it (a convolution of CLIPSeg's refined decoder
    /// crashed there before the scratchpad was ours). The portable backend gives the expected values.
    @Test(arguments: [false, true])
    func oneDNNLayersRunOnAnyThread(transposed: Bool) throws {
        func values(_ count: Int, _ seed: Int) -> [Float] { (0..<count).map { Float(($0 * 7919 + seed) % 201) / 100 - 1 } }
        let x = Tensor(shape: [4, 16, 4, 4], scalars: values(4 * 16 * 16, 3))
        let apply: @Sendable (Tensor) -> Tensor, reference: Tensor
        if transposed {
            let (weight, bias) = (Tensor(shape: [16, 8, 4, 4], scalars: values(16 * 8 * 16, 5)), Tensor(shape: [8], scalars: values(8, 7)))
            let layer = try ConvTranspose2d(weight: weight, bias: bias, stride: 4)
            reference = try ConvTranspose2d(weight: weight, bias: bias, stride: 4, padding: 0, backend: .portable)(x)
            apply = { layer($0) }
        } else {
            let (weight, bias) = (Tensor(shape: [16, 16, 3, 3], scalars: values(16 * 16 * 9, 5)), Tensor(shape: [16], scalars: values(16, 7)))
            let layer = try Conv2d(weight: weight, bias: bias, stride: 1, padding: 1)
            reference = try Conv2d(weight: weight, bias: bias, stride: 1, padding: 1, backend: .portable)(x)
            apply = { layer($0) }
        }
        expectClose(apply(x), reference, "on the first thread")
        let done = DispatchSemaphore(value: 0)
        let result = Mutex<Tensor?>(nil)
        let thread = Thread {
            result.withLock { $0 = apply(x) }
            done.signal()
        }
        thread.start()
        done.wait()
        expectClose(try #require(result.withLock { $0 }), reference, "on a fresh thread")
    }
}

