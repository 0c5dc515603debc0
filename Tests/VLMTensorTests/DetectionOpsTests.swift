import Testing
@testable import VLMTensor

/// OWL-ViT's head ops against PyTorch (oracle/detection_ops.py); ELU runs in OperationTests' activation cases.
@Suite struct DetectionOpsTests {
    let fixtures = OpFixtures.shared

    @Test func l2NormalizedWithEpsilonMatchesTorch() throws {
        let c = try #require(fixtures.cases["l2_normalized_epsilon"])
        let y = l2Normalized(c.input("x"), epsilon: try #require(c.params.eps))
        expectClose(y, c.output(), "l2Normalized(epsilon:)", tolerance: 1e-6)
        #expect(y.scalars[(1 * 5 + 2) * 24..<((1 * 5 + 3) * 24)].allSatisfy { $0 == 0 }, "a zero row stays zero")
    }

    @Test func multiplyingTokensMatchesTorch() throws {
        let c = try #require(fixtures.cases["multiplying_tokens"])
        expectClose(multiplyingTokens(c.input("x"), by: c.input("factors")), c.output(), "multiplyingTokens", tolerance: 0)
    }

    @Test func shiftedAndScaledMatchesTorch() throws {
        let c = try #require(fixtures.cases["shifted_and_scaled"])
        let y = shiftedAndScaled(c.input("x"), shift: c.input("shift"), scale: c.input("scale"))
        expectClose(y, c.output(), "shiftedAndScaled", tolerance: 0)
    }
}
