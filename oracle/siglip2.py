"""SigLIP 2 (NaFlex) fixtures: tiny random-init Siglip2Model checkpoints with a tiny Gemma-style tokenizer, and what
transformers computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/siglip2.py

Published SigLIP 2 checkpoints ship Gemma's tokenizer.json (256,000 pieces, far too large for a fixture) with a
tokenizer_config.json naming "GemmaTokenizer". transformers 5.23 lists siglip2 among the model types whose Hub
tokenizer class is wrong and loads Siglip2Tokenizer instead: the vocabulary and merges of tokenizer.json in its own
pipeline (Lowercase + Replace(" ", "▁") normalizer, Split(" ") pre-tokenizer, byte-fallback BPE), whatever
normalizer and pre-tokenizer the file states; `<eos>` appended (add_eos_token, or the file's post-processor). The
tokenizer here is the same kind of file: a byte-fallback BPE trained here on the shared tokenizer strings, Gemma's
special tokens and byte pieces first, saved by GemmaTokenizer as the conversion script configured it
(add_bos_token false, add_eos_token true, right padding, model_input_names ["input_ids"]).

Writes Tests/Fixtures/siglip2/<checkpoint>/ (a checkpoint directory SwiftVLM loads as is, plus expected.safetensors
and expected.json) and Tests/Fixtures/siglip2/interpolate.safetensors (F.interpolate(mode="bilinear",
align_corners=False, antialias=True) on random planes, shrinking and growing). Photos: a landscape, a portrait
JPEG turned upright by its EXIF orientation, a 40×27 photo and a 5:1 one (from other families' fixtures), so that
images upscale, downscale, pad and take non-square patch grids.
"""
import collections
import json
import os
import shutil
import tempfile

import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file
from transformers import (AutoTokenizer, GemmaTokenizer, Siglip2Config, Siglip2ImageProcessorPil, Siglip2Model,
                          pipeline)
from transformers.image_utils import load_image
from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches
from transformers.utils import logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "siglip2")
PHOTOS = ["photos/chelsea.png", "clipseg/photos/coffee-portrait-exif6.jpg", "clipseg/photos/rocket-small.png",
          "llava-next/photos/wide.png"]

# Embedded as Siglip2Processor's text defaults tokenize them: padding="max_length", max_length=64, truncation.
TEXTS = [
    "a photo of a cat",
    "A Photo of a DOG!",
    "This is a photo of coffee.",
    "",
    "Ünïcödé text, with CJK 猫 and emoji 🚀",
    "  leading spaces,\tand a tab",
]
LABELS = ["cat", "Coffee", "rocket", "camera man"]
TEMPLATE = "This is a photo of {}."
# A label whose prompt passes the 64 tokens the pipeline pads to: transformers truncates it, SwiftVLM refuses it.
TOO_LONG_LABEL = " ".join(["a very long label"] * 12)
TOKENIZER_STRINGS = 2000

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]

CHECKPOINTS = {
    # Laid out as the published checkpoints: no attention mask for the text tower, add_eos_token in the config and
    # tokenizer.json without a pre-tokenizer (as 4.x GemmaTokenizerFast saved it). A 4×4 position grid, patch 8.
    "tiny-naflex-fp16": dict(
        dtype=torch.float16, logit_scale=2.3, logit_bias=-1.5, published_layout=True,
        tokenizer=dict(model_input_names=["input_ids"]),
        text=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  projection_size=32),
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    patch_size=8, num_patches=16),
        processor=dict(patch_size=8, max_num_patches=64),
    ),
    # The tokenizer as 5.23 saves it (the attention mask reaches the text tower), erf GELU, bf16, bicubic resizing,
    # other mean/std, a 5×5 grid of patch 6 and 40 patches at most.
    "tiny-naflex-bf16": dict(
        dtype=torch.bfloat16, logit_scale=1.7, logit_bias=0.4, published_layout=False,
        tokenizer={},
        text=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                  hidden_act="gelu", layer_norm_eps=1e-5),
        vision=dict(hidden_size=48, intermediate_size=72, num_hidden_layers=3, num_attention_heads=3,
                    patch_size=6, num_patches=25, hidden_act="gelu", layer_norm_eps=1e-5),
        processor=dict(patch_size=6, max_num_patches=40, resample=Image.Resampling.BICUBIC,
                       image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711]),
    ),
}


def gemma_style_tokenizer(strings, size=900, alphabet_size=150):
    """A byte-fallback BPE over SentencePiece-style text (spaces as "▁", no pre-tokenization): Gemma's special tokens
    first, then the 256 byte pieces, then the most frequent characters of the shared strings and merges learnt from
    their "▁"-prefixed words, as SentencePiece learns them. Trained here rather than by `tokenizers`' BpeTrainer,
    whose ties fall in hash order: the same tokenizer every run (a minute or so)."""
    words = collections.Counter()
    for text in strings:
        for word in text.replace(" ", "▁").split("▁"):
            if word:
                words["▁" + word] += 1
    frequency = collections.Counter()
    for word, count in words.items():
        for character in word:
            frequency[character] += count
    pieces = sorted(frequency, key=lambda c: (-frequency[c], c))[:alphabet_size]
    known = set(pieces)
    sequences = [(list(word), count) for word, count in sorted(words.items())]
    merges = []
    while len(pieces) < size:
        pairs = collections.Counter()
        for symbols, count in sequences:
            for a, b in zip(symbols, symbols[1:]):
                if a in known and b in known:
                    pairs[a, b] += count
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        merges.append((a, b))
        pieces.append(a + b)
        known.add(a + b)
        for index, (symbols, count) in enumerate(sequences):
            if a not in symbols:
                continue
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            sequences[index] = (merged, count)
    vocab = {}
    for token in SPECIAL + [f"<0x{b:02X}>" for b in range(256)] + pieces:
        vocab.setdefault(token, len(vocab))
    return vocab, merges


def write_tokenizer(out, vocab, merges, spec):
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=False, add_eos_token=True,
                               padding_side="right", **spec["tokenizer"])
    tokenizer.save_pretrained(out)
    if spec["published_layout"]:
        path = os.path.join(out, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        data["pre_tokenizer"] = None
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
        path = os.path.join(out, "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        config.update(add_bos_token=False, add_eos_token=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=2)


def build(name, spec, vocab, merges, strings):
    out = os.path.join(OUT, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    write_tokenizer(out, vocab, merges, spec)
    text = dict(vocab_size=len(vocab), max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                **spec["text"])
    config = Siglip2Config(text_config=text, vision_config=spec["vision"])
    torch.manual_seed(len(name))
    model = Siglip2Model(config).eval()
    with torch.no_grad():  # random init zeroes them; make them tested numbers
        model.logit_scale.fill_(spec["logit_scale"])
        model.logit_bias.fill_(spec["logit_bias"])
        for key, value in model.named_parameters():
            if key.endswith("bias") and value.dim() == 1 and value.numel() > 1:
                value.normal_(0, 0.02)
    model.to(spec["dtype"]).save_pretrained(out)
    Siglip2ImageProcessorPil(**spec["processor"]).save_pretrained(out)

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(tokenizer).__name__ == "Siglip2Tokenizer", type(tokenizer)
    model = Siglip2Model.from_pretrained(out, dtype=torch.float32).eval()
    processor = Siglip2ImageProcessorPil.from_pretrained(out)
    images = [load_image(os.path.join(FIXTURES, p)) for p in PHOTOS]
    processed = processor(images=images, return_tensors="pt")
    sizes = [get_image_size_for_max_num_patches(i.height, i.width, processor.patch_size, processor.max_num_patches)
             for i in images]
    text_inputs = tokenizer(TEXTS, padding="max_length", max_length=64, truncation=True, return_tensors="pt")
    prompts = tokenizer([TEMPLATE.format(l) for l in LABELS], padding="max_length", max_length=64, truncation=True,
                        return_tensors="pt")
    with torch.inference_mode():
        vision = model.vision_model(**processed)
        text_embeds = model.get_text_features(**text_inputs).pooler_output
        logits_per_image = model(**processed, **prompts).logits_per_image
        # Each image alone, padded to max_num_patches, as the pipeline runs it.
        alone = torch.cat([model.get_image_features(**processor(images=[i], return_tensors="pt")).pooler_output
                           for i in images])

    classifier = pipeline("zero-shot-image-classification", model=out, image_processor=processor,
                          dtype=torch.float32)
    assert type(classifier.tokenizer).__name__ == "Siglip2Tokenizer"
    classified = [classifier(os.path.join(FIXTURES, p), candidate_labels=LABELS, hypothesis_template=TEMPLATE)
                  for p in PHOTOS]
    too_long = len(tokenizer(TEMPLATE.format(TOO_LONG_LABEL)).input_ids)
    assert too_long > 64
    # Siglip2Tokenizer pads on the left when tokenizer_config.json names no padding_side.
    with tempfile.TemporaryDirectory() as unsided:
        for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(out, file), unsided)
        path = os.path.join(unsided, "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        del config["padding_side"]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        left = AutoTokenizer.from_pretrained(unsided)
        assert left.padding_side == "left"
        left_padded = left(TEXTS[:3], padding="max_length", max_length=16).input_ids

    save_file({
        "pixel_values": processed.pixel_values.contiguous(),
        "pixel_attention_mask": processed.pixel_attention_mask.to(torch.float32).contiguous(),
        "image_embeds": vision.pooler_output.contiguous(),
        "image_embeds_alone": alone.contiguous(),
        "last_hidden_state": vision.last_hidden_state.contiguous(),
        "text_embeds": text_embeds.contiguous(),
        "logits_per_image": logits_per_image.contiguous(),
    }, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({
            "photos": PHOTOS,
            "image_sizes": [[i.height, i.width] for i in images],
            "resized_sizes": [list(s) for s in sizes],
            "spatial_shapes": processed.spatial_shapes.tolist(),
            "texts": TEXTS,
            "input_ids": text_inputs.input_ids.tolist(),
            "attention_mask": text_inputs["attention_mask"].tolist() if "attention_mask" in text_inputs else None,
            "labels": LABELS,
            "template": TEMPLATE,
            "prompt_ids": prompts.input_ids.tolist(),
            "prompt_mask": prompts["attention_mask"].tolist() if "attention_mask" in prompts else None,
            "left_padded_ids": left_padded,
            "too_long_label": TOO_LONG_LABEL,
            "too_long_tokens": too_long,
            "zero_shot": [{"image": p, "scores": c} for p, c in zip(PHOTOS, classified)],
            # The tokenizer is the same in both checkpoints: its ids for the shared strings are kept once.
            "tokenizer_strings": ([tokenizer(s).input_ids for s in strings[:TOKENIZER_STRINGS]]
                                  if spec["published_layout"] else None),
        }, f, ensure_ascii=False, separators=(",", ":"))


def interpolation_cases():
    """Antialiased bilinear resizes of random [1, C, H, W] planes to sizes smaller, larger and mixed."""
    torch.manual_seed(7)
    tensors = {}
    for index, (source, target) in enumerate([((4, 4), (2, 9)), ((5, 5), (8, 3)), ((16, 16), (5, 7)),
                                              ((4, 4), (4, 4)), ((3, 6), (1, 1)), ((7, 5), (15, 2))]):
        x = torch.randn(1, 3, *source)
        tensors[f"{index}.input"] = x
        tensors[f"{index}.output"] = F.interpolate(x, size=target, mode="bilinear", align_corners=False,
                                                   antialias=True).contiguous()
    save_file(tensors, os.path.join(OUT, "interpolate.safetensors"))


def main():
    logging.set_verbosity_error()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(FIXTURES, "tokenizers", "real", "strings.json"), encoding="utf-8") as f:
        strings = json.load(f)
    vocab, merges = gemma_style_tokenizer(strings)
    for name, spec in CHECKPOINTS.items():
        build(name, spec, vocab, merges, strings)
    interpolation_cases()
    for directory, _, files in os.walk(OUT):
        for file in files:
            os.chmod(os.path.join(directory, file), 0o644)


if __name__ == "__main__":
    main()
