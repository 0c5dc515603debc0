"""Phase-2 tokenizer fixtures: SentencePiece-style pipelines converted by transformers, and offsets, pairs and every
truncation strategy for them and for the phase-1 pipelines. Called by tokenizer_fixtures.py, or run alone:
    python oracle/tokenizer_phase2.py
Writes Tests/Fixtures/tokenizers/:
  t5-style/        Unigram + Precompiled + Metaspace: a sentencepiece unigram model trained here, converted by
                   transformers' T5Converter (sentencepiece 0.2.3)
  llama-style/     BPE + byte_fallback + fuse_unk + Metaspace (prepend_scheme first, no split) + Replace/ByteFallback/
                   Fuse/Strip decoders, "<s> $A" template: Llama 2's pipeline (as its converted tokenizer.json
                   has it) over a sentencepiece BPE model (byte_fallback) trained here, vocab and merges extracted by
                   transformers' SentencePieceExtractor (its LlamaConverter cannot run without a Llama tokenizer)
  <name>_phase2.json for those and clip, gpt2-style, bert-style: per string ids, tokens, offsets, type ids, decoded
                   text (offsets flattened: start, end, start, end...); pairs; truncation with longest_first / only_first / only_second, both sides
"""
import json
import os
import random
import tempfile

from tokenizer_fixtures import OUT, strings

import sentencepiece as spm
from tokenizers import Tokenizer


def corpus(seed, count):
    return [s for s in strings(seed, count) if s.strip()]


def train_spm(model_type, directory, byte_fallback):
    text_path = os.path.join(directory, "corpus.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        for line in corpus(3, 4000):
            f.write(line.replace("\n", " ") + "\n")
    prefix = os.path.join(directory, model_type)
    spm.SentencePieceTrainer.train(
        input=text_path, model_prefix=prefix, vocab_size=800, model_type=model_type, byte_fallback=byte_fallback,
        character_coverage=0.995, normalization_rule_name="nmt_nfkc", user_defined_symbols=["<sep>"],
        minloglevel=2)
    return prefix + ".model"


def converted(model_file, converter_name):
    import transformers.convert_slow_tokenizer as convert

    class Original:
        vocab_file = model_file
        legacy = True
        add_prefix_space = True
        _extra_ids = 0
        eos_token = "</s>"
        additional_special_tokens = []

        def __init__(self):
            self.sp_model = spm.SentencePieceProcessor(model_file=model_file)

        def convert_tokens_to_ids(self, token):
            return self.sp_model.piece_to_id(token)

        def convert_ids_to_tokens(self, index):
            return self.sp_model.id_to_piece(index)

    return getattr(convert, converter_name)(Original()).converted()


def llama_style(model_file):
    from tokenizers import AddedToken, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    extracted = SentencePieceExtractor(model_file).extract(BPE)
    tok = Tokenizer(BPE(vocab=extracted["vocab"], merges=extracted["merges"], unk_token="<unk>", fuse_unk=True,
                        byte_fallback=True))
    tok.add_special_tokens([AddedToken("<unk>", normalized=False, special=True),
                            AddedToken("<s>", normalized=False, special=True),
                            AddedToken("</s>", normalized=False, special=True)])
    tok.add_tokens([AddedToken("<sep>", normalized=False, special=False)])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", bos)])
    return tok


def record(tok, texts, seed):
    out = {"single": [], "pairs": [], "truncation": []}
    for text in texts:
        enc = tok.encode(text)
        out["single"].append({
            "text": text, "ids": enc.ids, "tokens": enc.tokens, "offsets": [x for o in enc.offsets for x in o],
            "type_ids": enc.type_ids, "ids_without_special": tok.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(enc.ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
        })
    rng = random.Random(seed)
    for _ in range(200):
        a, b = rng.choice(texts), rng.choice(texts)
        enc = tok.encode(a, b)
        out["pairs"].append({"text": a, "pair": b, "ids": enc.ids, "type_ids": enc.type_ids,
                             "offsets": [x for o in enc.offsets for x in o], "tokens": enc.tokens})
    for _ in range(300):
        a = rng.choice(texts)
        b = rng.choice(texts) if rng.random() < 0.8 else None
        strategy = rng.choice(["longest_first", "only_first", "only_second"])
        side = rng.choice(["right", "left"])
        max_length = rng.randint(0, 40)
        tok.enable_truncation(max_length, strategy=strategy, direction=side)
        try:
            enc = tok.encode(a, b)
            result = {"ids": enc.ids, "type_ids": enc.type_ids, "offsets": [x for o in enc.offsets for x in o]}
        except Exception as error:  # tokenizers refuses some strategies; the Swift side must refuse them too
            result = {"error": str(error)}
        tok.no_truncation()
        out["truncation"].append({"text": a, "pair": b, "strategy": strategy, "side": side, "max_length": max_length,
                                  **result})
    return out


def write(name, obj):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for name, model_type, byte_fallback in [("t5-style", "unigram", False), ("llama-style", "bpe", True)]:
            model_file = train_spm(model_type, tmp, byte_fallback)
            tok = converted(model_file, "T5Converter") if name == "t5-style" else llama_style(model_file)
            directory = os.path.join(OUT, name)
            os.makedirs(directory, exist_ok=True)
            tok.save(os.path.join(directory, "tokenizer.json"))
            tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
            write(name.replace("-", "_") + "_phase2.json", record(tok, strings(21, 5000), 21))
    for name in ["clip", "gpt2-style", "bert-style"]:
        tok = Tokenizer.from_file(os.path.join(OUT, name, "tokenizer.json"))
        write(name.replace("-", "_") + "_phase2.json", record(tok, strings(31, 1500), 31))


if __name__ == "__main__":
    main()
