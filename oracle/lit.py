"""Locked-image text tuning (LiT): what transformers and torch compute when a CLIP model's text side is trained on
image–text pairs while its image tower stays frozen.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/clip.py has
written its checkpoints:

    python oracle/lit.py    # → Tests/Fixtures/lit/<checkpoint>.json and .safetensors

For each CLIP fixture: its four photos (the pixel values oracle/clip.py recorded) paired with its four templated
labels, image i with text i, and `model(input_ids, pixel_values, attention_mask, return_loss=True).loss` minimized
over `text_model.*`, `text_projection` and `logit_scale` with `vision_model` and `visual_projection` frozen, as
transformers' Trainer takes a step: torch.optim.AdamW over two groups (weight decay on all but biases and
LayerNorm parameters, Trainer's `get_decay_parameter_names`), `clip_grad_norm_` to `max_grad_norm`, then the
linear schedule with warmup (`get_linear_schedule_with_warmup`). Recorded: each step's loss and gradient norm
(before clipping), the first step's gradients and the parameters after the last step.
"""
import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import CLIPModel
from transformers.optimization import get_linear_schedule_with_warmup
from transformers.trainer_pt_utils import get_parameter_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
CHECKPOINTS = ["tiny-quickgelu-argmax", "tiny-gelu-eos-fp16"]
SETTINGS = dict(learning_rate=5e-3, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                max_grad_norm=1.0, warmup_steps=1, steps=5)
# transformers.Trainer.get_decay_parameter_names
NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def train(name):
    directory = os.path.join(FIXTURES, "clip", name)
    model = CLIPModel.from_pretrained(directory, dtype=torch.float32)
    model.train()
    model.vision_model.requires_grad_(False)
    model.visual_projection.requires_grad_(False)
    expected = json.load(open(os.path.join(directory, "expected.json")))
    inputs = dict(pixel_values=load_file(os.path.join(directory, "expected.safetensors"))["pixel_values"],
                  input_ids=torch.tensor(expected["prompt_ids"]), attention_mask=torch.tensor(expected["prompt_mask"]))

    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], NO_DECAY_PATTERNS))
    groups = [dict(params=[p for n, p in trained.items() if n in decay], weight_decay=SETTINGS["weight_decay"]),
              dict(params=[p for n, p in trained.items() if n not in decay], weight_decay=0.0)]
    optimizer = torch.optim.AdamW(groups, lr=SETTINGS["learning_rate"], eps=SETTINGS["adam_epsilon"],
                                  betas=(SETTINGS["adam_beta1"], SETTINGS["adam_beta2"]), foreach=False)
    schedule = get_linear_schedule_with_warmup(optimizer, SETTINGS["warmup_steps"], SETTINGS["steps"])

    losses, norms, first_gradients = [], [], {}
    for step in range(SETTINGS["steps"]):
        optimizer.zero_grad()
        loss = model(**inputs, return_loss=True).loss
        loss.backward()
        if step == 0:
            first_gradients = {f"gradient.{n}": p.grad.detach().clone() for n, p in trained.items()}
        norms.append(torch.nn.utils.clip_grad_norm_(list(trained.values()), SETTINGS["max_grad_norm"]).item())
        losses.append(loss.item())
        optimizer.step()
        schedule.step()

    with torch.no_grad():
        final_loss = model(**inputs, return_loss=True).loss.item()
    out = os.path.join(FIXTURES, "lit")
    os.makedirs(out, exist_ok=True)
    tensors = dict(first_gradients)
    tensors.update({f"trained.{n}": p.detach().clone().reshape(p.shape or [1]) for n, p in trained.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(dict(settings=SETTINGS, losses=losses, gradient_norms=norms, final_loss=final_loss,
                       decayed=sorted(n for n in trained if n in decay),
                       not_decayed=sorted(n for n in trained if n not in decay)), f, indent=1)
    print(name, "losses", [round(x, 5) for x in losses], "final", round(final_loss, 5), "norms", [round(x, 4) for x in norms])


def main():
    torch.manual_seed(0)
    for name in CHECKPOINTS:
        train(name)


if __name__ == "__main__":
    main()
