"""ViLT fixtures: tiny random-init ViltForQuestionAnswering checkpoints with their ViltProcessor, and what transformers
computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/vilt.py    # → Tests/Fixtures/vilt/<case>/

Each case is a checkpoint SwiftVLM loads as is: config.json (with id2label), model.safetensors (fp16 weights;
transformers computes in fp32 from the same rounded values), processor_config.json (ViltImageProcessor at a small
shortest edge) and the real BERT uncased tokenizer (a link to Tests/Fixtures/tokenizers/real/bert-uncased), plus
expected.json and pixel values as raw little-endian float32 files:

- "images": per photo (chelsea.png landscape, camera.png square greyscale, and coffee.png transposed into a portrait,
  as EXIF orientation 5 shows it), the shape of the Pil processor's `pixel_values` [1, 3, H, W] (H and W multiples of
  size_divisor; the position embeddings are interpolated to the patch grid) and the file holding them;
- "batch": chelsea and the portrait processed together: `pixel_values` padded to the larger size (a file) and
  `pixel_mask`;
- "questions": per question, the tokenizer's `input_ids`, and per photo the answer logits and the top-5 answers
  (`logits.sigmoid().topk(5)`, labels from id2label), as the visual-question-answering pipeline of transformers 4
  returned them (5.23 removed the pipeline; its computation is this); the batch's logits too.

ViLT samples which image patches its encoder reads (`torch.multinomial`), but with all valid patches kept (no
max_image_length) the order is the only randomness, and the pooled answer does not depend on it.

Cases:
- "b16-gelu": patch 16, image_size 64 (a 4×4 grid of position embeddings), qkv biases, 6 answers.
- "b32-noqkvbias": patch 32, image_size 96 (3×3), no qkv biases, 3 layers, 9 answers.
"""
import json
import os
import shutil

import torch
from PIL import Image
from transformers import AutoTokenizer, ViltConfig, ViltForQuestionAnswering, ViltImageProcessorPil, ViltProcessor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "vilt")
PHOTOS = os.path.join(ROOT, "Tests", "Fixtures", "photos")
BERT = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "bert-uncased")

ANSWERS = ["yes", "no", "2", "1", "cat", "red", "blue", "coffee", "camera"]
QUESTIONS = ["How many cats are there?", "What colour is the cup?"]

CASES = {
    "b16-gelu": dict(seed=7, config=dict(hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                                         image_size=64, patch_size=16, qkv_bias=True), answers=6, shortest_edge=64),
    "b32-noqkvbias": dict(seed=11, config=dict(hidden_size=12, intermediate_size=36, num_hidden_layers=3,
                                               num_attention_heads=2, image_size=96, patch_size=32, qkv_bias=False),
                          answers=9, shortest_edge=64),
}


def photos():
    coffee = Image.open(os.path.join(PHOTOS, "coffee.png")).convert("RGB").transpose(Image.Transpose.TRANSPOSE)
    return {"chelsea.png": Image.open(os.path.join(PHOTOS, "chelsea.png")).convert("RGB"),
            "camera.png": Image.open(os.path.join(PHOTOS, "camera.png")).convert("RGB"),
            "coffee.png transposed": coffee}


def randomize(model, generator):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if ("norm" in name.lower() or "LayerNorm" in name) and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(0.3 * noise)


def write_pixels(directory, name, pixel_values):
    file = "pixels-" + name.replace(" ", "-").replace(".png", "") + ".f32"
    pixel_values.numpy().astype("<f4").tofile(os.path.join(directory, file))
    return file


def build(name, case):
    directory = os.path.join(FIXTURES, name)
    shutil.rmtree(directory, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(BERT)
    labels = ANSWERS[:case["answers"]]
    config = ViltConfig(vocab_size=len(tokenizer), **case["config"], id2label=dict(enumerate(labels)),
                        label2id={label: i for i, label in enumerate(labels)})
    torch.manual_seed(case["seed"])
    model = ViltForQuestionAnswering(config).eval()
    randomize(model, torch.Generator().manual_seed(case["seed"]))
    model.to(torch.float16).save_pretrained(directory)
    image_processor = ViltImageProcessorPil(size={"shortest_edge": case["shortest_edge"]})
    ViltProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(directory)
    tokenizer_file = os.path.join(directory, "tokenizer.json")
    os.remove(tokenizer_file)
    os.symlink(os.path.relpath(os.path.join(BERT, "tokenizer.json"), directory), tokenizer_file)
    model = ViltForQuestionAnswering.from_pretrained(directory, dtype=torch.float32).eval()
    processor = ViltProcessor.from_pretrained(directory)

    images = photos()
    expected = dict(labels=labels, images={}, questions=[])
    for photo, image in images.items():
        pixels = processor.image_processor(image, return_tensors="pt")
        assert bool(pixels.pixel_mask.all()), "one image alone is never padded"
        expected["images"][photo] = dict(shape=list(pixels.pixel_values.shape), file=write_pixels(directory, photo, pixels.pixel_values))
    batch_images = [images["chelsea.png"], images["coffee.png transposed"]]
    batch = processor.image_processor(batch_images, return_tensors="pt")
    expected["batch"] = dict(photos=["chelsea.png", "coffee.png transposed"], shape=list(batch.pixel_values.shape),
                             file=write_pixels(directory, "batch", batch.pixel_values), pixel_mask=batch.pixel_mask.tolist())
    for question in QUESTIONS:
        record = dict(question=question, answers={})
        for photo, image in images.items():
            inputs = processor(images=image, text=question, return_tensors="pt")
            record["input_ids"] = inputs.input_ids[0].tolist()
            with torch.no_grad():
                logits = model(**inputs).logits[0]
            top = logits.sigmoid().topk(5)
            record["answers"][photo] = dict(logits=logits.tolist(), top=[dict(answer=labels[i], score=s)
                                                                      for s, i in zip(top.values.tolist(), top.indices.tolist())])
        inputs = processor(images=batch_images, text=[question, question], return_tensors="pt")
        with torch.no_grad():
            record["batch_logits"] = model(**inputs).logits.tolist()
        expected["questions"].append(record)

    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file)
    print(name, {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))},
          {p: v["shape"] for p, v in expected["images"].items()})


if __name__ == "__main__":
    for name, case in CASES.items():
        build(name, case)
