import Foundation
import Testing
import VLMTokenizers

/// `Tokenizer(gguf:)` refuses metadata it cannot build transformers' tokenizer from, naming the file and the key. The
/// tokenizers it builds are checked against transformers in VLMPipelinesTests (GGUFTokenizerLoadingTests), which reads
/// the files.
struct GGUFTokenizerTests {
    /// A byte-level vocabulary in which "a b" merges into "ab".
    func metadata(_ change: (inout GGUFTokenizerMetadata) -> Void = { _ in }) -> GGUFTokenizerMetadata {
        var metadata = GGUFTokenizerMetadata(file: "/models/x.gguf", model: "gpt2", tokens: ["a", "b", "ab", "<|endoftext|>"],
                                             tokenTypes: [1, 1, 1, 3], merges: ["a b"], eosTokenId: 3)
        change(&metadata)
        return metadata
    }

    func refusal(_ metadata: GGUFTokenizerMetadata) -> String? {
        do {
            _ = try Tokenizer(gguf: metadata)
            return nil
        } catch {
            return "\(error)"
        }
    }

    @Test func consistentMetadataLoads() throws {
        let tokenizer = try Tokenizer(gguf: metadata())
        #expect(tokenizer.eosTokenId == 3)
        #expect(tokenizer.tokenId("ab") == 2)
    }

    @Test func unsupportedTokenizerModel() {
        let message = refusal(metadata { $0.model = "rwkv" })
        #expect(message?.contains("/models/x.gguf") == true && message?.contains("tokenizer.ggml.model") == true)
        #expect(message?.contains("rwkv") == true)
    }

    /// Every name llama.cpp knows builds (its regexes compile), but for the three whose text stays raw UTF-8, which a
    /// byte-level vocabulary cannot take; none of them warns.
    @Test func everyPreTokenizerNameLlamaCppKnowsBuilds() {
        let names = GGUFTokenizerMetadata.knownPreTokenizerNames
        #expect(names.count == 91)
        for name in names {
            let file = metadata { $0.pre = name }
            #expect(file.preTokenizerWarning == nil)
            let message = refusal(file)
            if ["gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"].contains(name) {
                #expect(message?.contains("tokenizer.ggml.pre") == true, "\(name)")
            } else {
                #expect(message == nil, "\(name): \(message ?? "")")
            }
        }
    }

    @Test func anUnknownOrMissingPreTokenizerWarnsNamingTheDefault() throws {
        let unknown = metadata { $0.pre = "no-such-family" }
        #expect(unknown.preTokenizerWarning == "warning: /models/x.gguf: tokenizer.ggml.pre \"no-such-family\" is not a pre-tokenizer llama.cpp knows; splitting text as GPT-2 does (\"gpt-2\")")
        #expect(metadata().preTokenizerWarning?.contains("tokenizer.ggml.pre is missing") == true)
        #expect(try Tokenizer(gguf: unknown).encode("a b").ids == (try Tokenizer(gguf: metadata { $0.pre = "gpt-2" })).encode("a b").ids)
    }

    @Test func noTokens() {
        #expect(refusal(metadata { $0.tokens = []; $0.tokenTypes = nil; $0.eosTokenId = nil })?.contains("tokenizer.ggml.tokens") == true)
    }

    @Test func scoresOfAnotherLength() {
        let message = refusal(metadata { $0.scores = [0, 0, 0] })
        #expect(message?.contains("/models/x.gguf") == true && message?.contains("tokenizer.ggml.scores") == true)
    }

    @Test func tokenTypesOfAnotherLength() {
        #expect(refusal(metadata { $0.tokenTypes = [1] })?.contains("tokenizer.ggml.token_type") == true)
    }

    @Test func specialTokenIdOutsideTheVocabulary() {
        #expect(refusal(metadata { $0.bosTokenId = 4 })?.contains("tokenizer.ggml.bos_token_id") == true)
        #expect(refusal(metadata { $0.paddingTokenId = -1 })?.contains("tokenizer.ggml.padding_token_id") == true)
    }

    @Test func mergeThatIsNotAPair() {
        #expect(refusal(metadata { $0.merges = ["a b", "ab"] })?.contains("tokenizer.ggml.merges[1]") == true)
    }

    @Test func mergeOfUnknownTokens() {
        #expect(refusal(metadata { $0.merges = ["a c"] })?.contains("/models/x.gguf") == true)
    }

    @Test func sentencePieceWithoutMergesOrScores() {
        #expect(refusal(metadata { $0.model = "llama"; $0.merges = nil })?.contains("tokenizer.ggml.scores") == true)
    }
}
