import Testing
@testable import VLMTensor

@Suite struct OperationTests {
    let fixtures = OpFixtures.shared

    @Test(arguments: OpFixtures.names(op: "layerNorm"), [KernelPath.vector, .scalar])
    func layerNormMatchesTorch(name: String, path: KernelPath) throws {
        let c = try #require(fixtures.cases[name])
        let y = layerNorm(c.input("x"), weight: c.input("weight"), bias: c.input("bias"), eps: try #require(c.params.eps), path: path)
        expectClose(y, c.output(), "\(name) \(path)", tolerance: 1e-6)
    }

    @Test(arguments: OpFixtures.names(op: "activation"), Backend.allCases)
    func activationMatchesTorch(name: String, backend: Backend) throws {
        let c = try #require(fixtures.cases[name])
        let y = activation(c.input("x"), activationNamed(try #require(c.params.activation)), backend: backend)
        expectClose(y, c.output(), "\(name) \(backend)")
    }

    /// torch's quick_gelu is x·sigmoid(1.702·x): the sigmoid checked against it, on each backend.
    @Test(arguments: Backend.allCases)
    func sigmoidMatchesTorchsQuickGelu(backend: Backend) throws {
        let c = try #require(fixtures.cases["activation_quickGelu"])
        let x = c.input("x")
        let y = multiply(activation(scaled(x, by: 1.702), .sigmoid, backend: backend), x)
        expectClose(y, c.output(), "sigmoid \(backend)")
    }

    @Test func identityActivationReturnsInput() throws {
        let x = Tensor(shape: [2, 2], scalars: [1, -2, 3, -4])
        #expect(activation(x, .identity).scalars == x.scalars)
    }

    @Test(arguments: Backend.allCases)
    func softmaxMatchesTorch(backend: Backend) throws {
        let c = try #require(fixtures.cases["softmax"])
        expectClose(softmax(c.input("x"), backend: backend), c.output(), "softmax \(backend)")
    }

    @Test(arguments: Backend.allCases)
    func scaledMatchesTorch(backend: Backend) throws {
        let c = try #require(fixtures.cases["scaled"])
        expectClose(scaled(c.input("x"), by: try #require(c.params.factor), backend: backend), c.output(), "scaled \(backend)")
    }

    @Test(arguments: OpFixtures.names(op: "add"), Backend.allCases)
    func addMatchesTorch(name: String, backend: Backend) throws {
        let c = try #require(fixtures.cases[name])
        expectClose(add(c.input("a"), c.input("b"), backend: backend), c.output(), "\(name) \(backend)")
    }

    @Test func l2NormalizedMatchesTorch() throws {
        let c = try #require(fixtures.cases["l2_normalize"])
        expectClose(l2Normalized(c.input("x")), c.output(), "l2Normalized")
    }

    @Test(arguments: OpFixtures.names(op: "matmul"), Backend.allCases)
    func matmulMatchesTorch(name: String, backend: Backend) throws {
        let c = try #require(fixtures.cases[name])
        let y = matmul(c.input("a"), c.input("b"), transposeB: try #require(c.params.transposeB as Bool?), backend: backend)
        expectClose(y, c.output(), "\(name) \(backend)")
    }

    @Test func embeddingMatchesTorch() throws {
        let c = try #require(fixtures.cases["embedding"])
        expectClose(embedding(c.input("table"), ids: try #require(c.params.ids)), c.output(), "embedding", tolerance: 0)
    }

    @Test(arguments: OpFixtures.names(op: "concatenate"))
    func concatenateMatchesTorch(name: String) throws {
        let c = try #require(fixtures.cases[name])
        let parts = (0..<c.inputs.count).map { c.input("part\($0)") }
        expectClose(concatenate(parts, axis: try #require(c.params.axis)), c.output(), name, tolerance: 0)
    }

    @Test func gatherTokensMatchesTorch() throws {
        let c = try #require(fixtures.cases["gather_tokens"])
        expectClose(gatherTokens(c.input("x"), positions: try #require(c.params.positions)), c.output(), "gatherTokens", tolerance: 0)
    }

    /// masked_scatter over rows: the marked rows take the source's rows in order, the others stay.
    @Test func replacingRowsScattersInOrder() {
        let x = Tensor(shape: [2, 3, 2], scalars: (0..<12).map(Float.init))
        let source = Tensor(shape: [1, 3, 2], scalars: [-1, -2, -3, -4, -5, -6])
        let y = replacingRows(of: x, at: [1, 3, 4], with: source)
        #expect(y.shape == [2, 3, 2])
        #expect(y.scalars == [0, 1, -1, -2, 4, 5, -3, -4, -5, -6, 10, 11])
        #expect(x.scalars == (0..<12).map(Float.init))
        #expect(replacingRows(of: x, at: [], with: Tensor(zeros: [0, 2])).scalars == x.scalars)
    }

    @Test(arguments: Backend.allCases)
    func emptyTensorsPassThrough(backend: Backend) {
        let empty = Tensor(zeros: [0, 8])
        #expect(softmax(empty, backend: backend).shape == [0, 8])
        #expect(matmul(Tensor(zeros: [3, 0]), Tensor(zeros: [0, 2]), transposeB: false, backend: backend).scalars == [Float](repeating: 0, count: 6))
        #expect(layerNorm(empty, weight: Tensor(zeros: [8]), bias: Tensor(zeros: [8]), eps: 1e-5).shape == [0, 8])
        #expect(embedding(Tensor(zeros: [4, 8]), ids: []).shape == [0, 8])
    }

    @Test(arguments: OpFixtures.names(op: "interpolate"))
    func interpolateMatchesTorch(name: String) throws {
        let c = try #require(fixtures.cases[name])
        let mode: InterpolationMode = try #require(c.params.mode) == "bicubic" ? .bicubic : .bilinear
        let y = interpolate(c.input("x"), height: try #require(c.params.height), width: try #require(c.params.width), mode: mode)
        expectClose(y, c.output(), name)
    }

    /// Resizing to the same size reads every pixel back: the taps fall exactly on the source pixels.
    @Test(arguments: [InterpolationMode.bilinear, .bicubic])
    func interpolateToTheSameSizeIsIdentity(mode: InterpolationMode) {
        let x = Tensor(shape: [2, 3, 5], scalars: (0..<30).map { Float($0 * $0 % 7) - 2.5 })
        #expect(interpolate(x, height: 3, width: 5, mode: mode).scalars == x.scalars)
    }

    @Test func modulatedMatchesTorch() throws {
        let c = try #require(fixtures.cases["modulated"])
        expectClose(modulated(c.input("x"), scale: c.input("scale"), shift: c.input("shift")), c.output(), "modulated")
    }

    @Test func channelsFirstMatchesTorch() throws {
        let c = try #require(fixtures.cases["channels_first"])
        #expect(channelsFirst(c.input("x")).shape == c.output().shape)
        #expect(channelsFirst(c.input("x")).scalars == c.output().scalars)
    }
}

