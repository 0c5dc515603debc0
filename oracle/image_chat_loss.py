"""Image chat losses: `model(**processor(images, text), labels=labels).loss` of the LLaVA, LLaVA-NeXT,
LLaVA-OneVision and Gemma 3 fixtures (Gemma 3's with the processor's token_type_ids, so its image tokens attend to each
other), the objective of LLaVA's projector alignment (its first training stage, where only the
projector learns) and of its instruction tuning: the answer's tokens scored, the image tokens and the question not.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/llava.py,
oracle/llava_next.py, oracle/llava_onevision.py and oracle/gemma3.py have written their checkpoints:

    python oracle/image_chat_loss.py    # → Tests/Fixtures/image-chat-loss.json

For each checkpoint, its fixture's first request (a photo and a question in the family's prompt format) with an
answer appended: the ids, the labels (-100 up to the end of the question, the answer's ids after) and the loss.
"""
import json
import os
import sys

import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
CHECKPOINTS = ["llava/llama-default-fp16", "llava/qwen2-layers-full-bf16", "llava-next/llama-tied-fp16",
               "llava-next/mistral-layers-bf16", "llava-onevision/qwen2-layers-fp16", "llava-onevision/qwen2-smollm2-bf16",
               "gemma3/tiny"]
ANSWER = " A cat is lying on a blanket."
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llava_onevision  # noqa: E402  (its load_processor reads the fixtures' processor_config.json)


def case(checkpoint):
    directory = os.path.join(FIXTURES, checkpoint)
    # Gemma 3's expected.json sits beside its two checkpoint layouts.
    found = [path for path in (directory, os.path.dirname(directory)) if os.path.exists(os.path.join(path, "expected.json"))]
    expected = json.load(open(os.path.join(found[0], "expected.json")))
    request = expected["requests"][0]
    image_path = request["image"] if "image" in request else request["images"][0]
    if "/" not in image_path:
        image_path = "photos/" + image_path
    image = Image.open(os.path.join(FIXTURES, image_path)).convert("RGB")
    # OneVision's fixtures are written without a video processor config, which AutoProcessor asks for.
    processor = llava_onevision.load_processor(directory) if "onevision" in checkpoint else AutoProcessor.from_pretrained(directory)
    model = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32).eval()
    prompt_ids = processor(images=image, text=request["prompt"], return_tensors="pt").input_ids[0].tolist()
    assert prompt_ids == request["input_ids"], checkpoint
    inputs = processor(images=image, text=request["prompt"] + ANSWER, return_tensors="pt")
    ids = inputs.input_ids[0].tolist()
    assert ids[:len(prompt_ids)] == prompt_ids, checkpoint
    labels = [-100] * len(prompt_ids) + ids[len(prompt_ids):]
    with torch.no_grad():
        loss = model(**inputs, labels=torch.tensor([labels])).loss.item()
    print(checkpoint, len(ids), "tokens,", len(ids) - len(prompt_ids), "scored, loss", loss)
    return dict(checkpoint=checkpoint, image=image_path, text=request["prompt"] + ANSWER, input_ids=ids, labels=labels,
                loss=loss)


def main():
    cases = [case(checkpoint) for checkpoint in CHECKPOINTS]
    with open(os.path.join(FIXTURES, "image-chat-loss.json"), "w") as f:
        json.dump(dict(cases=cases), f, indent=1)


if __name__ == "__main__":
    main()
