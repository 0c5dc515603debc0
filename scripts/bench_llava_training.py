"""LLaVA training speed: a training step of either stage on a LLaVA-1.5 checkpoint with a Qwen2-0.5B-shaped language
model, in SwiftVLM (`vlm train projector` or `vlm train sft`) and in transformers/PyTorch, in one run.

    python scripts/make_llava_gguf_pair.py --checkpoint-only   # once: models/llava-1.5-qwen2-0.5b-random/checkpoint (ViT-L/14-336)
    swift build -c release
    python scripts/bench_llava_training.py [--stage projector|sft|lora] [--pairs 4] [--batch-size 1] [--steps 2] [--rounds 3]

--stage projector (the default) is projector alignment: only `multi_modal_projector` learns, through the frozen
language model. --stage sft is instruction tuning: the projector and every language-model weight learn (the vision
tower frozen), the conversation scored where the template's generation blocks mark the reply
(`return_assistant_tokens_mask`), AdamW over Trainer's two decay groups. --stage lora is instruction tuning as LLaVA's
LoRA recipe runs it: rank-16 updates (alpha 32) beside all seven projections of every language-model layer and the
projector learning whole (PEFT's `get_peft_model` with `modules_to_save=["multi_modal_projector"]` on the PyTorch side,
which needs `pip install peft`).

The checkpoint's own chat template takes text contents only, so both read a copy of it (links to its files) with
llava-1.5's multimodal template, the one Tests/Fixtures/image-chat/llava-1.5 has. Both train the same thing from the
same imagefolder dataset (written to a temporary directory: the repository's
photos, each captioned by seeded random words, 20 of them): each pair a conversation through the checkpoint's chat
template (the image, then the caption as the reply: 576 image tokens and about 40 more), only the reply scored, with
AdamW, gradient clipping and the linear schedule, on 2 threads, in fp32, the
pairs in order. The vision tower is frozen, so both compute its features once per image before the steps (SwiftVLM
always does; the PyTorch loop is written to, so that the steps compare the same work). SwiftVLM's time is `vlm train
projector|sft --json`'s `train_runtime`; PyTorch's the same span of a plain loop: the projector on the cached features,
the embeddings with them in the image tokens' places, the language model's loss on the labels, `backward`,
`clip_grad_norm_`, `AdamW.step`, the scheduler's step. Per round each engine runs --steps steps once; the table gives
each engine's median time per step over the rounds and SwiftVLM's relative to PyTorch's as the median of the
per-round ratios.
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

import json

import torch

from machine import describe, summary
from training_bench import parse_arguments, trainer_step, vlm_step_seconds, write_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "llava-1.5-qwen2-0.5b-random", "checkpoint")


INSTRUCTION = "Describe the image."
LORA_RANK = 16
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_TARGETS_REGEX = r".*language_model.*\.(" + "|".join(LORA_TARGETS) + ")"


def conversation(row, reply=True, instruction=None, image_path=None):
    """A caption pair as a chat: the image (and the instruction when given), then the caption as the reply."""
    image = dict(type="image", path=image_path) if image_path else dict(type="image")
    question = [image] + ([dict(type="text", text=instruction)] if instruction else [])
    turns = [dict(role="user", content=question)]
    if reply:
        turns.append(dict(role="assistant", content=[dict(type="text", text=row["text"])]))
    return turns


def torch_step_seconds(model_dir, data, rows, batch_size, steps, learning_rate, stage):
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    from transformers.optimization import get_linear_schedule_with_warmup

    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "right"
    from transformers.trainer_pt_utils import get_parameter_names

    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.requires_grad_(stage == "sft")
    model.model.vision_tower.requires_grad_(False)
    model.model.multi_modal_projector.requires_grad_(True)
    config = model.config
    if stage == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=LORA_TARGETS_REGEX,
                                                 lora_dropout=0.0, modules_to_save=["multi_modal_projector"]))
    inner = model.get_base_model() if stage == "lora" else model
    projector = inner.model.multi_modal_projector

    examples = []
    with torch.no_grad():
        for row in rows:
            image = Image.open(os.path.join(data, row["file_name"])).convert("RGB")
            if stage in ("sft", "lora"):
                chat = [conversation(row, instruction=INSTRUCTION, image_path=os.path.join(data, row["file_name"]))]
                full = processor.apply_chat_template(chat, tokenize=True, return_dict=True, return_tensors="pt",
                                                     return_assistant_tokens_mask=True)
                labels = torch.where(full["assistant_masks"] == 1, full.input_ids, -100)
            else:
                prompt = processor(images=image, text=processor.apply_chat_template(conversation(row, False), add_generation_prompt=True),
                                   return_tensors="pt").input_ids[0]
                full = processor(images=image, text=processor.apply_chat_template(conversation(row)), return_tensors="pt")
                labels = full.input_ids.clone()
                labels[:, :len(prompt)] = -100
            states = inner.model.vision_tower(full.pixel_values, output_hidden_states=True).hidden_states
            layer = config.vision_feature_layer
            features = states[layer] if isinstance(layer, int) else torch.cat([states[i] for i in layer], dim=-1)
            if config.vision_feature_select_strategy == "default":
                features = features[:, 1:]
            examples.append((full.input_ids, labels, features))
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm", r"(?:^|\.)norm(?:$|\.)", "_norm(?:$|\.)"]))
    optimizer = torch.optim.AdamW([dict(params=[p for n, p in trained if n in decay], weight_decay=0.01),
                                   dict(params=[p for n, p in trained if n not in decay], weight_decay=0.0)], lr=learning_rate)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, steps)
    embed = inner.get_input_embeddings()
    start = time.perf_counter()
    for step in range(steps):
        batch = [examples[(step * batch_size + i) % len(examples)] for i in range(batch_size)]
        length = max(ids.shape[1] for ids, _, _ in batch)
        pad = lambda t, value: torch.nn.functional.pad(t, (0, length - t.shape[1]), value=value)
        ids = torch.cat([pad(i, processor.tokenizer.pad_token_id or 0) for i, _, _ in batch])
        labels = torch.cat([pad(l, -100) for _, l, _ in batch])
        mask = torch.cat([pad(torch.ones_like(i), 0) for i, _, _ in batch])
        image_rows = projector(torch.cat([f for _, _, f in batch]))
        embeddings = embed(ids).masked_scatter((ids == config.image_token_id)[..., None], image_rows)
        loss = model(inputs_embeds=embeddings, attention_mask=mask, labels=labels).loss
        trainer_step(loss, [p for _, p in trained], optimizer, schedule)
    return (time.perf_counter() - start) / steps


def main():
    args = parse_arguments(__doc__, DEFAULT_MODEL, pairs=4, batch_size=1, steps=2,
                           choices=dict(stage=("projector", "sft", "lora")))
    torch.set_num_threads(args.threads)
    print(summary(describe(args.threads)))
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "model")
        os.makedirs(model)
        for name in os.listdir(args.model):
            if name != "chat_template.jinja":
                os.symlink(os.path.join(os.path.abspath(args.model), name), os.path.join(model, name))
        shutil.copy(os.path.join(ROOT, "Tests", "Fixtures", "image-chat", "llava-1.5", "chat_template.jinja"), model)
        data = os.path.join(work, "data")
        os.makedirs(data)
        rows = write_dataset(data, args.pairs, words=lambda generator: 20, seed=0)
        options = ["--weight-decay", "0.01"]
        if args.stage == "lora":
            options += ["--lora-rank", str(LORA_RANK), "--lora-alpha", str(2 * LORA_RANK), "--lora-target-modules", ",".join(LORA_TARGETS)]
        if args.stage in ("sft", "lora"):
            with open(os.path.join(data, "metadata.jsonl"), "w") as f:
                f.write("\n".join(json.dumps(dict(file_name=row["file_name"], messages=conversation(row, instruction=INSTRUCTION)))
                                  for row in rows) + "\n")
        swift, pytorch = [], []
        for round_index in range(args.rounds):
            swift.append(vlm_step_seconds(args.vlm, "projector" if args.stage == "projector" else "sft", model, data, os.path.join(work, "out"), args.batch_size,
                                          args.steps, 1e-3, args.threads, *options))
            pytorch.append(torch_step_seconds(model, data, rows, args.batch_size, args.steps, 1e-3, args.stage))
            print(f"round {round_index + 1}: SwiftVLM {swift[-1]:.2f} s/step, PyTorch {pytorch[-1]:.2f} s/step", file=sys.stderr)
    ratios = [s / p for s, p in zip(swift, pytorch)]
    what = dict(projector="Projector alignment", sft="Instruction tuning (projector and language model)",
                lora=f"Instruction tuning with LoRA (rank {LORA_RANK} on every projection, the projector whole)")[args.stage]
    print(f"\n{what} step, LLaVA-1.5 with Qwen2-0.5B shapes (ViT-L/14-336 features cached), batch "
          f"{args.batch_size}, {args.steps} steps per round, {args.rounds} rounds, {args.threads} threads, fp32\n")
    print("| engine | s per step (median) | relative to PyTorch (rounds) |")
    print("|---|---:|---|")
    print(f"| PyTorch {torch.__version__} | {statistics.median(pytorch):.2f} | 1 |")
    print(f"| SwiftVLM | {statistics.median(swift):.2f} | **{statistics.median(ratios):.2f}** ({', '.join(f'{r:.2f}' for r in ratios)}) |")


if __name__ == "__main__":
    main()
