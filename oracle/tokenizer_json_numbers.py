"""How tokenizers (serde_json without float_roundtrip) reads JSON numbers: not always the correctly rounded double.
Writes Tests/Fixtures/tokenizers/json_numbers.json: [{"text": number as written, "read": repr of the double tokenizers
holds after loading it as a Unigram score}]. Run: python oracle/tokenizer_json_numbers.py
"""
import json
import os
import random

from tokenizers import Tokenizer

OUT = os.path.join(os.path.dirname(__file__), "..", "Tests", "Fixtures", "tokenizers", "json_numbers.json")


def number_texts(seed, count):
    rng = random.Random(seed)
    texts = ["0", "-0", "1", "-1.5", "0.1", "1e-7", "-2.5E+3", "123456789012345678901234567890", "1.0e-320", "-1e-400",
             "18446744073709551615", "18446744073709551616.5", "0.000000000000000000000000000001",
             "3.14159265358979323846264338327950288"]
    while len(texts) < count:
        digits = rng.randrange(1, 24)
        significand = str(rng.randrange(10 ** (digits - 1), 10 ** digits))
        point = rng.randrange(1, len(significand) + 1)
        text = ("-" if rng.random() < 0.7 else "") + significand[:point] + ("." + significand[point:] if point < len(significand) else "")
        if rng.random() < 0.2:
            text += "e" + str(rng.randrange(-30, 30))
        texts.append(text)
    return texts


def main():
    texts = number_texts(11, 400)
    vocab = ",".join('["<unk>", 0.0]' if i == 0 else '["p%d", %s]' % (i, text) for i, text in enumerate([""] + texts))
    source = ('{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,'
              ' "pre_tokenizer": null, "post_processor": null, "decoder": null,'
              ' "model": {"type": "Unigram", "unk_id": 0, "vocab": [%s], "byte_fallback": false}}' % vocab)
    read = json.loads(Tokenizer.from_str(source).to_str())["model"]["vocab"][1:]
    cases = [{"text": text, "read": repr(float(score))} for text, (_, score) in zip(texts, read)]
    differing = sum(float(case["text"]) != float(case["read"]) for case in cases)
    print(f"{len(cases)} numbers, {differing} read differently from correct rounding")
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(cases, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
