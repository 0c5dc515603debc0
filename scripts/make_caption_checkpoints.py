"""Writes full-size, randomly initialised captioning checkpoints for benchmarking (scripts/bench_caption.py).

    python scripts/make_caption_checkpoints.py [--only NAME ...] [--seed N]

Into models/ (git-ignored; nothing here is committed), each with transformers' own random initialisation (seeded):

- blip2-opt-2.7b-random: the architecture of Salesforce/blip2-opt-2.7b, `Blip2ForConditionalGeneration` with 3.7 B
  parameters in fp32 as that checkpoint stores them (15 GB): the EVA ViT-g vision tower (width 1408, 39 layers of 16
  heads, feed-forward 6144, 224-pixel images in 14-pixel patches: 257 tokens), the Q-Former (width 768, 12 layers,
  cross-attention every 2nd, 32 query tokens; these are the class defaults of Blip2VisionConfig and
  Blip2QFormerConfig, which are that checkpoint's), the language projection and OPT-2.7B (width 2560, 32 layers of
  32 heads, feed-forward 10240, ReLU, 2048 positions, facebook/opt-2.7b's 50,272-row embedding tied to the head).
  Its tokenizer is the test fixtures' real GPT-2 BPE (the vocabulary OPT's is built on) with `<image>` added, as
  oracle/image_to_text.py saves it; the image processor BlipImageProcessor at 224 pixels.
- blip2-opt-2.7b-random-bf16: the same model stored in bf16 (7.5 GB), for the weights-as-stored case.
- blip-image-captioning-base-random, blip-image-captioning-large-random: `BlipForConditionalGeneration` in the shapes of
  Salesforce/blip-image-captioning-base (ViT-B/16) and -large (ViT-L/16) at 384 pixels, with BLIP's BERT-base text
  decoder (12 layers of 12 heads) and tokenizer (bert-base-uncased with [DEC] and [ENC], as oracle/image_to_text.py
  builds it), fp32.

A directory that already holds a complete checkpoint is left alone, so the script is safe to run before every benchmark.
"""
import argparse
import os
import sys

from checkpoint_dirs import write_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
GPT2 = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "gpt2")
BERT = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "bert-uncased")

# facebook/opt-2.7b as blip2-opt-2.7b's text_config publishes it (bos/eos/pad become the tokenizer's).
OPT_2_7B = dict(vocab_size=50272, hidden_size=2560, word_embed_proj_dim=2560, ffn_dim=10240, num_hidden_layers=32,
                num_attention_heads=32, max_position_embeddings=2048, do_layer_norm_before=True, activation_function="relu")
BLIP_TEXT = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 max_position_embeddings=512)
BLIP_VISION = {"base": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
               "large": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16)}


def blip2(dtype):
    import torch
    from transformers import AutoTokenizer, Blip2Config, Blip2ForConditionalGeneration, Blip2Processor, BlipImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(GPT2, add_bos_token=True)
    processor = Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": 224, "width": 224}),
                               tokenizer=tokenizer, num_query_tokens=32)
    eos = processor.tokenizer.eos_token_id
    config = Blip2Config(text_config=dict(OPT_2_7B, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos),
                         num_query_tokens=32, image_token_index=processor.tokenizer.convert_tokens_to_ids("<image>"))
    model = Blip2ForConditionalGeneration(config).eval()
    if dtype == torch.bfloat16:
        model = model.to(dtype)
    return model, processor


def blip(size):
    from transformers import AutoTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessorPil, BlipProcessor

    tokenizer = AutoTokenizer.from_pretrained(BERT, bos_token="[DEC]")
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    processor = BlipProcessor(image_processor=BlipImageProcessorPil(), tokenizer=tokenizer)
    config = BlipConfig(text_config=dict(BLIP_TEXT, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                         pad_token_id=tokenizer.pad_token_id, sep_token_id=tokenizer.sep_token_id),
                        vision_config=BLIP_VISION[size])
    return BlipForConditionalGeneration(config).eval(), processor


def builders():
    import torch
    return {"blip2-opt-2.7b-random": lambda: blip2(torch.float32),
            "blip2-opt-2.7b-random-bf16": lambda: blip2(torch.bfloat16),
            "blip-image-captioning-base-random": lambda: blip("base"),
            "blip-image-captioning-large-random": lambda: blip("large")}


NAMES = ["blip2-opt-2.7b-random", "blip2-opt-2.7b-random-bf16", "blip-image-captioning-base-random",
         "blip-image-captioning-large-random"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=NAMES, default=NAMES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    def write(name, staging):
        torch.manual_seed(args.seed)
        model, processor = builders()[name]()
        # Shards of 2 GB: safetensors copies a shard's tensors into one buffer before writing it.
        model.save_pretrained(staging, max_shard_size="2GB")
        model.generation_config.save_pretrained(staging)
        processor.save_pretrained(staging)
        parameters = sum(p.numel() for p in model.parameters())
        print(f"{name}: {parameters / 1e9:.2f} B parameters, {next(model.parameters()).dtype}")

    for name in args.only:
        write_once(os.path.join(MODELS, name), lambda staging: write(name, staging))


if __name__ == "__main__":
    sys.exit(main())
