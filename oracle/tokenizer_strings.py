"""The input strings every tokenizer fixture shares: Tests/Fixtures/tokenizers/real/strings.json.

Hand-written edge cases, then random strings from pools: English words, digits, punctuation and contractions,
whitespace of every kind and long runs of it, accents (composed and decomposed), a few dozen scripts, emoji (ZWJ,
flags, keycaps, tags), control characters, noncharacters and other invalid-looking code points, and the special
tokens of every fixture pipeline glued to words. Deterministic: the same list on every run.
"""
import random

COUNT = 5000

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
    # Added in the second round: real-tokenizer prompts, script changes, runs, invalid-looking code points.
    "<|im_start|>user\nWhat is in this image?<|im_end|>\n<|im_start|>assistant\n",
    "[CLS] a [MASK] sat on the [SEP]", "[cls] lower [mask]", "<|im_start|><|im_end|>", "<repo_name>x<file_sep>",
    "[CLS] hello [MASK] world [SEP]", "[mask] x[SEP]y", "word[CLS]word<s>word</s>word<unk><sep>x",
    "<|begin_of_text|>Hi<|eot_id|><|begin_of_text|>", "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?",
    "Ünïcödé façade — naïve café, Straße; ΑΒΓ αβγ; Привет, мир! こんにちは世界 你好，世界",
    "    indented code:\n\tdef f(x):\n\t\treturn x ** 2  # square\n", "don't won't can't I'm you're they've we'll he'd",
    "https://example.com/path?query=1&b=2#frag", "email@example.com", "$1,234.56 and 99% of 1e-10",
    "どこで生れ。Yes", "Apples are りんご 林檎", "カタカナーひらがなー漢字ー", "ラーメン1杯とcoffee☕を",
    "Latin123Ελληνικά456Кириллица", "mixed/scripts:абв-αβγ-abc", "x\u0301\u0302y\u0300", "\u0300\u0301 leading marks",
    "\ufffe\uffff\U0001fffe\U0010ffff noncharacters", "\u0378\u0379\u0380 unassigned", "\ufffd\ufffd replacement",
    "bidi \u202eevil\u202c \u2066isolate\u2069 \u200fRLM", "tags \U000e0001\U000e0041\U000e007f end",
    "mojibake Ã© Ã¨ â€™ â€œ Â\xa0", "\x80\x81\x9f C1 controls", "\ufeffBOM at start", "\x00" * 5,
    "!" * 64, "." * 100, "-" * 80 + "=" * 40, "?!" * 30, " " * 64, "\t" * 20, "\n" * 30, "\r\n" * 12,
    " \t \n \u3000 \u00a0 " * 5, "a" + " " * 40 + "b", "end with spaces" + " " * 17,
    "Tiếng Việt có dấu: người, đường, phở", "فارسی\u200cنویسی", "ትግርኛ ኣማርኛ", "தமிழ் மொழி", "বাংলা লিপি",
    "ᠮᠣᠩᠭᠣᠯ", "བོད་ཡིག", "ភាសាខ្មែរ", "ພາສາລາວ", "සිංහල", "ᏣᎳᎩ", "ꦗꦮ", "𐌰𐌱𐌲 gothic", "𓀀𓀁 hieroglyphs",
]

POOLS = {
    "ascii_words": ["the", "a", "photo", "of", "cat", "Dog", "RUNNING", "in", "the", "park", "x", "z", "qu",
                    "hello", "World", "tokenizer", "CLIP", "model", "is", "Great", "xyzzy", "aaaa", "bbbbbb",
                    "Internationalization", "don't", "I'm", "e.g.", "U.S.A.", "iPhone", "McDonald's", "naïve"],
    "digits": ["0", "1", "42", "2024", "3.14", "007", "1e10", "99.9%", "12,345", "1234567890", "0x1F", "-7"],
    "punct": [".", ",", "!", "?", "...", "-", "--", "'", "''", '"', "(", ")", "[", "]", "{", "}", ":", ";", "/",
              "\\", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=", "~", "`", "|", "<", ">", "<|", "|>", "。",
              "、", "！", "？", "«", "»", "—", "…", "¿", "¡", "·", "•"],
    "contractions": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't", "'x", "''s"],
    "spaces": [" ", "  ", "   ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u2028", "\x0b", "\x0c",
               "\x85", " \t ", "\u200b", "\u180e", "\r", "\u2029", "\u202f", "\u205f"],
    "accents": ["é", "e\u0301", "ñ", "n\u0303", "ü", "Å", "A\u030a", "ø", "ç", "œ", "Æ", "ő", "ğ", "İ", "ı",
                "ß", "ẞ", "Σ", "ς", "ǅ", "ﬁ", "Ω", "\u2126", "\u212a", "\u0301", "\u0308\u0301", "ǰ", "ΐ", "ệ",
                "ữ", "Ǆ", "ŉ"],
    "scripts": ["漢字", "日本語", "ひらがな", "カタカナ", "ー", "ラーメン", "한국어", "\u1100\u1161", "Ελληνικά",
                "Кириллица", "עברית", "العربية", "हिन्दी", "ไทย", "ქართული", "Հայերեն", "ᚠᚢᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚",
                "ꙮ", "தமிழ்", "বাংলা", "ગુજરાતી", "ਪੰਜਾਬੀ", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "සිංහල", "ትግርኛ",
                "བོད", "ខ្មែរ", "ລາວ", "ᠮᠣᠩ", "ㄅㄆㄇ", "ꀀꀁ", "𐌰𐌱", "ᏣᎳᎩ", "Tiếng", "فارسی\u200cنویسی", "ߒߞߏ"],
    "emoji": ["😀", "👍", "👍🏽", "👨‍👩‍👧", "👩‍💻", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "✨", "🤖", "1️⃣", "©", "™", "🀄",
              "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🫠", "☕", "⚡️", "🧑🏿‍🚀"],
    "specials": ["<|startoftext|>", "<|endoftext|>", "<|ENDOFTEXT|>", "</w>", "<|", "|>", "<|endoftext",
                 "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "[cls]", "<s>", "</s>", "<unk>", "<sep>", "<pad>",
                 "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "▁", "##", "##s", "Ġ"],
    "controls": ["\x00", "\x01", "\x07", "\x08", "\x1b", "\x7f", "\x9f", "\x1f", "\ufeff", "\ufffd", "\ue000",
                 "\x80", "\xad", "\u200e", "\u202e", "\u2066"],
    "invalid": ["\ufffe", "\uffff", "\U0001fffe", "\U0010ffff", "\u0378", "\U000e0001", "\U000e0041", "Ã©",
                "â€™", "\U000f0000", "\U00100000", "\ufdd0", "\U0003fffe", "\u2fff", "\U0001d455"],
    "numbers": ["½", "²", "Ⅻ", "①", "٣", "४", "０", "௰", "𝟗", "፩", "〇", "十"],
}

RUNS = [" ", "\t", "\n", "\r\n", "\u3000", ".", "!", "?", "-", "=", "_", "*", "#", "~", "\u00a0", "😀", "ー", "a"]


def random_run(rng):
    """A long run of one or two characters: whitespace and punctuation runs stress the splitting patterns."""
    first, second = rng.choice(RUNS), rng.choice(RUNS)
    return "".join(first if rng.random() < 0.7 else second for _ in range(rng.randint(8, 70)))


def random_string(rng):
    kinds = list(POOLS)
    pieces = []
    for _ in range(rng.randint(1, 14)):
        if rng.random() < 0.04:
            pieces.append(random_run(rng))
        else:
            pieces.append(rng.choice(POOLS[rng.choice(kinds)]))
        if rng.random() < 0.5:
            pieces.append(rng.choice([" ", " ", " ", "", "\t", "  ", "\n"]))
    return "".join(pieces)


def random_long_string(rng):
    words = POOLS["ascii_words"] + POOLS["scripts"] + POOLS["emoji"] + POOLS["digits"]
    return " ".join(rng.choice(words) for _ in range(rng.randint(30, 80)))


def strings(seed, count):
    rng = random.Random(seed)
    out = list(HAND_WRITTEN)
    while len(out) < count:
        out.append(random_long_string(rng) if rng.random() < 0.015 else random_string(rng))
    return out[:count]


def shared_strings():
    """The strings of real/strings.json."""
    return strings(41, COUNT)
