"""Writes a full-size, randomly initialised LLaVA-1.5-architecture checkpoint and the GGUF pair llama.cpp's own tools
make of it, for benchmarking SwiftVLM against llama-mtmd-cli on the same files (scripts/bench_image_chat.py
--llama-cpp).

    LLAMA_CPP_PYTHON=/path/to/venv/bin/python python scripts/make_llava_gguf_pair.py
    python scripts/make_llava_gguf_pair.py --checkpoint-only    # the checkpoint alone (scripts/bench_llava_training.py)

Run with a python that has transformers 5.23 and torch (the oracle venv, oracle/requirements.txt); LLAMA_CPP_PYTHON is
a venv with what llama.cpp pins for its legacy LLaVA scripts (tools/mtmd/requirements.txt: transformers==4.57.6,
torch, numpy), as oracle/llava_gguf.py uses them. llama.cpp's tree and llama-quantize come from
scripts/llama_cpp_tree.py (fetched and built on first use).

models/llava-1.5-qwen2-0.5b-random (git-ignored; nothing here is committed):
- checkpoint/: `LlavaForConditionalGeneration` with the published CLIP ViT-L/14-336 tower of llava-1.5 (width 1024,
  24 layers of 16 heads, feed-forward 4096, quick GELU, 336-pixel images of 14-pixel patches: 576 image tokens),
  vision_feature_layer -2, the "default" strategy and a two-layer GELU projector, in front of a Qwen2-0.5B-shaped
  language model (width 896, 24 layers of 14 query and 2 key-value heads, feed-forward 4864, the 152,000-row
  embedding tied to the head), saved in the published llava-hf layout; the tokenizer is the fixtures' SmolLM2 one
  with `<image>` and its ChatML template (see make_image_chat_checkpoints.py: what the time depends on is the
  prompt's length and the head's rows).
- mmproj-f16.gguf: llama.cpp's LLaVA-1.5 recipe (docs/multimodal/llava.md): llava_surgery_v2.py, then
  convert_image_encoder_to_gguf.py at its default f16.
- lm-q4_k_m.gguf: the language model as a Qwen2ForCausalLM directory through convert_hf_to_gguf.py (f16, which
  recognises the tokenizer as SmolLM's), then llama-quantize Q4_K_M.

A directory that already holds both files is left alone.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import llama_cpp_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "models", "llava-1.5-qwen2-0.5b-random")
SMOLLM2 = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "smollm2")
LLAMA_CPP_PYTHON = os.environ.get("LLAMA_CPP_PYTHON", sys.executable)

# llava-hf/llava-1.5-7b-hf's vision_config (openai/clip-vit-large-patch14-336).
CLIP_L_336 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu", layer_norm_eps=1e-5)
# Qwen2-0.5B as llava-onevision-qwen2-0.5b-ov-hf's text_config publishes it.
QWEN2_0_5B = dict(model_type="qwen2", vocab_size=152000, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_act="silu",
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)


def run(tree, *args, python=LLAMA_CPP_PYTHON):
    """A llama.cpp script (under `python`, with its gguf-py) or tool (python=None) of `tree`."""
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "gguf-py"))
    print("+", os.path.basename(args[0]), *args[1:3], flush=True)
    result = subprocess.run([python, *args] if python else list(args), env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def checkpoint(directory):
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (AutoTokenizer, CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor)

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1)
    text = dict(QWEN2_0_5B, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    config = LlavaConfig(vision_config=dict(CLIP_L_336, model_type="clip_vision_model"), text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"), projector_hidden_act="gelu",
                         vision_feature_layer=-2, vision_feature_select_strategy="default",
                         multimodal_projector_bias=True, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    # The published llava-hf layout, which llava_surgery_v2.py keys on (5.23 saves `vision_tower.…` without
    # CLIPVisionModel's `vision_model.`).
    path = os.path.join(directory, "model.safetensors")
    if not os.path.exists(path):
        raise SystemExit(f"{directory}: expected one model.safetensors")
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
               for k, v in load_file(path).items()}
    save_file(renamed, path, metadata={"format": "pt"})
    parameters = sum(p.numel() for p in model.parameters())
    print(f"checkpoint: {parameters / 1e9:.2f} B parameters")
    return model, tokenizer


def language_model(model, tokenizer, directory):
    """The language model alone, as the Qwen2ForCausalLM it is, for convert_hf_to_gguf.py."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(**{k: v for k, v in QWEN2_0_5B.items() if k != "model_type"},
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    lm = Qwen2ForCausalLM(config)
    missing = lm.model.load_state_dict(model.model.language_model.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    lm.tie_weights()
    lm.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    # convert_hf_to_gguf.py recognises a tokenizer by the ids it gives a test text. Under 5.23, AutoTokenizer builds
    # Qwen2Tokenizer for any qwen2 config, with Qwen2's own pre-tokenizer instead of this tokenizer.json's, so the
    # converter runs under the 4.57.6 venv, which builds the class tokenizer_config.json names (not the 5.x-only
    # TokenizersBackend 5.23 writes there; and 4.x names added special tokens additional_special_tokens).
    path = os.path.join(directory, "tokenizer_config.json")
    with open(path) as file:
        settings = json.load(file)
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings["additional_special_tokens"] = settings.pop("extra_special_tokens", [])
    with open(path, "w") as file:
        json.dump(settings, file, indent=2)


def mmproj(tree, checkpoint_directory, work, out):
    legacy = os.path.join(tree, "tools", "mtmd", "legacy-models")
    run(tree, os.path.join(legacy, "llava_surgery_v2.py"), "-C", "-m", checkpoint_directory)
    vit = os.path.join(work, "vit")
    os.makedirs(vit)
    shutil.move(os.path.join(checkpoint_directory, "llava.clip"), os.path.join(vit, "pytorch_model.bin"))
    shutil.move(os.path.join(checkpoint_directory, "llava.projector"), os.path.join(vit, "llava.projector"))
    with open(os.path.join(checkpoint_directory, "config.json")) as file:
        config = json.load(file)
    vision = dict(config["vision_config"], architectures=["CLIPVisionModel"],
                  vision_feature_layer=config["vision_feature_layer"])
    with open(os.path.join(vit, "config.json"), "w") as file:
        json.dump(vision, file, indent=2)
    run(tree, os.path.join(legacy, "convert_image_encoder_to_gguf.py"), "-m", vit, "--llava-projector",
        os.path.join(vit, "llava.projector"), "--output-dir", vit, "--clip-model-is-vision")
    shutil.move(os.path.join(vit, "mmproj-model-f16.gguf"), out)


def main():
    if sys.argv[1:] == ["--checkpoint-only"]:
        ckpt = os.path.join(OUT, "checkpoint")
        if os.path.exists(os.path.join(ckpt, "model.safetensors")):
            print(f"{ckpt}: already written")
        else:
            shutil.rmtree(ckpt, ignore_errors=True)
            checkpoint(ckpt)
        return
    lm_file, mmproj_file = os.path.join(OUT, "lm-q4_k_m.gguf"), os.path.join(OUT, "mmproj-f16.gguf")
    if os.path.exists(lm_file) and os.path.exists(mmproj_file):
        print(f"{OUT}: already written")
        return
    tree = llama_cpp_tree.built_tree()
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(OUT)) as work:
        ckpt = os.path.join(OUT, "checkpoint")
        shutil.rmtree(ckpt, ignore_errors=True)
        model, tokenizer = checkpoint(ckpt)
        lm = os.path.join(work, "qwen2")
        language_model(model, tokenizer, lm)
        del model
        mmproj(tree, ckpt, work, mmproj_file + ".partial")
        f16 = os.path.join(work, "lm-f16.gguf")
        run(tree, os.path.join(tree, "convert_hf_to_gguf.py"), lm, "--outtype", "f16", "--outfile", f16)
        run(tree, llama_cpp_tree.tool(tree, "llama-quantize"), f16, lm_file + ".partial", "Q4_K_M", python=None)
    os.rename(mmproj_file + ".partial", mmproj_file)
    os.rename(lm_file + ".partial", lm_file)
    print({f: os.path.getsize(os.path.join(OUT, f)) for f in sorted(os.listdir(OUT)) if f.endswith(".gguf")})


if __name__ == "__main__":
    sys.exit(main())
