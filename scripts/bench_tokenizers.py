"""Tokenizer throughput: Rust `tokenizers` (single-threaded) beside SwiftVLM's `vlm bench-tokenizer`, in one run.

    swift build -c release                                   # for the SwiftVLM rows
    python scripts/bench_tokenizers.py [--megabytes 1] [--passes 3] [--vlm .build/release/vlm]
                                                             [--json results.json]

The text is ~1 MB of multilingual lines: the 5,000 strings of Tests/Fixtures/tokenizers/real/strings.json (English,
accents, a dozen scripts, emoji, digits, controls), shuffled with a fixed seed and repeated, newlines inside a string
turned into spaces. Every engine encodes each line with its special tokens, no padding or truncation:
  - tokenizers, `encode_batch(lines)` with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false;
  - tokenizers, one `encode(line)` call per line (Python's call overhead included);
  - SwiftVLM, one `Tokenizer.encode(_:)` call per line, timed inside `vlm bench-tokenizer`.
Each row is the fastest of --passes passes; every engine's token count must agree, or the script fails.
Tokenizers: byte-level BPE (SmolLM2's tokenizer.json; GPT-2 from vocab.json + merges.txt) and WordPiece
(bert-base-uncased's tokenizer.json).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from transformers import AutoTokenizer  # noqa: E402

from machine import describe, summary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real")
TOKENIZERS = [("SmolLM2 (byte-level BPE)", "smollm2"), ("GPT-2 (byte-level BPE)", "gpt2"), ("BERT uncased (WordPiece)", "bert-uncased")]


def build_text(megabytes, seed):
    with open(os.path.join(REAL, "strings.json"), encoding="utf-8") as f:
        strings = [s.replace("\n", " ") for s in json.load(f)]
    rng = random.Random(seed)
    lines, size = [], 0
    while size < megabytes * 1e6:
        line = rng.choice(strings)
        lines.append(line)
        size += len(line.encode()) + 1
    return lines


def best_of(passes, run):
    best, result = float("inf"), None
    for _ in range(passes):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=float, default=1.0)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    parser.add_argument("--json")
    args = parser.parse_args()

    lines = build_text(args.megabytes, seed=7)
    text = "\n".join(lines)
    size = len(text.encode())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        for title, name in TOKENIZERS:
            directory = os.path.join(REAL, name)
            backend = AutoTokenizer.from_pretrained(directory).backend_tokenizer
            # As transformers calls it: all-MiniLM's tokenizer.json itself pads and truncates to 128.
            backend.no_padding()
            backend.no_truncation()
            seconds, encodings = best_of(args.passes, lambda: backend.encode_batch(lines))
            batch_tokens = sum(len(e.ids) for e in encodings)
            rows.append({"tokenizer": title, "engine": "tokenizers encode_batch, 1 thread", "tokens": batch_tokens, "seconds": seconds})
            seconds, tokens = best_of(args.passes, lambda: sum(len(backend.encode(line).ids) for line in lines))
            rows.append({"tokenizer": title, "engine": "tokenizers encode per line", "tokens": tokens, "seconds": seconds})
            try:
                out = subprocess.run([args.vlm, "bench-tokenizer", "--model", directory, "--file", path, "--passes",
                                      str(args.passes), "--json"], check=True, capture_output=True, text=True)
                report = json.loads(out.stdout)
                assert report["bytes"] == size, (report["bytes"], size)
                rows.append({"tokenizer": title, "engine": "SwiftVLM encode per line", "tokens": report["tokens"], "seconds": report["seconds"]})
            except (OSError, subprocess.CalledProcessError) as error:
                rows.append({"tokenizer": title, "engine": "SwiftVLM encode per line", "error": str(error)})
            counts = {row["tokens"] for row in rows if row["tokenizer"] == title and "tokens" in row}
            if len(counts) != 1:
                sys.exit(f"{title}: the engines disagree on the token count: {[row for row in rows if row['tokenizer'] == title]}")

    print(summary(describe(1)))
    print(f"{size} bytes, {len(lines)} lines; fastest of {args.passes} passes, one thread")
    print(f"{'tokenizer':26} {'engine':36} {'tokens':>9} {'seconds':>8} {'MB/s':>7}")
    for row in rows:
        if "error" in row:
            print(f"{row['tokenizer']:26} {row['engine']:36} failed: {row['error']}")
            continue
        row["mb_per_s"] = size / 1e6 / row["seconds"]
        print(f"{row['tokenizer']:26} {row['engine']:36} {row['tokens']:9d} {row['seconds']:8.3f} {row['mb_per_s']:7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": size, "lines": len(lines), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
