"""Projector alignment: what transformers and torch compute when a LLaVA, LLaVA-NeXT or LLaVA-OneVision checkpoint's
multimodal projector is trained with its vision tower and language model frozen (LLaVA's first training stage; the
tiling families' `image_newline` frozen too, as LLaVA-NeXT's pretraining leaves it).

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/image_chat.py,
oracle/llava_next.py and oracle/llava_onevision.py have written their checkpoints (LLaVA fixtures with multimodal
chat templates; this script links two more: "llava-next/mistral-chat", llava-next/mistral-layers-bf16 with an
`[INST]` template in the form of llava-hf/llava-v1.6-mistral-7b-hf's, its replies marked with `{% generation %}`, and
"llava-onevision/qwen2-layers-chat", llava-onevision/qwen2-layers-fp16 with qwen2-smollm2-bf16's ChatML template,
whose anyres_max_4 shrinks the photos' tile grids bilinearly):

    python oracle/projector_alignment.py    # → Tests/Fixtures/projector-alignment/<checkpoint>.json and .safetensors

For each fixture, a batch of two conversations, each a user turn holding a photo and an instruction and the
assistant's caption of it (different lengths), rendered and tokenized by the checkpoint's processor
(`apply_chat_template(..., tokenize=True)`, right-padded); labels -100 over each conversation's prompt (the user turn
with the generation prompt, as `apply_chat_template(..., add_generation_prompt=True)` gives it) and the padding, the
reply's ids after. `model(**inputs, labels=labels).loss` minimized over `multi_modal_projector.*` alone,
as transformers' Trainer takes a step: torch.optim.AdamW over two groups (weight decay on the weights, not the
biases: Trainer's `get_decay_parameter_names`), `clip_grad_norm_` to `max_grad_norm`, the linear schedule with
warmup. Recorded: the ids, mask and labels, each step's loss and gradient norm (before clipping), the first step's
gradients and the parameters after the last step, under the checkpoint's own tensor names.
"""
import json
import os
import shutil

import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import AutoModelForImageTextToText, AutoProcessor
from transformers.optimization import get_linear_schedule_with_warmup
from transformers.trainer_pt_utils import get_parameter_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
CHECKPOINTS = ["image-chat/llava-1.5", "image-chat/chatml", "llava-next/mistral-chat", "llava-onevision/qwen2-smollm2-bf16",
               "llava-onevision/qwen2-layers-chat"]
MISTRAL_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{{ ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' }}"
    "{% generation %}{{ message['content'][0]['text'] + '</s>' }}{% endgeneration %}{% else %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
# Inputs the models' forward reads (the tiling families' image sizes too).
MODEL_INPUTS = ("input_ids", "attention_mask", "pixel_values", "image_sizes")
EXAMPLES = [("photos/chelsea.png", "A cat is lying on a blanket."), ("photos/coffee.png", "A cup of coffee on a saucer, seen from above.")]
INSTRUCTION = "Describe the image briefly."
SETTINGS = dict(learning_rate=2e-2, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                max_grad_norm=1.0, warmup_steps=1, steps=5)
NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def checkpoint_names(directory):
    """A function from a parameter's module name (`model.language_model.…`) to the name the checkpoint stores it
    under (`language_model.model.…` in checkpoints saved before transformers 4.52)."""
    from safetensors import safe_open
    with safe_open(os.path.join(directory, "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    legacy = [("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
              ("model.multi_modal_projector.", "multi_modal_projector."), ("model.vision_tower.", "vision_tower."),
              ("model.image_newline", "image_newline")]

    def rename(name):
        for candidate in [name] + [name.replace(new, old, 1) for new, old in legacy if name.startswith(new)]:
            if candidate in saved:
                return candidate
        raise KeyError(name)
    return rename


def trainer_steps(model, directory, inputs, labels, settings):
    """`settings["steps"]` steps of transformers' Trainer over the model's parameters that require gradients, on one
    batch: AdamW over Trainer's two decay groups, `clip_grad_norm_`, the linear schedule with warmup. Without `labels`
    the inputs ask for the loss themselves (`return_loss=True`)."""
    rename = checkpoint_names(directory)
    if labels is not None:
        inputs = dict(inputs, labels=labels)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], NO_DECAY_PATTERNS))
    groups = [dict(params=[p for n, p in trained.items() if n in decay], weight_decay=settings["weight_decay"]),
              dict(params=[p for n, p in trained.items() if n not in decay], weight_decay=0.0)]
    optimizer = torch.optim.AdamW(groups, lr=settings["learning_rate"], eps=settings["adam_epsilon"],
                                  betas=(settings["adam_beta1"], settings["adam_beta2"]), foreach=False)
    schedule = get_linear_schedule_with_warmup(optimizer, settings["warmup_steps"], settings["steps"])
    losses, norms, first_gradients = [], [], {}
    for step in range(settings["steps"]):
        optimizer.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        if step == 0:
            first_gradients = {n: p.grad.detach().clone() for n, p in trained.items()}
        norms.append(torch.nn.utils.clip_grad_norm_(list(trained.values()), settings["max_grad_norm"]).item())
        losses.append(loss.item())
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        final_loss = model(**inputs).loss.item()
    return dict(trained=trained, decay=decay, rename=rename, losses=losses, norms=norms,
                first_gradients=first_gradients, final_loss=final_loss)


def link_chat_checkpoints():
    """A checkpoint's files, linked, with a chat template: llava-next/mistral-chat and llava-onevision/qwen2-layers-chat."""
    with open(os.path.join(FIXTURES, "llava-onevision", "qwen2-smollm2-bf16", "chat_template.jinja")) as f:
        chatml = f.read()
    for family, name, source, template in [("llava-next", "mistral-chat", "mistral-layers-bf16", MISTRAL_CHAT_TEMPLATE),
                                           ("llava-onevision", "qwen2-layers-chat", "qwen2-layers-fp16", chatml)]:
        directory = os.path.join(FIXTURES, family, name)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "generation_config.json", "processor_config.json"]:
            os.symlink(os.path.join("..", source, file), os.path.join(directory, file))
        with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
            f.write(template)


def chat_processor(directory):
    """The checkpoint's processor padding on the right, with the end-of-sequence token where its tokenizer has no
    padding token (as TRL's trainers set it). LLaVA-OneVision's is built as oracle/llava_onevision.py builds it,
    without the video processor the oracle venv cannot load."""
    with open(os.path.join(directory, "config.json")) as f:
        onevision = json.load(f)["model_type"] == "llava_onevision"
    if onevision:
        from llava_onevision import load_processor
        processor = load_processor(directory)
    else:
        processor = AutoProcessor.from_pretrained(directory)
    processor.tokenizer.padding_side = "right"
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return processor


def train(checkpoint):
    directory = os.path.join(FIXTURES, checkpoint)
    processor = chat_processor(directory)

    def conversation(photo, caption=None):
        turns = [dict(role="user", content=[dict(type="image", path=os.path.join(FIXTURES, photo)),
                                              dict(type="text", text=INSTRUCTION)])]
        if caption is not None:
            turns.append(dict(role="assistant", content=[dict(type="text", text=caption)]))
        return turns

    prompts = [processor.apply_chat_template(conversation(photo), add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"][0] for photo, _ in EXAMPLES]
    inputs = processor.apply_chat_template([conversation(photo, caption) for photo, caption in EXAMPLES], tokenize=True,
                                           return_dict=True, padding=True, return_tensors="pt")
    texts = processor.apply_chat_template([conversation(photo, caption) for photo, caption in EXAMPLES], tokenize=False)
    photos = [photo for photo, _ in EXAMPLES]
    labels = []
    for row, prompt in enumerate(prompts):
        prompt = list(prompt)
        ids, mask = inputs.input_ids[row].tolist(), inputs.attention_mask[row].tolist()
        assert ids[:len(prompt)] == prompt
        labels.append([-100 if i < len(prompt) or not m else t for i, (t, m) in enumerate(zip(ids, mask))])
    inputs = {k: v for k, v in inputs.items() if k in MODEL_INPUTS}

    model = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32)
    model.train()
    model.requires_grad_(False)
    model.model.multi_modal_projector.requires_grad_(True)
    run = trainer_steps(model, directory, inputs, torch.tensor(labels), SETTINGS)
    trained, decay, rename = run["trained"], run["decay"], run["rename"]
    losses, norms, final_loss = run["losses"], run["norms"], run["final_loss"]

    out = os.path.join(FIXTURES, "projector-alignment")
    os.makedirs(out, exist_ok=True)
    name = checkpoint.replace("/", "-")
    tensors = {f"gradient.{rename(n)}": g for n, g in run["first_gradients"].items()}
    tensors.update({f"trained.{rename(n)}": p.detach().clone() for n, p in trained.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(dict(settings=SETTINGS, photos=photos, instruction=INSTRUCTION, captions=[c for _, c in EXAMPLES],
                       texts=texts, input_ids=inputs["input_ids"].tolist(), attention_mask=inputs["attention_mask"].tolist(), labels=labels, losses=losses, gradient_norms=norms,
                       final_loss=final_loss,
                       decayed=sorted(rename(n) for n in trained if n in decay),
                       not_decayed=sorted(rename(n) for n in trained if n not in decay)), f, indent=1)
    print(name, "losses", [round(x, 5) for x in losses], "final", round(final_loss, 5), "norms", [round(x, 4) for x in norms])


def main():
    torch.manual_seed(0)
    link_chat_checkpoints()
    for checkpoint in CHECKPOINTS:
        train(checkpoint)


if __name__ == "__main__":
    main()
