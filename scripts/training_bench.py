"""What the training benchmarks (bench_contrastive_training.py, bench_llava_training.py) share: the captioned photos they train on and a
timed `vlm train` run."""
import json
import os
import random
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHOTOS = os.path.join(ROOT, "Tests", "Fixtures", "photos")
WORDS = ("cat dog coffee rocket camera man woman street night sky tree river house red blue green small large old "
         "young sitting running on in under beside a the with of photo picture painting close view").split()


def write_dataset(directory, pairs, words, seed):
    """An imagefolder dataset in `directory`: the repository's photos, cycled, each pair captioned by seeded random
    words, as many as `words(generator)` says. Returns the metadata rows."""
    generator = random.Random(seed)
    photos = sorted(p for p in os.listdir(PHOTOS) if p.endswith((".png", ".jpg")))
    for photo in photos:
        shutil.copy(os.path.join(PHOTOS, photo), os.path.join(directory, photo))
    rows = [{"file_name": photos[i % len(photos)], "text": " ".join(generator.choice(WORDS) for _ in range(words(generator)))}
            for i in range(pairs)]
    with open(os.path.join(directory, "metadata.jsonl"), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    return rows


def vlm_step_seconds(binary, recipe, model_dir, data, out, batch_size, steps, learning_rate, threads, *options):
    """Seconds per step of `vlm train RECIPE`, from its `train_runtime` (the steps alone), pairs in order."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    command = [binary, "train", recipe, "--model", model_dir, "--data", data, "--out", out, "--force", "--json",
               "--no-shuffle", "--batch-size", str(batch_size), "--max-steps", str(steps),
               "--learning-rate", str(learning_rate), *options]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"vlm train {recipe} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)["train_runtime"] / steps


def parse_arguments(description, model, pairs, batch_size, steps, choices=None):
    """The benchmarks' command line, with their own defaults for the model, pairs, batch size and steps, and their
    own options each taking one of a few values (the first the default)."""
    import argparse
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=model)
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    parser.add_argument("--pairs", type=int, default=pairs)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    for name, values in (choices or {}).items():
        parser.add_argument(f"--{name}", choices=values, default=values[0])
    return parser.parse_args()


def trainer_step(loss, parameters, optimizer, schedule):
    """What transformers' Trainer does with a batch's loss: backward, clip to 1, step, schedule, clear."""
    import torch
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
