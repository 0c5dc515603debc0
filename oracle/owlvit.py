"""OWL-ViT and OWLv2 fixtures: tiny random-init OwlViTForObjectDetection and Owlv2ForObjectDetection checkpoints
with the real CLIP tokenizer, and what transformers computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt; Owlv2ImageProcessorPil also
needs scipy, pinned there):

    python oracle/owlvit.py

Writes Tests/Fixtures/owlvit/<checkpoint>/: a checkpoint directory SwiftVLM loads as is (tokenizer.json is a link to
Tests/Fixtures/tokenizers/clip/tokenizer.json; tokenizer_config.json says model_max_length 16 as the OWL-ViT
checkpoints do), plus expected.safetensors and expected.json:
- OwlViTProcessor / Owlv2Processor(text=labels, images=photo) with the PIL image processor: token ids and attention masks (padded to
  max_length 16), each photo's pixel values;
- the model's logits, pred_boxes and the normalized text embeddings for each photo;
- what the `zero-shot-object-detection` pipeline returns for each photo, at threshold LOW (so that many boxes pass)
  and at its default threshold, with the unrounded boxes (scaled, before `.int()`) beside them, so a test can tell a
  box coordinate that float rounding may move across an integer;
- image-guided detection: `image_guided_detection` of a query photo in a target photo, its logits and
  target_pred_boxes, and post_process_image_guided_detection (threshold GUIDED_THRESHOLD, nms 0.3) in the target's
  pixels.

The photos are those of the CLIPSeg fixtures (Tests/Fixtures/clipseg/photos: a portrait JPEG with EXIF orientation 6,
a small PNG) and Tests/Fixtures/photos/chelsea.png (landscape). Biases and norm weights, which init leaves at 0 and 1,
are drawn at random so that every parameter is a tested number; the box and class heads are scaled so that their
sigmoids do not saturate.
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import (Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessorPil, Owlv2Processor, OwlViTConfig,
                          OwlViTForObjectDetection, OwlViTImageProcessorPil, OwlViTProcessor, pipeline)
from transformers.image_utils import load_image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "owlvit")
TOKENIZER = os.path.join(FIXTURES, "tokenizers", "clip")

LABELS = ["cat", "a cup of coffee", "the rocket", "Ünïcödé 猫 🚀"]
PHOTOS = {
    "landscape": os.path.join(FIXTURES, "photos", "chelsea.png"),
    "portrait": os.path.join(FIXTURES, "clipseg", "photos", "coffee-portrait-exif6.jpg"),
    "small": os.path.join(FIXTURES, "clipseg", "photos", "rocket-small.png"),
}
GUIDED = {"target": "landscape", "query": "small"}
LOW = 0.02
GUIDED_THRESHOLD = 0.0

# The class head compares its patch embeddings (text hidden_size wide) with projected texts: projection_dim must be
# the text hidden_size, as in every published checkpoint. Text towers of width 4 keep the 49408-token vocabulary small.
CHECKPOINTS = {
    # Patch 16 on a 64-pixel image (a 4x4 grid), fp16, the processor in its current form (size as a dict, no crop).
    "tiny-patch16-fp16": dict(
        dtype=torch.float16,
        text=dict(hidden_size=4, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2),
        vision=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
                    image_size=64),
        model=dict(projection_dim=4),
        processor=dict(size={"height": 64, "width": 64}),
    ),
    # Patch 32 on a 96-pixel image (3x3), bf16, erf GELU and eps 1e-6; the processor as the google/owlvit checkpoints
    # write it (an int size read as a square, a centre crop, the legacy feature extractor name): 112 then cropped to 96.
    "tiny-patch32-bf16": dict(
        dtype=torch.bfloat16,
        text=dict(hidden_size=4, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2, hidden_act="gelu",
                  layer_norm_eps=1e-6),
        vision=dict(hidden_size=16, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, patch_size=32,
                    image_size=96, hidden_act="gelu", layer_norm_eps=1e-6),
        model=dict(projection_dim=4),
        processor=dict(size=112, crop_size=96, do_center_crop=True),
        legacy_processor=True,
    ),
    # OWLv2: the objectness head; the processor pads each photo to a square (bottom and right) and resizes it with
    # scipy (Gaussian anti-aliasing when shrinking, linear zoom). Patch 16 on 64 pixels in fp16 (the photos shrink),
    # patch 32 on 96 pixels in bf16 with a size given as an int.
    "v2-patch16-fp16": dict(
        generation=2, dtype=torch.float16,
        text=dict(hidden_size=4, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2),
        vision=dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
                    image_size=64),
        model=dict(projection_dim=4),
        processor=dict(size={"height": 64, "width": 64}),
    ),
    "v2-patch32-bf16": dict(
        generation=2, dtype=torch.bfloat16,
        text=dict(hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1, hidden_act="gelu",
                  layer_norm_eps=1e-6),
        vision=dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, patch_size=32,
                    image_size=96, hidden_act="gelu", layer_norm_eps=1e-6),
        model=dict(projection_dim=4),
        processor=dict(size={"height": 96, "width": 96}),
        int_size=96,
    ),
}

CLASSES = {
    1: (OwlViTConfig, OwlViTForObjectDetection, OwlViTImageProcessorPil, OwlViTProcessor),
    2: (Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessorPil, Owlv2Processor),
}


def write_tokenizer(out):
    os.symlink(os.path.relpath(os.path.join(TOKENIZER, "tokenizer.json"), out), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(TOKENIZER, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["model_max_length"] = 16
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=1, sort_keys=True)


def write_processor(out, spec, image_processor_class):
    image_processor_class(**spec["processor"]).save_pretrained(out)
    path = os.path.join(out, "preprocessor_config.json")
    with open(path) as f:
        config = json.load(f)
    if "int_size" in spec:
        config["size"] = spec["int_size"]
        with open(path, "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
    if not spec.get("legacy_processor"):
        return
    config.pop("image_processor_type", None)
    config["feature_extractor_type"] = "OwlViTFeatureExtractor"
    config["size"] = spec["processor"]["size"]
    config["crop_size"] = spec["processor"]["crop_size"]
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def pipeline_results(detector, photo, threshold):
    """The pipeline's results, and the same boxes before `.int()` (the pipeline's own arithmetic, redone)."""
    results = detector(photo, candidate_labels=LABELS, threshold=threshold)
    return [{"label": r["label"], "score": r["score"], "box": r["box"]} for r in results]


def unrounded_boxes(model, processor, photo, threshold):
    """Each (label, score, unrounded box) as post_process_object_detection gives them, one label at a time as the
    pipeline runs them, sorted as the pipeline sorts them."""
    found = []
    for label in LABELS:
        text = processor.tokenizer(label, return_tensors="pt")
        pixels = processor.image_processor(photo, return_tensors="pt")
        with torch.inference_mode():
            outputs = model(**text, **pixels)
        result = processor.image_processor.post_process_object_detection(
            outputs, threshold=threshold, target_sizes=torch.tensor([[photo.height, photo.width]], dtype=torch.int32))[0]
        for index in result["scores"].nonzero():
            found.append({"label": label, "score": result["scores"][index].item(),
                          "box": result["boxes"][index][0].tolist()})
    return sorted(found, key=lambda r: r["score"], reverse=True)


def build(name, spec):
    out = os.path.join(OUT, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    config_class, model_class, image_processor_class, processor_class = CLASSES[spec.get("generation", 1)]
    config = config_class(text_config=spec["text"], vision_config=spec["vision"], **spec["model"])
    torch.manual_seed(len(name))
    model = model_class(config).eval()
    with torch.no_grad():  # init leaves biases at 0 and norm weights at 1: make every parameter a tested number
        for parameter in model.parameters():
            if torch.all(parameter == 0):
                parameter.normal_(0, 0.1)
            elif torch.all(parameter == 1):
                parameter.normal_(1, 0.1)
        # Init's unit-variance heads saturate every sigmoid (boxes of no width, scores of exactly 1.0 whose order is
        # a tie): scale them so boxes have sizes and scores spread around the default threshold.
        width = spec["vision"]["hidden_size"]
        for layer, gain in [(model.box_head.dense0, 1.0), (model.box_head.dense1, 1.0), (model.box_head.dense2, 0.5),
                            (model.class_head.logit_shift, 0.3), (model.class_head.logit_scale, 0.3)]:
            layer.weight.normal_(0, gain / width ** 0.5)
        model.class_head.logit_shift.bias.fill_(-1.5)
        if hasattr(model, "objectness_head"):
            for layer, gain in [(model.objectness_head.dense0, 1.0), (model.objectness_head.dense1, 1.0),
                                (model.objectness_head.dense2, 1.0)]:
                layer.weight.normal_(0, gain / width ** 0.5)
    model.to(spec["dtype"]).save_pretrained(out)
    write_processor(out, spec, image_processor_class)
    write_tokenizer(out)

    # Reload exactly what was written, in fp32: the oracle's numbers are those of the stored weights and files.
    model = model_class.from_pretrained(out, dtype=torch.float32).eval()
    assert model.config.text_config.hidden_size == spec["text"]["hidden_size"]
    assert model.config.vision_config.patch_size == spec["vision"]["patch_size"]
    processor = processor_class.from_pretrained(out)
    assert isinstance(processor.image_processor, image_processor_class), type(processor.image_processor)
    detector = pipeline("zero-shot-object-detection", model=model, tokenizer=processor.tokenizer,
                        image_processor=processor.image_processor)

    tensors, photos = {}, {}
    text = None
    for key, path in PHOTOS.items():
        photo = load_image(path)
        inputs = processor(text=LABELS, images=photo, return_tensors="pt")
        with torch.inference_mode():
            outputs = model(**inputs)
        text = text or {"input_ids": inputs.input_ids.tolist(), "attention_mask": inputs.attention_mask.tolist()}
        tensors["text_embeds"] = outputs.text_embeds[0].contiguous()
        tensors[f"{key}.pixel_values"] = inputs.pixel_values.contiguous()
        tensors[f"{key}.logits"] = outputs.logits.contiguous()
        tensors[f"{key}.pred_boxes"] = outputs.pred_boxes.contiguous()
        if getattr(outputs, "objectness_logits", None) is not None:
            tensors[f"{key}.objectness_logits"] = outputs.objectness_logits.contiguous()
        low = pipeline_results(detector, photo, LOW)
        low_unrounded = unrounded_boxes(model, processor, photo, LOW)
        assert [r["box"] for r in low] == [{k: int(v) for k, v in zip(["xmin", "ymin", "xmax", "ymax"], torch.tensor(u["box"]).int().tolist())} for u in low_unrounded]
        photos[key] = {
            "file": os.path.relpath(path, FIXTURES),
            "width": photo.width,
            "height": photo.height,
            "low": low,
            "low_unrounded": [u["box"] for u in low_unrounded],
            "default": pipeline_results(detector, photo, 0.1),
        }

    target, query = load_image(PHOTOS[GUIDED["target"]]), load_image(PHOTOS[GUIDED["query"]])
    inputs = processor(images=target, query_images=query, return_tensors="pt")
    with torch.inference_mode():
        outputs = model.image_guided_detection(**inputs)
    tensors["guided.query_pixel_values"] = inputs.query_pixel_values.contiguous()
    tensors["guided.logits"] = outputs.logits.contiguous()
    tensors["guided.target_pred_boxes"] = outputs.target_pred_boxes.contiguous()
    tensors["guided.query_pred_boxes"] = outputs.query_pred_boxes.contiguous()
    guided = processor.image_processor.post_process_image_guided_detection(
        outputs, threshold=GUIDED_THRESHOLD, nms_threshold=0.3,
        target_sizes=torch.tensor([[target.height, target.width]]))[0]

    save_file(tensors, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({
            "labels": LABELS,
            **text,
            "photos": photos,
            "low_threshold": LOW,
            "guided": {
                **GUIDED,
                "threshold": GUIDED_THRESHOLD,
                "scores": guided["scores"].tolist(),
                "boxes": guided["boxes"].tolist(),
            },
        }, f, ensure_ascii=False, indent=1)
    print(name, {k: (len(v["low"]), len(v["default"])) for k, v in photos.items()},
          "logit range", float(tensors["landscape.logits"].min()), float(tensors["landscape.logits"].max()),
          "guided", len(guided["scores"]))


def main():
    for name, spec in CHECKPOINTS.items():
        build(name, spec)


if __name__ == "__main__":
    main()
