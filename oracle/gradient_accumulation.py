"""Gradient accumulation: what transformers' own `Trainer` logs and leaves when each optimizer step sums the gradients of
several batches (`gradient_accumulation_steps`), in the two ways it scales them.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/sft.py and
oracle/clip.py have written their checkpoints:

    python oracle/gradient_accumulation.py    # → Tests/Fixtures/gradient-accumulation/<run>.json and .safetensors

Both runs are `Trainer.train()` itself (sequential sampling, logging every step, torch's AdamW, the linear schedule
with a warmup step, `max_grad_norm` 1):

- `sft-qwen2-chatml`: the sft fixture's Qwen2 chat model on five conversations of different lengths, tokenized as
  oracle/sft.py tokenizes them, labels on the assistant's replies, one conversation a batch, two batches a step, two
  epochs (three steps an epoch, the last of one batch). A causal language model takes Trainer's `num_items_in_batch`:
  each batch's loss is its summed token losses over the tokens scored in all the step's batches, so a step's loss is
  its tokens' mean whatever the batches' lengths.
- `clip-tiny-quickgelu-argmax`: the CLIP fixture's four photos and templated labels, two pairs a batch, three batches
  a step (so each epoch's one step has two), three epochs. Without labels there is no item count: each batch's
  loss is divided by the number of batches the step has.

Recorded: Trainer's `log_history` (loss, grad_norm, learning_rate, epoch per step), the first step's summed
gradients (as a callback sees them before the optimizer steps, clipped, then scaled back by the clipping factor
the logged norm gives) and every parameter after training.
"""
import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, CLIPModel, Qwen2ForCausalLM, Trainer, TrainerCallback, TrainingArguments

from projector_alignment import FIXTURES

CONVERSATIONS = [
    [dict(role="user", content="Name a colour."), dict(role="assistant", content="Blue.")],
    [dict(role="system", content="You are terse."), dict(role="user", content="What is two plus two?"),
     dict(role="assistant", content="Four, which is two more than two.")],
    [dict(role="user", content="Say hi."), dict(role="assistant", content="Hi."), dict(role="user", content="Again?"),
     dict(role="assistant", content="Hello there, once more.")],
    [dict(role="user", content="Is the sky green?"), dict(role="assistant", content="No.")],
    [dict(role="user", content="Count to five."), dict(role="assistant", content="One, two, three, four, five.")],
]
SETTINGS = dict(learning_rate=1e-2, weight_decay=0.1, max_grad_norm=1.0, warmup_steps=1)


class FirstGradients(TrainerCallback):
    """The gradients the first optimizer step applies (after clipping)."""

    def __init__(self):
        self.gradients = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self.gradients = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def arguments(out, batch_size, accumulation, epochs):
    return TrainingArguments(output_dir=out, per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                             num_train_epochs=epochs, learning_rate=SETTINGS["learning_rate"],
                             weight_decay=SETTINGS["weight_decay"], max_grad_norm=SETTINGS["max_grad_norm"],
                             warmup_steps=SETTINGS["warmup_steps"], lr_scheduler_type="linear", optim="adamw_torch",
                             logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                             train_sampling_strategy="sequential", remove_unused_columns=False, disable_tqdm=True)


def write(name, settings, model, history, first, **extra):
    out = os.path.join(FIXTURES, "gradient-accumulation")
    os.makedirs(out, exist_ok=True)
    steps = [dict(step=h["step"], epoch=h["epoch"], loss=h["loss"], grad_norm=h["grad_norm"], learning_rate=h["learning_rate"])
             for h in history if "loss" in h]
    # clip_grad_norm_'s factor, undone.
    clipping = min(1.0, settings["max_grad_norm"] / (steps[0]["grad_norm"] + 1e-6))
    tensors = {f"trained.{n}": p.detach().clone().reshape(p.shape or [1]) for n, p in model.named_parameters()}
    tensors.update({f"gradient.{n}": (g / clipping).reshape(g.shape or [1]) for n, g in first.gradients.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(dict(settings=settings, log_history=steps, **extra), f, indent=1)
    print(name, [(s["step"], round(s["epoch"], 3), round(s["loss"], 5), round(s["grad_norm"], 4)) for s in steps])


def sft(work):
    directory = os.path.join(FIXTURES, "sft", "qwen2-chatml")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    items = []
    for conversation in CONVERSATIONS:
        encoded = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids = encoded["input_ids"]
        labels = [i if m == 1 else -100 for i, m in zip(ids, encoded["assistant_masks"])]
        items.append(dict(input_ids=ids, labels=labels))

    def collate(batch):
        length = max(len(b["input_ids"]) for b in batch)
        pad = lambda row, value: row + [value] * (length - len(row))
        return dict(input_ids=torch.tensor([pad(b["input_ids"], tokenizer.pad_token_id) for b in batch]),
                    attention_mask=torch.tensor([pad([1] * len(b["input_ids"]), 0) for b in batch]),
                    labels=torch.tensor([pad(b["labels"], -100) for b in batch]))

    model = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    settings = dict(SETTINGS, batch_size=1, gradient_accumulation_steps=2, epochs=2)
    first = FirstGradients()
    trainer = Trainer(model=model, args=arguments(work, 1, 2, 2), train_dataset=ListDataset(items), data_collator=collate,
                      callbacks=[first])
    trainer.train()
    write("sft-qwen2-chatml", settings, model, trainer.state.log_history, first, conversations=CONVERSATIONS,
          input_ids=[i["input_ids"] for i in items], labels=[i["labels"] for i in items])


def clip(work):
    directory = os.path.join(FIXTURES, "clip", "tiny-quickgelu-argmax")
    expected = json.load(open(os.path.join(directory, "expected.json")))
    pixels = load_file(os.path.join(directory, "expected.safetensors"))["pixel_values"]
    captions = [expected["template"].format(label) for label in expected["labels"]]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    items = [dict(pixel_values=pixels[i], text=captions[i]) for i in range(len(captions))]

    def collate(batch):
        text = tokenizer([b["text"] for b in batch], padding=True, truncation=True, return_tensors="pt")
        return dict(pixel_values=torch.stack([b["pixel_values"] for b in batch]), input_ids=text.input_ids,
                    attention_mask=text.attention_mask, return_loss=True)

    model = CLIPModel.from_pretrained(directory, dtype=torch.float32)
    settings = dict(SETTINGS, learning_rate=5e-3, batch_size=2, gradient_accumulation_steps=3, epochs=3)
    args = arguments(work, 2, 3, 3)
    args.learning_rate = settings["learning_rate"]
    first = FirstGradients()
    trainer = Trainer(model=model, args=args, train_dataset=ListDataset(items), data_collator=collate, callbacks=[first])
    trainer.train()
    write("clip-tiny-quickgelu-argmax", settings, model, trainer.state.log_history, first, captions=captions)


def main():
    torch.manual_seed(0)
    work = os.path.join("/tmp", "gradient-accumulation-oracle")
    sft(work)
    clip(work)


if __name__ == "__main__":
    main()
