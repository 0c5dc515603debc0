"""What the image-chat benchmarks (bench_image_chat.py, bench_llava_gguf.py) time: the photo, the question, and one
`vlm bench` turn on them."""
import json
import os
import subprocess
import sys

import numpy as np

PROMPT = "What is in this picture?"
WIDTH, HEIGHT = 640, 480


def noise_photo(path):
    """Writes a WIDTH×HEIGHT PNG of seeded noise to `path` and returns the path."""
    from PIL import Image
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pixels = np.random.default_rng(0x5EED).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def vlm_turn(vlm, model, photo, new_tokens, runs, dtype, threads, timeout):
    """`vlm bench`'s report on PROMPT about `photo` for `model` (its --model and any --mmproj arguments), with
    first_token_ms counted from the processed inputs, the image's features included."""
    command = [vlm, "bench", *model, "--image", photo, "--prompt", PROMPT, "--new-tokens", str(new_tokens),
               "--runs", str(runs), "--dtype", dtype, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {done.stderr.strip()}")
    report = json.loads(done.stdout)
    if report.get("dtype") != dtype:
        sys.exit(f"vlm ran {report.get('dtype')} for --dtype {dtype} (a CPU without its instructions runs fp32)")
    report["first_token_ms"] = report["image_ms"] + report["first_token_ms"]
    return report
