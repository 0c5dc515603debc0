"""Visual instruction tuning: what transformers and torch compute when a LLaVA, LLaVA-NeXT or LLaVA-OneVision
checkpoint is fine-tuned on image conversations with the loss on the assistant's replies only (LLaVA's second
training stage: projector, language model and the tiling families' `image_newline` learn, the vision tower stays
frozen).

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after
oracle/projector_alignment.py (which links the LLaVA-NeXT chat checkpoint; the others' templates mark the replies
with `{% generation %}` too):

    python oracle/instruction_tuning.py    # → Tests/Fixtures/instruction-tuning/<checkpoint>.json and .safetensors

For each fixture, a batch of two conversations of different lengths, one of two exchanges, each with a photo in its
first user turn, rendered and tokenized by the checkpoint's processor (`apply_chat_template(..., tokenize=True,
return_assistant_tokens_mask=True)`, right-padded); labels -100 wherever the assistant mask is 0 (what TRL's
`assistant_only_loss=True` computes) and over the padding. Trainer's steps as oracle/projector_alignment.py takes
them, over every parameter outside `model.vision_tower`. Recorded: the ids, mask and labels, each step's loss and
gradient norm, the first step's gradients and the parameters after the last step, under the checkpoint's own names.

Then, on the LLaVA-1.5 fixture, the same with LoRA as LLaVA's LoRA recipe runs it through PEFT: `LoraConfig(r=2,
lora_alpha=4, target_modules=".*language_model.*\\.(q_proj|v_proj|down_proj)", modules_to_save=["multi_modal_projector"])`,
the updates and the whole projector learning. Recorded beside the run: each `lora_A` as PEFT drew it (the tests start
from these; `lora_B` starts at zero), the updates under the names PEFT saves them by, the projector under the
checkpoint's.
"""
import json
import os

import torch
from safetensors.torch import save_file
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForImageTextToText

from projector_alignment import CHECKPOINTS, FIXTURES, MODEL_INPUTS, chat_processor, trainer_steps

CONVERSATIONS = [
    ("photos/chelsea.png", [("What animal is this?", "A cat."), ("What is it lying on?", "A blanket, in the sun.")]),
    ("photos/coffee.png", [("Describe the image briefly.", "A cup of coffee on a saucer, seen from above.")]),
]
LORA = dict(r=2, lora_alpha=4, target_modules=r".*language_model.*\.(q_proj|v_proj|down_proj)", lora_dropout=0.0,
            modules_to_save=["multi_modal_projector"])
SETTINGS = dict(learning_rate=1e-2, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                max_grad_norm=1.0, warmup_steps=1, steps=4)


def messages(photo, exchanges):
    """The conversation as transformers' chat templates read it, the photo in the first user turn."""
    turns = []
    for index, (question, answer) in enumerate(exchanges):
        content = [dict(type="text", text=question)]
        if index == 0:
            content.insert(0, dict(type="image", path=os.path.join(FIXTURES, photo)))
        turns.append(dict(role="user", content=content))
        turns.append(dict(role="assistant", content=[dict(type="text", text=answer)]))
    return turns


def train(checkpoint, lora=False):
    directory = os.path.join(FIXTURES, checkpoint)
    processor = chat_processor(directory)
    conversations = [messages(photo, exchanges) for photo, exchanges in CONVERSATIONS]
    inputs = processor.apply_chat_template(conversations, tokenize=True, return_dict=True, padding=True,
                                           return_tensors="pt", return_assistant_tokens_mask=True)
    texts = processor.apply_chat_template(conversations, tokenize=False)
    assistant_masks = inputs["assistant_masks"].tolist()
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    labels = torch.where((inputs["assistant_masks"] == 1) & (attention == 1), ids, torch.full_like(ids, -100))
    assert (labels != -100).any(dim=1).all(), "every conversation scores some tokens"
    inputs = {k: v for k, v in inputs.items() if k in MODEL_INPUTS}

    model = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32)
    model.train()
    initial = {}
    if lora:
        model = get_peft_model(model, LoraConfig(**LORA))
        initial = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}
    else:
        model.requires_grad_(True)
        model.model.vision_tower.requires_grad_(False)
    run = trainer_steps(model, directory, inputs, labels, SETTINGS)
    trained, decay, checkpoint_name = run["trained"], run["decay"], run["rename"]

    def rename(module_name):
        """An update under the name PEFT saves it by, anything else under the checkpoint's."""
        if ".lora_" in module_name:
            return module_name.replace(".default.", ".")
        return checkpoint_name(module_name.replace("base_model.model.", "", 1).replace(".modules_to_save.default.", "."))

    out = os.path.join(FIXTURES, "instruction-tuning")
    os.makedirs(out, exist_ok=True)
    name = checkpoint.replace("/", "-") + ("-lora" if lora else "")
    tensors = {f"initial.{rename(n)}": p for n, p in initial.items()}
    tensors.update({f"gradient.{rename(n)}": g for n, g in run["first_gradients"].items()})
    tensors.update({f"trained.{rename(n)}": p.detach().clone() for n, p in trained.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(dict(settings=SETTINGS, photos=[photo for photo, _ in CONVERSATIONS],
                       exchanges=[[list(e) for e in exchanges] for _, exchanges in CONVERSATIONS], texts=texts,
                       input_ids=ids.tolist(), attention_mask=attention.tolist(), assistant_masks=assistant_masks,
                       labels=labels.tolist(), losses=run["losses"], gradient_norms=run["norms"],
                       final_loss=run["final_loss"], trained=sorted(rename(n) for n in trained), lora=LORA if lora else None,
                       decayed=sorted(rename(n) for n in trained if n in decay),
                       tied_word_embeddings=model.config.get_text_config().tie_word_embeddings), f, indent=1)
    if lora:
        # What PEFT saves, for checking an adapter SwiftVLM writes against by hand.
        model.save_pretrained(os.path.join("/tmp", f"peft-{name}"))
    print(name, "losses", [round(x, 5) for x in run["losses"]], "final", round(run["final_loss"], 5),
          "norms", [round(x, 4) for x in run["norms"]], "tensors", len(trained))


def main():
    torch.manual_seed(0)
    for checkpoint in CHECKPOINTS:
        train(checkpoint)
    train("image-chat/llava-1.5", lora=True)


if __name__ == "__main__":
    main()
