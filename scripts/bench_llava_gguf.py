"""Image chat from a GGUF pair: SwiftVLM's `vlm bench --mmproj` against llama.cpp's llama-mtmd-cli on the same files.

    python scripts/make_llava_gguf_pair.py            # once: models/llava-1.5-qwen2-0.5b-random/*.gguf
    swift build -c release
    python scripts/bench_llava_gguf.py [--pair DIR] [--dtype fp32 bf16 int8] [--new-tokens 32] [--runs 3] [--rounds 3]
                                       [--threads 2] [--vlm .build/release/vlm] [--json results.json] [--prompt-slack N]

Any pair directory holding lm-q4_k_m.gguf and mmproj-f16.gguf serves: scripts/make_gemma3_gguf_pair.py writes Gemma
3's (models/gemma-3-4b-12-layers-gguf; run it with --prompt-slack 4, the blank lines transformers' Gemma3Processor
puts around an image and llama.cpp's mtmd does not).

The work is the question of bench_image_chat.py about its 640×480 photo, one user turn through the chat template the
language model's GGUF carries (llama-mtmd-cli with --jinja renders it as `vlm` does, the image's marker before the
text; without it llama.cpp formats ChatML by its own code, which leaves out the template's default system turn), the
image 576 tokens of CLIP ViT-L/14-336, then --new-tokens greedy tokens with no stop token (llama.cpp:
--ignore-eos). llama-mtmd-cli and llama-quantize come from scripts/llama_cpp_tree.py, built for this CPU. Each engine
reports

- image: the vision tower and projector (llama.cpp: its "mtmd batch encoding done in" line; SwiftVLM: `image_ms`),
- first token: image plus the prefill of the whole prompt (llama.cpp: its prompt eval time, which runs from the
  prompt's first chunk to the first token, the image's encoding included; SwiftVLM: `image_ms` + `first_token_ms`),
- decoding: single-token steps per second (llama.cpp: its eval time over its runs; SwiftVLM: `decode_tokens_per_s`).

llama-mtmd-cli runs once per timed turn (its own warm-up runs first in each process; loading is not timed);
`vlm bench` does --runs turns after a warm-up. In each of --rounds rounds llama.cpp does --runs turns, then SwiftVLM
each --dtype; the table gives each engine's median and SwiftVLM's per-round ratios to llama.cpp. Run on an idle
machine: the CPU and the load average are printed beside the numbers.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

import llama_cpp_tree
from image_chat_work import PROMPT, noise_photo, vlm_turn
from machine import describe, summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PAIR = os.path.join(ROOT, "models", "llava-1.5-qwen2-0.5b-random")


def llama_turn(cli, args, photo):
    command = [cli, "-m", os.path.join(args.pair, "lm-q4_k_m.gguf"), "--mmproj", os.path.join(args.pair, "mmproj-f16.gguf"),
               "--image", photo, "-p", PROMPT, "-n", str(args.new_tokens), "--temp", "0", "--ignore-eos",
               "-t", str(args.threads), "-c", "4096", "--jinja", "-v"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{log[-2000:]}")
    encoded = re.search(r"mtmd batch encoding done in (\d+) ms", log)
    prompt = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", log)
    steps = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", log)
    if not (encoded and prompt and steps):
        sys.exit(f"llama-mtmd-cli printed no timings:\n{log[-2000:]}")
    # Its prompt eval time runs from the first chunk of the prompt to the first token, the image's encoding included
    # (checked against the timestamps of its verbose log).
    image_ms, first_token_ms = float(encoded.group(1)), float(prompt.group(1))
    if first_token_ms < image_ms:
        sys.exit(f"llama-mtmd-cli's prompt eval time ({first_token_ms} ms) no longer includes the image's encoding")
    return {"image_ms": image_ms, "first_token_ms": first_token_ms, "prompt_tokens": int(prompt.group(2)),
            "decode_tokens_per_s": int(steps.group(2)) / (float(steps.group(1)) / 1e3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default=DEFAULT_PAIR)
    parser.add_argument("--dtype", nargs="+", choices=["fp32", "bf16", "int8"], default=["fp32", "bf16"])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="timed turns per engine and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", help="also write every sample as JSON to this file")
    parser.add_argument("--prompt-slack", type=int, default=0,
                        help="tokens by which vlm's prompt may exceed llama.cpp's (Gemma 3: 4, the blank lines "
                             "transformers' Gemma3Processor puts around the image and llama.cpp's mtmd leaves out)")
    args = parser.parse_args()
    if args.new_tokens < 2 or args.runs < 1 or args.rounds < 1:
        parser.error("--new-tokens must be at least 2, --runs and --rounds positive")

    cli = llama_cpp_tree.tool(llama_cpp_tree.built_tree(), "llama-mtmd-cli")
    load_before = os.getloadavg()[0]
    machine = describe(args.threads)
    photo = noise_photo(os.path.join(ROOT, "models", "bench-photo-640x480.png"))
    llama_turn(cli, args, photo)  # untimed: the files into the page cache

    samples = {"llama.cpp": [], **{dtype: [] for dtype in args.dtype}}
    ratios = {dtype: {"first_token": [], "decode": []} for dtype in args.dtype}
    for round_index in range(args.rounds):
        runs = [llama_turn(cli, args, photo) for _ in range(args.runs)]
        samples["llama.cpp"] += runs
        llama_first = statistics.median(r["first_token_ms"] for r in runs)
        llama_decode = statistics.median(r["decode_tokens_per_s"] for r in runs)
        for dtype in args.dtype:
            report = vlm_turn(args.vlm, ["--model", os.path.join(args.pair, "lm-q4_k_m.gguf"), "--mmproj",
                                         os.path.join(args.pair, "mmproj-f16.gguf")], photo, args.new_tokens,
                              args.runs, dtype, args.threads, args.timeout)
            samples[dtype].append(report)
            if not 0 <= report["prompt_tokens"] - runs[0]["prompt_tokens"] <= args.prompt_slack:
                sys.exit(f"vlm's prompt has {report['prompt_tokens']} tokens, llama.cpp's {runs[0]['prompt_tokens']}")
            ratios[dtype]["first_token"].append(report["first_token_ms"] / llama_first)
            ratios[dtype]["decode"].append(report["decode_tokens_per_s"] / llama_decode)
        print(f"round {round_index + 1} done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]

    print(summary(machine))
    vlm_tokens = samples[args.dtype[0]][0]["prompt_tokens"]
    print(f"{os.path.basename(args.pair)}: Q4_K_M language model, F16 mmproj; {samples['llama.cpp'][0]['prompt_tokens']}"
          f"-token prompt ({vlm_tokens} in vlm), {args.new_tokens} new tokens, {args.threads} threads; {args.rounds} rounds; 1-minute load "
          f"average {load_before:.1f} before, {load_after:.1f} after\n")
    print("| engine | image ms | first token ms | decode tok/s | first token ÷ llama.cpp (rounds) | decode × llama.cpp (rounds) |")
    print("|---|---:|---:|---:|---|---|")

    def median(rows, key):
        return statistics.median(r[key] for r in rows)
    rows = samples["llama.cpp"]
    print(f"| llama-mtmd-cli | {median(rows, 'image_ms'):.0f} | {median(rows, 'first_token_ms'):.0f} | "
          f"{median(rows, 'decode_tokens_per_s'):.1f} | – | – |")
    for dtype in args.dtype:
        first, decode = ratios[dtype]["first_token"], ratios[dtype]["decode"]
        print(f"| SwiftVLM {dtype} | {median(samples[dtype], 'image_ms'):.0f} | "
              f"{median(samples[dtype], 'first_token_ms'):.0f} | {median(samples[dtype], 'decode_tokens_per_s'):.1f} | "
              f"{statistics.median(first):.2f} ({', '.join(f'{r:.2f}' for r in first)}) | "
              f"{statistics.median(decode):.2f} ({', '.join(f'{r:.2f}' for r in decode)}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "pair": args.pair, "new_tokens": args.new_tokens, "threads": args.threads,
                       "load_average_before": load_before, "load_average_after": load_after, "samples": samples,
                       "ratios": ratios}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
