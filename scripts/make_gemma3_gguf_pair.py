"""Writes the GGUF pair llama.cpp's own tools make of the Gemma 3 benchmark checkpoint, for timing SwiftVLM against
llama-mtmd-cli on the same files (scripts/bench_llava_gguf.py --pair models/gemma-3-4b-12-layers-gguf).

    python scripts/make_image_chat_checkpoints.py --family gemma3    # once: models/gemma-3-4b-12-layers-random
    python scripts/make_gemma3_gguf_pair.py

Run with a python that has transformers 5.23, torch and sentencepiece (the oracle venv, oracle/requirements.txt).
llama.cpp's tree and llama-quantize come from scripts/llama_cpp_tree.py (fetched and built on first use).

models/gemma-3-4b-12-layers-gguf (git-ignored; nothing here is committed), from google/gemma-3-4b-it's image side
whole and its decoder's widths with 12 of 34 layers (see make_image_chat_checkpoints.py), as llama.cpp's converter
takes a published Gemma 3 directory:
- lm-q4_k_m.gguf: convert_hf_to_gguf.py at f16, then llama-quantize Q4_K_M. The converter reads Gemma's vocabulary
  from a SentencePiece tokenizer.model, which the benchmark checkpoint lacks (its tokenizer is the fixtures' small
  BPE): the directory handed to it gets oracle/gemma3_gguf.py's Gemma-shaped SentencePiece model (1000 pieces, the
  turn and image markers among them, <image_soft_token> added after), which the converter pads with [PAD] tokens to
  the checkpoint's 262,208 rows, so the embeddings and the head keep Gemma 3's full size. What the time depends on is
  the prompt's length (about the same) and those rows.
- mmproj-f16.gguf: convert_hf_to_gguf.py --mmproj at f16 (its own choices: the patch and position embeddings f32).
  The converter maps the published layout (`vision_tower.vision_model.…`); transformers 5.23 saves the tower without
  `vision_model.`, so the image side is renamed into a copy first.

A directory that already holds both files is left alone.
"""
import json
import os
import shutil
import sys
import tempfile

import llama_cpp_tree
from make_llava_gguf_pair import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "models", "gemma-3-4b-12-layers-random")
OUT = os.path.join(ROOT, "models", "gemma-3-4b-12-layers-gguf")
sys.path.insert(0, os.path.join(ROOT, "oracle"))


def converter_directories(work):
    """The checkpoint as the converter takes a published Gemma 3 directory, twice: for the language model (the source
    weights linked, a SentencePiece tokenizer.model with the added tokens listed in tokenizer_config.json) and for
    the mmproj (the image side alone, renamed into the published layout; the converter reads every tensor of every
    file, so the source's 5.23-layout tower cannot sit beside it)."""
    from gemma3_gguf import IMAGE_TOKENS, MARKERS, PIECES, train_tokenizer
    from safetensors import safe_open
    from safetensors.torch import save_file

    text, vision = os.path.join(work, "text"), os.path.join(work, "vision")
    for directory in (text, vision):
        os.makedirs(directory)
        for name in ("config.json", "processor_config.json", "chat_template.jinja", "generation_config.json"):
            shutil.copy(os.path.join(SOURCE, name), directory)
    shutil.copy(train_tokenizer(tempfile.mkdtemp(dir=work)), text)
    added = {i: t for i, t in enumerate(["<pad>", "<eos>", "<bos>", "<unk>"] + MARKERS)}
    added[PIECES] = IMAGE_TOKENS["image_token"]
    with open(os.path.join(text, "tokenizer_config.json"), "w") as file:
        json.dump({"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "added_tokens_decoder": {
            str(i): dict(content=t, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
            for i, t in added.items()}}, file, indent=2)
    source = os.path.join(SOURCE, "model.safetensors")
    os.symlink(source, os.path.join(text, "model.safetensors"))
    with safe_open(source, "pt") as weights:
        image_side = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k):
                      weights.get_tensor(k) for k in weights.keys() if not k.startswith("language_model.")}
    save_file(image_side, os.path.join(vision, "model.safetensors"), metadata={"format": "pt"})
    return text, vision


def main():
    lm_file, mmproj_file = os.path.join(OUT, "lm-q4_k_m.gguf"), os.path.join(OUT, "mmproj-f16.gguf")
    if os.path.exists(lm_file) and os.path.exists(mmproj_file):
        print(f"{OUT}: already written")
        return
    if not os.path.exists(os.path.join(SOURCE, "model.safetensors")):
        raise SystemExit(f"{SOURCE} is missing: python scripts/make_image_chat_checkpoints.py --family gemma3")
    tree = llama_cpp_tree.built_tree()
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(OUT)) as work:
        text, vision = converter_directories(work)
        convert = os.path.join(tree, "convert_hf_to_gguf.py")
        # The converter runs under this python (transformers 5.23 reads the checkpoint's tokenizer_config.json).
        run(tree, convert, vision, "--mmproj", "--outtype", "f16", "--outfile", mmproj_file + ".partial",
            python=sys.executable)
        f16 = os.path.join(work, "lm-f16.gguf")
        run(tree, convert, text, "--outtype", "f16", "--outfile", f16, python=sys.executable)
        run(tree, llama_cpp_tree.tool(tree, "llama-quantize"), f16, lm_file + ".partial", "Q4_K_M", python=None)
    os.rename(mmproj_file + ".partial", mmproj_file)
    os.rename(lm_file + ".partial", lm_file)
    print({f: os.path.getsize(os.path.join(OUT, f)) for f in sorted(os.listdir(OUT)) if f.endswith(".gguf")})


if __name__ == "__main__":
    sys.exit(main())
