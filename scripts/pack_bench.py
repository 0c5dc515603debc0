#!/usr/bin/env python3
"""SwiftVLM's speed on a machine without a Swift toolchain: one directory with `vlm`, llama.cpp's source and what the
benchmarks need, made here and run there (another CPU family, a cloud VM).

    python3 scripts/pack_bench.py [--out .build-pack]     # here, after scripts/setup (about 2 minutes)
    bash .build-pack/run.sh [RESULTS_DIR]                 # there (scripts/pack_bench_run.sh: what it runs and needs)

The pack holds `vlm` (stripped) with every shared library it loads but glibc's own, xz-compressed; llama.cpp's source
as scripts/llama_cpp_tree.py keeps it (the one llama-cpp-python 0.3.36 vendors) less its models, docs, tests and
GPU backends, built there for that CPU; SmolLM2-135M-Instruct Q4_1's GGUF header (metadata, tokenizer, tensor infos)
and tensor layout, from which run.sh writes a file of the same layout with seeded random blocks (`fill` below: speed
depends on the layout, not the values; here the two files decode and prefill at the same speeds within the machine's
noise), so 2 MB travel instead of 98; the config and tokenizer of the CLIP ViT-B/32 benchmark checkpoint
(scripts/make_clip_checkpoint.py), whose random weights transformers writes there; the benchmark scripts; the
read/FMA probe, compiled statically for x86-64-v3 and -v4 for a machine with no C compiler on its PATH; and the
kernels' own decoding step (scripts/decoder_step_bench.c with Sources/CVLMKernels as a shared library, built with
clang as bench_decoder_step.py builds them; libgomp comes with `vlm`'s libraries), which run.sh times with its
products read as four streams a thread and as one (vlm_quant_streams' choice on that CPU). About 45 MB.

    python3 scripts/pack_bench.py fill HEADER LAYOUT OUT.gguf     # what run.sh calls
    python3 scripts/pack_bench.py swiftvlm --vlm V --model M      # and, where no llama.cpp runs, SwiftVLM alone
"""
import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

from bench_decoder_step import build_harness, build_library
from bench_llamacpp import DEFAULT_MODEL, bench_swiftvlm, gguf_layout, step_weight_bytes
from llama_cpp_tree import source_tree
from machine import describe, probe

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["bench_llamacpp.py", "bench_decoder_step.py", "bench_clip.py", "machine.py", "machine_probe.c", "pack_bench.py",
           "llama_cpp_tree.py"]
CLIP_DIR = ROOT / "models" / "clip-vit-base-patch32-random"
# The libraries every Linux has in its glibc, which `vlm` must take from the machine it runs on.
GLIBC = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "libresolv.so",
         "libutil.so")
# Paths of llama.cpp's tree that building llama-bench and llama-quantize for a CPU does not read.
LLAMA_CPP_SKIPPED = ("build", "models", "docs", "media", "benches", "tests", "tools/ui", ".git", "gguf-py",
                     "tools/mtmd/test-", "ggml/src/ggml-cuda", "ggml/src/ggml-vulkan", "ggml/src/ggml-sycl",
                     "ggml/src/ggml-opencl", "ggml/src/ggml-metal", "ggml/src/ggml-hexagon", "ggml/src/ggml-webgpu",
                     "ggml/src/ggml-et", "ggml/src/ggml-cann", "ggml/src/ggml-musa", "ggml/src/ggml-zdnn")
# ggml type -> (block bytes, elements per block, [(byte offset of an fp16 field, its value)]). Q4_1 blocks hold
# d and m, Q8_0 blocks d: values d·q + m within ±0.04 and ±0.06, so activations stay finite through every layer.
BLOCKS = {3: (20, 32, [(0, 0.005), (2, -0.0375)]), 8: (34, 32, [(0, 0.0005)])}
F32 = 0


def pack_vlm(vlm: Path, out: Path):
    staging = out / "vlm"
    (staging / "lib").mkdir(parents=True)
    shutil.copy2(vlm, staging / "vlm")
    listed = subprocess.run(["ldd", vlm], check=True, capture_output=True, text=True).stdout
    for line in listed.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) > parts.index("=>") + 1 and parts[parts.index("=>") + 1].startswith("/"):
            library = Path(parts[parts.index("=>") + 1])
            if not library.name.startswith(GLIBC):
                shutil.copy(library.resolve(), staging / "lib" / parts[0])
        elif "not found" in line:
            sys.exit(f"{vlm}: {line.strip()}")
    if shutil.which("strip"):
        subprocess.run(["strip", staging / "vlm"], check=True)
        subprocess.run(["strip", "--strip-unneeded", *sorted((staging / "lib").iterdir())], check=True)
    with tarfile.open(out / "vlm.tar.xz", "w:xz") as archive:
        archive.add(staging, arcname="vlm")
    shutil.rmtree(staging)


def pack_llama_cpp(out: Path):
    tree = Path(source_tree())

    def kept(info):
        relative = info.name.partition("/")[2]
        return None if relative.startswith(LLAMA_CPP_SKIPPED) else info

    with tarfile.open(out / "llama.cpp.tar.gz", "w:gz") as archive:
        archive.add(tree, arcname="llama.cpp", filter=kept)


def pack_model(model: Path, out: Path):
    layout = gguf_layout(model)
    unknown = {tensor["type"] for tensor in layout["tensors"]} - set(BLOCKS) - {F32}
    if unknown:
        sys.exit(f"{model}: ggml types {sorted(unknown)} have no random fill here (F32, Q4_1 and Q8_0 have)")
    with open(model, "rb") as f:
        (out / "smollm2-q4_1.header").write_bytes(f.read(layout["data_start"]))
    (out / "smollm2-q4_1.layout.json").write_text(json.dumps(layout))


def fill(header: Path, layout_file: Path, target: Path):
    """A GGUF file with `header` and `layout`'s tensors, F32 ones (norms) all ones, quantized ones seeded random
    blocks under fixed scales."""
    layout = json.loads(layout_file.read_text())
    generator = random.Random(0)
    with open(target, "wb") as f:
        f.write(header.read_bytes())
        if f.tell() != layout["data_start"]:
            sys.exit(f"{header}: {f.tell()} bytes, where {layout_file} says the tensors start at {layout['data_start']}")
        for tensor in layout["tensors"]:
            f.seek(layout["data_start"] + tensor["offset"])
            count = 1
            for dim in tensor["dims"]:
                count *= dim
            if tensor["type"] == F32:
                f.write(struct.pack("<f", 1.0) * count)
                continue
            size, per_block, scales = BLOCKS[tensor["type"]]
            blocks = count // per_block
            data = bytearray(generator.randbytes(blocks * size))
            for at, scale in scales:
                low, high = struct.pack("<e", scale)
                data[at::size] = bytes([low]) * blocks
                data[at + 1::size] = bytes([high]) * blocks
            f.write(data)
        f.truncate(layout["size"])


def swiftvlm_alone(vlm: Path, model: Path, rounds: int, threads: int) -> dict:
    """`vlm bench` beside the read probe, round by round, as bench_llamacpp.py measures it but without llama.cpp
    (its JSON's shape, less the llama.cpp parts): how near the memory's limit a decoding step reads its weights."""
    args = argparse.Namespace(threads=threads, runs=3, prompt_tokens=256, new_tokens=128)
    weight_bytes = step_weight_bytes(gguf_layout(model))
    megabytes = -(-weight_bytes // (1 << 20))
    machine = describe(threads)
    measured, probes = [], []
    for _ in range(rounds):
        probes.append(probe(threads, [megabytes])["read_gb_per_s"][str(megabytes)])
        result = bench_swiftvlm(vlm, model, args)
        read = weight_bytes * result["decode_tokens_per_s"] / 1e9
        measured.append(dict(result, weights_gb_per_s=read, of_probe=read / probes[-1]))
    return {"model": str(model), "machine": machine, "threads": threads, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "step_weight_bytes": weight_bytes, "probe_gb_per_s": probes,
            "rounds": [{"swiftvlm": result} for result in measured],
            "swiftvlm": {key: statistics.median(result[key] for result in measured) for key in measured[0]}}


def pack(out: Path, vlm: Path, model: Path):
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pack_vlm(vlm, out)
    pack_llama_cpp(out)
    pack_model(model, out)
    if (CLIP_DIR / "config.json").is_file():
        (out / "clip").mkdir()
        for name in ("config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
                     "vocab.json", "merges.txt"):
            shutil.copy(CLIP_DIR / name, out / "clip" / name)
    else:
        print(f"no {CLIP_DIR} (scripts/make_clip_checkpoint.py makes it): the pack runs no CLIP benchmark",
              file=sys.stderr)
    (out / "scripts").mkdir()
    for name in SCRIPTS:
        shutil.copy(ROOT / "scripts" / name, out / "scripts" / name)
    shutil.copy(ROOT / "scripts" / "pack_bench_run.sh", out / "run.sh")
    for level in ("v3", "v4"):
        subprocess.run([os.environ.get("CC", "cc"), "-O2", f"-march=x86-64-{level}", "-fopenmp", "-static",
                        ROOT / "scripts" / "machine_probe.c", "-o", out / f"probe-{level}"], check=True,
                       stderr=subprocess.DEVNULL)
    (out / "step").mkdir()
    build_harness(out / "step" / "decoder_step_bench")
    build_library(ROOT / "Sources" / "CVLMKernels", out / "step" / "kernels.so")
    total = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(f"{out}: {total / 1e6:.1f} MB; there: bash {out.name}/run.sh [RESULTS_DIR]")


def main():
    if sys.argv[1:2] == ["fill"]:
        parser = argparse.ArgumentParser(prog="pack_bench.py fill")
        parser.add_argument("header", type=Path)
        parser.add_argument("layout", type=Path)
        parser.add_argument("out", type=Path)
        args = parser.parse_args(sys.argv[2:])
        fill(args.header, args.layout, args.out)
        return
    if sys.argv[1:2] == ["swiftvlm"]:
        parser = argparse.ArgumentParser(prog="pack_bench.py swiftvlm")
        parser.add_argument("--vlm", type=Path, required=True)
        parser.add_argument("--model", type=Path, required=True)
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--threads", type=int, default=2)
        args = parser.parse_args(sys.argv[2:])
        print(json.dumps(swiftvlm_alone(args.vlm, args.model, args.rounds, args.threads), indent=1))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / ".build-pack")
    parser.add_argument("--vlm", type=Path, default=ROOT / ".build" / "release" / "vlm")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the GGUF file whose layout travels")
    args = parser.parse_args()
    if not args.vlm.is_file():
        sys.exit(f"{args.vlm}: no such binary (scripts/setup builds it)")
    pack(args.out.resolve(), args.vlm.resolve(), args.model.resolve())


if __name__ == "__main__":
    main()
