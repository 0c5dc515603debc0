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
}
