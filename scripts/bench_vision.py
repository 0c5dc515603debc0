"""Zero-shot vision models' speed per image: transformers/PyTorch, ONNX Runtime and SwiftVLM's `vlm bench`, in one run.

    python scripts/make_vision_checkpoints.py   # once: the full-size random-weight checkpoints
    swift build -c release                                            # for the SwiftVLM rows
    python scripts/bench_vision.py [--models clipseg owlv2 vilt siglip] [--labels 3] [--runs 10] [--rounds 3]
                                   [--vlm-dtype fp32] [--pytorch-bf16] [--vlm .build/release/vlm] [--json results.json]

Needs onnxruntime and onnxscript beside transformers (a venv layered on the oracle venv will do); without
onnxruntime the ONNX Runtime rows say so. All engines run fp32 on --threads threads, SwiftVLM in --vlm-dtype (bf16:
its matrix products on the CPU's bf16 units, beside the others' fp32); --pytorch-bf16 adds PyTorch under
`torch.autocast("cpu", dtype=torch.bfloat16)` as a fourth engine, the peer of SwiftVLM's bf16. The work per image is what each
model's pipeline does once its processor has run (processing is untimed everywhere):

- clipseg (CIDAS/clipseg-rd64-refined): a 640×480 photo of noise and --labels text prompts padded to 77 tokens →
  text tower, vision tower (once: the activations the decoder reads are shared by every prompt, as SwiftVLM reads
  the photo once; transformers' documented usage repeats the photo per prompt, which costs PyTorch a vision pass per
  prompt, so this is the stronger baseline), decoder, sigmoid, and the probability maps resized bilinearly to 480×640.
- owlv2 (google/owlv2-base-patch16-ensemble): the same photo padded and resized to 960×960, --labels queries padded
  to 16 tokens → logits, boxes and objectness, and the logits' sigmoid.
- vilt (dandelin/vilt-b32-finetuned-vqa): random pixel values [1, 3, 384, 640] with their pixel mask and a
  12-token question → the answer logits (what `vlm bench` times for ViLT).
- siglip (google/siglip-base-patch16-224): the photo resized to 224×224 → the image embedding (`get_image_features`).

PyTorch runs a small module doing exactly that; ONNX Runtime runs the same module exported with torch's dynamo
exporter, or where torch.export cannot capture it, the TorchScript exporter (cached as onnx/bench-<work>.onnx in the
checkpoint directory), and its outputs are checked against PyTorch's: each output's max |difference| / max(1, its
largest |value|) must stay within 1e-4. A model that neither exports says why below the table. SwiftVLM is timed by
its own `vlm bench --json`, which draws the same shapes from its own noise.

A shared machine's speed drifts by tens of percent within minutes, and measurements taken side by side drift
together: in each of --rounds rounds, PyTorch and ONNX Runtime take turns for --runs timed passes (after --warmup
untimed ones), then `vlm bench` reports its median of --runs. The table shows each engine's median over all its
runs (SwiftVLM: over its rounds' medians) and SwiftVLM's time relative to PyTorch's and ONNX Runtime's as the median
of the per-round ratios, every round's ratio listed. The CPU model and the load average are printed with it: a
table measured on a loaded machine is a smoke check, not a result. There, OpenMP's threads spin at every barrier
while their partner waits for a core (SwiftVLM's SigLIP profile under a load average of 5: 62% of the cycles in
libgomp); OMP_WAIT_POLICY=passive in the environment, which reaches PyTorch's and SwiftVLM's OpenMP alike (ONNX
Runtime has a pool of its own), makes such a smoke check less lopsided. The header says which policy ran.
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
MODELS = os.path.join(ROOT, "models")
TOLERANCE = 1e-4
PHOTO_WIDTH, PHOTO_HEIGHT = 640, 480


def bench_labels(count):
    """The labels `vlm bench --labels` asks (Sources/vlm/Bench.swift)."""
    return [f"a photo of object number {index + 1}" for index in range(count)]


def noise_photo():
    from PIL import Image
    pixels = np.random.default_rng(0x5EED).integers(0, 256, (PHOTO_HEIGHT, PHOTO_WIDTH, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def onnxruntime_version():
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime.__version__


class CLIPSegWork(torch.nn.Module):
    """CLIPSegForImageSegmentation's forward with the photo read once for all prompts, then the pipeline's
    probability maps at the photo's size."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, pixel_values):
        model, prompts = self.model, input_ids.shape[0]
        vision = model.clip.get_image_features(pixel_values=pixel_values, interpolate_pos_encoding=True,
                                               output_hidden_states=True)
        activations = [vision.hidden_states[i + 1].expand(prompts, -1, -1) for i in model.extract_layers]
        conditional = model.clip.get_text_features(input_ids, attention_mask=attention_mask).pooler_output
        logits = model.decoder(activations, conditional).logits
        maps = torch.nn.functional.interpolate(torch.sigmoid(logits).unsqueeze(1), size=(PHOTO_HEIGHT, PHOTO_WIDTH),
                                               mode="bilinear", align_corners=False)
        return logits, maps


class OwlWork(torch.nn.Module):
    """Owlv2ForObjectDetection's forward and the scores' sigmoid."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, pixel_values):
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values)
        return torch.sigmoid(output.logits), output.pred_boxes, output.objectness_logits


class ViltWork(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids, pixel_values, pixel_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          pixel_values=pixel_values, pixel_mask=pixel_mask).logits


class SiglipWork(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model.get_image_features(pixel_values=pixel_values).pooler_output


def clipseg_work(directory, labels):
    from transformers import CLIPSegForImageSegmentation, CLIPSegProcessor
    model = CLIPSegForImageSegmentation.from_pretrained(directory, dtype=torch.float32).eval()
    processor = CLIPSegProcessor.from_pretrained(directory)
    texts = bench_labels(labels)
    inputs = processor(text=texts, images=[noise_photo()], padding="max_length", return_tensors="pt")
    work = CLIPSegWork(model).eval()
    feed = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
            "pixel_values": inputs["pixel_values"]}
    # The shared vision pass gives transformers' own logits, those of its usage with the photo once per prompt.
    with torch.inference_mode():
        repeated = processor(text=texts, images=[noise_photo()] * labels, padding="max_length", return_tensors="pt")
        reference = model(**repeated).logits
        ours = work(**feed)[0]
    difference = float((ours - reference).abs().max())
    if difference > 1e-5:
        sys.exit(f"CLIPSeg with the photo read once differs from transformers' usage by {difference}")
    return work, feed


def owlv2_work(directory, labels):
    from transformers import Owlv2ForObjectDetection, Owlv2Processor
    model = Owlv2ForObjectDetection.from_pretrained(directory, dtype=torch.float32).eval()
    processor = Owlv2Processor.from_pretrained(directory)
    inputs = processor(text=[bench_labels(labels)], images=noise_photo(), return_tensors="pt")
    return OwlWork(model).eval(), {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
                                   "pixel_values": inputs["pixel_values"]}


def vilt_work(directory, labels):
    from transformers import ViltForQuestionAnswering
    model = ViltForQuestionAnswering.from_pretrained(directory, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0x5EED)
    ids = torch.arange(100, 112).unsqueeze(0)
    return ViltWork(model).eval(), {
        "input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
        "pixel_values": torch.rand(1, 3, 384, 640, generator=generator) * 2 - 1,
        "pixel_mask": torch.ones(1, 384, 640, dtype=torch.long)}


def siglip_work(directory, labels):
    from transformers import SiglipImageProcessor, SiglipModel
    model = SiglipModel.from_pretrained(directory, dtype=torch.float32).eval()
    pixels = SiglipImageProcessor.from_pretrained(directory)(noise_photo(), return_tensors="pt")["pixel_values"]
    return SiglipWork(model).eval(), {"pixel_values": pixels}


# name: (checkpoint directory, what it runs, the task `vlm bench` reports, whether it takes --labels)
MODELS_BENCHED = {
    "clipseg": ("clipseg-rd64-refined-random", clipseg_work, "zero-shot-image-segmentation", True),
    "owlv2": ("owlv2-base-patch16-ensemble-random", owlv2_work, "zero-shot-object-detection", True),
    "vilt": ("vilt-b32-finetuned-vqa-random", vilt_work, "visual-question-answering", False),
    "siglip": ("siglip-base-patch16-224-random", siglip_work, "image-embedding", False),
}


def onnx_session(directory, name, work, feed, labels, threads):
    """ONNX Runtime's session of `work` exported once (a checkpoint newer than the export makes it stale) and which
    exporter made it, or None and the reason there is none."""
    try:
        import onnxruntime
    except ImportError:
        return None, "onnxruntime is not installed"
    tag = f"{name}-k{labels}" if MODELS_BENCHED[name][3] else name
    path = os.path.join(directory, "onnx", f"bench-{tag}.onnx")
    weights = os.path.join(directory, "model.safetensors")
    if not (os.path.isfile(path) and os.path.isfile(path + ".exporter")
            and os.path.getmtime(path) >= os.path.getmtime(weights)):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = path + ".partial"
        failures = []
        # The dynamo exporter first; where torch.export cannot capture the model (ViLT sizes its position
        # embeddings from the pixel mask's contents), the TorchScript exporter traces it for these inputs' shapes.
        for dynamo in (True, False):
            try:
                with torch.no_grad():
                    torch.onnx.export(work, tuple(feed.values()), partial, dynamo=dynamo, external_data=False,
                                      input_names=list(feed))
                break
            except Exception as error:  # the exporters raise many kinds; any of them means no ONNX row
                failures.append(f"{'dynamo' if dynamo else 'TorchScript'} exporter: {export_failure(error)}")
        else:
            return None, "export failed: " + "; ".join(failures)
        os.replace(partial, path)
        with open(path + ".exporter", "w") as f:
            f.write("dynamo" if not failures else f"TorchScript ({failures[0]})")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as error:
        return None, f"ONNX Runtime refused the export: {str(error).strip().splitlines()[0][:160]}"
    with open(path + ".exporter") as f:
        return session, f.read()


def export_failure(error):
    """The line of an exporter's exception that says what went wrong (torch.export's summary when it has one)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if "## Exception summary" in lines and lines.index("## Exception summary") + 1 < len(lines):
        return lines[lines.index("## Exception summary") + 1][:200]
    return f"{type(error).__name__}: {(lines or [''])[0][:200]}"


def scaled_difference(ours, reference):
    """max |ours - reference| / max(1, max |reference|): absolute for outputs within ±1 (probabilities, boxes),
    relative to the output's largest value for logits."""
    reference = np.asarray(reference, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - reference)) / max(1, np.max(np.abs(reference))))


def interleaved_samples_ms(engines, warmup, runs):
    """Per-engine times in ms; the engines take turns, so load from elsewhere hits them alike."""
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


def vlm_ms_per_image(binary, directory, task, labels, runs, threads, timeout_s, dtype):
    """`vlm bench`'s ms per image, or the reason it is unavailable."""
    if not os.path.isfile(binary):
        return None, f"no binary at {binary}"
    command = [binary, "bench", "--model", directory, "--runs", str(runs), "--dtype", dtype, "--json"]
    if labels is not None:
        command += ["--labels", str(labels)]
    try:
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
        if report["task"] != task or report.get("labels", labels) != labels or not math.isfinite(ms) or ms <= 0:
            raise ValueError(report)
    except (IndexError, KeyError, TypeError, ValueError) as error:
        return None, f"unexpected output {done.stdout.strip()[-200:]!r} ({error!r})"
    return ms, None


def bench_model(name, args):
    checkpoint, make_work, task, takes_labels = MODELS_BENCHED[name]
    directory = os.path.join(os.path.abspath(args.models_dir), checkpoint)
    if not os.path.isfile(os.path.join(directory, "model.safetensors")):
        return {"model": name, "unavailable": f"no checkpoint in {directory}: run scripts/make_vision_checkpoints.py"}
    labels = args.labels if takes_labels else None
    work, feed = make_work(directory, args.labels)
    with torch.inference_mode():
        reference = work(**feed)
    reference = [t.numpy() for t in (reference if isinstance(reference, tuple) else (reference,))]
    session, onnx_note = (None, "--no-onnx") if args.no_onnx else onnx_session(directory, name, work, feed,
                                                                                args.labels, args.threads)
    onnx_error = None if session is not None else onnx_note
    result = {"model": name, "checkpoint": directory, "labels": labels, "pytorch_ms": [], "onnx_ms": [],
              "pytorch_bf16_ms": [], "vlm_round_ms": [], "ratio_to_pytorch": [], "ratio_to_onnx": [],
              "ratio_to_pytorch_bf16": []}
    engines = {"PyTorch": lambda: work(**feed)}
    if args.pytorch_bf16:
        def autocast_work():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return work(**feed)
        engines["PyTorch bf16"] = autocast_work
    if session is not None:
        result["onnx_exporter"] = onnx_note
        onnx_feed = {key: value.numpy() for key, value in feed.items()}
        outputs = session.run(None, onnx_feed)
        result["onnx_difference"] = max(scaled_difference(o, r) for o, r in zip(outputs, reference))
        if result["onnx_difference"] > TOLERANCE:
            onnx_error = f"outputs differ from PyTorch's by {result['onnx_difference']:.1e} (> {TOLERANCE:g})"
            session = None
        else:
            engines["ONNX Runtime"] = lambda: session.run(None, onnx_feed)
    if onnx_error:
        result["onnx_unavailable"] = onnx_error
    vlm_error = None
    for _ in range(args.rounds):
        with torch.inference_mode():
            samples = interleaved_samples_ms(engines, args.warmup, args.runs)
        result["pytorch_ms"] += samples["PyTorch"]
        result["onnx_ms"] += samples.get("ONNX Runtime", [])
        result["pytorch_bf16_ms"] += samples.get("PyTorch bf16", [])
        vlm_ms, vlm_error = vlm_ms_per_image(args.vlm, directory, task, labels, args.runs, args.threads,
                                             args.vlm_timeout, args.vlm_dtype)
        if vlm_error:
            break
        result["vlm_round_ms"].append(vlm_ms)
        result["ratio_to_pytorch"].append(vlm_ms / statistics.median(samples["PyTorch"]))
        if "ONNX Runtime" in samples:
            result["ratio_to_onnx"].append(vlm_ms / statistics.median(samples["ONNX Runtime"]))
        if "PyTorch bf16" in samples:
            result["ratio_to_pytorch_bf16"].append(vlm_ms / statistics.median(samples["PyTorch bf16"]))
    if vlm_error:
        result["vlm_unavailable"] = vlm_error
    return result


DESCRIPTIONS = {
    "clipseg": "CLIPSeg rd64-refined, 352², {labels} prompts",
    "owlv2": "OWLv2 B/16 ensemble, 960², {labels} labels",
    "vilt": "ViLT B/32 VQA, 384×640",
    "siglip": "SigLIP B/16-224, image embedding",
}


def ratio_cell(ratios):
    if not ratios:
        return "–"
    return f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"


def print_table(results, args):
    bf16 = args.pytorch_bf16
    print("| model | PyTorch ms | " + ("PyTorch bf16 ms | " if bf16 else "") + "ONNX Runtime ms | SwiftVLM ms "
          "| SwiftVLM ÷ PyTorch (rounds) | " + ("SwiftVLM ÷ PyTorch bf16 (rounds) | " if bf16 else "")
          + "SwiftVLM ÷ ONNX Runtime (rounds) |")
    print("|---|---:|" + ("---:|" if bf16 else "") + "---:|---:|---|" + ("---|" if bf16 else "") + "---|")
    for result in results:
        name = DESCRIPTIONS[result["model"]].format(labels=args.labels)
        if "unavailable" in result:
            print(f"| {name} | unavailable: {result['unavailable']} | | | | |" + (" | |" if bf16 else ""))
            continue
        pytorch = f"{statistics.median(result['pytorch_ms']):.1f}"
        # Why ONNX Runtime is missing is printed in full below the table.
        onnx = (f"{statistics.median(result['onnx_ms']):.1f}" if result["onnx_ms"]
                else "does not export" if result.get("onnx_unavailable", "").startswith("export failed")
                else "unavailable")
        vlm = (f"**{statistics.median(result['vlm_round_ms']):.1f}**" if result["vlm_round_ms"]
               else f"unavailable: {result.get('vlm_unavailable', 'not run')}")
        pytorch_bf16 = f"{statistics.median(result['pytorch_bf16_ms']):.1f} | " if bf16 else ""
        bf16_ratio = f"{ratio_cell(result['ratio_to_pytorch_bf16'])} | " if bf16 else ""
        print(f"| {name} | {pytorch} | {pytorch_bf16}{onnx} | {vlm} | {ratio_cell(result['ratio_to_pytorch'])} "
              f"| {bf16_ratio}{ratio_cell(result['ratio_to_onnx'])} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS_BENCHED), default=list(MODELS_BENCHED))
    parser.add_argument("--models-dir", default=MODELS, help="where the checkpoints are (default: %(default)s)")
    parser.add_argument("--labels", type=int, default=3, help="prompts per image for CLIPSeg and OWLv2")
    parser.add_argument("--runs", type=int, default=10, help="timed passes per engine and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes before them")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-onnx", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"), help="SwiftVLM's binary")
    parser.add_argument("--vlm-dtype", choices=["fp32", "bf16"], default="fp32", help="SwiftVLM's --dtype")
    parser.add_argument("--pytorch-bf16", action="store_true",
                        help="also time PyTorch under torch.autocast(\"cpu\", dtype=torch.bfloat16)")
    parser.add_argument("--vlm-timeout", type=float, default=900, help="seconds one `vlm bench` may take")
    parser.add_argument("--json", help="also write the results, with every timed sample, as JSON to this file")
    args = parser.parse_args()
    if args.labels < 1 or args.runs < 1 or args.rounds < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--labels, --runs, --rounds and --threads must be positive, --warmup not negative")

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    machine = describe(args.threads)
    results = []
    for name in args.models:
        results.append(bench_model(name, args))
        print(f"{name} done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]

    print(summary(machine))
    print(f"fp32 (SwiftVLM {args.vlm_dtype}), {args.threads} threads; torch {torch.__version__}"
          f"; onnxruntime {onnxruntime_version() or 'not installed'}"
          f"; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
          f"; {args.rounds} rounds of {args.runs} timed runs after {args.warmup} warm-up; 1-minute load average "
          f"{load_before:.1f} before, {load_after:.1f} after (this run alone adds about {args.threads})\n")
    print_table(results, args)
    print()
    for result in results:
        if "onnx_difference" in result:
            verdict = "ok" if result["onnx_difference"] <= TOLERANCE else "MISMATCH"
            print(f"ONNX Runtime vs PyTorch, {result['model']}: max |diff| / max(1, max |value|) "
                  f"{result['onnx_difference']:.2e} (tolerance {TOLERANCE:g}) {verdict}; exported by the "
                  f"{result.get('onnx_exporter', '?')} exporter")
        elif "onnx_unavailable" in result:
            print(f"ONNX Runtime, {result['model']}: {result['onnx_unavailable']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                       "threads": args.threads, "runs": args.runs, "rounds": args.rounds, "warmup": args.warmup,
                       "labels": args.labels, "vlm_dtype": args.vlm_dtype, "load_average_before": load_before,
                       "load_average_after": load_after, "torch": torch.__version__,
                       "onnxruntime": onnxruntime_version(), "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
