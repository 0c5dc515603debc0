"""GroupViT fixtures: tiny random-init GroupViTModel checkpoints with the real CLIP tokenizer, and what transformers
computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/clipseg.py (whose
portrait and small photos it reuses):

    python oracle/groupvit.py

Writes Tests/Fixtures/groupvit/<checkpoint>/: a checkpoint directory SwiftVLM loads as is (tokenizer.json is a link to
Tests/Fixtures/tokenizers/clip/tokenizer.json), plus expected.safetensors and expected.json:
- the processor's outputs, as CLIPProcessor(text=labels, images=photo, padding=True) with the PIL image processor
  makes them (the call of transformers' GroupViT docs): token ids and attention masks, each photo's pixel values;
- get_text_features and get_image_features (all photos in one batch too), and model(..., output_segmentation=True)'s
  logits_per_image, segmentation_logits and the vision tower's soft assignments (`attentions`), per photo;
- what `vlm segment` reports: softmax over the labels of segmentation_logits, resized bilinearly
  (F.interpolate(align_corners=False)) onto the part of the photo the processor's centre crop kept (`region`, in
  the photo's pixels: the crop's edges in the resized image scaled back to the photo, rounded half up), zero outside
  it; sampled every SAMPLE pixels, the fraction of the photo's pixels above 0.5 (coverage) and how many sit within
  AMBIGUOUS of it.

GroupViT's grouping is a hard assignment in eval mode (each token to its argmax group): a token whose two best groups
are nearly tied could flip under float rounding, so the oracle records the smallest top-2 margin of every soft
assignment and refuses a checkpoint where it is under MIN_MARGIN, and checks fp32 against float64. Biases, norm
weights and the projections' BatchNorm running statistics, which init leaves at 0 and 1, are drawn at random so that
every parameter is a tested number.
"""
import json
import math
import os
import shutil

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoTokenizer, CLIPImageProcessorPil, CLIPProcessor, GroupViTConfig, GroupViTModel
from transformers.image_utils import load_image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "groupvit")
TOKENIZER = os.path.join(FIXTURES, "tokenizers", "clip")

LABELS = ["a photo of a cat", "coffee", "the rocket", "Ünïcödé 猫 🚀"]
PHOTOS = {
    "landscape": os.path.join(FIXTURES, "photos", "chelsea.png"),
    "portrait": os.path.join(FIXTURES, "clipseg", "photos", "coffee-portrait-exif6.jpg"),
    "small": os.path.join(FIXTURES, "clipseg", "photos", "rocket-small.png"),
}
SAMPLE = 7
AMBIGUOUS = 1e-5
MIN_MARGIN = 1e-5
ASSIGN_GAIN = 12
BATCH_VARIANCE = 1e-3

CHECKPOINTS = {
    # Two grouping stages, the second with a group projector (8 groups mixed into 4 tokens, assigned to 2 output
    # groups); quick_gelu text, erf GELU vision; fp16 on disk; the processor's default centre crop.
    "tiny-fp16": dict(
        dtype=torch.float16, legacy_config=False, seed=3,
        text=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                  hidden_act="quick_gelu"),
        vision=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                    depths=[2, 1], num_group_tokens=[8, 4], num_output_groups=[8, 2], patch_size=4, image_size=32,
                    hidden_act="gelu"),
        model=dict(projection_dim=12, projection_intermediate_dim=24, logit_scale_init_value=2.0),
        processor=dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
    ),
    # Three stages as the published checkpoints have (the last without group tokens); quick_gelu vision, erf GELU
    # text, eps 1e-6, assign_eps 0.5 and other MLP ratios; the legacy eos_token_id 2 (argmax pooling); bf16; the
    # 2022 config layout whose *_config_dict replace stale *_config; a crop smaller than the resized image.
    "tiny-legacy-bf16": dict(
        dtype=torch.bfloat16, legacy_config=True,
        text=dict(hidden_size=4, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2, hidden_act="gelu",
                  layer_norm_eps=1e-6, eos_token_id=2),
        vision=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                    depths=[1, 1, 1], num_group_tokens=[6, 3, 0], num_output_groups=[6, 3, 3], patch_size=8,
                    image_size=48, hidden_act="quick_gelu", layer_norm_eps=1e-6, assign_eps=0.5,
                    assign_mlp_ratio=[1, 2]),
        model=dict(projection_dim=8, projection_intermediate_dim=16, logit_scale_init_value=3.2),
        processor=dict(size={"shortest_edge": 56}, crop_size={"height": 48, "width": 48}),
    ),
}


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


def write_tokenizer(out):
    os.symlink(os.path.relpath(os.path.join(TOKENIZER, "tokenizer.json"), out), os.path.join(out, "tokenizer.json"))
    shutil.copy(os.path.join(TOKENIZER, "tokenizer_config.json"), out)


def region(processor, height, width):
    """The photo's pixels the processor's centre crop shows: (top, left, height, width), maybe reaching outside."""
    scale_height = scale_width = None
    short, long = min(height, width), max(height, width)
    target = processor.size["shortest_edge"]
    resized_long = int(target * long / short)
    resized = (target, resized_long) if height <= width else (resized_long, target)
    crop = (processor.crop_size["height"], processor.crop_size["width"])
    edges = []
    for size, resized_size, crop_size in zip((height, width), resized, crop):
        start = (resized_size - crop_size) // 2 if resized_size >= crop_size else -((crop_size - resized_size + 1) // 2)
        first = math.floor(start * size / resized_size + 0.5)
        last = math.floor((start + crop_size) * size / resized_size + 0.5)
        edges.append((first, last - first))
    return edges[0][0], edges[1][0], edges[0][1], edges[1][1]


def probability_maps(logits, photo, box):
    """softmax over the labels, resized onto `box` of the photo, zero outside it: [labels, height, width]."""
    top, left, height, width = box
    resized = F.interpolate(logits.softmax(dim=1), size=(height, width), mode="bilinear", align_corners=False)[0]
    maps = torch.zeros(resized.shape[0], photo.height, photo.width)
    rows = slice(max(top, 0), min(top + height, photo.height))
    columns = slice(max(left, 0), min(left + width, photo.width))
    maps[:, rows, columns] = resized[:, rows.start - top:rows.stop - top, columns.start - left:columns.stop - left]
    return maps


def smallest_margin(attentions):
    margins = []
    for attention in attentions:
        top = attention.topk(2, dim=1).values  # over the groups, per image token
        margins.append(float((top[:, 0] - top[:, 1]).min()))
    return min(margins)


def check_conditioning(model, inputs, logits):
    exact = model.to(torch.float64)
    with torch.inference_mode():
        reference = exact(**{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()},
                          output_segmentation=True).segmentation_logits
    model.to(torch.float32)
    error = float(((logits.double() - reference).abs() / reference.abs().clamp(min=1)).max())
    assert error < 2e-5, f"fp32 logits are {error} from float64: the checkpoint is too ill-conditioned to test at 1e-4"


def build(name, spec):
    out = os.path.join(OUT, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    config = GroupViTConfig(text_config=spec["text"], vision_config=spec["vision"], **spec["model"])
    torch.manual_seed(spec.get("seed", len(name)))
    model = GroupViTModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if torch.all(parameter == 0):
                parameter.normal_(0, 0.1)
            elif torch.all(parameter == 1):
                parameter.normal_(1, 0.1)
        for projection in (model.visual_projection, model.text_projection):
            projection[1].running_mean.normal_(0, 0.1)
            projection[1].running_var.uniform_(0.5, 1.5).mul_(BATCH_VARIANCE)
        # Init leaves group tokens at zero and the assignment's query and key projections at std 0.02, so every
        # token would sit almost evenly between the groups; a trained model assigns decisively.
        for stage in model.vision_model.encoder.stages:
            if stage.group_token is not None:
                stage.group_token.normal_(0, 1)
                stage.downsample.assign.q_proj.weight.mul_(ASSIGN_GAIN)
                stage.downsample.assign.k_proj.weight.mul_(ASSIGN_GAIN)
    model.to(spec["dtype"]).save_pretrained(out)
    write_config(out, spec)
    CLIPImageProcessorPil(**spec["processor"]).save_pretrained(out)
    write_tokenizer(out)

    model = GroupViTModel.from_pretrained(out, dtype=torch.float32).eval()
    assert model.config.text_config.hidden_size == spec["text"]["hidden_size"]
    assert model.config.vision_config.depths == spec["vision"]["depths"]
    processor = CLIPProcessor(image_processor=CLIPImageProcessorPil.from_pretrained(out),
                              tokenizer=AutoTokenizer.from_pretrained(out))

    tensors, photos, margins = {}, {}, []
    text = None
    for key, path in PHOTOS.items():
        photo = load_image(path)
        inputs = processor(text=LABELS, images=photo, padding=True, return_tensors="pt")
        with torch.inference_mode():
            outputs = model(**inputs, output_segmentation=True)
        text = text or {"input_ids": inputs.input_ids.tolist(), "attention_mask": inputs.attention_mask.tolist()}
        attentions = outputs.vision_model_output.attentions
        margins.append(smallest_margin(attentions))
        assert margins[-1] > MIN_MARGIN, f"{name} {key}: a token's two best groups are {margins[-1]} apart"
        check_conditioning(model, inputs, outputs.segmentation_logits)
        tensors[f"{key}.pixel_values"] = inputs.pixel_values.contiguous()
        tensors[f"{key}.logits_per_image"] = outputs.logits_per_image.contiguous()
        tensors[f"{key}.segmentation_logits"] = outputs.segmentation_logits.contiguous()
        for stage, attention in enumerate(attentions):
            tensors[f"{key}.attentions.{stage}"] = attention.contiguous()
        box = region(processor.image_processor, photo.height, photo.width)
        probabilities = probability_maps(outputs.segmentation_logits, photo, box)
        tensors[f"{key}.probabilities_sampled"] = probabilities[:, ::SAMPLE, ::SAMPLE].contiguous()
        photos[key] = {
            "file": os.path.relpath(path, FIXTURES),
            "width": photo.width,
            "height": photo.height,
            "region": dict(zip(("top", "left", "height", "width"), box)),
            "coverage": [float((p > 0.5).sum()) / p.numel() for p in probabilities],
            "ambiguous_pixels": [int(((p - 0.5).abs() < AMBIGUOUS).sum()) for p in probabilities],
        }

    with torch.inference_mode():
        tensors["text_embeds"] = model.get_text_features(
            input_ids=torch.tensor(text["input_ids"]), attention_mask=torch.tensor(text["attention_mask"])
        ).pooler_output.contiguous()
        batch = torch.cat([tensors[f"{key}.pixel_values"] for key in PHOTOS])
        tensors["image_embeds"] = model.get_image_features(pixel_values=batch).pooler_output.contiguous()

    save_file(tensors, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({
            "labels": LABELS,
            **text,
            "photos": photos,
            "photo_order": list(PHOTOS),
            "sample_stride": SAMPLE,
            "ambiguous_margin": AMBIGUOUS,
            "smallest_assignment_margin": min(margins),
        }, f, ensure_ascii=False, indent=1)
    print(name, {k: [round(c, 3) for c in v["coverage"]] for k, v in photos.items()},
          "regions", {k: v["region"] for k, v in photos.items()}, "margin", min(margins),
          "logit range", float(tensors["landscape.segmentation_logits"].min()),
          float(tensors["landscape.segmentation_logits"].max()))


def main():
    for name, spec in CHECKPOINTS.items():
        build(name, spec)


if __name__ == "__main__":
    main()
