"""Contrastive losses: what `model(..., return_loss=True).loss` gives for the CLIP, SigLIP and SigLIP 2 fixtures.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/clip.py,
oracle/siglip.py and oracle/siglip2.py have written their checkpoints:

    python oracle/contrastive_loss.py    # → Tests/Fixtures/contrastive_loss.json

Each fixture's four photos and four templated labels, image i paired with label i, through the forward pass those
scripts recorded `logits_per_image` from (the same pixel values and prompt ids, checked against it here): CLIP's
symmetric cross-entropy over the similarity matrix (`clip_loss`), SigLIP's and SigLIP 2's sigmoid loss.
"""
import json
import os

import torch
from safetensors.torch import load_file
from transformers import CLIPModel, Siglip2Model, SiglipModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
CHECKPOINTS = {"clip/tiny-quickgelu-argmax": CLIPModel, "clip/tiny-gelu-eos-fp16": CLIPModel,
               "clip/tiny-sharded-bf16": CLIPModel, "siglip/tiny-tanh-fp16": SiglipModel,
               "siglip/tiny-gelu-bf16": SiglipModel, "siglip2/tiny-naflex-fp16": Siglip2Model,
               "siglip2/tiny-naflex-bf16": Siglip2Model}


def loss(checkpoint, cls):
    directory = os.path.join(FIXTURES, checkpoint)
    model = cls.from_pretrained(directory, dtype=torch.float32).eval()
    expected = json.load(open(os.path.join(directory, "expected.json")))
    tensors = load_file(os.path.join(directory, "expected.safetensors"))
    inputs = dict(pixel_values=tensors["pixel_values"], input_ids=torch.tensor(expected["prompt_ids"]))
    if expected.get("prompt_mask") is not None:
        inputs["attention_mask"] = torch.tensor(expected["prompt_mask"])
    if "pixel_attention_mask" in tensors:
        inputs["pixel_attention_mask"] = tensors["pixel_attention_mask"].to(torch.int64)
        inputs["spatial_shapes"] = torch.tensor(expected["spatial_shapes"])
    with torch.inference_mode():
        out = model(**inputs, return_loss=True)
    difference = (out.logits_per_image - tensors["logits_per_image"]).abs().max().item()
    assert difference < 1e-5, (checkpoint, difference)
    return out.loss.item()


def main():
    losses = {checkpoint: loss(checkpoint, cls) for checkpoint, cls in CHECKPOINTS.items()}
    for checkpoint, value in losses.items():
        print(checkpoint, value)
    with open(os.path.join(FIXTURES, "contrastive_loss.json"), "w") as f:
        json.dump(losses, f, indent=1)


if __name__ == "__main__":
    main()
