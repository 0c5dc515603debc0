"""CLIP fixtures: tiny random-init checkpoints and what transformers computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/clip.py --bpe PATH/bpe_simple_vocab_16e6.txt.gz --photos PATH/skimage/data

Writes Tests/Fixtures/clip/<checkpoint>/ (a checkpoint directory SwiftVLM loads as is, plus expected.safetensors and
expected.json) and copies the photos it uses to Tests/Fixtures/photos/.
"""
import argparse
import json
import os
import shutil

import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer, pipeline
from transformers.image_utils import load_image

from clip_vocab import clip_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
PHOTOS = ["chelsea.png", "coffee.png", "rocket.jpg", "camera.png"]
MERGES = 1000  # vocabulary of 1514 real CLIP tokens: eos/pad <|endoftext|> = 1513, bos = 1512

TEXTS = [
    "a photo of a cat",
    "a photo of a dog",
    "This is a photo of coffee.",
    "A rocket launching into the sky!",
    "",
    "Ünïcödé text, with CJK 猫 and emoji 🚀",
    " ".join(["a very long caption that goes on"] * 20),  # far beyond 77 tokens: truncated
]
LABELS = ["cat", "coffee", "rocket", "camera man"]
TEMPLATE = "This is a photo of {}."

# Three shapes that differ in every dimension the Swift model reads from config.json.
CHECKPOINTS = {
    # eos_token_id 2: the pre-#24773 convention, pooling at the argmax of the ids.
    "tiny-quickgelu-argmax": dict(
        dtype=torch.float32, shard=None,
        text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  hidden_act="quick_gelu", eos_token_id=2, bos_token_id=0, pad_token_id=1),
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    patch_size=8, image_size=32, hidden_act="quick_gelu"),
        projection_dim=16,
        processor=dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
    ),
    # First eos position pooling, erf GELU, fp16 weights on disk.
    "tiny-gelu-eos-fp16": dict(
        dtype=torch.float16, shard=None,
        text=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  hidden_act="gelu", eos_token_id=1513, bos_token_id=1512, pad_token_id=1513, layer_norm_eps=1e-6),
        vision=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                    patch_size=14, image_size=56, hidden_act="gelu", layer_norm_eps=1e-6),
        projection_dim=24,
        processor=dict(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56},
                       image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
    ),
    # bf16 weights split over several shards with an index.
    "tiny-sharded-bf16": dict(
        dtype=torch.bfloat16, shard="150KB",
        text=dict(hidden_size=48, intermediate_size=128, num_hidden_layers=2, num_attention_heads=3,
                  hidden_act="quick_gelu", eos_token_id=1513, bos_token_id=1512, pad_token_id=1513,
                  max_position_embeddings=40),
        vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    patch_size=16, image_size=64, hidden_act="quick_gelu"),
        projection_dim=32,
        processor=dict(size={"shortest_edge": 72}, crop_size={"height": 64, "width": 64}),
    ),
}


def build(name, spec, bpe, photo_dir):
    out = os.path.join(FIXTURES, "clip", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    clip_tokenizer(bpe, out, merge_count=MERGES, model_max_length=spec["text"].get("max_position_embeddings", 77))
    text = dict(vocab_size=1514, **spec["text"])
    config = CLIPConfig(text_config=text, vision_config=spec["vision"], projection_dim=spec["projection_dim"])
    torch.manual_seed(len(name))
    model = CLIPModel(config).eval()
    with torch.no_grad():  # random init leaves logit_scale at its constant; make it a tested number
        model.logit_scale.fill_(2.3)
    model.to(spec["dtype"]).save_pretrained(out, max_shard_size=spec["shard"] or "2GB")
    CLIPImageProcessorPil(**spec["processor"]).save_pretrained(out)

    # Reload exactly what was written, in fp32: the oracle's numbers are those of the stored weights.
    model = CLIPModel.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = CLIPTokenizer.from_pretrained(out)
    processor = CLIPImageProcessorPil.from_pretrained(out)
    images = [load_image(os.path.join(photo_dir, p)).convert("RGB") for p in PHOTOS]
    pixels = processor(images=images, return_tensors="pt").pixel_values
    text_inputs = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        image_embeds = model.get_image_features(pixel_values=pixels).pooler_output
        text_embeds = model.get_text_features(**text_inputs).pooler_output
        prompts = tokenizer([TEMPLATE.format(l) for l in LABELS], padding=True, return_tensors="pt")
        logits_per_image = model(pixel_values=pixels, **prompts).logits_per_image

    classifier = pipeline("zero-shot-image-classification", model=out, image_processor=processor, dtype=torch.float32)
    classified = [classifier(os.path.join(photo_dir, p), candidate_labels=LABELS) for p in PHOTOS]

    save_file({
        "pixel_values": pixels.contiguous(),
        "image_embeds": image_embeds.contiguous(),
        "text_embeds": text_embeds.contiguous(),
        "logits_per_image": logits_per_image.contiguous(),
    }, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({
            "photos": PHOTOS,
            "texts": TEXTS,
            "input_ids": text_inputs.input_ids.tolist(),
            "attention_mask": text_inputs.attention_mask.tolist(),
            "labels": LABELS,
            "prompt_ids": prompts.input_ids.tolist(),
            "prompt_mask": prompts.attention_mask.tolist(),
            "template": TEMPLATE,
            "zero_shot": [{"image": p, "scores": c} for p, c in zip(PHOTOS, classified)],
        }, f, ensure_ascii=False, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bpe", required=True, help="open_clip's bpe_simple_vocab_16e6.txt.gz")
    parser.add_argument("--photos", required=True, help="scikit-image's skimage/data directory")
    args = parser.parse_args()
    photos_out = os.path.join(FIXTURES, "photos")
    os.makedirs(photos_out, exist_ok=True)
    for p in PHOTOS:
        shutil.copyfile(os.path.join(args.photos, p), os.path.join(photos_out, p))
    for name, spec in CHECKPOINTS.items():
        build(name, spec, args.bpe, photos_out)


if __name__ == "__main__":
    main()
