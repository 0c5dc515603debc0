"""CLIP ViT-B/32 image-embedding speed: transformers/PyTorch, ONNX Runtime and SwiftVLM's `vlm bench`, in one run.

    python scripts/make_clip_checkpoint.py     # once: the full-size random-weight checkpoint
    swift build -c release                                           # for the SwiftVLM row
    python scripts/bench_clip.py [--batch-sizes 1 32] [--runs 10] [--rounds 3] [--dtype fp32|bf16]
                                                       [--vlm .build/release/vlm] [--json results.json]

All engines run on 2 threads, in fp32; with --dtype bf16, SwiftVLM runs `vlm bench --dtype bf16` and PyTorch runs
under `torch.autocast("cpu", dtype=torch.bfloat16)`; with --dtype int8, `vlm bench --dtype int8` beside PyTorch's and
ONNX Runtime's own dynamic quantization (`quantize_dynamic`); ONNX Runtime in fp32 is always there. The table has
SwiftVLM's time relative to every other engine, and the peers' low-precision embeddings are compared with PyTorch's
fp32 ones by cosine (SwiftVLM's are checked by scripts/precision_check.py and the tests). PyTorch (`CLIPModel.get_image_features`) and ONNX Runtime see the same seeded random
pixels [B, 3, 224, 224], and ONNX Runtime's embeddings are checked against PyTorch's. ONNX Runtime runs the vision
tower and projection exported with torch's dynamo exporter (needs the onnxscript package), cached in the model
directory as onnx/vision_model.onnx. SwiftVLM is timed by its own `vlm bench --json`, which draws its own inputs; if the
binary is missing or fails, its row says so. Each batch size is measured in --rounds rounds; in each, PyTorch and
ONNX Runtime take turns for --runs forward passes (after --warmup untimed ones) and SwiftVLM then reports the median of
as many. A shared machine's speed drifts by tens of percent within minutes, and measurements taken side by side
drift together, so the table shows each engine's median over all its runs (PyTorch, ONNX Runtime) or rounds
(SwiftVLM), and SwiftVLM's time relative to ONNX Runtime's as the median of the per-round ratios (each round's
medians), with every round's ratio listed. The ceiling column compares with the time the model's FLOPs would take
at the FMA peak that scripts/machine.py measures (or --peak-gflops; twice it for bf16 and four times for int8,
whose dot-product instructions do that many more multiply-adds), and the machine's description is printed above the table.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from machine import describe, summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "clip-vit-base-patch32-random")
ONNX_TOLERANCE = 1e-4


def vision_gflop_per_image(vision_config, projection_dim):
    """Multiply-adds of the patch embedding, encoder and projection, as 2 FLOPs each (norms and softmax left out)."""
    d, mlp = vision_config.hidden_size, vision_config.intermediate_size
    patches = (vision_config.image_size // vision_config.patch_size) ** 2
    tokens = patches + 1
    patch_embedding = patches * vision_config.num_channels * vision_config.patch_size ** 2 * d
    per_layer = tokens * (4 * d * d + 2 * d * mlp) + 2 * tokens * tokens * d
    macs = patch_embedding + vision_config.num_hidden_layers * per_layer + d * projection_dim
    return 2 * macs / 1e9


class ImageEmbedder(torch.nn.Module):
    """`get_image_features` as a plain tensor-to-tensor module, the shape the ONNX exporter needs."""

    def __init__(self, clip):
        super().__init__()
        self.clip = clip

    def forward(self, pixel_values):
        return self.clip.get_image_features(pixel_values=pixel_values).pooler_output


def onnx_model_path(model_dir, embedder, image_size):
    """Exports the vision tower + projection once; a checkpoint newer than the export makes it stale."""
    path = os.path.join(model_dir, "onnx", "vision_model.onnx")
    weights = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(path) and os.path.getmtime(path) >= os.path.getmtime(weights):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".partial"
    example = torch.zeros(2, 3, image_size, image_size)
    torch.onnx.export(embedder, (example,), partial, dynamo=True, external_data=False,
                      input_names=["pixel_values"], output_names=["image_embeds"],
                      dynamic_shapes={"pixel_values": {0: torch.export.Dim("batch")}})
    os.replace(partial, path)
    return path


def onnx_int8_path(fp32_path):
    """ONNX Runtime's dynamic int8 quantization of the export (per-tensor uint8 activations, int8 weights), once."""
    path = fp32_path.replace(".onnx", ".int8.onnx")
    if os.path.isfile(path) and os.path.getmtime(path) >= os.path.getmtime(fp32_path):
        return path
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    # The dynamo exporter's recorded intermediate shapes trip the quantizer's shape inference; it infers its own.
    model = onnx.load(fp32_path)
    del model.graph.value_info[:]
    stripped = path + ".shapeless.onnx"
    onnx.save(model, stripped)
    quantize_dynamic(stripped, path + ".partial", weight_type=QuantType.QInt8)
    os.remove(stripped)
    os.replace(path + ".partial", path)
    return path


def interleaved_samples_ms(engines, warmup, runs):
    """Per-engine forward-pass times in ms. The engines take turns, so load from elsewhere on the machine (which
    comes and goes) hits them alike instead of whichever happened to run at the time."""
    for _ in range(warmup):
        for run in engines.values():
            run()
    samples = {name: [] for name in engines}
    for _ in range(runs):
        for name, run in engines.items():
            start = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return samples


def vlm_ms_per_image(binary, model_dir, batch_size, runs, threads, timeout_s, dtype):
    """`vlm bench`'s ms per image, or the reason it is unavailable."""
    if not os.path.isfile(binary):
        return None, f"no binary at {binary}"
    command = [binary, "bench", "--model", model_dir, "--batch-size", str(batch_size), "--runs", str(runs),
               "--dtype", dtype, "--json"]
    try:
        # oneDNN's OpenMP runtime takes its thread count from here.
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    if done.returncode != 0:
        last_line = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {done.returncode}: {last_line}"
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
        ms = float(report["ms_per_item"])
        if report["batch_size"] != batch_size or report["dtype"] != dtype or not math.isfinite(ms) or ms <= 0:
            raise ValueError(report)
    except (IndexError, KeyError, TypeError, ValueError) as error:
        return None, f"unexpected output {done.stdout.strip()[-200:]!r} ({error!r})"
    return ms, None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint directory (default: %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--runs", type=int, default=10, help="timed forward passes per engine and batch size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed forward passes before them")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all engines per batch size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"), help="SwiftVLM's binary")
    parser.add_argument("--vlm-timeout", type=float, default=900, help="seconds one `vlm bench` may take")
    parser.add_argument("--peak-gflops", type=float, help="fp32 peak of the machine, for the ceiling (default: measured)")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "int8"], default="fp32",
                        help="precision of SwiftVLM and PyTorch (ONNX Runtime runs fp32, and for int8 also its own "
                             "dynamic quantization)")
    parser.add_argument("--json", help="also write the results, with every timed sample, as JSON to this file")
    args = parser.parse_args()
    if min(args.batch_sizes) < 1 or args.runs < 1 or args.rounds < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("batch sizes, --runs, --rounds and --threads must be positive, --warmup not negative")

    import onnxruntime
    from transformers import CLIPModel

    model_dir = os.path.abspath(args.model)
    if not os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        sys.exit(f"no checkpoint in {model_dir}: run scripts/make_clip_checkpoint.py first")
    torch.set_num_threads(args.threads)
    machine = describe(args.threads)
    peak = args.peak_gflops or machine["fma_peak_gflops"]
    clip = CLIPModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    embedder = ImageEmbedder(clip).eval()
    vision = clip.config.vision_config
    gflop = vision_gflop_per_image(vision, clip.config.projection_dim)
    # bf16 dot products do twice the multiply-adds of fp32 FMAs per instruction, int8 (VNNI) four times.
    speedup = {"fp32": 1, "bf16": 2, "int8": 4}[args.dtype]
    ceiling_ms = gflop / (peak * speedup) * 1e3

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(onnx_model_path(model_dir, embedder, vision.image_size), options,
                                           providers=["CPUExecutionProvider"])
    # The peers at the precision asked for: PyTorch in it (autocast for bf16, quantize_dynamic for int8), ONNX
    # Runtime in fp32 (the yardstick) and, for int8, ONNX Runtime's own dynamic quantization of the export.
    engines = {}
    if args.dtype == "fp32":
        engines["PyTorch"] = embedder
    elif args.dtype == "bf16":
        def autocast(pixels):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return embedder(pixels)
        engines["PyTorch bf16 (autocast)"] = autocast
    else:
        engines["PyTorch int8 (quantize_dynamic)"] = torch.ao.quantization.quantize_dynamic(
            ImageEmbedder(CLIPModel.from_pretrained(model_dir, dtype=torch.float32).eval()).eval(),
            {torch.nn.Linear}, dtype=torch.qint8)
    engines["ONNX Runtime"] = lambda pixels: session.run(None, {"pixel_values": pixels.numpy()})[0]
    if args.dtype == "int8":
        quantized = onnx_int8_path(onnx_model_path(model_dir, embedder, vision.image_size))
        int8_session = onnxruntime.InferenceSession(quantized, options, providers=["CPUExecutionProvider"])
        engines["ONNX Runtime int8 (quantize_dynamic)"] = lambda pixels: int8_session.run(
            None, {"pixel_values": pixels.numpy()})[0]
    references = list(engines)

    load_before = os.getloadavg()[0]
    rows, checks, cosines = [], [], []
    for batch_size in args.batch_sizes:
        pixels = torch.randn(batch_size, 3, vision.image_size, vision.image_size,
                             generator=torch.Generator().manual_seed(batch_size))
        feed = {"pixel_values": pixels.numpy()}
        with torch.inference_mode():
            reference = embedder(pixels).numpy()
            (onnx_embeddings,) = session.run(None, feed)
            checks.append({"batch_size": batch_size,
                           "max_abs_diff": float(np.max(np.abs(onnx_embeddings - reference)))})
            for name, run in engines.items():
                if name in ("PyTorch", "ONNX Runtime"):
                    continue
                low = run(pixels)
                low = low.float().numpy() if isinstance(low, torch.Tensor) else np.asarray(low)
                cosine = np.sum(low * reference, axis=1) / (np.linalg.norm(low, axis=1) * np.linalg.norm(reference, axis=1))
                cosines.append({"engine": name, "batch_size": batch_size, "min_cosine": float(np.min(cosine))})
        samples = {name: [] for name in engines}
        vlm_rounds, vlm_error, ratios = [], None, {name: [] for name in references}
        for _ in range(args.rounds):
            with torch.inference_mode():
                round_samples = interleaved_samples_ms({name: (lambda run=run: run(pixels))
                                                        for name, run in engines.items()}, args.warmup, args.runs)
            for engine, engine_samples in round_samples.items():
                samples[engine] += engine_samples
            vlm_ms, vlm_error = vlm_ms_per_image(args.vlm, model_dir, batch_size, args.runs, args.threads,
                                                 args.vlm_timeout, args.dtype)
            if vlm_error:
                break
            vlm_rounds.append(vlm_ms)
            for name in references:
                ratios[name].append(vlm_ms / (statistics.median(round_samples[name]) / batch_size))
        for engine, engine_samples in samples.items():
            rows.append({"engine": engine, "batch_size": batch_size,
                         "ms_per_image": statistics.median(engine_samples) / batch_size,
                         "best_ms_per_image": min(engine_samples) / batch_size,
                         "batch_ms_samples": engine_samples})
        rows.append({"engine": f"SwiftVLM {args.dtype}", "batch_size": batch_size,
                     "ms_per_image": statistics.median(vlm_rounds) if vlm_rounds else None,
                     **({"unavailable": vlm_error} if vlm_error else
                        {"round_ms_per_image": vlm_rounds,
                         "ratios": {name: statistics.median(values) for name, values in ratios.items()},
                         "round_ratios": ratios})})
    load_after = os.getloadavg()[0]

    print(summary(machine))
    print(f"CLIP ViT-B/32 image embedding, {args.dtype}, {args.threads} threads; {gflop:.2f} GFLOP per image, "
          f"ceiling {ceiling_ms:.1f} ms at {peak * speedup:g} GFLOP/s; {args.rounds} rounds "
          f"of {args.runs} runs after {args.warmup} warm-up; 1-minute load average {load_before:.1f} before, "
          f"{load_after:.1f} after (this run alone adds about {args.threads})\n")
    # The best run shows what an engine does when nothing else wants the cores; SwiftVLM reports only its median.
    print("| engine | batch | ms/image | best ms/image | images/s | × ceiling | "
          + " | ".join(f"× {name} (per round)" for name in references) + " |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---" for _ in references) + " |")
    for row in rows:
        ms = row["ms_per_image"]
        if ms is None:
            print(f"| {row['engine']} | {row['batch_size']} | unavailable: {row['unavailable']} | | | | "
                  + " | ".join("" for _ in references) + " |")
            continue
        best = f"{row['best_ms_per_image']:.1f}" if "best_ms_per_image" in row else ""
        relative = [""] * len(references)
        if "ratios" in row:
            relative = [f"{row['ratios'][name]:.2f} ({', '.join(f'{r:.2f}' for r in row['round_ratios'][name])})"
                        for name in references]
        print(f"| {row['engine']} | {row['batch_size']} | {ms:.1f} | {best} | {1e3 / ms:.1f} | {ms / ceiling_ms:.2f} | "
              + " | ".join(relative) + " |")
    print()
    for check in checks:
        verdict = "ok" if check["max_abs_diff"] <= ONNX_TOLERANCE else "MISMATCH"
        print(f"ONNX Runtime vs PyTorch, batch {check['batch_size']}: max |diff| {check['max_abs_diff']:.2e} "
              f"(tolerance {ONNX_TOLERANCE:g}) {verdict}")
    for check in cosines:
        print(f"{check['engine']} vs PyTorch fp32, batch {check['batch_size']}: lowest cosine {check['min_cosine']:.6f}")

    if args.json:
        results = {"model": model_dir, "machine": machine, "dtype": args.dtype, "threads": args.threads,
                   "runs": args.runs, "rounds": args.rounds,
                   "warmup": args.warmup,
                   "load_average_before": load_before, "load_average_after": load_after,
                   "gflop_per_image": gflop, "ceiling_ms_per_image": ceiling_ms, "rows": rows,
                   "onnx_vs_pytorch": checks, "peer_cosines": cosines, "torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    if any(check["max_abs_diff"] > ONNX_TOLERANCE for check in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
