"""Contrastive training speed: a training step of CLIP ViT-B/32 in SwiftVLM (`vlm train lit`, `vlm train clip`) and
in transformers/PyTorch, in one run; with `--model` a SigLIP checkpoint, its whole-model step (`--recipe clip`).

    python scripts/make_clip_checkpoint.py     # once: the full-size random-weight checkpoint
    python scripts/make_vision_checkpoints.py --models siglip-base-patch16-224    # for SigLIP B/16
    swift build -c release
    python scripts/bench_contrastive_training.py [--recipe lit|clip] [--model DIR] [--pairs 256] [--batch-size 32] [--steps 8] [--rounds 3]

Both train the same thing from the same imagefolder dataset (written to a temporary directory: the repository's
photos, each captioned by seeded random words, 5 to 15 of them) by CLIP's contrastive loss, with AdamW, gradient
clipping and the linear schedule, on 2 threads, in fp32, the pairs in the metadata's order. `lit`: the text
transformer, text projection and logit scale learn against image embeddings computed once beforehand. `clip` (run_clip.py's
recipe): the whole model learns, each batch's photos read from their files and through the image processor every step.
SwiftVLM's time is `vlm train RECIPE --json`'s `train_runtime` (the steps, from the first batch's inputs to the last
optimizer step); PyTorch's is the same span of a plain loop: `tokenizer(texts, padding=True, truncation=True)`
(`clip`: the photos opened and through `CLIPImageProcessorPil`, then `get_image_features`), `get_text_features`,
transformers' `image_text_contrastive_loss` on the logits (`clip`: the model's own `return_loss=True`, CLIP's or
SigLIP's loss, SigLIP's texts padded to 64 tokens as its processor pads them), `backward`, `clip_grad_norm_`, `AdamW.step`, the scheduler's step. Per round
each engine runs --steps steps once (first step included: both build their kernels then); the table gives each
engine's median time per step over the rounds, SwiftVLM's relative to PyTorch's as the median of the per-round ratios,
and the step's FLOPs (three times the forward's multiply-adds, twice) against the FMA peak scripts/machine.py measures.
"""
import os
import statistics
import sys
import tempfile
import time

import torch

from machine import describe, summary
from training_bench import parse_arguments, trainer_step, vlm_step_seconds, write_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "clip-vit-base-patch32-random")


def encoder_macs(tower, token_rows):
    """Forward multiply-adds of a tower's encoder layers for `token_rows` tokens per batch item."""
    d, mlp, layers = tower.hidden_size, tower.intermediate_size, tower.num_hidden_layers
    return layers * (sum(token_rows) * (4 * d * d + 2 * d * mlp) + sum(2 * n * n * d for n in token_rows))


def train_gflop(config, token_rows, recipe):
    """The step's FLOPs for `token_rows` padded tokens per batch item: three times the forward's multiply-adds, twice
    (the image tower's and projection's too for `clip`; SigLIP's pooling head counted as one more layer's worth per
    image, about what its probe's attention and MLP take)."""
    siglip = config.model_type == "siglip"
    t = config.text_config
    projection = t.hidden_size if siglip else config.projection_dim
    macs = encoder_macs(t, token_rows) + len(token_rows) * t.hidden_size * projection
    if recipe == "clip":
        v = config.vision_config
        patches = (v.image_size // v.patch_size) ** 2
        head = 4 * v.hidden_size ** 2 + 2 * v.hidden_size * v.intermediate_size if siglip else v.hidden_size * projection
        macs += len(token_rows) * (patches * v.num_channels * v.patch_size ** 2 * v.hidden_size + head)
        macs += encoder_macs(v, [patches + (0 if siglip else 1)] * len(token_rows))
    return 3 * 2 * macs / 1e9


def torch_step_seconds(model_dir, rows, batch_size, steps, settings, recipe):
    from transformers import AutoModel, AutoTokenizer, CLIPImageProcessorPil, SiglipImageProcessorPil
    from transformers.models.clip.modeling_clip import image_text_contrastive_loss
    from transformers.optimization import get_linear_schedule_with_warmup
    from transformers.trainer_pt_utils import get_parameter_names
    from PIL import Image

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    siglip = model.config.model_type == "siglip"
    processor = (SiglipImageProcessorPil if siglip else CLIPImageProcessorPil).from_pretrained(model_dir)
    text_kwargs = dict(padding="max_length") if siglip else dict(padding=True, truncation=True)

    def pixels(indices):
        images = [Image.open(os.path.join(settings["data"], rows[i]["file_name"])).convert("RGB") for i in indices]
        return processor(images=images, return_tensors="pt")

    def image_features(indices):
        features = model.get_image_features(**pixels(indices)).pooler_output
        return features / features.norm(p=2, dim=-1, keepdim=True)

    if recipe == "lit":
        model.vision_model.requires_grad_(False)
        model.visual_projection.requires_grad_(False)
        with torch.no_grad():
            cached = image_features(range(len(rows)))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
    optimizer = torch.optim.AdamW(
        [dict(params=[p for n, p in trained.items() if n in decay], weight_decay=settings["weight_decay"]),
         dict(params=[p for n, p in trained.items() if n not in decay], weight_decay=0.0)], lr=settings["learning_rate"])
    schedule = get_linear_schedule_with_warmup(optimizer, 0, steps)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        batch = [(step * batch_size + i) % len(rows) for i in range(batch_size)]
        inputs = tokenizer([rows[i]["text"] for i in batch], return_tensors="pt", **text_kwargs)
        if recipe == "clip":
            loss = model(**pixels(batch), **inputs, return_loss=True).loss
        else:
            text = model.get_text_features(**inputs).pooler_output
            text = text / text.norm(p=2, dim=-1, keepdim=True)
            loss = image_text_contrastive_loss(text @ cached[batch].t() * model.logit_scale.exp())
        trainer_step(loss, list(trained.values()), optimizer, schedule)
    return (time.perf_counter() - start) / steps


def main():
    args = parse_arguments(__doc__, DEFAULT_MODEL, pairs=256, batch_size=32, steps=8, choices=dict(recipe=("lit", "clip")))
    torch.set_num_threads(args.threads)
    machine = describe(args.threads)
    print(summary(machine))

    from transformers import AutoConfig, AutoTokenizer
    config = AutoConfig.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    text_kwargs = dict(padding="max_length") if config.model_type == "siglip" else {}
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "data")
        os.makedirs(data)
        rows = write_dataset(data, args.pairs, words=lambda generator: generator.randint(5, 15), seed=0)
        settings = dict(learning_rate=1e-5, weight_decay=0.1, data=data)
        batches = [[(s * args.batch_size + i) % len(rows) for i in range(args.batch_size)] for s in range(args.steps)]
        padded = [max(len(tokenizer(rows[i]["text"], **text_kwargs).input_ids) for i in b) for b in batches]
        gflop = statistics.mean(train_gflop(config, [n] * args.batch_size, args.recipe) for n in padded)
        swift, pytorch = [], []
        for round_index in range(args.rounds):
            swift.append(vlm_step_seconds(args.vlm, args.recipe, args.model, data, os.path.join(work, "out"), args.batch_size,
                                          args.steps, settings["learning_rate"], args.threads,
                                          "--weight-decay", str(settings["weight_decay"])))
            pytorch.append(torch_step_seconds(args.model, rows, args.batch_size, args.steps, settings, args.recipe))
            print(f"round {round_index + 1}: SwiftVLM {swift[-1] * 1e3:.1f} ms/step, PyTorch {pytorch[-1] * 1e3:.1f} ms/step",
                  file=sys.stderr)
    ratios = [s / p for s, p in zip(swift, pytorch)]
    peak = machine.get("fma_peak_gflops")
    name = os.path.basename(os.path.normpath(args.model))
    what = f"LiT step, {name} text side" if args.recipe == "lit" else f"whole-model contrastive training step (run_clip.py), {name}"
    print(f"\n{what}, batch {args.batch_size}, {args.steps} steps per round, "
          f"{args.rounds} rounds, {args.threads} threads, fp32; {gflop:.1f} GFLOP per step (3x forward)\n")
    print("| engine | ms per step (median) | GFLOP/s | of FMA peak | relative to PyTorch (rounds) |")
    print("|---|---:|---:|---:|---|")
    for name, times, relative in (("PyTorch " + torch.__version__, pytorch, "1"),
                                  ("SwiftVLM", swift, f"**{statistics.median(ratios):.2f}** ({', '.join(f'{r:.2f}' for r in ratios)})")):
        seconds = statistics.median(times)
        rate = gflop / seconds
        share = f"{rate / peak:.0%}" if peak else "n/a"
        print(f"| {name} | {seconds * 1e3:.1f} | {rate:.1f} | {share} | {relative} |")


if __name__ == "__main__":
    main()
