"""CLIPSeg checkpoints as zero-shot image classifiers: transformers maps `clipseg` to `CLIPSegModel` (CLIP with its
position embeddings interpolated to the processor's size) for the zero-shot-image-classification pipeline and for
`get_image_features` / `get_text_features`.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/clipseg.py has
written its checkpoints:

    python oracle/clipseg_zero_shot.py    # → Tests/Fixtures/clipseg/<checkpoint>/zero_shot.json

For each checkpoint: the pipeline's scores for three photos and three labels (its default template), the projected
image embeddings of the photos, the projected text embeddings of three texts padded to the longest, and
`logits_per_image` of the photos against the templated labels.
"""
import json
import os

import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForZeroShotImageClassification, AutoTokenizer, pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
CHECKPOINTS = ["tiny-fp16", "tiny-refined-bf16"]
PHOTOS = ["chelsea.png", "coffee.png", "rocket.jpg"]
LABELS = ["cat", "coffee", "rocket"]
TEMPLATE = "This is a photo of {}."
TEXTS = ["a cat", "a cup of coffee on a table", "a rocket"]


def case(name):
    directory = os.path.join(FIXTURES, "clipseg", name)
    model = AutoModelForZeroShotImageClassification.from_pretrained(directory, dtype=torch.float32).eval()
    assert type(model).__name__ == "CLIPSegModel"
    processor = AutoImageProcessor.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    images = [Image.open(os.path.join(FIXTURES, "photos", p)).convert("RGB") for p in PHOTOS]
    pixels = processor(images=images, return_tensors="pt").pixel_values
    with torch.no_grad():
        image_embeds = model.get_image_features(pixel_values=pixels).pooler_output
        text_embeds = model.get_text_features(**tokenizer(TEXTS, padding=True, return_tensors="pt")).pooler_output
        prompts = tokenizer([TEMPLATE.format(label) for label in LABELS], padding=True, return_tensors="pt")
        logits = model(pixel_values=pixels, **prompts).logits_per_image
    classifier = pipeline("zero-shot-image-classification", model=directory, dtype=torch.float32)
    scores = [classifier(os.path.join(FIXTURES, "photos", p), candidate_labels=LABELS) for p in PHOTOS]
    print(name, scores[0])
    return dict(photos=PHOTOS, labels=LABELS, template=TEMPLATE, texts=TEXTS, zero_shot=scores,
                image_embeds=image_embeds.tolist(), text_embeds=text_embeds.tolist(), logits_per_image=logits.tolist())


def main():
    for name in CHECKPOINTS:
        with open(os.path.join(FIXTURES, "clipseg", name, "zero_shot.json"), "w") as f:
            json.dump(case(name), f)


if __name__ == "__main__":
    main()
