"""Hugging Face CLIP tokenizer files built from OpenAI's BPE merges (shipped in open-clip-torch's wheel).

The HF vocab.json/merges.txt of every openai/clip-* checkpoint are derived this way: 256 byte symbols, the same with
`</w>`, one token per merge, then <|startoftext|> and <|endoftext|>. `merge_count` keeps only the first merges, which
gives a real-but-small vocabulary for tiny test checkpoints.
"""
import gzip
import json
import os

FULL_MERGE_COUNT = 49152 - 256 - 2


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_clip_vocab(bpe_gz_path, out_dir, merge_count=FULL_MERGE_COUNT):
    """Writes vocab.json and merges.txt to out_dir; returns the vocabulary size."""
    lines = gzip.open(bpe_gz_path).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 1 + merge_count]]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({token: i for i, token in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.write("\n".join(" ".join(m) for m in merges) + "\n")
    return len(vocab)


def clip_tokenizer(bpe_gz_path, out_dir, merge_count=FULL_MERGE_COUNT, model_max_length=77):
    """A transformers CLIPTokenizer over those files, saved (tokenizer.json, tokenizer_config.json...) in out_dir."""
    from transformers import CLIPTokenizer

    write_clip_vocab(bpe_gz_path, out_dir, merge_count)
    tok = CLIPTokenizer.from_pretrained(out_dir, model_max_length=model_max_length)
    tok.save_pretrained(out_dir)
    return tok
