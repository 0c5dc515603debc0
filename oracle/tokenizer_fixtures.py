"""Fixtures for VLMTokenizers: what transformers' CLIPTokenizer (tokenizers 0.23 underneath) makes of many strings.

Run by hand from the package root: python oracle/tokenizer_fixtures.py
Writes Tests/Fixtures/tokenizers/:
  clip/                 tokenizer.json + tokenizer_config.json of the full OpenAI CLIP vocabulary
  clip-small-legacy/    vocab.json + merges.txt + tokenizer_config.json (first 1000 merges, no tokenizer.json)
  gpt2-style/, bert-style/: tokenizer.json only, built with the tokenizers library (GPT-2's byte-level pipeline over
                        the small CLIP vocabulary; a WordPiece trained here with BERT's normalizer and processors)
  gpt2_style_cases.json, bert_style_cases.json: ids, tokens and decoded text from tokenizers itself
  clip_cases.json, clip_small_cases.json: per string ids, tokens, decoded text (with and without special tokens);
                        batches encoded with padding=True, truncation=True, max_length=77; random id runs decoded
"""
import json
import os
import random
import shutil
import tempfile

from clip_vocab import clip_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers")
BPE_GZ = "/work/data/clipvocab/bpe_simple_vocab_16e6.txt.gz"

HAND_WRITTEN = [
    "",
    " ",
    "a",
    "A photo of a cat",
    "a photo of a dog.",
    "Hello, world!",
    "  leading and trailing  ",
    "it's what we'll do, they're sure I'm right and you've said she'd go; don't",
    "IT'S WE'LL THEY'RE I'M YOU'VE SHE'D DON'T",
    "'s 'll 're 've 'm 'd 't '' ''' 'x 'stop",
    "rock'n'roll o'clock",
    "tabs\tand\nnewlines\r\nand\x0bvertical\x0cform feed",
    "non\u00a0breaking\u3000ideographic\u2028line\u2029para\u0085nel\u2000en quad\u200bzero width",
    "many     spaces   between",
    "\t\t\n\n   ",
    "café naïve résumé façade coöperate Ångström",
    "cafe\u0301 nai\u0308ve A\u030angstro\u0308m",  # decomposed: NFC must compose
    "\u212b \u2126 \u212a",  # Angstrom sign, Ohm sign, Kelvin sign: NFC maps to letters
    "ΣΊΣΥΦΟΣ ΟΔΟΣ Σ σ ς",  # final sigma must not apply
    "İstanbul IĞDIR ıi",  # Turkish dotted capital I lowercases to i + combining dot
    "Straße STRASSE ẞ",
    "ﬁ ﬀ ﬃ ǅ ǈ ǋ",
    "漢字と仮名の混じった文章です。",
    "中文句子，带有标点符号！",
    "한국어 문장입니다",
    "\u1112\u1161\u11ab\u1100\u1173\u11af",  # conjoining jamo: NFC composes to 한글
    "العربية نص",
    "עברית טקסט",
    "हिन्दी पाठ",
    "ภาษาไทย",
    "Русский текст ЁЖИК",
    "emoji 👍 👍🏽 ❤️ 😀😃😄",
    "family 👨‍👩‍👧‍👦 and 👩‍💻 zwj",
    "flags 🇫🇷🇩🇪🇯🇵 🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "keycaps 1️⃣ #️⃣",
    "digits 0123456789 3.14159 1,000,000 2024-01-01",
    "numbers ½ ² ³ Ⅻ ① ٣ ४ ０１２",
    "fullwidth ＡＢＣ ａｂｃ",
    "math ∑ ∫ √ ≤ ≥ ≠ ∞ π",
    "punctuation !!! ??? ... --- ((())) [x] {y} <z> @#$%^&*",
    "quotes “double” ‘single’ «guillemets» „low“",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|startoftext|>a photo<|endoftext|>",
    "hello<|endoftext|>world",
    "a<|startoftext|>b<|endoftext|>c",
    "<|ENDOFTEXT|> <|EndOfText|>",
    "<|endoftext|<|endoftext|>|>",
    "<|endoftext",
    "</w> word</w> </w></w>",
    "control \x00 \x01 \x07 \x1b \x7f \x1c\x1d\x1e\x1f end",
    "combining a\u0300\u0301\u0302 e\u0327\u0306 q\u0307\u0323 \u0301alone",
    "private use \ue000\uf8ff and \U000f0000",
    "soft\u00adhyphen zero\u200cwidth\u200djoiner",
    "http://example.com/path?q=1&r=2#frag user@example.com",
    "C++ C# .NET node.js",
    "snake_case camelCase kebab-case SCREAMING_CASE",
    "A" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    " ".join(["word"] * 100),
    "The quick brown fox jumps over the lazy dog. " * 6,
    "ab" * 200,
    "😀" * 40,
]

POOLS = {
    "ascii_words": ["the", "a", "photo", "of", "cat", "Dog", "RUNNING", "in", "the", "park", "x", "z", "qu",
                    "hello", "World", "tokenizer", "CLIP", "model", "is", "Great", "xyzzy", "aaaa", "bbbbbb"],
    "digits": ["0", "1", "42", "2024", "3.14", "007", "1e10", "99.9%", "12,345"],
    "punct": [".", ",", "!", "?", "...", "-", "--", "'", "''", '"', "(", ")", "[", "]", "{", "}", ":", ";", "/",
              "\\", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=", "~", "`", "|", "<", ">", "<|", "|>"],
    "contractions": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't", "'x", "''s"],
    "spaces": [" ", "  ", "   ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u2028", "\x0b", "\x0c",
               "\x85", " \t ", "\u200b", "\u180e"],
    "accents": ["é", "e\u0301", "ñ", "n\u0303", "ü", "Å", "A\u030a", "ø", "ç", "œ", "Æ", "ő", "ğ", "İ", "ı",
                "ß", "ẞ", "Σ", "ς", "ǅ", "ﬁ", "Ω", "\u2126", "\u212a", "\u0301", "\u0308\u0301", "ǰ", "ΐ"],
    "scripts": ["漢字", "日本語", "ひらがな", "カタカナ", "한국어", "\u1100\u1161", "Ελληνικά", "Кириллица", "עברית",
                "العربية", "हिन्दी", "ไทย", "ქართული", "Հայերեն", "ᚠᚢᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚", "ꙮ"],
    "emoji": ["😀", "👍", "👍🏽", "👨‍👩‍👧", "👩‍💻", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "✨", "🤖", "1️⃣", "©", "™", "🀄"],
    "specials": ["<|startoftext|>", "<|endoftext|>", "<|ENDOFTEXT|>", "</w>", "<|", "|>", "<|endoftext"],
    "controls": ["\x00", "\x01", "\x07", "\x08", "\x1b", "\x7f", "\x9f", "\x1f", "\ufeff", "\ufffd", "\ue000"],
    "numbers": ["½", "²", "Ⅻ", "①", "٣", "४", "０", "௰", "𝟗"],
}


def random_string(rng):
    kinds = list(POOLS)
    pieces = []
    for _ in range(rng.randint(1, 14)):
        pieces.append(rng.choice(POOLS[rng.choice(kinds)]))
        if rng.random() < 0.5:
            pieces.append(rng.choice([" ", " ", " ", "", "\t", "  ", "\n"]))
    return "".join(pieces)


def random_long_string(rng):
    words = POOLS["ascii_words"] + POOLS["scripts"] + POOLS["emoji"] + POOLS["digits"]
    return " ".join(rng.choice(words) for _ in range(rng.randint(40, 120)))


def strings(seed, count):
    rng = random.Random(seed)
    out = list(HAND_WRITTEN)
    while len(out) < count:
        out.append(random_long_string(rng) if rng.random() < 0.05 else random_string(rng))
    return out


def cases(tok, texts, seed, with_batches=True):
    backend = tok.backend_tokenizer
    out = {"single": [], "batches": [], "decode_ids": []}
    for text in texts:
        enc = backend.encode(text)
        ids = tok(text)["input_ids"]
        assert ids == enc.ids, text
        plain = tok(text, add_special_tokens=False)["input_ids"]
        out["single"].append({
            "text": text,
            "ids": ids,
            "tokens": enc.tokens,
            "ids_without_special": plain,
            "decoded": tok.decode(ids),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    if with_batches:
        rng = random.Random(seed + 1)
        for _ in range(40):
            batch = rng.sample(texts, rng.randint(1, 6))
            enc = tok(batch, padding=True, truncation=True, max_length=77)
            fixed = tok(batch, padding="max_length", truncation=True, max_length=16)
            out["batches"].append({
                "texts": batch,
                "longest_77": {"ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                "max_length_16": {"ids": fixed["input_ids"], "attention_mask": fixed["attention_mask"]},
            })
    rng = random.Random(seed + 2)
    vocab_size = len(tok)
    for _ in range(200):
        # Random id runs decode to partial UTF-8 sequences: checks the lossy byte decoding too.
        ids = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))]
        out["decode_ids"].append({"ids": ids, "decoded": tok.decode(ids),
                                  "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return out


def write_json(name, obj):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full = clip_tokenizer(BPE_GZ, os.path.join(tmp, "full"))
        clip_dir = os.path.join(OUT, "clip")
        os.makedirs(clip_dir, exist_ok=True)
        for name in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(os.path.join(tmp, "full", name), clip_dir)
        write_json("clip_cases.json", cases(full, strings(1234, 2200), 1234))

        small_src = os.path.join(tmp, "small")
        clip_tokenizer(BPE_GZ, small_src, merge_count=1000)
        legacy_dir = os.path.join(OUT, "clip-small-legacy")
        os.makedirs(legacy_dir, exist_ok=True)
        for name in ["vocab.json", "merges.txt", "tokenizer_config.json"]:
            shutil.copy(os.path.join(small_src, name), legacy_dir)
        from transformers import AutoTokenizer

        small = AutoTokenizer.from_pretrained(legacy_dir)
        assert type(small).__name__ == "CLIPTokenizer"
        write_json("clip_small_cases.json", cases(small, strings(99, 600), 99))
    extra_pipelines()
    import tokenizer_phase2

    tokenizer_phase2.main()


def backend_cases(tok, texts, seed):
    """Cases from a tokenizers.Tokenizer directly (no transformers class exists for these hand-built pipelines)."""
    out = {"single": [], "decode_ids": []}
    for text in texts:
        enc = tok.encode(text)
        out["single"].append({
            "text": text, "ids": enc.ids, "tokens": enc.tokens,
            "ids_without_special": tok.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(enc.ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
        })
    rng = random.Random(seed)
    for _ in range(100):
        ids = [rng.randrange(tok.get_vocab_size()) for _ in range(rng.randint(1, 12))]
        out["decode_ids"].append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                                  "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return out


def write_backend(name, tok, texts, seed):
    directory = os.path.join(OUT, name)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    write_json(name.replace("-", "_") + "_cases.json", backend_cases(tok, texts, seed))


def extra_pipelines():
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE, WordPiece

    legacy_dir = os.path.join(OUT, "clip-small-legacy")
    gpt2 = Tokenizer(BPE.from_file(os.path.join(legacy_dir, "vocab.json"), os.path.join(legacy_dir, "merges.txt")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_special_tokens(["<|endoftext|>"])
    write_backend("gpt2-style", gpt2, strings(7, 500), 7)

    bert = Tokenizer(WordPiece(unk_token="[UNK]"))
    bert.normalizer = normalizers.BertNormalizer(lowercase=True)
    bert.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    bert.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    bert.train_from_iterator(strings(5, 3000), trainer)
    cls_id, sep_id = bert.token_to_id("[CLS]"), bert.token_to_id("[SEP]")
    bert.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    write_backend("bert-style", bert, strings(11, 500) + ["[CLS] hello [MASK] world [SEP]", "[mask] x[SEP]y"], 11)


if __name__ == "__main__":
    main()
