#!/usr/bin/env python3
"""GGUF files of random weights in the shapes of Qwen3-0.6B and Gemma 3 270M, for speed measurements beside llama.cpp.

No real Qwen3 or Gemma 3 weights can be had here, and a decoding step's speed does not depend on the values. Each
model is built by transformers (`Qwen3ForCausalLM`, `Gemma3ForCausalLM`, random init) in its published config's shape
and written as llama.cpp's converter writes that architecture (oracle/llama.py's writers: Qwen3 unpermuted, Gemma 3
with its norms stored plus one), every matrix in Q8_0, with a vocabulary-less tokenizer ("none") so that llama.cpp
loads it too. Then:

    python scripts/make_decoder_shapes.py                 # → models/qwen3-0.6b-shape.Q8_0.gguf, models/gemma-3-270m-shape.Q8_0.gguf
    python3 scripts/bench_llamacpp.py --model models/qwen3-0.6b-shape.Q8_0.gguf --requantize Q4_K_M --llama-bench BIN

Run with the oracle venv (oracle/requirements.txt); about a minute and 4 GB of memory per model.
"""
import argparse
import os
import sys

import torch
from gguf import GGMLQuantizationType as Q
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "oracle"))
import llama  # noqa: E402  (the GGUF writers)

MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
           "mlp.down_proj"]
TYPES = {module: Q.Q8_0 for module in ["model.embed_tokens"] + MODULES}


def qwen3(path):
    # Qwen/Qwen3-0.6B's config.json.
    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
                         rope_parameters=dict(rope_type="default", rope_theta=1000000.0))
    llama.write_gguf(Qwen3ForCausalLM(config).eval(), path, "qwen3", TYPES, permute=False, name="qwen3-0.6b-shape",
                     tokenizer="none")


def gemma3(path):
    # google/gemma-3-270m's config.json.
    config = Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256, max_position_embeddings=32768,
                              sliding_window=512, query_pre_attn_scalar=256, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    llama.write_gemma3_gguf(Gemma3ForCausalLM(config).eval(), path, TYPES, name="gemma-3-270m-shape", tokenizer="none")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "models"))
    parser.add_argument("models", nargs="*", help="qwen3, gemma3 (both by default)")
    args = parser.parse_args()
    unknown = set(args.models) - {"qwen3", "gemma3"}
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}: the models are qwen3 and gemma3")
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    for name in args.models or ["qwen3", "gemma3"]:
        path = os.path.join(args.out, {"qwen3": "qwen3-0.6b-shape.Q8_0.gguf", "gemma3": "gemma-3-270m-shape.Q8_0.gguf"}[name])
        {"qwen3": qwen3, "gemma3": gemma3}[name](path)
        print(path, os.path.getsize(path) // (1 << 20), "MiB")


if __name__ == "__main__":
    main()
