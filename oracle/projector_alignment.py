"""Projector alignment: what transformers and torch compute when a LLaVA checkpoint's multimodal projector is trained
with its vision tower and language model frozen (LLaVA's first training stage).

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/llava.py has
written its checkpoints:

    python oracle/projector_alignment.py    # → Tests/Fixtures/projector-alignment/<checkpoint>.json and .safetensors

For each LLaVA fixture, a batch of its first two requests' photos and prompts with an answer appended to each
(different lengths, right-padded), tokenized by the checkpoint's processor; labels -100 over each prompt and the
padding, the answer's ids after. `model(**inputs, labels=labels).loss` minimized over `multi_modal_projector.*` alone,
as transformers' Trainer takes a step: torch.optim.AdamW over two groups (weight decay on the weights, not the
biases: Trainer's `get_decay_parameter_names`), `clip_grad_norm_` to `max_grad_norm`, the linear schedule with
warmup. Recorded: the ids, mask and labels, each step's loss and gradient norm (before clipping), the first step's
gradients and the parameters after the last step, under the checkpoint's own tensor names.
"""
import json
import os

import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import AutoProcessor, LlavaForConditionalGeneration
from transformers.optimization import get_linear_schedule_with_warmup
from transformers.trainer_pt_utils import get_parameter_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
CHECKPOINTS = ["llava/llama-default-fp16", "llava/qwen2-layers-full-bf16"]
ANSWERS = [" A cat is lying on a blanket.", " coffee"]
SETTINGS = dict(learning_rate=2e-2, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                max_grad_norm=1.0, warmup_steps=1, steps=5)
NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def checkpoint_name(module_name, saved_names):
    """The tensor name the checkpoint stores `model.multi_modal_projector.…` under."""
    for candidate in (module_name, module_name.replace("model.multi_modal_projector.", "multi_modal_projector.")):
        if candidate in saved_names:
            return candidate
    raise KeyError(module_name)


def train(checkpoint):
    directory = os.path.join(FIXTURES, checkpoint)
    expected = json.load(open(os.path.join(directory, "expected.json")))
    requests = expected["requests"][:2]
    photos = [r["image"] if "/" in r["image"] else "photos/" + r["image"] for r in requests]
    images = [Image.open(os.path.join(FIXTURES, p)).convert("RGB") for p in photos]
    processor = AutoProcessor.from_pretrained(directory)
    processor.tokenizer.padding_side = "right"
    prompts = [processor(images=i, text=r["prompt"], return_tensors="pt").input_ids[0].tolist() for i, r in zip(images, requests)]
    texts = [r["prompt"] + a for r, a in zip(requests, ANSWERS)]
    inputs = processor(images=images, text=texts, padding=True, return_tensors="pt")
    labels = []
    for row, prompt in enumerate(prompts):
        ids, mask = inputs.input_ids[row].tolist(), inputs.attention_mask[row].tolist()
        assert ids[:len(prompt)] == prompt
        labels.append([-100 if i < len(prompt) or not m else t for i, (t, m) in enumerate(zip(ids, mask))])

    model = LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float32)
    model.train()
    model.requires_grad_(False)
    model.model.multi_modal_projector.requires_grad_(True)
    from safetensors import safe_open
    with safe_open(os.path.join(directory, "model.safetensors"), "pt") as f:
        saved_names = set(f.keys())
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], NO_DECAY_PATTERNS))
    groups = [dict(params=[p for n, p in trained.items() if n in decay], weight_decay=SETTINGS["weight_decay"]),
              dict(params=[p for n, p in trained.items() if n not in decay], weight_decay=0.0)]
    optimizer = torch.optim.AdamW(groups, lr=SETTINGS["learning_rate"], eps=SETTINGS["adam_epsilon"],
                                  betas=(SETTINGS["adam_beta1"], SETTINGS["adam_beta2"]), foreach=False)
    schedule = get_linear_schedule_with_warmup(optimizer, SETTINGS["warmup_steps"], SETTINGS["steps"])
    label_tensor = torch.tensor(labels)

    losses, norms, first_gradients = [], [], {}
    for step in range(SETTINGS["steps"]):
        optimizer.zero_grad()
        loss = model(**inputs, labels=label_tensor).loss
        loss.backward()
        if step == 0:
            first_gradients = {f"gradient.{checkpoint_name(n, saved_names)}": p.grad.detach().clone() for n, p in trained.items()}
        norms.append(torch.nn.utils.clip_grad_norm_(list(trained.values()), SETTINGS["max_grad_norm"]).item())
        losses.append(loss.item())
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        final_loss = model(**inputs, labels=label_tensor).loss.item()

    out = os.path.join(FIXTURES, "projector-alignment")
    os.makedirs(out, exist_ok=True)
    name = checkpoint.replace("/", "-")
    tensors = dict(first_gradients)
    tensors.update({f"trained.{checkpoint_name(n, saved_names)}": p.detach().clone() for n, p in trained.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(dict(settings=SETTINGS, photos=photos, texts=texts, input_ids=inputs.input_ids.tolist(),
                       attention_mask=inputs.attention_mask.tolist(), labels=labels, losses=losses, gradient_norms=norms,
                       final_loss=final_loss,
                       decayed=sorted(checkpoint_name(n, saved_names) for n in trained if n in decay),
                       not_decayed=sorted(checkpoint_name(n, saved_names) for n in trained if n not in decay)), f, indent=1)
    print(name, "losses", [round(x, 5) for x in losses], "final", round(final_loss, 5), "norms", [round(x, 4) for x in norms])


def main():
    torch.manual_seed(0)
    for checkpoint in CHECKPOINTS:
        train(checkpoint)


if __name__ == "__main__":
    main()
