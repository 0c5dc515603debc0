#!/usr/bin/env python3
"""Decoding steps of the C kernels alone (no Swift, no model file), and a change to them set against a baseline.

Usage:  python3 scripts/bench_decoder_step.py [--baseline REV | --streams 1 4] [--format Q4_1] [--dtype fp32|int8]
                                             [--position 320] [--capacity N] [--steps 400] [--rounds 4] [--threads 2]
                                             [--json]

Builds Sources/CVLMKernels as it is in the working tree into a shared library (and, with --baseline, as it is at
the git revision REV into another) and runs scripts/decoder_step_bench.c over it: the fused decoding step
(vlm_decoder_step_run, its products in fixed point or with --dtype int8 in int8) of a SmolLM2-135M-shaped model, random weights of one GGUF block format laid out on huge pages
as vlm lays a model's, a KV cache of --position positions (with --capacity, room for that many, each key head's
positions that far apart as in the cache `vlm` makes for a prompt and its new tokens; by default just enough). With a baseline the two builds take alternate steps in
one process, so that both see the same memory speed; `vlm bench` runs, seconds apart, drift by more than the few
percent a kernel change moves (two alternated runs of one binary differed by 5% in medians here). Each round reports
each build's mean step time and the weights it streamed per second; the summary gives the median over the rounds
of the per-round ratio baseline / working tree (above 1: the working tree is faster), and the largest difference
between the two builds' logits (0 unless the change alters arithmetic). Rounds alternate which build goes first.
--streams A B runs the working tree's build twice the same way, its products read as A streams a thread in one and B
in the other (vlm_quant_streams' choice, measured; the ratio is A's time over B's); --streams A alone sets the count
of every build, which otherwise is the CPU's.
Both builds are driven through the working tree's vlm_kernels.h, so a baseline must lay out vlm_decoder_layer as it
does (and vlm_decoder_step): revisions before Qwen3's head norms joined the layer (246490d), or before the step
gained `int8` (56ee273), cannot be one.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import describe, summary

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / ".build-step"
FORMATS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8}


def build_library(sources: Path, output: Path) -> Path:
    """The kernels compiled as SwiftPM's release build compiles them (clang; gcc's -O2 build of them took twice as
    long a step here)."""
    files = sorted(str(path) for path in sources.glob("*.c"))
    subprocess.run(["clang", "-O2", "-fPIC", "-fno-omit-frame-pointer", "-shared", f"-I{sources}/include",
                    f"-I{sources}", *files, "-o", output, "-lm"], check=True)
    return output


def build_harness(output: Path) -> Path:
    """scripts/decoder_step_bench.c, linked to libgomp so that the libraries' parallel step has a runtime."""
    subprocess.run(["clang", "-O2", f"-I{ROOT / 'Sources' / 'CVLMKernels' / 'include'}",
                    str(ROOT / "scripts" / "decoder_step_bench.c"), "-o", output, "-ldl", "-lm", "-Wl,--no-as-needed",
                    "-lgomp"], check=True)
    return output


def baseline_sources(revision: str, directory: Path) -> Path:
    done = subprocess.run(["git", "-C", ROOT, "archive", revision, "Sources/CVLMKernels"], capture_output=True)
    if done.returncode != 0:
        sys.exit(f"bench_decoder_step.py: --baseline {revision}: {done.stderr.decode().strip().splitlines()[-1]}")
    archive = done.stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    return directory / "Sources" / "CVLMKernels"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", metavar="REV", help="a git revision whose kernels the working tree's are set against")
    parser.add_argument("--format", choices=FORMATS, default="Q4_1")
    parser.add_argument("--dtype", choices=["fp32", "int8"], default="fp32", help="the step's products (vlm bench --dtype)")
    parser.add_argument("--streams", type=int, nargs="+", choices=[1, 4], metavar="COUNT",
                        help="streams a thread (1 or 4): one count for every build, or two for the working tree's")
    parser.add_argument("--position", type=int, default=320, help="cached positions before the step's own")
    parser.add_argument("--capacity", type=int, help="the cache's room in positions (default: position + 1)")
    parser.add_argument("--steps", type=int, default=400, help="timed steps per build and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.steps, args.rounds, args.threads) < 1 or args.position < 0:
        parser.error("--steps, --rounds and --threads must be positive and --position at least 0")
    if args.streams and (len(args.streams) > 2 or len(args.streams) == 2 and args.baseline):
        parser.error("--streams takes one count, or two without --baseline")

    if not shutil.which("clang"):
        sys.exit("bench_decoder_step.py: no clang on PATH (Swift toolchains ship one; SwiftPM builds the kernels with it)")
    BUILD.mkdir(exist_ok=True)
    (BUILD / ".gitignore").write_text("*\n")
    kernels = ROOT / "Sources" / "CVLMKernels"
    bench = build_harness(BUILD / "decoder_step_bench")
    working_tree = build_library(kernels, BUILD / "working-tree.so")
    with tempfile.TemporaryDirectory() as scratch:
        # (name, the harness's LIBRARY[@STREAMS] argument) of each build; the ratio is the first's time over the second's.
        if args.streams and len(args.streams) == 2:
            builds = [(f"streams {count}", f"{working_tree}@{count}") for count in args.streams]
        else:
            suffix = f"@{args.streams[0]}" if args.streams else ""
            builds = [("working-tree", f"{working_tree}{suffix}")]
            if args.baseline:
                baseline = build_library(baseline_sources(args.baseline, Path(scratch)), BUILD / "baseline.so")
                builds.insert(0, ("baseline", f"{baseline}{suffix}"))
        machine = describe(args.threads)
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        rounds = []
        for index in range(args.rounds):
            order = builds if index % 2 == 0 else builds[::-1]
            done = subprocess.run([bench, *(["--int8"] if args.dtype == "int8" else []),
                                   *(["--capacity", str(args.capacity)] if args.capacity else []), str(FORMATS[args.format]),
                                   str(args.position), str(args.steps), *(argument for _, argument in order)],
                                  check=True, capture_output=True, text=True, env=env)
            result = json.loads(done.stdout)
            rounds.append({name: build for (name, _), build in zip(order, result["builds"])})
            rounds[-1]["largest_logit_difference"] = result["largest_logit_difference"]
            weight_bytes = result["weight_bytes"]
    names = [name for name, _ in builds]
    ratios = [r[names[0]]["ms_per_step"] / r[names[1]]["ms_per_step"] for r in rounds] if len(names) == 2 else []
    report = {"machine": machine, "format": args.format, "dtype": args.dtype, "position": args.position,
              "capacity": args.capacity or args.position + 1, "steps": args.steps,
              "threads": args.threads, "weight_bytes": weight_bytes, "rounds": rounds,
              "median_ratio": statistics.median(ratios) if ratios else None}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(summary(machine))
    print(f"SmolLM2-135M-shaped decoding step, {args.format} ({args.dtype} products), {weight_bytes / 1e6:.1f} MB of weights, "
          f"{args.position} cached positions (room for {args.capacity or args.position + 1}), {args.threads} threads, {args.steps} steps per build and round")
    for index, r in enumerate(rounds):
        cells = ", ".join(f"{name} {r[name]['ms_per_step']:.3f} ms ({r[name]['weights_gb_per_s']:.1f} GB/s)"
                          for name in names)
        extra = f", ratio {ratios[index]:.3f}, logits differ by {r['largest_logit_difference']:g}" if ratios else ""
        print(f"round {index + 1}: {cells}{extra}")
    if ratios:
        print(f"{names[0]} / {names[1]}: median {statistics.median(ratios):.3f} "
              f"({', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    sys.exit(main())
