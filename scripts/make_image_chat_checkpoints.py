"""Writes a full-size, randomly initialised image-chat checkpoint for benchmarking (scripts/bench_image_chat.py).

    python scripts/make_image_chat_checkpoints.py [--seed N]

models/llava-onevision-qwen2-0.5b-ov-random (git-ignored; nothing here is committed): the architecture of
llava-hf/llava-onevision-qwen2-0.5b-ov-hf, `LlavaOnevisionForConditionalGeneration`: SigLIP so400m-patch14-384 as the
vision tower (transformers' class defaults for LlavaOnevisionConfig, which are that tower, the 36 anyres pinpoints of
384-pixel tiles up to 6×6, anyres_max_9, the "full" feature strategy and layer -1), a two-layer GELU projector, and
Qwen2-0.5B as the language model (width 896, 24 layers of 14 query and 2 key-value heads, feed-forward 4864,
RMSNorm eps 1e-6, rope theta 1e6, the published 152,000-row embedding tied to the head). The weights are random
(seeded) and fp32, as the published ones are used on CPUs by transformers (its dtype="auto" would read their bf16).

The tokenizer is the test fixtures' SmolLM2 tokenizer with `<image>` (id 49152, inside the published vocabulary) and
its ChatML template, not Qwen2's 151,646-token one, which is not in the fixtures: what a benchmark's time depends on
is the prompt's length, the image's 2,929 tokens at 640×480 dominating it, and the head's 152,000 rows, which are the
published ones. The image processor is `LlavaOnevisionImageProcessor`'s defaults, the published settings.

A directory that already holds a complete checkpoint is left alone, so the script is safe to run before every benchmark.
"""
import argparse
import json
import os
import shutil
import sys

from checkpoint_dirs import write_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
FIXTURE = os.path.join(ROOT, "Tests", "Fixtures", "llava-onevision", "qwen2-smollm2-bf16")
NAME = "llava-onevision-qwen2-0.5b-ov-random"

# Qwen2-0.5B as llava-onevision-qwen2-0.5b-ov-hf's text_config publishes it.
QWEN2_0_5B = dict(vocab_size=152000, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def write(out, seed):
    import torch
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessorPil, Qwen2Config)

    with open(os.path.join(FIXTURE, "tokenizer.json")) as f:
        image_token = json.load(f)["added_tokens"][-1]
    assert image_token["content"] == "<image>", image_token
    config = LlavaOnevisionConfig(text_config=Qwen2Config(**QWEN2_0_5B).to_dict(), image_token_index=image_token["id"],
                                  video_token_index=image_token["id"], tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    side, patch = config.vision_config.image_size, config.vision_config.patch_size
    # The processor's files as LlavaOnevisionProcessor.save_pretrained writes them (it needs a video processor, and
    # with it torchvision, to be built at all): the fixture's tokenizer and template, the published image settings.
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(os.path.join(FIXTURE, name), os.path.join(out, name))
    with open(os.path.join(FIXTURE, "processor_config.json")) as f:
        settings = json.load(f)
    images = LlavaOnevisionImageProcessorPil().to_dict()
    images["image_processor_type"] = "LlavaOnevisionImageProcessor"
    settings.update(image_processor=images, num_image_tokens=(side // patch) ** 2,
                    vision_aspect_ratio=config.vision_aspect_ratio)
    with open(os.path.join(out, "processor_config.json"), "w") as f:
        json.dump(settings, f, indent=2)
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{NAME}: {parameters / 1e9:.2f} B parameters, {settings['num_image_tokens']} tokens per {side}-pixel tile")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_once(os.path.join(MODELS, NAME), lambda staging: write(staging, args.seed))


if __name__ == "__main__":
    sys.exit(main())
