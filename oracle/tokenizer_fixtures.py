"""Fixtures for VLMTokenizers: what tokenizers 0.23 (and transformers 5.23 where a transformers class exists) make of
the shared strings (oracle/tokenizer_strings.py) through eight pipelines.

Run by hand from the package root: python oracle/tokenizer_fixtures.py
Writes Tests/Fixtures/tokenizers/:
  real/strings.json     the shared input strings (also read by tokenizer_real.py and scripts/bench_tokenizers.py)
  clip/                 tokenizer.json + tokenizer_config.json of the full OpenAI CLIP vocabulary (transformers'
                        CLIPTokenizer, decoded and padded by transformers)
  clip-small-legacy/    vocab.json + merges.txt + tokenizer_config.json (first 1000 merges, no tokenizer.json)
  gpt2-style/           GPT-2's byte-level pipeline over the small CLIP vocabulary
  bert-style/           WordPiece trained here, BERT's normalizer (lowercase, accents stripped) and processors
  bert-cased-style/     WordPiece trained here, BertNormalizer with lowercase and strip_accents off
  llama3-style/         byte-level BPE trained here with ignore_merges, Llama 3's split regex and processors
  t5-style/             Unigram + Precompiled + Metaspace: a sentencepiece unigram model trained here, converted by
                        transformers' T5Converter (sentencepiece 0.2.3)
  llama-style/          BPE + byte_fallback + fuse_unk + Metaspace (prepend_scheme first, no split) + Replace/
                        ByteFallback/Fuse/Strip decoders, "<s> $A" template: Llama 2's converted pipeline over a
                        sentencepiece BPE model (byte_fallback) trained here, extracted by SentencePieceExtractor
  cases/<name>.json     per shared string (by index): ids, ids without special tokens (null: the ids not marked in the
                        special tokens mask), token strings (null: each the
                        vocabulary's token of its id, as everywhere but for Unigram's unknown pieces), offsets
                        flattened (each token's length, preceded by -1 - start where it does not start at the
                        previous token's end), type ids (null: all 0), decoded text (null: the input
                        string) and decoded skipping special tokens (null: same as decoded). Then pairs (string
                        indices), truncation with every strategy, side and stride (overflowing encodings included,
                        or the error tokenizers raised), random id runs decoded, and for CLIP padded batches.
The WordPiece trainer breaks ties in an order that changes between runs: the trained tokenizer.json files and their
cases are always regenerated together.
"""
import json
import os
import random
import shutil
import tempfile

from clip_vocab import clip_tokenizer
from tokenizer_strings import shared_strings, strings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers")
CASES = os.path.join(OUT, "cases")
BPE_GZ = "/work/data/clipvocab/bpe_simple_vocab_16e6.txt.gz"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))


def flat(offsets):
    """Each token's length, preceded by -1 - start where the token does not start at the previous one's end."""
    out, previous = [], 0
    for start, end in offsets:
        if start != previous:
            out.append(-1 - start)
        out.append(end - start)
        previous = end
    return out


def tokens_unless_derivable(tok, enc):
    """None when every token string is the vocabulary's token of its id (Unigram's unknown pieces are not)."""
    return None if enc.tokens == [tok.id_to_token(i) for i in enc.ids] else enc.tokens


def encoding_record(tok, enc):
    out = {"ids": enc.ids, "offsets": flat(enc.offsets)}
    if any(enc.type_ids):
        out["type_ids"] = enc.type_ids
    tokens = tokens_unless_derivable(tok, enc)
    if tokens is not None:
        out["tokens"] = tokens
    return out


def record(tok, texts, seed, transformers_tok=None):
    """Cases from the tokenizers.Tokenizer `tok`; decoding (and padding) through `transformers_tok` when given."""
    single = {"ids": [], "ids_without_special": [], "tokens": [], "offsets": [], "type_ids": [], "decoded": [],
              "decoded_skip_special": []}
    decode = (lambda ids, skip: transformers_tok.decode(ids, skip_special_tokens=skip)) if transformers_tok else \
        (lambda ids, skip: tok.decode(ids, skip_special_tokens=skip))
    for text in texts:
        enc = tok.encode(text)
        if transformers_tok is not None:
            assert transformers_tok(text)["input_ids"] == enc.ids, text
        plain = tok.encode(text, add_special_tokens=False).ids
        unmarked = [i for i, special in zip(enc.ids, enc.special_tokens_mask) if not special]
        decoded = decode(enc.ids, False)
        skipped = decode(enc.ids, True)
        single["ids"].append(enc.ids)
        single["ids_without_special"].append(None if plain == unmarked else plain)
        single["tokens"].append(tokens_unless_derivable(tok, enc))
        single["offsets"].append(flat(enc.offsets))
        single["type_ids"].append(enc.type_ids if any(enc.type_ids) else None)
        single["decoded"].append(None if decoded == text else decoded)
        single["decoded_skip_special"].append(None if skipped == decoded else skipped)
    out = {"single": single, "pairs": [], "truncation": [], "decode_ids": []}
    rng = random.Random(seed)
    shorter = [i for i, text in enumerate(texts) if len(text) <= 200]
    short = [i for i, text in enumerate(texts) if len(text) <= 60]
    for _ in range(200):
        a, b = rng.choice(shorter), rng.choice(shorter)
        enc = tok.encode(texts[a], texts[b])
        out["pairs"].append({"a": a, "b": b, **encoding_record(tok, enc)})
    for _ in range(400):
        # Short texts: a stride makes many overflowing windows of a long one.
        a = rng.choice(short)
        b = rng.choice(short) if rng.random() < 0.7 else None
        strategy = rng.choice(["longest_first", "only_first", "only_second"])
        side = rng.choice(["right", "left"])
        max_length = rng.randint(0, 40)
        stride = 0 if rng.random() < 0.4 else rng.randint(1, 12)
        case = {"a": a, "b": b, "strategy": strategy, "side": side, "max_length": max_length, "stride": stride}
        try:
            tok.enable_truncation(max_length, stride=stride, strategy=strategy, direction=side)
            enc = tok.encode(texts[a], None if b is None else texts[b])
            case.update(encoding_record(tok, enc))
            case["overflowing"] = [encoding_record(tok, o) for o in enc.overflowing]
        except BaseException as error:  # noqa: B036 -- a stride too long panics in Rust: PanicException
            # tokenizers refuses some strategies and strides (a stride not below the effective max length when
            # truncation is set, or below a sequence's share of it at encoding); the Swift side must refuse them too.
            case["error"] = str(error).splitlines()[0] if str(error) else type(error).__name__
        tok.no_truncation()
        out["truncation"].append(case)
    vocab_size = tok.get_vocab_size()
    for _ in range(200):
        # Random id runs decode to partial UTF-8 sequences: checks the lossy byte decoding too.
        ids = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))]
        decoded = decode(ids, False)
        skipped = decode(ids, True)
        out["decode_ids"].append({"ids": ids, "decoded": decoded, "decoded_skip_special": None if skipped == decoded else skipped})
    if transformers_tok is not None:
        out["batches"] = batches(transformers_tok, len(texts), seed + 1)
        check_overflow_in_transformers(transformers_tok, texts, out["truncation"])
    return out


def batches(tok, count, seed):
    rng = random.Random(seed)
    out = []
    texts = shared_strings()
    for _ in range(40):
        batch = rng.sample(range(count), rng.randint(1, 6))
        enc = tok([texts[i] for i in batch], padding=True, truncation=True, max_length=77)
        fixed = tok([texts[i] for i in batch], padding="max_length", truncation=True, max_length=16)
        out.append({"texts": batch,
                    "longest_77": {"ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                    "max_length_16": {"ids": fixed["input_ids"], "attention_mask": fixed["attention_mask"]}})
    return out


def check_overflow_in_transformers(tok, texts, cases):
    """transformers' return_overflowing_tokens=True gives the encoding then its overflowing ones, as recorded."""
    checked = 0
    for case in cases:
        if "error" in case:
            continue
        pair = None if case["b"] is None else texts[case["b"]]
        tok.truncation_side = case["side"]
        try:
            enc = tok(texts[case["a"]], pair, truncation=case["strategy"], max_length=case["max_length"],
                      stride=case["stride"], return_overflowing_tokens=True)
        except Exception:  # noqa: BLE001 -- transformers refuses a few combinations tokenizers accepts
            continue
        ids = enc["input_ids"] if enc["input_ids"] and isinstance(enc["input_ids"][0], list) else [enc["input_ids"]]
        assert ids == [case["ids"]] + [o["ids"] for o in case["overflowing"]], case
        checked += 1
    tok.truncation_side = "right"
    print(f"  transformers agrees on {checked} overflowing truncations")


def write_cases(name, tok, texts, seed, transformers_tok=None):
    write_json(os.path.join(CASES, name + ".json"), record(tok, texts, seed, transformers_tok))


def save(tok, name):
    """Saves tokenizer.json compactly and reloads it: the cases come from what the fixture file holds."""
    from tokenizers import Tokenizer

    directory = os.path.join(OUT, name)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        write_json(path, json.load(f))
    return Tokenizer.from_file(path)


def gpt2_style():
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    legacy_dir = os.path.join(OUT, "clip-small-legacy")
    gpt2 = Tokenizer(BPE.from_file(os.path.join(legacy_dir, "vocab.json"), os.path.join(legacy_dir, "merges.txt")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_special_tokens(["<|endoftext|>"])
    return gpt2


def wordpiece(lowercase):
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import WordPiece

    bert = Tokenizer(WordPiece(unk_token="[UNK]"))
    bert.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None if lowercase else False)
    bert.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    bert.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=600 if lowercase else 900, show_progress=False,
                                        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    bert.train_from_iterator(strings(5, 3000), trainer)
    cls_id, sep_id = bert.token_to_id("[CLS]"), bert.token_to_id("[SEP]")
    bert.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return bert


def llama3_style():
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    tok.train_from_iterator(strings(6, 3000), trainer)
    # Llama 3's vocabulary (converted from tiktoken) has tokens no merge sequence reaches, which only ignore_merges
    # finds for a whole word; dropping every seventh learned merge makes such tokens here.
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [m for i, m in enumerate(data["model"]["merges"]) if i < 100 or i % 7 != 3]
    tok = Tokenizer.from_str(json.dumps(data))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def check_ignore_merges_matters(tok, texts):
    """Some strings must tokenize differently without ignore_merges, or the fixture would not test it."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    assert data["model"]["ignore_merges"] is True
    data["model"]["ignore_merges"] = False
    plain = Tokenizer.from_str(json.dumps(data))
    differing = sum(tok.encode(t).ids != plain.encode(t).ids for t in texts)
    print(f"  ignore_merges changes {differing} of {len(texts)} strings")
    assert differing > 50


def corpus(seed, count):
    return [s for s in strings(seed, count) if s.strip()]


def train_spm(model_type, directory, byte_fallback):
    import sentencepiece as spm

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


def t5_style(model_file):
    import sentencepiece as spm
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

    return convert.T5Converter(Original()).converted()


def llama_style(model_file):
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
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


def main():
    from transformers import AutoTokenizer

    texts = shared_strings()
    os.makedirs(CASES, exist_ok=True)
    os.makedirs(os.path.join(OUT, "real"), exist_ok=True)
    write_json(os.path.join(OUT, "real", "strings.json"), texts)
    with tempfile.TemporaryDirectory() as tmp:
        full = clip_tokenizer(BPE_GZ, os.path.join(tmp, "full"))
        clip_dir = os.path.join(OUT, "clip")
        os.makedirs(clip_dir, exist_ok=True)
        for name in ["tokenizer.json", "tokenizer_config.json"]:
            with open(os.path.join(tmp, "full", name), encoding="utf-8") as f:
                write_json(os.path.join(clip_dir, name), json.load(f))
        print("clip")
        clip = AutoTokenizer.from_pretrained(clip_dir)
        assert type(clip).__name__ == "CLIPTokenizer"
        write_cases("clip", clip.backend_tokenizer, texts, 1234, clip)

        small_src = os.path.join(tmp, "small")
        clip_tokenizer(BPE_GZ, small_src, merge_count=1000)
        legacy_dir = os.path.join(OUT, "clip-small-legacy")
        os.makedirs(legacy_dir, exist_ok=True)
        for name in ["vocab.json", "merges.txt", "tokenizer_config.json"]:
            shutil.copy(os.path.join(small_src, name), legacy_dir)
        small = AutoTokenizer.from_pretrained(legacy_dir)
        assert type(small).__name__ == "CLIPTokenizer"
        print("clip-small-legacy")
        write_cases("clip-small-legacy", small.backend_tokenizer, texts[:1000], 99, small)

    for name, build in [("gpt2-style", gpt2_style), ("bert-style", lambda: wordpiece(True)),
                        ("bert-cased-style", lambda: wordpiece(False)), ("llama3-style", llama3_style)]:
        print(name)
        tok = save(build(), name)
        if name == "llama3-style":
            check_ignore_merges_matters(tok, texts)
        write_cases(name, tok, texts, 7)

    with tempfile.TemporaryDirectory() as tmp:
        for name, model_type, byte_fallback in [("t5-style", "unigram", False), ("llama-style", "bpe", True)]:
            print(name)
            model_file = train_spm(model_type, tmp, byte_fallback)
            tok = save(t5_style(model_file) if name == "t5-style" else llama_style(model_file), name)
            write_cases(name, tok, texts, 21)


if __name__ == "__main__":
    main()
