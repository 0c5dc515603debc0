"""Supervised fine-tuning of a chat language model: what transformers and torch compute when a causal language model is
trained on conversations with the loss on the assistant's replies only (TRL's `SFTTrainer` with
`assistant_only_loss=True`).

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/sft.py    # → Tests/Fixtures/sft/qwen2-chatml/ (the checkpoint), Tests/Fixtures/sft/qwen2-chatml.json and .safetensors,
                            #   Tests/Fixtures/sft/qwen2-chatml-lora.json and .safetensors
    python oracle/sft.py qwen3   # → Tests/Fixtures/sft/qwen3-chatml/, qwen3-chatml.json and .safetensors alone

The checkpoint: a tiny random-init `Qwen2ForCausalLM` (q/k/v biases, untied head) with SmolLM2's real tokenizer, its
`<|im_end|>` the pad token (so the embedding's `padding_idx`), and a ChatML template whose `{% generation %}` block
marks each reply and its `<|im_end|>`. A batch of two conversations (a system turn and two exchanges; one exchange),
tokenized by `tokenizer.apply_chat_template(..., tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`,
right-padded; labels -100 where the assistant mask is 0 and over the padding. Trainer's steps as
oracle/projector_alignment.py takes them, over every parameter. Recorded: the ids, mask and labels, each step's loss
and gradient norm, the first step's gradients and the parameters after the last step.

Then the same with every token scored but the padding (TRL's default, `assistant_only_loss=False`): the losses and
norms, in the record's `every_token_*` members.

A Qwen3 checkpoint (`qwen3` argument) is trained the same way on the same batch, assistant tokens only: each query
and key head RMS-normalized before the rotation (q_norm, k_norm drawn like every other weight), a head_dim of 6 that
is not hidden_size / num_attention_heads, no biases, the head tied to the embedding.

Then the same with LoRA (PEFT's `get_peft_model` with `LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj",
"v_proj", "down_proj"], lora_dropout=0)`): only the updates learn. Recorded beside the run: each `lora_A` as PEFT drew
it (the tests start from these; `lora_B` starts at zero), under the names PEFT saves them by, and the adapter PEFT
saves.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from peft import LoraConfig, get_peft_model
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from projector_alignment import FIXTURES, trainer_steps

NAME = "qwen2-chatml"
TOKENIZER = os.path.join(FIXTURES, "image-chat", "chatml")
TEMPLATE = os.path.join(FIXTURES, "chat-templates", "assistant-masks", "chatml-generation.jinja")
CONVERSATIONS = [
    [dict(role="system", content="You are terse."), dict(role="user", content="Name a colour."),
     dict(role="assistant", content="Blue."), dict(role="user", content="Another?"),
     dict(role="assistant", content="Green, like grass.")],
    [dict(role="user", content="What is two plus two?"), dict(role="assistant", content="Four.")],
]
LORA = dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
SETTINGS = dict(learning_rate=1e-2, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                max_grad_norm=1.0, warmup_steps=1, steps=4)


def make_checkpoint(directory, family="qwen2"):
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.chat_template = open(TEMPLATE).read()
    shape = dict(vocab_size=len(tokenizer), hidden_size=4, intermediate_size=12, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                 pad_token_id=tokenizer.pad_token_id)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=6, tie_word_embeddings=True))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=False))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.5)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    # The vocabulary as a link to the LLaVA fixtures' copy (3.5 MB), once it is known to be the same.
    source = os.path.realpath(os.path.join(TOKENIZER, "tokenizer.json"))
    written = os.path.join(directory, "tokenizer.json")
    assert json.load(open(written)) == json.load(open(source))
    os.remove(written)
    os.symlink(os.path.relpath(source, directory), written)
    return tokenizer


def assistant_only_run(name, family, model_class):
    """The checkpoint `name` of `family` made afresh, the batch laid out by its chat template (labels on the assistant
    tokens), Trainer's steps over it, and the first step's gradients and the trained tensors saved; returns the
    tokenizer, the batch and the run."""
    torch.manual_seed(0)
    out = os.path.join(FIXTURES, "sft")
    directory = os.path.join(out, name)
    shutil.rmtree(directory, ignore_errors=True)
    tokenizer = make_checkpoint(directory, family)
    tokenizer.padding_side = "right"
    inputs = tokenizer.apply_chat_template(CONVERSATIONS, tokenize=True, return_dict=True, padding=True,
                                           return_tensors="pt", return_assistant_tokens_mask=True)
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    labels = torch.where((inputs["assistant_masks"] == 1) & (attention == 1), ids, torch.full_like(ids, -100))
    model = model_class.from_pretrained(directory, dtype=torch.float32)
    model.train()
    run = trainer_steps(model, directory, dict(input_ids=ids, attention_mask=attention), labels, SETTINGS)
    rename = run["rename"]
    tensors = {f"gradient.{rename(n)}": g for n, g in run["first_gradients"].items()}
    tensors.update({f"trained.{rename(n)}": p.detach().clone() for n, p in run["trained"].items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    print(name, "losses", [round(x, 5) for x in run["losses"]], "final", round(run["final_loss"], 5),
          "norms", [round(x, 4) for x in run["norms"]], "tensors", len(run["trained"]))
    return tokenizer, inputs, labels, run


def run_record(run, inputs, labels, tokenizer=None):
    """The run's record; with the tokenizer, also the conversations, their renderings and the assistant masks."""
    trained, decay, rename = run["trained"], run["decay"], run["rename"]
    fields = dict(settings=SETTINGS)
    if tokenizer is not None:
        fields.update(conversations=CONVERSATIONS, texts=tokenizer.apply_chat_template(CONVERSATIONS, tokenize=False))
    fields.update(input_ids=inputs["input_ids"].tolist(), attention_mask=inputs["attention_mask"].tolist())
    if tokenizer is not None:
        fields.update(assistant_masks=inputs["assistant_masks"].tolist())
    fields.update(labels=labels.tolist(), losses=run["losses"], gradient_norms=run["norms"], final_loss=run["final_loss"],
                  trained=sorted(rename(n) for n in trained), decayed=sorted(rename(n) for n in trained if n in decay))
    return fields


def qwen3():
    name = "qwen3-chatml"
    _, inputs, labels, run = assistant_only_run(name, "qwen3", Qwen3ForCausalLM)
    with open(os.path.join(FIXTURES, "sft", f"{name}.json"), "w") as f:
        json.dump(run_record(run, inputs, labels), f, indent=1)


def main():
    if sys.argv[1:] == ["qwen3"]:
        return qwen3()
    tokenizer, inputs, labels, run = assistant_only_run(NAME, "qwen2", Qwen2ForCausalLM)
    out = os.path.join(FIXTURES, "sft")
    directory = os.path.join(out, NAME)
    with open(os.path.join(out, f"{NAME}.json"), "w") as f:
        json.dump(run_record(run, inputs, labels, tokenizer), f, indent=1)
    ids, attention = inputs["input_ids"], inputs["attention_mask"]

    every_token = torch.where(attention == 1, ids, torch.full_like(ids, -100))
    model = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.train()
    run = trainer_steps(model, directory, dict(input_ids=ids, attention_mask=attention), every_token, SETTINGS)
    with open(os.path.join(out, f"{NAME}.json")) as f:
        record = json.load(f)
    record.update(every_token_losses=run["losses"], every_token_gradient_norms=run["norms"], every_token_final_loss=run["final_loss"])
    with open(os.path.join(out, f"{NAME}.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(NAME, "every token: losses", [round(x, 5) for x in run["losses"]], "final", round(run["final_loss"], 5))

    model = get_peft_model(Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32), LoraConfig(**LORA))
    model.train()
    saved = lambda n: n.replace(".default.", ".")
    initial = {f"initial.{saved(n)}": p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    run = trainer_steps(model, directory, dict(input_ids=ids, attention_mask=attention), labels, SETTINGS)
    trained = run["trained"]
    tensors = dict(initial)
    tensors.update({f"gradient.{saved(n)}": g for n, g in run["first_gradients"].items()})
    tensors.update({f"trained.{saved(n)}": p.detach().clone() for n, p in trained.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{NAME}-lora.safetensors"))
    with open(os.path.join(out, f"{NAME}-lora.json"), "w") as f:
        json.dump(dict(settings=SETTINGS, lora=LORA, input_ids=ids.tolist(), attention_mask=attention.tolist(),
                       labels=labels.tolist(), losses=run["losses"], gradient_norms=run["norms"],
                       final_loss=run["final_loss"], trained=sorted(saved(n) for n in trained),
                       decayed=sorted(saved(n) for n in trained if n in run["decay"])), f, indent=1)
    print(NAME, "LoRA losses", [round(x, 5) for x in run["losses"]], "final", round(run["final_loss"], 5),
          "norms", [round(x, 4) for x in run["norms"]], "tensors", len(trained))


if __name__ == "__main__":
    main()
