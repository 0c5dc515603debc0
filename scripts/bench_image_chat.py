"""Image chat's speed: transformers/PyTorch fp32 against SwiftVLM's `vlm bench` on one photo and a short question.

    python scripts/make_image_chat_checkpoints.py      # once: models/llava-onevision-qwen2-0.5b-ov-random
    python scripts/make_image_chat_checkpoints.py --family gemma3   # models/gemma-3-4b-12-layers-random
    swift build -c release
    python scripts/bench_image_chat.py [--model DIR] [--dtype fp32 bf16] [--new-tokens 16] [--runs 3] [--rounds 3]
                                       [--vlm .build/release/vlm] [--json results.json] [--pan-and-scan]

The work is one user turn of the checkpoint's chat template holding a 640×480 photo of noise and "What is in this
picture?", as transformers' `image-text-to-text` pipeline builds it: for LLaVA-OneVision at 640×480 the anyres tiling
makes 2,929 image tokens, so the prompt is about 2,945 tokens; Gemma 3 resizes any photo to 896×896 (4,096 patches
in its vision tower) and reads 256 image tokens, a 286-token prompt (with --pan-and-scan the photo is read whole and
as two 320×480 crops, each resized to 896×896: three views, 768 image tokens). Each engine reports

- image: the vision tower and projector over every tile (PyTorch: `get_image_features`; SwiftVLM: `image_ms`),
- first token: the time from the processed inputs to the first generated token, image included (PyTorch: one
  forward pass with the pixel values; SwiftVLM: `image_ms` + `first_token_ms`),
- decoding: greedy steps after the first token, in tokens per second (--new-tokens - 1 steps, KV cache kept).

The processor runs untimed everywhere. PyTorch runs fp32, its fastest on these CPUs (its bf16 is slower there);
SwiftVLM runs each --dtype given. In each of --rounds rounds PyTorch does --runs timed turns (after one untimed), then
each SwiftVLM dtype its `vlm bench --runs`; the table gives each engine's median over its runs and SwiftVLM's ratios
to PyTorch per round. The CPU, the load average and OMP_WAIT_POLICY are printed: a table measured on a loaded
machine is a smoke check, not a result.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

from image_chat_work import PROMPT, noise_photo, vlm_turn
from machine import describe, summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "llava-onevision-qwen2-0.5b-ov-random")


def load_pytorch(directory):
    """The model and its processor. LlavaOnevisionProcessor insists on a video processor, which needs torchvision;
    videos are out of scope, so the check is skipped for that one argument."""
    with open(os.path.join(directory, "config.json")) as f:
        if json.load(f)["model_type"] == "gemma3":
            from transformers import AutoProcessor, Gemma3ForConditionalGeneration
            model = Gemma3ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
            return model, AutoProcessor.from_pretrained(directory)
    from transformers.processing_utils import ProcessorMixin
    check = ProcessorMixin.check_argument_for_proper_class
    ProcessorMixin.check_argument_for_proper_class = (
        lambda self, name, argument: None if name == "video_processor" and argument is None else check(self, name, argument))
    from transformers import LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor, PreTrainedTokenizerFast
    with open(os.path.join(directory, "processor_config.json")) as f:
        settings = json.load(f)
    with open(os.path.join(directory, "chat_template.jinja")) as f:
        template = f.read()
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessorPil.from_pretrained(directory),
        tokenizer=PreTrainedTokenizerFast.from_pretrained(directory), chat_template=template,
        num_image_tokens=settings["num_image_tokens"],
        vision_feature_select_strategy=settings["vision_feature_select_strategy"],
        vision_aspect_ratio=settings["vision_aspect_ratio"])
    from transformers import LlavaOnevisionForConditionalGeneration
    model = LlavaOnevisionForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    return model, processor


def pytorch_turn(model, inputs, new_tokens):
    """One timed turn: image features alone, then the first token from scratch, then greedy steps."""
    with torch.inference_mode():
        start = time.perf_counter()
        model.get_image_features(**{key: inputs[key] for key in ("pixel_values", "image_sizes") if key in inputs})
        image = time.perf_counter() - start
        start = time.perf_counter()
        out = model(**inputs, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        first = time.perf_counter() - start
        cache, mask = out.past_key_values, inputs["attention_mask"]
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            out = model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        decode = time.perf_counter() - start
    return {"image_ms": image * 1e3, "first_token_ms": first * 1e3,
            "decode_tokens_per_s": (new_tokens - 1) / decode if new_tokens > 1 else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", nargs="+", choices=["fp32", "bf16", "int8"], default=["fp32", "bf16"])
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3, help="timed turns per engine and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    parser.add_argument("--vlm-timeout", type=float, default=1800)
    parser.add_argument("--json", help="also write every sample as JSON to this file")
    parser.add_argument("--pan-and-scan", action="store_true",
                        help="Gemma 3: the photo also read as crops (do_pan_and_scan=True; vlm bench --pan-and-scan)")
    args = parser.parse_args()
    if args.new_tokens < 2 or args.runs < 1 or args.rounds < 1:
        parser.error("--new-tokens must be at least 2, --runs and --rounds positive")

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    machine = describe(args.threads)
    photo_path = os.path.join(ROOT, "models", "bench-photo-640x480.png")
    from PIL import Image
    photo = Image.open(noise_photo(photo_path)).convert("RGB")
    model, processor = load_pytorch(args.model)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    # As apply_chat_template(tokenize=True) does: no second bos where the template wrote one (Gemma 3's does).
    bos = processor.tokenizer.bos_token
    crops = {"do_pan_and_scan": True} if args.pan_and_scan else {}
    inputs = processor(images=photo, text=text, return_tensors="pt", add_special_tokens=not (bos and text.startswith(bos)),
                       **crops)
    prompt_tokens = inputs["input_ids"].shape[1]
    pytorch_turn(model, inputs, 2)  # untimed: first-call allocations

    samples = {"pytorch": [], **{dtype: [] for dtype in args.dtype}}
    ratios = {dtype: {"first_token": [], "decode": []} for dtype in args.dtype}
    for round_index in range(args.rounds):
        runs = [pytorch_turn(model, inputs, args.new_tokens) for _ in range(args.runs)]
        samples["pytorch"] += runs
        torch_first = statistics.median(r["first_token_ms"] for r in runs)
        torch_decode = statistics.median(r["decode_tokens_per_s"] for r in runs)
        for dtype in args.dtype:
            report = vlm_turn(args.vlm, ["--model", args.model] + (["--pan-and-scan"] if args.pan_and_scan else []),
                              photo_path, args.new_tokens, args.runs, dtype, args.threads, args.vlm_timeout)
            samples[dtype].append(report)
            ratios[dtype]["first_token"].append(report["first_token_ms"] / torch_first)
            ratios[dtype]["decode"].append(report["decode_tokens_per_s"] / torch_decode)
            if report.get("prompt_tokens") != prompt_tokens:
                sys.exit(f"vlm's prompt has {report.get('prompt_tokens')} tokens, transformers' {prompt_tokens}")
        print(f"round {round_index + 1} done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]

    print(summary(machine))
    print(f"{os.path.basename(args.model)}{', pan and scan' if args.pan_and_scan else ''}, {prompt_tokens}-token prompt, "
          f"{inputs['pixel_values'].shape[0]} views of the photo, {args.new_tokens} new tokens, "
          f"{args.threads} threads; torch {torch.__version__} fp32; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}; {args.rounds} rounds; 1-minute load average "
          f"{load_before:.1f} before, {load_after:.1f} after\n")
    print("| engine | image ms | first token ms | decode tok/s | first token ÷ PyTorch (rounds) | decode × PyTorch (rounds) |")
    print("|---|---:|---:|---:|---|---|")
    def median(rows, key):
        return statistics.median(r[key] for r in rows)
    print(f"| PyTorch fp32 | {median(samples['pytorch'], 'image_ms'):.0f} | "
          f"{median(samples['pytorch'], 'first_token_ms'):.0f} | {median(samples['pytorch'], 'decode_tokens_per_s'):.2f} | – | – |")
    for dtype in args.dtype:
        first, decode = ratios[dtype]["first_token"], ratios[dtype]["decode"]
        print(f"| SwiftVLM {dtype} | {median(samples[dtype], 'image_ms'):.0f} | {median(samples[dtype], 'first_token_ms'):.0f} | "
              f"{median(samples[dtype], 'decode_tokens_per_s'):.2f} | {statistics.median(first):.2f} "
              f"({', '.join(f'{r:.2f}' for r in first)}) | {statistics.median(decode):.2f} "
              f"({', '.join(f'{r:.2f}' for r in decode)}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "model": args.model, "prompt_tokens": prompt_tokens,
                       "new_tokens": args.new_tokens, "threads": args.threads, "torch": torch.__version__,
                       "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_average_before": load_before,
                       "load_average_after": load_after, "samples": samples, "ratios": ratios}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
