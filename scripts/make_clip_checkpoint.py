"""Writes a full-size, randomly initialised openai/clip-vit-base-patch32 checkpoint for benchmarking.

The weights are random (seeded, so every run writes the same tensors); everything else matches the real repository:
the CLIPConfig architecture, its preprocessor_config.json, and the real CLIP tokenizer built from OpenAI's BPE merges
(see oracle/clip_vocab.py). Nothing here is committed: the default output directory, models/, is git-ignored.

    python scripts/make_clip_checkpoint.py [--out DIR] [--bpe PATH] [--seed N]

Without --bpe the merges file is taken from open-clip-torch's wheel, fetched with `pip download`. A directory that
already holds a complete checkpoint is left alone, so the script is safe to run before every benchmark.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "oracle"))

from clip_vocab import clip_tokenizer  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "models", "clip-vit-base-patch32-random")
OPEN_CLIP_WHEEL = "open-clip-torch==3.3.0"
BPE_IN_WHEEL = "open_clip/bpe_simple_vocab_16e6.txt.gz"
CHECKPOINT_FILES = ("config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json", "vocab.json",
                    "merges.txt", "tokenizer_config.json")

# The real text_config says bos 0, eos 2, pad 1 (transformers' CLIPTextConfig defaults are 49406/49407/1). eos 2 is what
# makes CLIPTextTransformer pool at argmax(input_ids), i.e. at <|endoftext|>, the highest id: the path the real
# checkpoint takes, so the benchmark model takes it too.
TEXT_CONFIG = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                   num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                   projection_dim=512, bos_token_id=0, eos_token_id=2, pad_token_id=1)
VISION_CONFIG = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                     image_size=224, patch_size=32, num_channels=3, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                     projection_dim=512)

# openai/clip-vit-base-patch32's preprocessor_config.json as published, in its legacy CLIPFeatureExtractor form
# (integer size and crop_size), which transformers reads as shortest_edge 224 and a 224x224 centre crop.
PREPROCESSOR_CONFIG = {
    "crop_size": 224,
    "do_center_crop": True,
    "do_normalize": True,
    "do_resize": True,
    "feature_extractor_type": "CLIPFeatureExtractor",
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "size": 224,
}


def fetch_bpe_merges(work_dir):
    """Downloads open-clip-torch's wheel (no dependencies) and extracts OpenAI's BPE merges from it."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", work_dir,
                    OPEN_CLIP_WHEEL], check=True)
    wheels = [name for name in os.listdir(work_dir) if name.endswith(".whl")]
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel from `pip download {OPEN_CLIP_WHEEL}` in {work_dir}, found {wheels}")
    with zipfile.ZipFile(os.path.join(work_dir, wheels[0])) as wheel:
        return wheel.extract(BPE_IN_WHEEL, work_dir)


def write_checkpoint(out_dir, bpe_path, seed):
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(seed)
    config = CLIPConfig(text_config=TEXT_CONFIG, vision_config=VISION_CONFIG, projection_dim=512,
                        logit_scale_init_value=2.6592)
    CLIPModel(config).eval().save_pretrained(out_dir)
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR_CONFIG, f, indent=2)
        f.write("\n")
    processor = CLIPImageProcessor.from_pretrained(out_dir)
    if processor.size != {"shortest_edge": 224} or processor.crop_size != {"height": 224, "width": 224}:
        raise SystemExit(f"transformers reads {out_dir}/preprocessor_config.json unexpectedly: {processor}")
    clip_tokenizer(bpe_path, out_dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_OUT, help="checkpoint directory (default: %(default)s)")
    parser.add_argument("--bpe", help="bpe_simple_vocab_16e6.txt.gz; fetched from open-clip-torch's wheel if omitted")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights (default: 0)")
    args = parser.parse_args()

    out_dir = os.path.abspath(args.out)
    if os.path.exists(out_dir):
        missing = [name for name in CHECKPOINT_FILES if not os.path.isfile(os.path.join(out_dir, name))]
        if missing:
            raise SystemExit(f"{out_dir} exists but lacks {', '.join(missing)}: remove it or choose another --out")
        print(f"{out_dir} already holds a checkpoint; left as it is")
        return
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent) as work_dir:
        bpe_path = args.bpe or fetch_bpe_merges(work_dir)
        # Built beside the target and renamed into place, so an interrupted run never leaves a half checkpoint that
        # the completeness check above would accept.
        staging = os.path.join(work_dir, "checkpoint")
        write_checkpoint(staging, bpe_path, args.seed)
        os.rename(staging, out_dir)
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
