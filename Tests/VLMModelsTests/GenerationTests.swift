import Foundation
import Testing
import VLMCheckpoint
@testable import VLMModels
import VLMTensor

/// Tests/Fixtures/generation, written by oracle/generation.py.
enum GenerationFixtures {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/generation")

    static func load<T: Decodable>(_ type: T.Type, _ name: String) throws -> T {
        try JSONDecoder().decode(type, from: Data(contentsOf: root.appendingPathComponent(name)))
    }

    struct Processors: Decodable {
        struct Case: Decodable {
            let config: GenerationConfig
            let processors: [String]
            let processed: [[Float?]]
        }
        let prompt_length: Int
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let scores: [[Float]]
        let cases: [Case]
    }

    /// Beam search cases: prompts (left-padded with id 0 here), the settings, and what transformers returned.
    struct Beams: Decodable {
        struct Case: Decodable {
            let config: GenerationConfig
            let sequences: [[Int]]
            let scores: [Float]
        }
        let prompts: [[Int]]
        let cases: [Case]
    }

    struct StopStrings: Decodable {
        let prompt: [Int]
        let stop_strings: [String]
        let max_new_tokens: Int
        let unstopped: [Int]
        let new_tokens: [Int]
    }
}

/// Left-pads `prompts` with `pad`: ids and attention mask.
func leftPadded(_ prompts: [[Int]], pad: Int = 0) -> (ids: [[Int]], mask: [[Int]]) {
    let length = prompts.map(\.count).max() ?? 0
    return (prompts.map { Array(repeating: pad, count: length - $0.count) + $0 },
            prompts.map { Array(repeating: 0, count: length - $0.count) + Array(repeating: 1, count: $0.count) })
}

/// Runs beam search with `config` on left-padded `prompts` and compares with transformers' sequences (new tokens of
/// each returned sequence) and `sequences_scores`. Reusable for any decoder's recorded beam outputs.
func expectBeamSearch(_ model: any CausalLanguageModel, prompts: [[Int]], config: GenerationConfig, sequences: [[Int]],
                      scores: [Float], tolerance: Float = 1e-4, _ label: String = "") throws {
    let (ids, mask) = leftPadded(prompts)
    let output = try model.generate(inputIds: ids, attentionMask: mask, config: config)
    #expect(output.sequences == sequences, "\(label)")
    #expect(output.scores.count == scores.count && maxDifference(output.scores, scores) < tolerance, "\(label): \(output.scores) vs \(scores)")
}

@Suite struct GenerationTests {
    @Test func processorsMatchTransformers() throws {
        let fixture = try GenerationFixtures.load(GenerationFixtures.Processors.self, "processors.json")
        for testCase in fixture.cases {
            let processors = testCase.config.logitsProcessors
            #expect(processors.count == testCase.processors.count, "\(testCase.processors)")
            for row in fixture.scores.indices {
                let padding = fixture.attention_mask[row].firstIndex(of: 1) ?? 0
                let history = TokenHistory(tokens: fixture.input_ids[row], paddingLength: padding, promptLength: fixture.prompt_length)
                var scores = fixture.scores[row]
                for processor in processors { processor.process(&scores, history: history) }
                let expected = testCase.processed[row]
                for (actual, wanted) in zip(scores, expected) {
                    if let wanted {
                        #expect(abs(actual - wanted) <= 1e-6 * max(1, abs(wanted)), "\(testCase.processors) row \(row)")
                    } else {
                        #expect(actual == -.infinity, "\(testCase.processors) row \(row)")
                    }
                }
            }
        }
    }

    @Test(arguments: ["gqa-untied", "llama3-tied"])
    func beamSearchMatchesTransformers(_ name: String) throws {
        let model = try LlamaFixture(name).model
        let fixture = try GenerationFixtures.load([String: GenerationFixtures.Beams].self, "beam.json")[name]!
        for testCase in fixture.cases {
            try expectBeamSearch(model, prompts: fixture.prompts, config: testCase.config, sequences: testCase.sequences,
                                 scores: testCase.scores, "\(name) \(testCase.config)")
        }
    }

    @Test func stopStringEndsGenerationLikeTransformers() throws {
        let fixture = try GenerationFixtures.load(GenerationFixtures.StopStrings.self, "stop_strings.json")
        let model = try LlamaFixture("gqa-untied").model
        // The tiny vocabulary is the SmolLM2 tokenizer's first 160 tokens: special tokens and single bytes.
        let table = try smolLM2TokenBytes(count: model.vocabularySize)
        var config = GenerationConfig()
        config.maxNewTokens = fixture.max_new_tokens
        let criterion = StopStringCriterion(stopStrings: fixture.stop_strings, tokenBytes: table)
        let free = try model.generate(inputIds: [fixture.prompt], config: config).sequences[0]
        #expect(free == fixture.unstopped)
        let stopped = try model.generate(inputIds: [fixture.prompt], config: config, stoppingCriteria: [criterion]).sequences[0]
        #expect(stopped == fixture.new_tokens)
    }

    @Test func greedyMatchesTheRecordedContinuationsThroughTheConfig() throws {
        let fixture = try LlamaFixture("gqa-untied")
        let generation = fixture.expected.generations[1]
        let (ids, mask) = leftPadded(generation.prompts)
        var config = GenerationConfig()
        config.maxNewTokens = fixture.expected.max_new_tokens
        config.eosTokenIds = generation.eos
        var steps = 0
        let output = try fixture.model.generate(inputIds: ids, attentionMask: mask, config: config) { tokens in
            steps += 1
            #expect(tokens.count == ids.count)
        }
        #expect(output.sequences == generation.new_tokens)
        #expect(steps == output.sequences.map(\.count).max())
    }

    /// The one-pass selection behind top-k, min-p, beam search and top_logprobs gives what a stable descending sort
    /// of the whole vocabulary gives (ties to the lower index), NaN ranking below every number.
    @Test func largestIndicesAreAStableDescendingSortsFirst() {
        var generator = SeededGenerator(seed: 5)
        for length in [1, 7, 64, 1000] {
            // Few distinct values, so that ties are everywhere.
            let values = (0..<length).map { _ in Float(generator.next() % 9) - 4 }
            let sorted = values.indices.sorted { values[$0] > values[$1] }
            for count in [1, 3, 50, length, length + 2] {
                #expect(largestIndices(values, count: count) == Array(sorted.prefix(count)), "\(length) values, \(count)")
            }
        }
        let withNaN: [Float] = [1, .nan, 3, -.infinity, .nan, 3]
        #expect(largestIndices(withNaN, count: 4) == [2, 5, 0, 3])
        #expect(largestIndices(withNaN, count: 6) == [2, 5, 0, 3, 1, 4])
        #expect(largestIndices(withNaN, count: 0).isEmpty)
    }

    @Test func seededSamplingIsReproducibleAndRespectsTheWarpers() throws {
        let model = try LlamaFixture("gqa-untied").model
        var config = GenerationConfig()
        config.maxNewTokens = 12
        config.doSample = true
        config.topK = 0
        let prompt = [[1, 17, 45, 99, 3]]
        let first = try model.generate(inputIds: prompt, config: config, seed: 42).sequences
        #expect(try model.generate(inputIds: prompt, config: config, seed: 42).sequences == first)
        #expect(try model.generate(inputIds: prompt, config: config, seed: 43).sequences != first)
        // xoshiro256** seeded by SplitMix64, as an independent Python implementation computes it.
        var generator = SeededGenerator(seed: 42)
        #expect([generator.next(), generator.next(), generator.next()]
                == [1_546_998_764_402_558_742, 6_990_951_692_964_543_102, 12_544_586_762_248_559_009])
        config.topK = 1
        var greedy = GenerationConfig()
        greedy.maxNewTokens = 12
        #expect(try model.generate(inputIds: prompt, config: config, seed: 7).sequences
                == model.generate(inputIds: prompt, config: greedy).sequences)
    }

    @Test func samplingNeverDrawsTokensOutsideTopP() throws {
        var generator = SeededGenerator(seed: 1)
        var scores: [Float] = [2.0, 1.5, 1.0, 0.2, -1.0, -3.0, 0.9, 1.4]
        TopPWarper(topP: 0.6).process(&scores, history: TokenHistory(tokens: [], promptLength: 0))
        let allowed = Set(scores.indices.filter { scores[$0] > -.infinity })
        #expect(allowed.count > 1 && allowed.count < scores.count)
        var seen = Set<Int>()
        for _ in 0..<5000 {
            let token = generator.sample(scores: scores)
            #expect(allowed.contains(token))
            seen.insert(token)
        }
        #expect(seen == allowed)
    }

    @Test func sampledReturnSequencesExpandEachPrompt() throws {
        let model = try LlamaFixture("gqa-untied").model
        var config = GenerationConfig()
        config.maxNewTokens = 6
        config.doSample = true
        config.numReturnSequences = 3
        let (ids, mask) = leftPadded([[1, 17, 45], [1, 8]])
        let output = try model.generate(inputIds: ids, attentionMask: mask, config: config, seed: 5)
        #expect(output.sequences.count == 6 && output.sequences.allSatisfy { $0.count == 6 })
    }

    @Test func configLoadsWithTransformersDefaultsAndRejectsBadValues() throws {
        let directory = LlamaFixture.root.appendingPathComponent("gqa-untied")
        let config = try GenerationConfig.load(directory: directory)
        #expect(config.eosTokenIds == [2] && config.padTokenId == 0 && config.bosTokenId == 1)
        #expect(config.maxLength == 20 && config.maxNewTokens == nil && config.topK == 50 && config.topP == 1)
        #expect(config.earlyStopping == .heuristic && config.numBeams == 1 && !config.doSample)

        func decode(_ json: String) throws -> GenerationConfig {
            try JSONDecoder().decode(GenerationConfig.self, from: Data(json.utf8))
        }
        let custom = try decode(#"{"eos_token_id": [2, 7], "early_stopping": "never", "do_sample": true, "top_p": 0.9, "stop_strings": "END"}"#)
        #expect(custom.eosTokenIds == [2, 7] && custom.earlyStopping == .never && custom.stopStrings == ["END"])
        #expect(try decode(#"{"early_stopping": true}"#).earlyStopping == .always)
        #expect(throws: ModelError.self) { try decode(#"{"early_stopping": "sometimes"}"#) }
        for bad in [#"{"do_sample": true, "temperature": 0}"#, #"{"num_beams": 0}"#, #"{"do_sample": true, "top_p": 1.5}"#,
                    #"{"repetition_penalty": -1}"#, #"{"num_beams": 2, "num_return_sequences": 3}"#, #"{"max_new_tokens": -1}"#] {
            #expect(throws: ModelError.self, "\(bad)") { try decode(bad).validate() }
        }
        // The prompt must fit in max_length when max_new_tokens is not set.
        let model = try LlamaFixture("gqa-untied").model
        var short = GenerationConfig()
        short.maxLength = 3
        #expect(throws: ModelError.self) { try model.generate(inputIds: [[1, 2, 3, 4]], config: short) }
    }

    @Test func cacheReorderMovesRows() throws {
        let model = try LlamaFixture("gqa-untied").model
        let prompts = [[1, 17, 45], [1, 60, 61]]
        let cache = try model.makeCache(batch: 2, capacity: 4)
        _ = try model.logits(inputIds: prompts, cache: cache)
        try cache.reorder(rows: [1, 1])
        let stepped = try model.logits(inputIds: [[7], [7]], cache: cache).scalars
        let expected = try model.logits(inputIds: [prompts[1] + [7]], lastPositionOnly: true).scalars
        let half = stepped.count / 2
        #expect(maxDifference(Array(stepped[..<half]), expected) < 1e-5)
        #expect(maxDifference(Array(stepped[half...]), expected) < 1e-5)
        #expect(throws: ModelError.self) { try cache.reorder(rows: [0, 2]) }
    }

    /// A cache that holds another prompt's first tokens, cut back to them and continued, gives transformers'
    /// greedy continuation of this prompt; copied into a larger cache it gives it too.
    @Test func continuingACacheMatchesTheRecordedContinuation() throws {
        let fixture = try LlamaFixture("gqa-untied")
        let generation = fixture.expected.generations[1]
        let (prompt, expected) = (generation.prompts[0], generation.new_tokens[0])
        var config = GenerationConfig()
        config.maxNewTokens = fixture.expected.max_new_tokens
        config.eosTokenIds = generation.eos
        let kept = prompt.count - 1
        let cache = try fixture.model.makeCache(batch: 1, capacity: prompt.count + config.maxNewTokens!)
        _ = try fixture.model.logits(inputIds: [Array(prompt[..<kept]) + [3, 4, 5]], cache: cache)
        try cache.truncate(to: kept)
        let continued = try fixture.model.generate(continuing: cache, inputIds: prompt, config: config)
        #expect(continued.sequences == [expected])
        #expect(cache.length == prompt.count + expected.count - 1)

        try cache.truncate(to: kept)
        let larger = try fixture.model.makeCache(batch: 1, capacity: 2 * cache.capacity)
        try cache.copyStored(into: larger)
        #expect(try fixture.model.generate(continuing: larger, inputIds: prompt, config: config).sequences == [expected])

        #expect(throws: ModelError.self) { try cache.truncate(to: kept + 1) }
        #expect(throws: ModelError.self) { try cache.copyStored(into: larger) }
        #expect(throws: ModelError.self) { try fixture.model.generate(continuing: cache, inputIds: Array(prompt[..<kept]), config: config) }
        var beams = config
        beams.numBeams = 2
        #expect(throws: ModelError.self) { try fixture.model.generate(continuing: cache, inputIds: prompt, config: beams) }
        var long = config
        long.maxNewTokens = cache.capacity
        #expect(throws: ModelError.self) { try fixture.model.generate(continuing: cache, inputIds: prompt, config: long) }
    }
}

/// Bytes of the SmolLM2 tokenizer's first `count` ids, from its tokenizer.json: added tokens as their text, the
/// others through GPT-2's byte-to-character table (printable bytes stand for themselves, the rest for 256 + n).
func smolLM2TokenBytes(count: Int) throws -> [[UInt8]] {
    let url = LlamaFixture.root.deletingLastPathComponent().appendingPathComponent("tokenizers/real/smollm2/tokenizer.json")
    let json = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
    let vocabulary = try #require((json["model"] as? [String: Any])?["vocab"] as? [String: Int])
    let added = try #require(json["added_tokens"] as? [[String: Any]])
    var tokens = [Int: String]()
    for (token, id) in vocabulary where id < count { tokens[id] = token }
    var special = Set<Int>()
    for entry in added { if let id = entry["id"] as? Int, id < count { tokens[id] = entry["content"] as? String; special.insert(id) } }
    let printable = Array(33...126) + Array(161...172) + Array(174...255)
    let others = (0...255).filter { !printable.contains($0) }
    return try (0..<count).map { id in
        let token = try #require(tokens[id])
        if special.contains(id) { return Array(token.utf8) }
        return token.unicodeScalars.map { scalar in
            let value = Int(scalar.value)
            return UInt8(printable.contains(value) ? value : others[value - 256])
        }
    }
}
