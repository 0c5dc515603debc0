"""Writes a full-size, randomly initialised image-chat checkpoint for benchmarking (scripts/bench_image_chat.py).

    python scripts/make_image_chat_checkpoints.py [--family llava-onevision|gemma3] [--seed N]

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

models/gemma-3-4b-12-layers-random (`--family gemma3`): google/gemma-3-4b-it's image side whole, its
`Gemma3ForConditionalGeneration` config's SigLIP so400m at 896 pixels (4,096 patches, 27 layers, pooled to 256 image
tokens) and projector, and its text decoder's widths (2,560 wide, 8 query and 4 key-value heads of 256, feed-forward
10,240, five sliding layers of 1,024 positions to one global, linear RoPE scaling 8 on the global ones, the
262,208-row embedding tied to the head) with 12 of its 34 layers, so that PyTorch's fp32 copy and SwiftVLM's fit
this machine's memory side by side (a full one is 17 GB in fp32). The tokenizer, chat template and image markers are
the Gemma 3 test fixture's (Tests/Fixtures/gemma3/tiny; its image token ids lie inside the published vocabulary),
the image processor the published settings (896×896 bilinear, mean and std 0.5), 256 image tokens an image.

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


def save(model, out, fixture, settings, name):
    """The checkpoint's files: the fixture's tokenizer and chat template, `settings` as processor_config.json, the
    model and its generation config; prints the parameter count."""
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(os.path.join(fixture, file), os.path.join(out, file))
    with open(os.path.join(out, "processor_config.json"), "w") as f:
        json.dump(settings, f, indent=2)
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")


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
    with open(os.path.join(FIXTURE, "processor_config.json")) as f:
        settings = json.load(f)
    images = LlavaOnevisionImageProcessorPil().to_dict()
    images["image_processor_type"] = "LlavaOnevisionImageProcessor"
    settings.update(image_processor=images, num_image_tokens=(side // patch) ** 2,
                    vision_aspect_ratio=config.vision_aspect_ratio)
    save(model, out, FIXTURE, settings, f"{NAME} ({settings['num_image_tokens']} tokens per {side}-pixel tile)")


GEMMA3_FIXTURE = os.path.join(ROOT, "Tests", "Fixtures", "gemma3", "tiny")
GEMMA3_NAME = "gemma-3-4b-12-layers-random"
# google/gemma-3-4b-it's text_config, 12 of its 34 layers (the sliding pattern kept: every sixth layer global).
GEMMA3_4B_TEXT = dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=12, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=1024,
                      rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=1000000.0,
                      rope_local_base_freq=10000.0, vocab_size=262208, max_position_embeddings=131072)
GEMMA3_4B_VISION = dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304,
                        num_hidden_layers=27, num_attention_heads=16, image_size=896, patch_size=14,
                        vision_use_head=False)


def write_gemma3(out, seed):
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    with open(os.path.join(GEMMA3_FIXTURE, "config.json")) as f:
        fixture = json.load(f)
    text = dict(GEMMA3_4B_TEXT, bos_token_id=fixture["text_config"]["bos_token_id"],
                eos_token_id=fixture["text_config"]["eos_token_id"], pad_token_id=fixture["text_config"]["pad_token_id"])
    config = Gemma3Config(text_config=text, vision_config=GEMMA3_4B_VISION, mm_tokens_per_image=256,
                          boi_token_index=fixture["boi_token_index"], eoi_token_index=fixture["eoi_token_index"],
                          image_token_index=fixture["image_token_index"])
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    with open(os.path.join(GEMMA3_FIXTURE, "processor_config.json")) as f:
        settings = json.load(f)
    settings["image_processor"]["size"] = {"height": 896, "width": 896}
    settings["image_seq_length"] = 256
    save(model, out, GEMMA3_FIXTURE, settings, GEMMA3_NAME)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["llava-onevision", "gemma3"], default="llava-onevision")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.family == "gemma3":
        write_once(os.path.join(MODELS, GEMMA3_NAME), lambda staging: write_gemma3(staging, args.seed))
    else:
        write_once(os.path.join(MODELS, NAME), lambda staging: write(staging, args.seed))


if __name__ == "__main__":
    sys.exit(main())
