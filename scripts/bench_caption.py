"""Captioning's speed and memory: transformers/PyTorch against SwiftVLM's `vlm bench` on one photo, 20 greedy tokens.

    python scripts/make_caption_checkpoints.py      # once: models/blip2-opt-2.7b-random, blip-image-captioning-*
    swift build -c release --product vlm
    python scripts/bench_caption.py [--model DIR ...] [--torch-dtype fp32 bf16] [--dtype fp32 bf16] [--runs 3]
                                    [--rounds 3] [--vlm .build/release/vlm] [--json results.json]

The work is transformers' `image-to-text` pipeline without a prompt on a 640×480 photo of noise: the processor
(untimed) makes the pixels, then one caption of exactly 20 greedy tokens (no stop token). PyTorch times
`generate(max_new_tokens=20, min_new_tokens=20)` whole; SwiftVLM's `vlm bench` reports the image features (vision
tower and connector), the language model's prefill to the first token and the 19 steps after it, whose sum is the
caption's time. Every engine runs in a process of its own, one after another (a 3.7 B-parameter model in fp32 is
15 GB; two at once do not fit in 24 GB), each loading the checkpoint untimed, then one untimed caption, then --runs
timed ones; the table gives each engine's median and SwiftVLM's ratio to each PyTorch per round (median over rounds).

Memory: each process's peak resident set (the kernel's ru_maxrss) beside the bytes of the weights it computes with:
every parameter at 4 bytes in fp32, at 2 in bf16 (what the checkpoint's tensors hold, counted from its safetensors
headers). The CPU, the load average and OMP_WAIT_POLICY are printed: a table measured on a loaded machine is a smoke
check, not a result.
"""
import argparse
import glob
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from image_chat_work import noise_photo
from machine import describe, summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
DEFAULT_MODELS = [os.path.join(MODELS, name) for name in (
    "blip2-opt-2.7b-random", "blip-image-captioning-base-random", "blip-image-captioning-large-random")]
NEW_TOKENS = 20


def parameter_count(directory):
    """Elements of every tensor in the checkpoint's safetensors files, from their headers."""
    count = 0
    for path in glob.glob(os.path.join(directory, "*.safetensors")):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                size = 1
                for dimension in entry["shape"]:
                    size *= dimension
                count += size
    return count


def torch_worker(args):
    """One PyTorch process: load (untimed), one untimed caption, --runs timed ones; prints JSON."""
    import torch
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor, Blip2ForConditionalGeneration, BlipForConditionalGeneration

    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.worker_dtype]
    model_class = {"blip-2": Blip2ForConditionalGeneration, "blip": BlipForConditionalGeneration}[
        AutoConfig.from_pretrained(args.model[0]).model_type]
    model = model_class.from_pretrained(args.model[0], dtype=dtype).eval()
    processor = AutoProcessor.from_pretrained(args.model[0])
    photo = Image.open(noise_photo(os.path.join(MODELS, "bench-photo-640x480.png"))).convert("RGB")
    inputs = processor(images=photo, return_tensors="pt")
    inputs["pixel_values"] = inputs["pixel_values"].to(dtype)

    def caption():
        with torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 num_beams=1)
            elapsed = time.perf_counter() - start
        return elapsed * 1e3, out

    caption()
    times = [caption()[0] for _ in range(args.runs)]
    print(json.dumps({"caption_ms": statistics.median(times), "runs_ms": times}))


def run_measured(command, threads, timeout):
    """Runs `command`, returning its parsed JSON stdout and its peak resident set in bytes."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors,
                                   env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        try:
            output = process.stdout.read()
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:
            process.kill()
            raise
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            errors.seek(0)
            sys.exit(f"{' '.join(command)} failed: {errors.read().decode(errors='replace').strip()}")
    report = json.loads(output)
    report["peak_rss_bytes"] = usage.ru_maxrss * 1024
    return report


def torch_engine(args, model, dtype):
    command = [sys.executable, os.path.abspath(__file__), "--worker", "torch", "--worker-dtype", dtype, "--model", model,
               "--runs", str(args.runs), "--threads", str(args.threads)]
    return run_measured(command, args.threads, args.timeout)


def vlm_engine(args, model, dtype):
    command = [args.vlm, "bench", "--model", model, "--runs", str(args.runs), "--dtype", dtype, "--json"]
    report = run_measured(command, args.threads, args.timeout)
    steps = (NEW_TOKENS - 1) / report["decode_tokens_per_s"] * 1e3
    report["caption_ms"] = report["image_ms"] + report["first_token_ms"] + steps
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--torch-dtype", nargs="+", choices=["fp32", "bf16"], default=["fp32"])
    parser.add_argument("--dtype", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    parser.add_argument("--runs", type=int, default=3, help="timed captions per engine and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--json", help="also write every sample as JSON to this file")
    parser.add_argument("--worker", choices=["torch"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return torch_worker(args)
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be positive")

    load_before = os.getloadavg()[0]
    machine = describe(args.threads)
    results = []
    for model in args.model:
        parameters = parameter_count(model)
        engines = [("PyTorch", dtype, torch_engine) for dtype in args.torch_dtype] + [
            ("SwiftVLM", dtype, vlm_engine) for dtype in args.dtype]
        samples = {(engine, dtype): [] for engine, dtype, _ in engines}
        for round_index in range(args.rounds):
            for engine, dtype, run in engines:
                samples[(engine, dtype)].append(run(args, model, dtype))
            print(f"{os.path.basename(model)}: round {round_index + 1} done", file=sys.stderr, flush=True)
        results.append((model, parameters, samples))
    load_after = os.getloadavg()[0]

    import torch
    print(summary(machine))
    print(f"{NEW_TOKENS}-token greedy caption of a 640×480 photo, {args.threads} threads; torch {torch.__version__}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; {args.rounds} rounds of {args.runs} runs; "
          f"1-minute load average {load_before:.1f} before, {load_after:.1f} after\n")
    print("| model | engine | caption ms | image ms | first token ms | decode tok/s | peak RSS GB | ÷ weights | "
          + " | ".join(f"÷ PyTorch {dtype} (rounds)" for dtype in args.torch_dtype) + " |")
    print("|---|---|---:|---:|---:|---:|---:|---:|" + "---|" * len(args.torch_dtype))
    for model, parameters, samples in results:
        for (engine, dtype), reports in samples.items():
            caption = statistics.median(r["caption_ms"] for r in reports)
            rss = max(r["peak_rss_bytes"] for r in reports)
            weights = parameters * (4 if dtype == "fp32" else 2)
            parts = ["–", "–", "–"]
            if engine == "SwiftVLM":
                parts = [f"{statistics.median(r[key] for r in reports):.{digits}f}"
                         for key, digits in (("image_ms", 0), ("first_token_ms", 0), ("decode_tokens_per_s", 2))]
            ratios = []
            for torch_dtype in args.torch_dtype:
                if engine == "PyTorch":
                    ratios.append("–")
                    continue
                per_round = [mine["caption_ms"] / theirs["caption_ms"]
                             for mine, theirs in zip(reports, samples[("PyTorch", torch_dtype)])]
                ratios.append(f"{statistics.median(per_round):.2f} ({', '.join(f'{r:.2f}' for r in per_round)})")
            print(f"| {os.path.basename(model)} | {engine} {dtype} | {caption:.0f} | {' | '.join(parts)} | "
                  f"{rss / 1e9:.2f} | {rss / weights:.2f} | {' | '.join(ratios)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "threads": args.threads, "torch": torch.__version__,
                       "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_average_before": load_before,
                       "load_average_after": load_after,
                       "results": [{"model": model, "parameters": parameters,
                                    "samples": {f"{engine} {dtype}": reports for (engine, dtype), reports in samples.items()}}
                                   for model, parameters, samples in results]}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
