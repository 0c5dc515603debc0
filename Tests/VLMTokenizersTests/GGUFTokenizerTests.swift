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
        let message = refusal(metadata { $0.model = "bert" })
        #expect(message?.contains("/models/x.gguf") == true && message?.contains("tokenizer.ggml.model") == true)
        #expect(message?.contains("bert") == true)
    }

    @Test func gemmaSentencePieceIsNotBuilt() {
        let message = refusal(metadata { $0.model = "llama"; $0.architecture = "gemma2"; $0.scores = [0, 0, 0, 0] })
        #expect(message?.contains("general.architecture") == true && message?.contains("gemma2") == true)
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
