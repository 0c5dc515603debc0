import Foundation

/// How a byte-level BPE vocabulary's text is split before its merges run, chosen by `tokenizer.ggml.pre`: the name
/// llama.cpp gives each family's pre-tokenizer (GGUF files carry the name, not the regex).
///
/// Every name llama.cpp's vocabulary loader knows is mapped (`GGUFPreTokenizerTable.swift`, generated from its
/// source). Where transformers' GGUF loader knows the name too it uses the original tokenizer.json regex, which
/// llama.cpp's adapted one matches; the others use llama.cpp's list of regexes, applied one after the other as a
/// Hugging Face `Sequence` of `Split(..., "isolated")` pre-tokenizers. Where llama.cpp and the family's own Hugging
/// Face tokenizer disagree, the Hugging Face tokenizer wins (see `huggingFaceOverrides`).
struct GGUFPreTokenization {
    /// The regexes applied in turn; nil: GPT-2's byte-level split.
    let regexes: [String]?
    /// Whether a word that is a token is taken whole before merging (tokenizers' `ignore_merges`).
    let ignoreMerges: Bool
    /// Whether the type keeps raw UTF-8 (SentencePiece-style BPE) instead of GPT-2's byte alphabet.
    let rawUTF8: Bool

    /// The split of `pre`; a missing or unknown name splits as GPT-2 does (`GGUFTokenizerMetadata.preTokenizerWarning`
    /// says so).
    init(_ pre: String?) {
        if let pre, let regex = transformersSplits[pre] {
            self.init(regexes: [regex], ignoreMerges: llamaCppIgnoreMergesNames.contains(pre), rawUTF8: false)
        } else if let pre, huggingFaceOverrides.contains(pre) {
            self.init(regexes: nil, ignoreMerges: false, rawUTF8: false)
        } else if let pre, let type = llamaCppPreTokenizerNames[pre], let entry = llamaCppPreTokenizerTypes[type] {
            self.init(regexes: entry.regexes.map { customRegexes[$0] ?? $0 },
                      ignoreMerges: llamaCppIgnoreMergesNames.contains(pre), rawUTF8: entry.rawUTF8)
        } else {
            self.init(regexes: nil, ignoreMerges: false, rawUTF8: false)
        }
    }

    fileprivate init(regexes: [String]?, ignoreMerges: Bool, rawUTF8: Bool) {
        self.regexes = regexes
        self.ignoreMerges = ignoreMerges
        self.rawUTF8 = rawUTF8
    }
}

extension GGUFTokenizerMetadata {
    /// Every `tokenizer.ggml.pre` name llama.cpp's vocabulary loader knows, each mapped to its split.
    public static var knownPreTokenizerNames: [String] { llamaCppPreTokenizerNames.keys.sorted() }

    /// One line for a byte-level ("gpt2") vocabulary whose `tokenizer.ggml.pre` is missing or a name llama.cpp does not
    /// know, naming it and the default used (GPT-2's split), as llama.cpp warns; nil otherwise.
    public var preTokenizerWarning: String? {
        guard model == "gpt2" else { return nil }
        if let pre, llamaCppPreTokenizerNames[pre] != nil || transformersSplits[pre] != nil { return nil }
        let what = pre.map { "tokenizer.ggml.pre \"\($0)\" is not a pre-tokenizer llama.cpp knows" }
            ?? "tokenizer.ggml.pre is missing"
        return "warning: \(file): \(what); splitting text as GPT-2 does (\"gpt-2\")"
    }
}

/// "smollm": llama.cpp splits digits one by one first, SmolLM's tokenizer.json (and transformers' GGUF loader) use
/// GPT-2's byte-level split alone, which keeps " ½" together.
private let huggingFaceOverrides: Set<String> = ["smollm"]

/// llama.cpp's regexes that stand for code of its own (unicode.cpp), as the regexes that code implements.
private let customRegexes: [String: String] = [
    // Kimi-K2's tiktoken pattern: Han runs apart, and letters other than Han in the GPT-4o-style alternatives.
    #"\p{Han}+"#: #"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]--\p{Han}]*[[\p{Ll}\p{Lm}\p{Lo}\p{M}]--\p{Han}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]--\p{Han}]+[[\p{Ll}\p{Lm}\p{Lo}\p{M}]--\p{Han}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#,
    // AFMoE's digits: a run of digits in groups of three counted from its end, the first group 1 to 3 long.
    #"\p{AFMoE_digits}"#: #"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"#,
]

private let llama3Split = #"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#
private let tekkenSplit = #"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#
private let qwen2Split = #"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#
private let qwen35Split = #"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"#
private let gpt4oSplit = #"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"#

/// transformers' GGUF_PRE_TOKENIZER_SPLITS: the original tokenizer.json regex of each name it knows.
private let transformersSplits: [String: String] = [
    "llama3": llama3Split, "llama-v3": llama3Split, "llama-bpe": llama3Split, "falcon3": llama3Split,
    "falcon-h1": llama3Split, "pixtral": llama3Split, "midm-2.0": llama3Split, "lfm2": llama3Split,
    "jina-v5-nano": llama3Split, "dbrx": llama3Split, "smaug-bpe": llama3Split,
    "tekken": tekkenSplit,
    "qwen2": qwen2Split, "deepseek-r1-qwen": qwen2Split, "kormo": qwen2Split, "f2llmv2": qwen2Split, "megrez": qwen2Split,
    "qwen35": qwen35Split,
    "gpt-4o": gpt4oSplit, "llama4": gpt4oSplit, "kanana2": gpt4oSplit, "talkie": gpt4oSplit, "minimax-m2": gpt4oSplit,
]
