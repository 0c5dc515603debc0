"""What bf16 and int8 matrix products cost in fidelity, on the repo's photos: `vlm embed` and `vlm classify` at each
--dtype against transformers in fp32 on the same checkpoint (the cosine of each photo's image embedding, and each
photo's top zero-shot label).

    python scripts/make_clip_checkpoint.py       # once: models/clip-vit-base-patch32-random
    swift build -c release --product vlm
    python scripts/precision_check.py [--model DIR] [--labels cat,coffee,...] [--vlm .build/release/vlm]

The checkpoint has random weights (no real CLIP weights can be had here), so its labels say nothing about accuracy
in the usual sense; what the table shows is how often lower precision changes fp32's answer, and by how much it
moves the embeddings.
"""
import argparse
import glob
import json
import os
import subprocess

import numpy as np
import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = "This is a photo of {}."


def vlm_json(binary, *arguments):
    done = subprocess.run([binary, *arguments, "--json"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "clip-vit-base-patch32-random"))
    parser.add_argument("--labels", default="cat,coffee,rocket,camera man,astronaut,dog,car,tree")
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    args = parser.parse_args()
    photos = sorted(glob.glob(os.path.join(ROOT, "Tests", "Fixtures", "photos", "*")))
    labels = [label.strip() for label in args.labels.split(",")]

    model = CLIPModel.from_pretrained(args.model, dtype=torch.float32).eval()
    processor = CLIPImageProcessorPil.from_pretrained(args.model)
    tokenizer = CLIPTokenizer.from_pretrained(args.model)
    images = [Image.open(photo).convert("RGB") for photo in photos]
    with torch.inference_mode():
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        reference = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
        texts = tokenizer([TEMPLATE.format(label) for label in labels], padding=True, return_tensors="pt")
        logits = model(pixel_values=pixels, **texts).logits_per_image
    probabilities = logits.softmax(dim=1)
    fp32_top = [labels[i] for i in probabilities.argmax(dim=1).tolist()]
    # How far the top label leads the next: a near-tie is flipped by any rounding.
    margins = [float(top[0] - top[1]) for top in probabilities.topk(2, dim=1).values]

    columns = {}
    for dtype in ["fp32", "bf16", "int8"]:
        embeddings = np.array(vlm_json(args.vlm, "embed", "--model", args.model, "--dtype", dtype,
                                       "--image", *photos)["embeddings"])
        cosines = np.sum(embeddings * reference, axis=1) / (
            np.linalg.norm(embeddings, axis=1) * np.linalg.norm(reference, axis=1))
        ranked = vlm_json(args.vlm, "classify", "--model", args.model, "--dtype", dtype, "--labels", ",".join(labels),
                          "--template", TEMPLATE, *photos)
        columns[dtype] = [(result["scores"][0]["label"], result["scores"][0]["score"], cosine)
                          for result, cosine in zip(ranked, cosines)]

    print(f"{os.path.basename(args.model)}, {len(labels)} labels ({', '.join(labels)}); per photo the top label and "
          "its score, and the image embedding's cosine to transformers fp32\n")
    print("| photo | transformers fp32 (lead over the next label) | " + " | ".join(f"SwiftVLM {dtype}" for dtype in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for index, photo in enumerate(photos):
        cells = [f"{label}{'' if label == fp32_top[index] else ' (differs)'} {score:.4f}, cos {cosine:.6f}"
                 for label, score, cosine in (columns[dtype][index] for dtype in columns)]
        print(f"| {os.path.basename(photo)} | {fp32_top[index]} ({margins[index]:.4f}) | " + " | ".join(cells) + " |")
    agreements = {dtype: sum(label == top for (label, _, _), top in zip(column, fp32_top)) for dtype, column in columns.items()}
    print("\ntop label as transformers fp32: " + ", ".join(f"{dtype} {count}/{len(photos)}"
                                                           for dtype, count in agreements.items()))


if __name__ == "__main__":
    main()
