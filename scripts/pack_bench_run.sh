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

# llama.cpp for this CPU, as a user building it here gets it (GGML_NATIVE). ggml routes weights to its AMX kernels
# where the CPU reports AMX; some VMs report it and withhold it, so a second build without AMX is made there and
# used if a short run of the first dies.
build_llama() {  # build directory, extra C/C++ flags
    CFLAGS="$2" CXXFLAGS="$2" cmake -S "$WORK/llama.cpp" -B "$1" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        > "$1.log" 2>&1 && cmake --build "$1" --target llama-bench llama-quantize -j "$(nproc)" >> "$1.log" 2>&1
}
build_llama "$WORK/llama-native" "" &
NATIVE=$!
NO_AMX=
if grep -q " amx_tile" /proc/cpuinfo; then
    build_llama "$WORK/llama-no-amx" "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" &
    NO_AMX=$!
fi
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
wait $NATIVE || { say "llama.cpp did not build:"; tail -20 "$WORK/llama-native.log"; exit 1; }
LLAMA=$WORK/llama-native/bin
if [ -n "$NO_AMX" ] && ! "$LLAMA/llama-bench" -m "$MODEL" -t "$THREADS" -p 8 -n 2 -r 1 > /dev/null 2>&1; then
    wait $NO_AMX || { say "llama.cpp without AMX did not build:"; tail -20 "$WORK/llama-no-amx.log"; exit 1; }
    LLAMA=$WORK/llama-no-amx/bin
    say "llama.cpp's native build died on a short run; using its build without AMX"
elif [ -n "$NO_AMX" ]; then
    wait $NO_AMX
fi
grep -m1 "C compiler identification" "$WORK/llama-native.log"
say "built"

# The probe: compiled here by machine.py with $CC or cc, else the pack's static build for this CPU's level.
export CC=${CC:-$(command -v cc || sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$WORK/llama-native/CMakeCache.txt")}
if ! "$CC" --version > /dev/null 2>&1; then
    mkdir -p "$PACK/.build-probe"
    if grep -q " avx512f" /proc/cpuinfo; then level=v4; else level=v3; fi
    cp "$PACK/probe-$level" "$PACK/.build-probe/machine_probe" && touch "$PACK/.build-probe/machine_probe"
fi
python3 "$PACK/scripts/machine.py" --threads "$THREADS" --json > "$RESULTS/machine.json" && cat "$RESULTS/machine.json"

for type in Q4_1 Q4_K_M Q8_0; do
    [ "$(left)" -gt 60 ] || { say "no time left for $type"; continue; }
    requantize=(); [ $type != Q4_1 ] && requantize=(--requantize $type)
    timeout "$(left)" python3 "$PACK/scripts/bench_llamacpp.py" --model "$MODEL" "${requantize[@]}" --rounds "$ROUNDS" \
        --runs 3 --threads "$THREADS" --vlm "$VLM" --llama-bench "$LLAMA/llama-bench" --json > "$RESULTS/llm-$type.json"
    say "$type: exit $?"
    python3 - "$RESULTS/llm-$type.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for engine in ("swiftvlm", "llama.cpp"):
    e = r[engine]
    print(f"  {engine:9} prefill {e['prefill_tokens_per_s']:7.1f}  decode {e['decode_tokens_per_s']:6.1f} tok/s  "
          f"weights {e['weights_gb_per_s']:5.1f} GB/s ({e['of_probe']:.0%} of the probe)")
print("  ratios: prefill", " ".join(f"{x:.2f}" for x in r["ratios_prefill_tokens_per_s"]),
      "decode", " ".join(f"{x:.2f}" for x in r["ratios_decode_tokens_per_s"]),
      "; probe GB/s", r["probe_gb_per_s"], "; llama.cpp extra buffers", r["llamacpp_extra_buffers"])
EOF
done

for dtype in $CLIP_DTYPES; do
    [ "$(left)" -gt 90 ] || { say "no time left for CLIP $dtype"; continue; }
    timeout "$(left)" python3 "$PACK/scripts/bench_clip.py" --model "$WORK/models/clip" --batch-sizes 32 --runs 5 \
        --rounds "$ROUNDS" --threads "$THREADS" --dtype "$dtype" --vlm "$VLM" --json "$RESULTS/clip-$dtype.json"
    say "CLIP $dtype: exit $?"
done
say "done"
