import Foundation
import Testing
import VLMPipelines
import VLMTokenizers

/// llama.cpp's own tokenizer suite (`tests/test-tokenizer-0`) run as it ships: the vocabulary-only GGUF files
/// `models/ggml-vocab-*.gguf` of the llama.cpp that PyPI's llama-cpp-python 0.3.36 source package vendors, each with
/// its inputs (`.gguf.inp`) and expected ids (`.gguf.out`, written by the Hugging Face tokenizer of each family).
/// The files take 75 MB, so they are not committed: `.ci/run` extracts them into models/llama-cpp-vocab/ and sets
/// `$SWIFTVLM_LLAMA_CPP_VOCAB` to that folder, and then every family must be there; without the variable the suite
/// reads models/llama-cpp-vocab/ under the package root when it exists and is skipped otherwise.
enum LlamaCppVocabulary {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static let required = ProcessInfo.processInfo.environment["SWIFTVLM_LLAMA_CPP_VOCAB"].map { !$0.isEmpty } ?? false

    static let directory: URL = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_LLAMA_CPP_VOCAB"], !path.isEmpty {
            return URL(fileURLWithPath: path, relativeTo: packageRoot)
        }
        return packageRoot.appendingPathComponent("models/llama-cpp-vocab")
    }()

    static let available = required || FileManager.default.fileExists(atPath: directory.path)

    static let skipMessage = "llama.cpp's vocabularies not found: run .ci/run's extraction of llama-cpp-python 0.3.36's models/ggml-vocab-* into models/llama-cpp-vocab/"

    /// Every vocabulary llama-cpp-python 0.3.36 ships with expected ids.
    static let families = [
        "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
        "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder",
    ]

    /// The vocabularies it ships without expected ids: aquila and gpt-neox (byte-level BPE without a pre-tokenizer
    /// name, which llama.cpp splits with its default), baichuan (SentencePiece) and nomic-bert-moe (Unigram, "t5").
    static let withoutExpectedIds = ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"]

    /// The cases as test-tokenizer-0.cpp's `read_tests` reads them: inputs separated by "\n__ggml_vocab_test__\n"
    /// (a trailing separator ends the list), one line of space-separated ids per input, stripped.
    static func cases(_ family: String) throws -> [(text: String, ids: [Int])] {
        let base = directory.appendingPathComponent("ggml-vocab-\(family).gguf")
        let raw = try String(contentsOf: URL(fileURLWithPath: base.path + ".inp"), encoding: .utf8)
        let out = try String(contentsOf: URL(fileURLWithPath: base.path + ".out"), encoding: .utf8)
        var inputs: [String] = []
        var rest = Substring(raw)
        let separator = "\n__ggml_vocab_test__\n"
        while !rest.isEmpty {
            guard let range = rest.range(of: separator) else { inputs.append(String(rest)); break }
            inputs.append(String(rest[..<range.lowerBound]))
            rest = rest[range.upperBound...]
        }
        var lines = out.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        if lines.last == "" { lines.removeLast() }
        guard inputs.count == lines.count else {
            throw TokenizerError.invalidField(file: base.path + ".out", path: "$",
                                              reason: "\(lines.count) lines for \(inputs.count) inputs")
        }
        return zip(inputs, lines).map { text, line in
            (text, line.split(separator: " ").compactMap { Int($0) })
        }
    }
}

@Suite(.enabled(if: LlamaCppVocabulary.available, Comment(rawValue: LlamaCppVocabulary.skipMessage)))
struct LlamaCppVocabularyTests {
    /// test-tokenizer-0 encodes with `add_special = false`: ids of the text alone.
    @Test(arguments: LlamaCppVocabulary.families)
    func expectedIdsOfTheSuite(family: String) throws {
        let file = LlamaCppVocabulary.directory.appendingPathComponent("ggml-vocab-\(family).gguf")
        let (tokenizer, _) = try loadTokenizer(path: file)
        let cases = try LlamaCppVocabulary.cases(family)
        #expect(!cases.isEmpty)
        var failures: [String] = []
        for (text, ids) in cases {
            let got = tokenizer.encode(text, addSpecialTokens: false).ids
            if got != ids { failures.append("\(text.debugDescription): \(got) != \(ids)") }
        }
        print("llama.cpp vocabulary \(family): \(cases.count - failures.count)/\(cases.count) identical")
        #expect(failures.isEmpty, "\(family): \(failures.count) of \(cases.count) differ:\n\(failures.prefix(6).joined(separator: "\n"))")
    }

    /// The vocabularies without expected ids load, and encode a sentence to known tokens that decode back to it.
    @Test(arguments: LlamaCppVocabulary.withoutExpectedIds)
    func vocabularyWithoutExpectedIdsLoads(family: String) throws {
        let (tokenizer, _) = try loadTokenizer(path: LlamaCppVocabulary.directory.appendingPathComponent("ggml-vocab-\(family).gguf"))
        let text = "Hello world, this is a test."
        let ids = tokenizer.encode(text, addSpecialTokens: false).ids
        #expect(!ids.isEmpty && ids.allSatisfy { tokenizer.token($0) != nil })
        #expect(tokenizer.decode(ids).trimmingCharacters(in: .whitespaces) == text)
    }
}
