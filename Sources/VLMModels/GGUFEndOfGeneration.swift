import VLMCheckpoint

extension GGUFFile {
    /// The tokens at which llama.cpp ends generation from this file's vocabulary, `eos` among them (src/llama-vocab.cpp
    /// of the llama.cpp that llama-cpp-python 0.3.36 vendors): a GGUF file names only its eos, and llama.cpp adds the
    /// end-of-turn and end-of-text tokens of the chat formats it knows, by their text, where transformers reads the
    /// list from generation_config.json (Qwen 2.5's `[151645, 151643]`, Llama 3.1's `<|eom_id|>` beside `<|eot_id|>`).
    ///
    /// The set: the fill-in-the-middle pad, repo and file-separator tokens (their metadata ids, else the first token
    /// with one of their texts: where a vocabulary has two, llama.cpp takes whichever its hash map yields first);
    /// every token whose text is on llama.cpp's end-of-generation list; `eos` and the metadata's eot and eom ids (the
    /// texts llama.cpp would find them by are all on the list); less `<|end|>` where `<|call|>` or `<|calls|>` ends
    /// generation beside `<|return|>` or `<|flush|>` (a message ends there, not the generation), and less `</s>`
    /// where `<|tool_response>` or `<|plamo:eos|>` does. Metadata ids outside the vocabulary are ignored, as llama.cpp
    /// ignores them; a file without a vocabulary keeps `eos`.
    public func endOfGenerationIds(eos: [Int]) -> [Int] {
        // A file without a vocabulary (a bare decoder) stops at what its config says.
        guard let tokens = metadata["tokenizer.ggml.tokens"]?.array?.map({ $0.string ?? "" }) else { return eos }
        func metadataId(_ name: String) -> Int? {
            metadata["tokenizer.ggml.\(name)_token_id"]?.integer.flatMap { tokens.indices.contains($0) ? $0 : nil }
        }
        var ids = Set<Int>()
        for (name, texts) in Self.fillInTheMiddleStops {
            if let id = metadataId(name) ?? tokens.firstIndex(where: texts.contains) { ids.insert(id) }
        }
        for (id, text) in tokens.enumerated() where Self.endOfGenerationTexts.contains(text) { ids.insert(id) }
        ids.formUnion(eos.filter(tokens.indices.contains))
        for name in ["eot", "eom"] {
            if let id = metadataId(name) { ids.insert(id) }
        }
        func stop(_ text: String) -> Int? { ids.first { tokens[$0] == text } }
        if let end = stop("<|end|>"), stop("<|call|>") != nil || stop("<|calls|>") != nil,
           stop("<|return|>") != nil || stop("<|flush|>") != nil {
            ids.remove(end)
        }
        if let endOfSequence = stop("</s>"), stop("<|tool_response>") != nil || stop("<|plamo:eos|>") != nil {
            ids.remove(endOfSequence)
        }
        return ids.sorted()
    }

    /// llama.cpp's texts for the FIM pad, repo and file-separator tokens, which it ends generation at too.
    private static let fillInTheMiddleStops: [(String, Set<String>)] = [
        ("fim_pad", ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"]),
        ("fim_rep", ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]),
        ("fim_sep", ["<|file_sep|>"]),
    ]

    /// llama.cpp's list of texts that end generation.
    private static let endOfGenerationTexts: Set<String> = [
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
        "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    ]
}
