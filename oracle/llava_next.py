"""LLaVA-NeXT fixtures: what transformers' LlavaNextImageProcessorPil makes of real photos of different aspect ratios,
and tiny random-init LlavaNextForConditionalGeneration checkpoints saved with their LlavaNextProcessor, with what
transformers computes with them.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after fetching scikit-image's
photos (`pip download --no-deps scikit-image==0.26.0 -d /tmp/skimage` and unzip its `skimage/data/rocket.jpg`):

    python oracle/llava_next.py [path/to/rocket.jpg]    # → Tests/Fixtures/llava-next/

photos/: crops of scikit-image's rocket.jpg (640×427) with extreme aspect ratios, next to Tests/Fixtures/photos'
camera.png (512×512) and chelsea.png (451×300), so that anyres picks different grids: wide.png 640×128, tall.png
96×427, half.png 320×160.

image_processor.json: per processor config (llava-hf's: 336-pixel tiles over the class's default pinpoints; the tiny one of the checkpoints; a non-square
`size` without centre crop, bilinear, pinpoints that are not multiples of the tile so edge tiles come out smaller),
all photos in one batch: the config as transformers saves it, pixel_values' shape, image_sizes, a checksum of each
image's float32 pixel values (padding tiles included: two wrapping 64-bit sums of their bit patterns, plain and
weighted by position from 1, in hex) and 64 sampled values, and the number of image
tokens LlavaNextProcessor expands each `<image>` into (patch_size 14, "default", num_additional_image_tokens 1, as
the llava-hf checkpoints have them; the tiny config with the checkpoints' patch size 7).

Checkpoints (Tests/Fixtures/tokenizers/llama-style's tokenizer, Llama 2's pipeline, plus the `<image>` token; CLIP
towers at 28 pixels with 7-pixel patches, so a tile has 16 features; image_grid_pinpoints 1×2, 2×1, 2×2, 3×1 and 1×3
tiles of 28, as LLaVA-NeXT's are of 336):
- "llama-tied-fp16": Llama language model, vision_feature_layer -2, GELU projector with biases, lm_head tied by the
  top-level tie_word_embeddings (the text config's says no, and LlavaNextConfig does not read it), fp16 weights in
  transformers 5.23's saved layout (`vision_tower.…`, `image_newline`, `language_model.model.…`).
- "mistral-layers-bf16": Mistral language model, vision_feature_layer [1, -1] (concatenated), SiLU projector without
  biases, its own lm_head (the text config's tie_word_embeddings says yes, the top level no), bf16 weights rewritten
  into the published llava-hf layout (`vision_tower.vision_model.…`); the script checks that transformers loads that
  file to the same logits.

expected.json: per request (photos and a prompt with one `<image>` per photo): the processor's input_ids,
image_sizes, pixel_values' shape (its values are image_processor.json's "tiny" case), the number of image tokens per
image, the image features
(`get_image_features(...).pooler_output`, [tokens, hidden] per image), logits at a few positions (the first, middle
and last image token, the last position) over the whole vocabulary, and the greedy continuation
(max_new_tokens 10) with its text (decoded, special tokens skipped, stripped) and its smallest top-1/top-2 margin.
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextImageProcessorPil,
                          LlavaNextProcessor, PreTrainedTokenizerFast)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "llava-next")
TOKENIZER = os.path.join(FIXTURES, "tokenizers", "llama-style", "tokenizer.json")
NEW_TOKENS = 10

# Crops (left, top, right, bottom) of rocket.jpg.
CROPS = {"wide.png": (0, 290, 640, 418), "tall.png": (262, 0, 358, 427), "half.png": (160, 100, 480, 260)}
PHOTOS = ["photos/camera.png", "photos/chelsea.png", "llava-next/photos/wide.png", "llava-next/photos/tall.png",
          "llava-next/photos/half.png"]

TINY_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]
TINY_PROCESSOR = dict(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28},
                      image_grid_pinpoints=TINY_PINPOINTS)
PROCESSOR_CASES = {
    "llava-hf": (dict(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}), 14),
    "tiny": (TINY_PROCESSOR, 7),
    "exact-size-no-crop": (dict(size={"height": 32, "width": 36}, crop_size={"height": 28, "width": 28},
                                do_center_crop=False, resample=2, image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.3, 0.4],
                                image_grid_pinpoints=[[64, 72], [32, 108], [96, 36], [60, 70]]), 4),
}

VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=28,
              patch_size=7, projection_dim=8, model_type="clip_vision_model")
TEXT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512)

VICUNA = "USER: <image>\nWhat is shown in this image? ASSISTANT:"
MISTRAL = "[INST] <image>\nWhat is shown in this image? [/INST]"
CASES = {
    "llama-tied-fp16": dict(dtype=torch.float16, published_layout=False, seed=1,
                            text=dict(TEXT, model_type="llama", tie_word_embeddings=False), tie=True,
                            vision_feature_layer=-2, act="gelu", bias=True,
                            requests=[([photo], VICUNA) for photo in PHOTOS[1:4]]),
    "mistral-layers-bf16": dict(dtype=torch.bfloat16, published_layout=True, seed=2,
                                text=dict(TEXT, model_type="mistral", tie_word_embeddings=True), tie=False,
                                vision_feature_layer=[1, -1], act="silu", bias=False,
                                requests=[([photo], MISTRAL) for photo in (PHOTOS[0], PHOTOS[3], PHOTOS[4])]
                                + [([PHOTOS[2], PHOTOS[1]], "[INST] <image>\n<image>\nWhat differs? [/INST]")]),
}


def photo(name):
    return Image.open(os.path.join(FIXTURES, name)).convert("RGB")


def checksum(array):
    """Two wrapping 64-bit sums of the float32 bit patterns, plain and weighted by position (1, 2, …): exact, as a
    digest is, but cheap to recompute in a debug build."""
    bits = np.ascontiguousarray(array, dtype="<f4").reshape(-1).view("<u4").astype(np.uint64)
    weights = np.arange(1, bits.size + 1, dtype=np.uint64)
    return [f"{int(bits.sum(dtype=np.uint64)):016x}", f"{int((bits * weights).sum(dtype=np.uint64)):016x}"]


def make_photos(rocket_path):
    os.makedirs(os.path.join(OUT, "photos"), exist_ok=True)
    rocket = Image.open(rocket_path).convert("RGB")
    for name, box in CROPS.items():
        rocket.crop(box).save(os.path.join(OUT, "photos", name), optimize=True)


def tokenizer():
    tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tok


def token_counts(image_processor, patch_size, pixel_values, image_sizes):
    processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer(), patch_size=patch_size,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1)
    height, width = pixel_values.shape[-2:]
    return [processor._get_number_of_features(int(h), int(w), height, width) - 1 for h, w in image_sizes]


def make_processor_cases():
    cases = []
    generator = np.random.default_rng(0)
    for name, (settings, patch_size) in PROCESSOR_CASES.items():
        processor = LlavaNextImageProcessorPil(**settings)
        out = processor([photo(p) for p in PHOTOS], return_tensors="pt")
        pixel_values = out.pixel_values.numpy()
        assert pixel_values.dtype == np.float32
        flat = pixel_values.reshape(-1)
        positions = sorted(generator.choice(flat.size, 64, replace=False).tolist())
        cases.append(dict(name=name, config=json.loads(processor.to_json_string()), images=PHOTOS,
                          shape=list(pixel_values.shape), image_sizes=out.image_sizes.tolist(),
                          checksums=[checksum(image) for image in pixel_values],
                          samples=[[p, float(flat[p])] for p in positions],
                          patch_size=patch_size,
                          num_image_tokens=token_counts(processor, patch_size, pixel_values, out.image_sizes.tolist())))
        print(name, pixel_values.shape, out.image_sizes.tolist(), cases[-1]["num_image_tokens"])
    with open(os.path.join(OUT, "image_processor.json"), "w") as file:
        json.dump(dict(cases=cases), file, indent=1)


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
                parameter.copy_((0.5 if "language_model" in name or "lm_head" in name or "newline" in name else 0.2) * noise)


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


def request_record(model, processor, images, prompt, image_token):
    inputs = processor(images=[photo(p) for p in images], text=prompt, return_tensors="pt")
    ids = inputs.input_ids[0].tolist()
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=inputs.pixel_values,
                                                  image_sizes=inputs.image_sizes).pooler_output
        logits = model(**inputs).logits[0]
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    image_positions = [i for i, token in enumerate(ids) if token == image_token]
    positions = sorted({image_positions[0], image_positions[len(image_positions) // 2], image_positions[-1], len(ids) - 1})
    new = out.sequences[0, len(ids):].tolist()
    margin = min((top[:, 0] - top[:, 1]).min().item() for top in (step.topk(2, dim=-1).values for step in out.logits))
    return dict(images=images, prompt=prompt, input_ids=ids, image_sizes=inputs.image_sizes.tolist(),
                pixel_shape=list(inputs.pixel_values.shape),
                num_image_tokens=[feature.shape[0] for feature in features],
                image_features=[feature.tolist() for feature in features],
                logits_positions=positions, logits=logits[positions].tolist(),
                greedy=dict(ids=new, text=processor.decode(new, skip_special_tokens=True).strip(), min_margin=margin))


def build(name, case):
    directory = os.path.join(OUT, name)
    shutil.rmtree(directory, ignore_errors=True)
    tok = tokenizer()
    image_processor = LlavaNextImageProcessorPil(**TINY_PROCESSOR)
    processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=VISION["patch_size"],
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1)
    text = dict(case["text"], vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = LlavaNextConfig(vision_config=VISION, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                             projector_hidden_act=case["act"], vision_feature_layer=case["vision_feature_layer"],
                             vision_feature_select_strategy="default", multimodal_projector_bias=case["bias"],
                             image_grid_pinpoints=TINY_PINPOINTS, tie_word_embeddings=case["tie"])
    torch.manual_seed(case["seed"])
    model = LlavaNextForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(case["seed"]))
    model.to(case["dtype"]).save_pretrained(directory)
    processor.save_pretrained(directory)
    compact_json(os.path.join(directory, "tokenizer.json"))
    model = LlavaNextForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = LlavaNextProcessor.from_pretrained(directory)
    tied = model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert tied == case["tie"], f"{name}: lm_head tied {tied}"

    requests = [request_record(model, processor, images, prompt, config.image_token_index)
                for images, prompt in case["requests"]]
    margin = min(r["greedy"]["min_margin"] for r in requests)
    assert margin > 1e-3, f"{name}: near-tie ({margin}), pick another seed"

    if case["published_layout"]:
        path = os.path.join(directory, "model.safetensors")
        save_file({published_layout(k): v for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
        reloaded = LlavaNextForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
        images, prompt = case["requests"][0]
        inputs = processor(images=[photo(p) for p in images], text=prompt, return_tensors="pt")
        with torch.no_grad():
            assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits), f"{name}: the published layout loads differently"

    expected = dict(max_new_tokens=NEW_TOKENS, image_token_index=config.image_token_index, requests=requests)
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file, separators=(",", ":"))
    print(name, f"margin {margin:.4f}", [r["num_image_tokens"] for r in requests],
          {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


if __name__ == "__main__":
    make_photos(sys.argv[1] if len(sys.argv) > 1 else "/tmp/skimage/skimage/data/rocket.jpg")
    make_processor_cases()
    for name, case in CASES.items():
        build(name, case)
