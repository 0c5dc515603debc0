"""Contrastive training of CLIP and SigLIP models: what transformers and torch compute when a dual encoder learns from
image–text pairs by its own contrastive loss, either whole (transformers' run_clip.py example, optionally with its
`--freeze_vision_model` or `--freeze_text_model`) or as locked-image text tuning (LiT: the image tower and its
projection frozen, the text side learning).

Run by hand from the repository root with the oracle venv (oracle/requirements.txt, plus sentencepiece and protobuf
for SigLIP's tokenizer, as for oracle/siglip.py), after oracle/clip.py, oracle/siglip.py and oracle/siglip2.py have
written their checkpoints:

    python oracle/contrastive_training.py
    # → Tests/Fixtures/lit/<family>-<checkpoint>.json and .safetensors (LiT)
    # → Tests/Fixtures/contrastive-training/<family>-<checkpoint>[-frozen-<module>].json and .safetensors

For each run: the fixture's four photos (the pixel values its oracle recorded) paired with its four templated labels,
image i with text i, the labels tokenized as the model's processor tokenizes texts for training (CLIP:
`padding=True, truncation=True`; SigLIP: `padding="max_length"`, to the tokenizer's model_max_length; SigLIP 2:
Siglip2Processor's `padding="max_length", max_length=64, truncation=True`), and `model(..., return_loss=True).loss` (CLIP's softmax
loss, SigLIP's sigmoid one) minimized over every parameter outside the run's frozen modules (LiT: `vision_model` and
CLIP's `visual_projection`; run_clip.py's flags: `vision_model` or `text_model`), as transformers' Trainer takes a
step: torch.optim.AdamW over two groups (weight decay on all but biases and
LayerNorm parameters, Trainer's `get_decay_parameter_names`), `clip_grad_norm_` to `max_grad_norm`, then the
linear schedule with warmup (`get_linear_schedule_with_warmup`). Recorded: each step's loss and gradient norm
(before clipping), the captions and their ids, the first step's gradients and the parameters after the last step.
"""
import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, CLIPModel, Siglip2Model, SiglipModel

from projector_alignment import FIXTURES, trainer_steps

CHECKPOINTS = {"clip/tiny-quickgelu-argmax": CLIPModel, "clip/tiny-gelu-eos-fp16": CLIPModel,
               "siglip/tiny-tanh-fp16": SiglipModel, "siglip/tiny-gelu-bf16": SiglipModel,
               "siglip2/tiny-naflex-fp16": Siglip2Model}
TEXT_KWARGS = {CLIPModel: dict(padding=True, truncation=True), SiglipModel: dict(padding="max_length"),
               Siglip2Model: dict(padding="max_length", max_length=64, truncation=True)}
SETTINGS = dict(learning_rate=5e-3, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                max_grad_norm=1.0, warmup_steps=1, steps=5)
# Modules frozen by each recipe, as `requires_grad_(False)` on them.
LIT = ("vision_model", "visual_projection")
# SigLIP's tiny fixtures diverge at 5e-3 (the tanh one's loss 2.6 → 11.4 in a step), where AdamW's normalized steps
# turn rounding differences in near-zero gradients into differences of a learning rate's size; their text sides learn
# at 1e-3, the whole models (whose loss still leaps to 7.8 at 1e-3) at 3e-4.
LEARNING_RATES = {SiglipModel: 1e-3, Siglip2Model: 1e-3}
RUNS = [(checkpoint, cls, LIT, "lit", "", None) for checkpoint, cls in CHECKPOINTS.items()] + [
    ("clip/tiny-quickgelu-argmax", CLIPModel, (), "contrastive-training", "", None),
    ("clip/tiny-gelu-eos-fp16", CLIPModel, (), "contrastive-training", "", None),
    ("siglip/tiny-tanh-fp16", SiglipModel, (), "contrastive-training", "", 3e-4),
    ("siglip/tiny-gelu-bf16", SiglipModel, (), "contrastive-training", "", 3e-4),
    ("siglip2/tiny-naflex-fp16", Siglip2Model, (), "contrastive-training", "", 3e-4),
    ("clip/tiny-quickgelu-argmax", CLIPModel, ("vision_model",), "contrastive-training", "-frozen-vision_model", None),
    ("clip/tiny-quickgelu-argmax", CLIPModel, ("text_model",), "contrastive-training", "-frozen-text_model", None),
]
# transformers.Trainer.get_decay_parameter_names


def train(checkpoint, cls, frozen, directory_name, suffix, learning_rate):
    settings = dict(SETTINGS, learning_rate=learning_rate or LEARNING_RATES.get(cls, SETTINGS["learning_rate"]))
    directory = os.path.join(FIXTURES, checkpoint)
    model = cls.from_pretrained(directory, dtype=torch.float32)
    model.train()
    for module in frozen:
        if hasattr(model, module):
            getattr(model, module).requires_grad_(False)
    expected = json.load(open(os.path.join(directory, "expected.json")))
    tensors = load_file(os.path.join(directory, "expected.safetensors"))
    captions = [expected["template"].format(label) for label in expected["labels"]]
    text = AutoTokenizer.from_pretrained(directory)(captions, return_tensors="pt", **TEXT_KWARGS[cls])
    inputs = dict(pixel_values=tensors["pixel_values"], input_ids=text.input_ids)
    if "attention_mask" in text:
        inputs["attention_mask"] = text.attention_mask
    if "pixel_attention_mask" in tensors:
        inputs["pixel_attention_mask"] = tensors["pixel_attention_mask"].to(torch.int64)
        inputs["spatial_shapes"] = torch.tensor(expected["spatial_shapes"])

    inputs["return_loss"] = True
    run = trainer_steps(model, directory, inputs, None, settings)
    trained, decay, losses, norms, final_loss = run["trained"], run["decay"], run["losses"], run["norms"], run["final_loss"]
    first_gradients = {f"gradient.{n}": g for n, g in run["first_gradients"].items()}
    out = os.path.join(FIXTURES, directory_name)
    name = checkpoint.replace("/", "-") + suffix
    os.makedirs(out, exist_ok=True)
    tensors = dict(first_gradients)
    tensors.update({f"trained.{n}": p.detach().clone().reshape(p.shape or [1]) for n, p in trained.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(dict(settings=settings, frozen=list(frozen), captions=captions, input_ids=inputs["input_ids"].tolist(),
                       attention_mask=inputs["attention_mask"].tolist() if "attention_mask" in inputs else None, losses=losses, gradient_norms=norms, final_loss=final_loss,
                       decayed=sorted(n for n in trained if n in decay),
                       not_decayed=sorted(n for n in trained if n not in decay)), f, indent=1)
    print(name, "losses", [round(x, 5) for x in losses], "final", round(final_loss, 5), "norms", [round(x, 4) for x in norms])


def main():
    torch.manual_seed(0)
    for run in RUNS:
        train(*run)


if __name__ == "__main__":
    main()
