"""CLIPSeg fixtures: tiny random-init CLIPSegForImageSegmentation checkpoints with the real CLIP tokenizer, and what
transformers computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/clipseg.py

Writes Tests/Fixtures/clipseg/photos/ (a portrait JPEG whose EXIF orientation turns stored landscape pixels upright,
and a small photo, both derived from Tests/Fixtures/photos/) and Tests/Fixtures/clipseg/<checkpoint>/: a checkpoint
directory SwiftVLM loads as is (tokenizer.json is a link to Tests/Fixtures/tokenizers/clip/tokenizer.json), plus
expected.safetensors and expected.json:
- the processor's outputs, as CLIPSegProcessor(text=labels, images=[photo] * len(labels), padding="max_length") with
  the PIL image processor makes them: token ids and attention masks, pixel values of each photo;
- text conditional embeddings (get_text_features), and the logits of each photo under every label;
- an image prompt (conditional_pixel_values from another photo): its embedding and the query's logits;
- logits at the vision tower's own image_size, where no position interpolation happens;
- what `vlm segment` reports: sigmoid(logits) resized to each photo by F.interpolate(mode="bilinear",
  align_corners=False), sampled every SAMPLE pixels, the fraction of the photo's pixels above 0.5 (coverage) and how
  many sit within AMBIGUOUS of it (whose side of 0.5 float rounding may change).

Random init still gives clear regions: the decoder's layer norms leave unit-scale features and the convolutions keep
PyTorch's default init, so the logits span tens of units (the refined decoder's three layers would reach hundreds:
they are scaled down to a trained model's range, where fp32's cancellation in logits near zero stays far below the
tests' 1e-4; the oracle checks fp32 against float64). Biases and norm weights, which init leaves at 0 and 1, are drawn at random so
that every parameter is a tested number.
"""
import json
import os
import shutil

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file
from transformers import AutoTokenizer, CLIPSegConfig, CLIPSegForImageSegmentation, CLIPSegProcessor, ViTImageProcessorPil
from transformers.image_utils import load_image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "clipseg")
TOKENIZER = os.path.join(FIXTURES, "tokenizers", "clip")

LABELS = ["cat", "a cup of coffee", "the rocket", "Ünïcödé 猫 🚀"]
PHOTOS = {
    "landscape": os.path.join(FIXTURES, "photos", "chelsea.png"),
    "portrait": os.path.join(OUT, "photos", "coffee-portrait-exif6.jpg"),
    "small": os.path.join(OUT, "photos", "rocket-small.png"),
}
PROMPT_PHOTO = os.path.join(FIXTURES, "photos", "camera.png")  # greyscale: converted to RGB like any prompt
PROMPT_QUERY = "landscape"
SAMPLE = 7
AMBIGUOUS = 1e-5
CIDAS_MEAN, CIDAS_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# Two shapes that differ in everything the Swift model reads from config.json.
CHECKPOINTS = {
    # One transposed convolution of kernel patch_size; FiLM before the first decoder layer; fp16 on disk; the
    # position grid 4x4 interpolated to the processor's 6x6.
    "tiny-fp16": dict(
        dtype=torch.float16, legacy_config=False, pad_token="<|endoftext|>",
        text=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, hidden_act="quick_gelu"),
        vision=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=4, num_attention_heads=2, patch_size=8,
                    image_size=32, hidden_act="quick_gelu"),
        model=dict(projection_dim=12, extract_layers=[1, 2, 3], reduce_dim=16, decoder_num_attention_heads=2,
                   decoder_intermediate_size=32, conditional_layer=0, use_complex_transposed_convolution=False),
        processor=dict(size={"height": 48, "width": 48}, image_mean=CIDAS_MEAN, image_std=CIDAS_STD),
    ),
    # The refined decoder (3x3 convolution, two transposed convolutions of kernel patch_size / 4); FiLM before the
    # second decoder layer; erf GELU and eps 1e-6; bf16; the 2022 config layout whose text_config_dict and
    # vision_config_dict replace stale text_config and vision_config; "!" as the pad token; a 3x3 grid made 4x4.
    "tiny-refined-bf16": dict(
        dtype=torch.bfloat16, legacy_config=True, pad_token="!",
        text=dict(hidden_size=8, intermediate_size=24, num_hidden_layers=1, num_attention_heads=4, hidden_act="gelu",
                  layer_norm_eps=1e-6),
        vision=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, patch_size=16,
                    image_size=48, hidden_act="gelu", layer_norm_eps=1e-6),
        model=dict(projection_dim=16, extract_layers=[0, 2], reduce_dim=16, decoder_num_attention_heads=2,
                   decoder_intermediate_size=24, conditional_layer=1, use_complex_transposed_convolution=True),
        processor=dict(size={"height": 64, "width": 64}),
        upsampling_gain=0.3,
    ),
}


def make_photos():
    """A portrait stored sideways with EXIF orientation 6, and a photo smaller than any model input."""
    os.makedirs(os.path.join(OUT, "photos"), exist_ok=True)
    coffee = Image.open(os.path.join(FIXTURES, "photos", "coffee.png")).convert("RGB")
    portrait = coffee.crop((170, 0, 437, 400)).resize((180, 270), Image.LANCZOS)
    # Stored a quarter turn anticlockwise; orientation 6 asks viewers to turn it a quarter clockwise, upright again.
    exif = Image.Exif()
    exif[0x0112] = 6
    portrait.transpose(Image.Transpose.ROTATE_90).save(PHOTOS["portrait"], quality=90, exif=exif.tobytes())
    rocket = Image.open(os.path.join(FIXTURES, "photos", "rocket.jpg")).convert("RGB").resize((40, 27), Image.LANCZOS)
    rocket.save(PHOTOS["small"], optimize=True)


def write_config(out, spec):
    if not spec["legacy_config"]:
        return
    path = os.path.join(out, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["text_config_dict"] = config.pop("text_config")
    config["vision_config_dict"] = config.pop("vision_config")
    config["text_config"] = {"hidden_size": 99, "num_attention_heads": 3, "num_hidden_layers": 5}
    config["vision_config"] = {"hidden_size": 30, "num_attention_heads": 5, "patch_size": 4, "image_size": 40}
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def write_tokenizer(out, spec):
    os.symlink(os.path.relpath(os.path.join(TOKENIZER, "tokenizer.json"), out), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(TOKENIZER, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["pad_token"] = spec["pad_token"]
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=1, sort_keys=True)


def check_conditioning(model, inputs, logits):
    """A fixture is a fair test at 1e-4 only where fp32 itself is far closer than that to exact: float64 says."""
    exact = model.to(torch.float64)
    with torch.inference_mode():
        reference = exact(**{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}).logits
    model.to(torch.float32)
    error = float(((logits.double() - reference).abs() / reference.abs().clamp(min=1)).max())
    assert error < 2e-5, f"fp32 logits are {error} from float64: the checkpoint is too ill-conditioned to test at 1e-4"


def build(name, spec):
    out = os.path.join(OUT, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    config = CLIPSegConfig(text_config=spec["text"], vision_config=spec["vision"], **spec["model"])
    torch.manual_seed(len(name))
    model = CLIPSegForImageSegmentation(config).eval()
    with torch.no_grad():  # init leaves biases at 0 and norm weights at 1: make every parameter a tested number
        for parameter in model.parameters():
            if torch.all(parameter == 0):
                parameter.normal_(0, 0.1)
            elif torch.all(parameter == 1):
                parameter.normal_(1, 0.1)
        for layer in model.decoder.transposed_convolution.modules():
            if isinstance(layer, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
                layer.weight.mul_(spec.get("upsampling_gain", 1.0))
                layer.bias.mul_(spec.get("upsampling_gain", 1.0))
    model.to(spec["dtype"]).save_pretrained(out)
    write_config(out, spec)
    ViTImageProcessorPil(**spec["processor"]).save_pretrained(out)
    write_tokenizer(out, spec)

    # Reload exactly what was written, in fp32: the oracle's numbers are those of the stored weights and files.
    model = CLIPSegForImageSegmentation.from_pretrained(out, dtype=torch.float32).eval()
    assert model.config.text_config.hidden_size == spec["text"]["hidden_size"]
    assert model.config.vision_config.patch_size == spec["vision"]["patch_size"]
    processor = CLIPSegProcessor(image_processor=ViTImageProcessorPil.from_pretrained(out),
                                 tokenizer=AutoTokenizer.from_pretrained(out))

    tensors, photos = {}, {}
    text = None
    for key, path in PHOTOS.items():
        photo = load_image(path)
        inputs = processor(text=LABELS, images=[photo] * len(LABELS), padding="max_length", return_tensors="pt")
        assert torch.equal(inputs.pixel_values[0], inputs.pixel_values[-1])
        with torch.inference_mode():
            outputs = model(**inputs)
        text = text or {"input_ids": inputs.input_ids.tolist(), "attention_mask": inputs.attention_mask.tolist()}
        tensors["conditional_embeddings"] = outputs.conditional_embeddings.contiguous()
        tensors[f"{key}.pixel_values"] = inputs.pixel_values[:1].contiguous()
        tensors[f"{key}.logits"] = outputs.logits.contiguous()
        check_conditioning(model, inputs, outputs.logits)
        probabilities = F.interpolate(torch.sigmoid(outputs.logits)[:, None], size=(photo.height, photo.width),
                                      mode="bilinear", align_corners=False)[:, 0]
        tensors[f"{key}.probabilities_sampled"] = probabilities[:, ::SAMPLE, ::SAMPLE].contiguous()
        photos[key] = {
            "file": os.path.relpath(path, FIXTURES),
            "width": photo.width,
            "height": photo.height,
            "coverage": [float((p > 0.5).sum()) / p.numel() for p in probabilities],
            "ambiguous_pixels": [int(((p - 0.5).abs() < AMBIGUOUS).sum()) for p in probabilities],
        }

    prompt = load_image(PROMPT_PHOTO)
    query = load_image(PHOTOS[PROMPT_QUERY])
    inputs = processor(images=[query], visual_prompt=[prompt], return_tensors="pt")
    with torch.inference_mode():
        outputs = model(**inputs)
    tensors["prompt.conditional_pixel_values"] = inputs["conditional_pixel_values"].contiguous()
    tensors["prompt.conditional_embeddings"] = outputs.conditional_embeddings.contiguous()
    tensors["prompt.logits"] = outputs.logits.contiguous()

    side = spec["vision"]["image_size"]
    native = processor(images=[query], size={"height": side, "width": side}, return_tensors="pt").pixel_values
    with torch.inference_mode():
        outputs = model(pixel_values=native, conditional_embeddings=tensors["conditional_embeddings"][:1])
    tensors["native.pixel_values"] = native.contiguous()
    tensors["native.logits"] = outputs.logits.contiguous()

    save_file(tensors, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({
            "labels": LABELS,
            **text,
            "photos": photos,
            "sample_stride": SAMPLE,
            "ambiguous_margin": AMBIGUOUS,
            "prompt": {"photo": os.path.relpath(PROMPT_PHOTO, FIXTURES), "query": PROMPT_QUERY},
            "native_size": side,
        }, f, ensure_ascii=False, indent=1)
    print(name, {k: [round(c, 3) for c in v["coverage"]] for k, v in photos.items()},
          "logit range", float(tensors["landscape.logits"].min()), float(tensors["landscape.logits"].max()))


def main():
    make_photos()
    for name, spec in CHECKPOINTS.items():
        build(name, spec)


if __name__ == "__main__":
    main()
