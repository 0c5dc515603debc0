#!/bin/bash
# Runs a pack that scripts/pack_bench.py made: SwiftVLM beside llama.cpp (SmolLM2-135M's layout in Q4_1, Q4_K_M
# and Q8_0: scripts/bench_llamacpp.py with llama.cpp's own llama-bench) and, where python3 has torch, transformers,
# onnxruntime and onnxscript, CLIP ViT-B/32 in bf16 and int8 beside PyTorch and ONNX Runtime (scripts/bench_clip.py).
#
#   bash run.sh [RESULTS_DIR]      # default: results/ beside this file
#
# Needs: a C and C++ compiler and cmake (llama.cpp is built here, for this CPU), python3 (numpy for CLIP). Writes
# log.txt, machine.json, llm-<type>.json and clip-<dtype>.json into RESULTS_DIR. Environment: THREADS (2), ROUNDS (3),
# LIMIT (seconds after which no benchmark starts; 3600), CLIP_DTYPES ("bf16 int8"; empty for none), WORK (where
# llama.cpp is built and the models are written; work/ beside this file).
set -u
PACK=$(cd "$(dirname "$0")" && pwd)
RESULTS=${1:-$PACK/results}
mkdir -p "$RESULTS" && RESULTS=$(cd "$RESULTS" && pwd)
THREADS=${THREADS:-2} ROUNDS=${ROUNDS:-3} LIMIT=${LIMIT:-3600} CLIP_DTYPES=${CLIP_DTYPES-bf16 int8}
START=$(date +%s)
say() { echo "[$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
exec > >(tee "$RESULTS/log.txt") 2>&1

WORK=${WORK:-$PACK/work}
rm -rf "$WORK" && mkdir -p "$WORK/models"
tar xJf "$PACK/vlm.tar.xz" -C "$WORK" && tar xzf "$PACK/llama.cpp.tar.gz" -C "$WORK" || exit 1
VLM=$WORK/vlm/run
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/vlm/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/vlm/vlm" "$@"\n' \
    "$WORK" "$WORK" > "$VLM" && chmod +x "$VLM"
"$VLM" --help > /dev/null || { say "vlm does not start here"; exit 1; }
say "unpacked"

# llama.cpp for this CPU, as a user building it here gets it (GGML_NATIVE). Some VMs report instructions they
# withhold (AMX on one; on another a natively built llama.cpp died with SIGSEGV, cause unknown), so two more builds
# run beside it: native without AMX where the CPU reports AMX, and one from ggml's own ISA switches (AVX2, and
# AVX-512 with VNNI, BF16 and VBMI where reported) without -march=native. The first, in that order, whose short
# llama-bench run succeeds is the one timed; each failure's last lines go into the log.
build_llama() {  # variant, extra C/C++ flags, cmake options...
    local dir=$WORK/llama-$1 flags=$2
    shift 2
    CFLAGS="$flags" CXXFLAGS="$flags" cmake -S "$WORK/llama.cpp" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "$@" > "$dir.log" 2>&1 \
        && cmake --build "$dir" --target llama-bench llama-quantize -j "$(nproc)" >> "$dir.log" 2>&1
}
reports() { grep -qw "$1" /proc/cpuinfo; }
explicit=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
reports avx512f && explicit+=(-DGGML_AVX512=ON)
reports avx512_vnni && explicit+=(-DGGML_AVX512_VNNI=ON)
reports avx512_bf16 && explicit+=(-DGGML_AVX512_BF16=ON)
reports avx512vbmi && explicit+=(-DGGML_AVX512_VBMI=ON)
VARIANTS=(native) BUILDS=()
build_llama native "" -DGGML_NATIVE=ON &
BUILDS+=($!)
if reports amx_tile; then
    build_llama no-amx "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DGGML_NATIVE=ON &
    VARIANTS+=(no-amx) BUILDS+=($!)
fi
build_llama explicit "" "${explicit[@]}" &
VARIANTS+=(explicit) BUILDS+=($!)
MODEL=$WORK/models/smollm2-random.Q4_1.gguf
python3 "$PACK/scripts/pack_bench.py" fill "$PACK/smollm2-q4_1.header" "$PACK/smollm2-q4_1.layout.json" "$MODEL" \
    || exit 1
if [ -n "$CLIP_DTYPES" ] && [ -d "$PACK/clip" ]; then
    cp -r "$PACK/clip" "$WORK/models/clip"
    python3 - "$WORK/models/clip" <<'EOF' || { say "no CLIP checkpoint (torch and transformers needed)"; CLIP_DTYPES=; }
import os, sys, tempfile, torch
from transformers import CLIPConfig, CLIPModel
torch.manual_seed(0)
with tempfile.TemporaryDirectory() as staging:
    CLIPModel(CLIPConfig.from_pretrained(sys.argv[1])).eval().save_pretrained(staging)
    os.replace(os.path.join(staging, "model.safetensors"), os.path.join(sys.argv[1], "model.safetensors"))
EOF
fi
LLAMA= QUANTIZE=
for index in "${!VARIANTS[@]}"; do
    variant=${VARIANTS[$index]}
    wait "${BUILDS[$index]}" || { say "llama.cpp ($variant) did not build:"; tail -5 "$WORK/llama-$variant.log"; continue; }
    QUANTIZE=${QUANTIZE:-$WORK/llama-$variant/bin/llama-quantize}
    [ -z "$LLAMA" ] || continue
    if "$WORK/llama-$variant/bin/llama-bench" -m "$MODEL" -t "$THREADS" -p 8 -n 2 -r 1 > "$WORK/trial-$variant.log" 2>&1; then
        LLAMA=$WORK/llama-$variant/bin
        say "llama.cpp: the $variant build"
    else
        say "llama.cpp's $variant build died on a short run (exit $?):"
        tail -5 "$WORK/trial-$variant.log"
    fi
done
grep -m1 "C compiler identification" "$WORK/llama-native.log"
say "built"

# The probe: compiled here by machine.py with $CC or cc, else the pack's static build for this CPU's level.
export CC=${CC:-$(command -v cc || sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$WORK"/llama-*/CMakeCache.txt | head -1)}
if ! "$CC" --version > /dev/null 2>&1; then
    mkdir -p "$PACK/.build-probe"
    if grep -q " avx512f" /proc/cpuinfo; then level=v4; else level=v3; fi
    cp "$PACK/probe-$level" "$PACK/.build-probe/machine_probe" && touch "$PACK/.build-probe/machine_probe"
fi
python3 "$PACK/scripts/machine.py" --threads "$THREADS" --json > "$RESULTS/machine.json" && cat "$RESULTS/machine.json"

# The kernels' own decoding step (SmolLM2-135M's shapes, random weights, 320 cached positions), its products read as
# four streams a thread and as one, the two taking alternate steps in one process, the order alternating by round:
# which count vlm_quant_streams should pick on this CPU (the ratio is four's time over one's).
for type in 3:Q4_1 8:Q8_0; do
    for round in $(seq "$ROUNDS"); do
        counts="4 1"; [ $((round % 2)) = 0 ] && counts="1 4"
        OMP_NUM_THREADS=$THREADS LD_LIBRARY_PATH="$WORK/vlm/lib" "$PACK/step/decoder_step_bench" "${type%%:*}" 320 400 \
            $(for count in $counts; do echo "$PACK/step/kernels.so@$count"; done)
    done > "$RESULTS/step-${type#*:}.jsonl"
    say "${type#*:} step, four streams a thread against one: exit $?"
    python3 - "$RESULTS/step-${type#*:}.jsonl" <<'EOF'
import json, statistics, sys
ratios = []
for line in open(sys.argv[1]):
    builds = {b["library"].rsplit("@", 1)[1]: b for b in json.loads(line)["builds"]}
    ratios.append(builds["4"]["ms_per_step"] / builds["1"]["ms_per_step"])
    print(f"  4 streams {builds['4']['ms_per_step']:.3f} ms ({builds['4']['weights_gb_per_s']:.1f} GB/s), "
          f"1 stream {builds['1']['ms_per_step']:.3f} ms ({builds['1']['weights_gb_per_s']:.1f} GB/s)")
if ratios:
    print("  four / one: median", f"{statistics.median(ratios):.3f}", "(" + ", ".join(f"{r:.3f}" for r in ratios) + ")")
EOF
done

# With a llama.cpp that runs: both engines, llama.cpp's quantizer writing the other two types. Without one, SwiftVLM
# alone beside the read probe (how near the memory's limit it decodes), on whatever types a built quantizer writes.
for type in Q4_1 Q4_K_M Q8_0; do
    [ "$(left)" -gt 60 ] || { say "no time left for $type"; continue; }
    file=$MODEL
    if [ $type != Q4_1 ]; then
        file=$WORK/models/smollm2-random.$type.gguf
        [ -n "$QUANTIZE" ] && "$QUANTIZE" --allow-requantize "$MODEL" "$file" $type > /dev/null 2>&1 \
            || { say "no $type file: llama.cpp's quantizer did not write it"; continue; }
    fi
    if [ -n "$LLAMA" ]; then
        timeout "$(left)" python3 "$PACK/scripts/bench_llamacpp.py" --model "$file" --rounds "$ROUNDS" --runs 3 \
            --threads "$THREADS" --vlm "$VLM" --llama-bench "$LLAMA/llama-bench" --json > "$RESULTS/llm-$type.json"
    else
        timeout "$(left)" python3 "$PACK/scripts/pack_bench.py" swiftvlm --model "$file" --rounds "$ROUNDS" \
            --threads "$THREADS" --vlm "$VLM" > "$RESULTS/llm-$type.json"
    fi
    say "$type: exit $?"
    python3 - "$RESULTS/llm-$type.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for engine in ("swiftvlm", "llama.cpp"):
    if engine in r:
        e = r[engine]
        print(f"  {engine:9} prefill {e['prefill_tokens_per_s']:7.1f}  decode {e['decode_tokens_per_s']:6.1f} tok/s  "
              f"weights {e['weights_gb_per_s']:5.1f} GB/s ({e['of_probe']:.0%} of the probe)")
if "ratios_decode_tokens_per_s" in r:
    print("  ratios: prefill", " ".join(f"{x:.2f}" for x in r["ratios_prefill_tokens_per_s"]),
          "decode", " ".join(f"{x:.2f}" for x in r["ratios_decode_tokens_per_s"]),
          "; llama.cpp extra buffers", r["llamacpp_extra_buffers"])
print("  probe GB/s", r["probe_gb_per_s"])
EOF
done

for dtype in $CLIP_DTYPES; do
    [ "$(left)" -gt 90 ] || { say "no time left for CLIP $dtype"; continue; }
    timeout "$(left)" python3 "$PACK/scripts/bench_clip.py" --model "$WORK/models/clip" --batch-sizes 32 --runs 5 \
        --rounds "$ROUNDS" --threads "$THREADS" --dtype "$dtype" --vlm "$VLM" --json "$RESULTS/clip-$dtype.json"
    say "CLIP $dtype: exit $?"
done
say "done"
