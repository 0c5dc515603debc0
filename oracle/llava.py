"""LLaVA fixtures: tiny random-init LlavaForConditionalGeneration checkpoints saved with their LlavaProcessor, and what
transformers computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/llava.py    # → Tests/Fixtures/llava/<case>/

Each case is a checkpoint SwiftVLM loads as is: config.json, model.safetensors, the processor (CLIPImageProcessor at
the tiny image size, processor_config.json with patch_size, vision_feature_select_strategy and
num_additional_image_tokens as llava-hf's checkpoints have them) and the real SmolLM2 byte-level BPE
(Tests/Fixtures/tokenizers/real/smollm2) plus the `<image>` token. The language model's vocabulary is the tokenizer's,
so its width is kept at 4 to stay small.

- "llama-default-fp16": Llama language model, vision_feature_layer -2, "default" (the CLS token dropped), GELU
  projector with biases, fp16 weights in transformers 5.23's layout (`model.vision_tower.…`, `model.language_model.…`).
- "qwen2-layers-full-bf16": Qwen2 language model (q/k/v biases), vision_feature_layer [0, 2, -1] (the embeddings, a
  middle layer and the last layer, concatenated), "full" (CLS kept), SiLU projector without biases, its own
  lm_head (`language_model.lm_head.weight`), bf16 weights rewritten into the layout of the published llava-hf
  checkpoints (`vision_tower.vision_model.…`); the script checks that transformers 5.23 loads that file to the same
  logits.

expected.json: for the first request, `pixel_values` [1, 3, S, S], `image_features` (the projector's output
[1, tokens, 4]), `logits_head` (the prompt's logits [1, T, 64], the first 64 vocabulary entries) and the last
position's 16 largest logits with their ids; per request (one photo, a prompt with `<image>`): the processor's
`input_ids`, greedy and 3-beam new tokens (max_new_tokens 10) with their text (decoded, special tokens skipped,
stripped), and the greedy steps' smallest top-1/top-2 logit margin.
"""
import json
import os
import shutil

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (AutoTokenizer, CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration,
                          LlavaProcessor)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "llava")
PHOTOS = os.path.join(ROOT, "Tests", "Fixtures", "photos")
SMOLLM2 = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "smollm2")
NEW_TOKENS = 10

# LLaVA-1.5's conversation layout (its chat template renders a user turn with an image this way).
REQUESTS = [("chelsea.png", "USER: <image>\nWhat is in this picture? ASSISTANT:"),
            ("coffee.png", "<image>\nA photo of")]

VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=28,
              patch_size=14, projection_dim=8)
TEXT = dict(hidden_size=4, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=128, tie_word_embeddings=True)

CASES = {
    "llama-default-fp16": dict(dtype=torch.float16, published_layout=False, seed=3, text=dict(TEXT, model_type="llama"),
                               vision_feature_layer=-2, strategy="default", act="gelu", bias=True),
    "qwen2-layers-full-bf16": dict(dtype=torch.bfloat16, published_layout=True, seed=5, text=dict(TEXT, model_type="qwen2", tie_word_embeddings=False),
                                   vision_feature_layer=[0, 2, -1], strategy="full", act="silu", bias=False),
}


def randomize(model, generator):
    """Every parameter drawn, norms near 1 (transformers' init leaves the CLIP tower's biases at zero)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_((0.5 if "language_model" in name or name.startswith("lm_head") else 0.2) * noise)


def published_layout(name):
    """A key as transformers 5.23 saves it → as the published llava-hf checkpoints have it (the CLIP tower keeps
    CLIPVisionModel's `vision_model.` prefix, which 5.23 drops on saving)."""
    if name.startswith("vision_tower."):
        return "vision_tower.vision_model." + name[len("vision_tower."):]
    return name


def compact_json(path):
    with open(path) as file:
        content = json.load(file)
    with open(path, "w") as file:
        json.dump(content, file, ensure_ascii=False, separators=(",", ":"))


def generations(model, processor, inputs):
    record = {}
    prompt_length = inputs.input_ids.shape[1]
    for mode, settings in (("greedy", dict(do_sample=False)), ("beam", dict(do_sample=False, num_beams=3))):
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, output_logits=mode == "greedy",
                                 return_dict_in_generate=True, **settings)
        ids = out.sequences[0, prompt_length:].tolist()
        record[mode] = dict(ids=ids, text=processor.decode(ids, skip_special_tokens=True).strip())
        if mode == "greedy":
            record[mode]["min_margin"] = min((top[:, 0] - top[:, 1]).min().item()
                                             for top in (logits.topk(2, dim=-1).values for logits in out.logits))
    return record


def build(name, case):
    directory = os.path.join(FIXTURES, name)
    shutil.rmtree(directory, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                               vision_feature_select_strategy=case["strategy"], num_additional_image_tokens=1)
    text = dict(case["text"], vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = LlavaConfig(vision_config=dict(VISION, model_type="clip_vision_model"), text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         projector_hidden_act=case["act"], vision_feature_layer=case["vision_feature_layer"],
                         vision_feature_select_strategy=case["strategy"], multimodal_projector_bias=case["bias"])
    torch.manual_seed(case["seed"])
    model = LlavaForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(case["seed"]))
    model.to(case["dtype"]).save_pretrained(directory)
    processor.save_pretrained(directory)
    compact_json(os.path.join(directory, "tokenizer.json"))
    model = LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = LlavaProcessor.from_pretrained(directory)

    expected = dict(max_new_tokens=NEW_TOKENS, image_token_index=config.image_token_index, requests=[])
    for index, (photo, prompt) in enumerate(REQUESTS):
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        inputs = processor(images=image, text=prompt, return_tensors="pt")
        if index == 0:
            with torch.no_grad():
                features = model.model.get_image_features(pixel_values=inputs.pixel_values).pooler_output[0]
                logits = model(**inputs).logits
            top = logits[0, -1].topk(16)
            expected.update(pixel_values=inputs.pixel_values.tolist(), image_features=features.tolist(),
                            logits_head=logits[..., :64].tolist(), last_top_ids=top.indices.tolist(),
                            last_top_logits=top.values.tolist())
        record = dict(image=photo, prompt=prompt, input_ids=inputs.input_ids[0].tolist())
        record.update(generations(model, processor, inputs))
        expected["requests"].append(record)
    assert min(r["greedy"]["min_margin"] for r in expected["requests"]) > 1e-3, f"{name}: near-tie, pick another seed"

    if case["published_layout"]:
        path = os.path.join(directory, "model.safetensors")
        save_file({published_layout(k): v for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
        reloaded = LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
        image = Image.open(os.path.join(PHOTOS, REQUESTS[0][0])).convert("RGB")
        inputs = processor(images=image, text=REQUESTS[0][1], return_tensors="pt")
        with torch.no_grad():
            assert torch.equal(reloaded(**inputs).logits, logits), f"{name}: the published layout loads differently"

    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file, indent=1)
    print(name, {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


if __name__ == "__main__":
    for name, case in CASES.items():
        build(name, case)
