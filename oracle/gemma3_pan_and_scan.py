"""Gemma 3's pan and scan: what transformers' Gemma3Processor does with `do_pan_and_scan=True`, through the tiny
checkpoint that oracle/gemma3.py made (Tests/Fixtures/gemma3/tiny, read as it is).

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/gemma3.py:

    python oracle/gemma3_pan_and_scan.py    # → Tests/Fixtures/gemma3/pan-and-scan.json

Pan and scan is a call-time option of the processor (`processor(..., do_pan_and_scan=True)`, or passed through
`apply_chat_template`): the processor's own defaults (crops at least 256 pixels, at most 4, for images at least 1.2
times as wide as tall or tall as wide) win over whatever preprocessor_config.json says, which this script checks
(`config_is_ignored`). An image sufficiently wide or tall is read whole and as `num_crops` crops side by side (each
resized like a whole image), and its `<start_of_image>` becomes "Here is the original image" + its image sequence +
" and here are some crops to help you see better " + the crops' sequences joined by spaces.

pan-and-scan.json (compact):
- "crops": per setting (`settings`: the call's pan-and-scan keyword arguments, {} for the defaults), per photo (paths
  relative to Tests/Fixtures): `num_crops`; with `views` for the non-default setting's photos in VIEWED: every view
  (the image, then its crops) as the image processor resizes it before rescaling (`do_rescale=False,
  do_normalize=False`: 3·32·32 bytes, channels first, base64).
- "requests": `processor(images=[[photos]], text=[prompt], do_pan_and_scan=True, **settings)` then the model, as
  oracle/gemma3.py's requests: settings, images, prompt (and messages where the chat template rendered it),
  num_crops, input_ids, token_type_ids, image_features (one [16, 16] list per view), logits at logits_positions (the
  first image's first crop's first token, the token after the last image block, the last position), greedy (10 new
  tokens: ids, stripped text, min margin).
- "chat": `processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
  do_pan_and_scan=True)` + 8 greedy tokens: messages, prompt, input_ids, token_type_ids, ids, text, min margin.
- "session": a conversation built turn by turn with pan and scan, the model's answers fed back (as oracle/gemma3.py's
  session): per turn its images, text, prompt, input_ids, ids, answer, min margin.
Floats are written with 9 significant digits, which give back the float32 each was.
"""
import base64
import json
import os
import shutil
import sys
import tempfile

import torch
from transformers import AutoProcessor, Gemma3ForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma3 import FIXTURES, NEW_TOKENS, OUT, TINY, answer, greedy, photo, session_record  # noqa: E402
from image_chat import assistant, image, text, user  # noqa: E402

COFFEE, ROCKET, CHELSEA, CAMERA = "photos/coffee.png", "photos/rocket.jpg", "photos/chelsea.png", "photos/camera.png"
WIDE, TALL = "llava-next/photos/wide.png", "llava-next/photos/tall.png"
PHOTOS = [COFFEE, ROCKET, CHELSEA, CAMERA, WIDE, TALL]
# Small crops, so that the small photos are cut too: wide.png (640×128) into 3, tall.png (96×427) into 3 with a
# shorter last one, chelsea.png (451×300) into 2 with a narrower last one.
SMALL = dict(pan_and_scan_min_crop_size=64, pan_and_scan_max_num_crops=3)
SETTINGS = [{}, SMALL]
VIEWED = [CHELSEA, WIDE, TALL]

REQUESTS = [
    ({}, [COFFEE], [user(image(COFFEE), text("What is on the table?"))]),
    ({}, [ROCKET, CAMERA], "<start_of_image><start_of_image> Which is brighter?"),
    (SMALL, [WIDE], "<start_of_image> Describe."),
]
CONVERSATION = [user(image(COFFEE), text("What is this?")), assistant("A cup."), user(image(ROCKET), text("And this?"))]
SESSION = [([COFFEE], "What is in this picture?"), ([ROCKET], "And this one?")]


def crops_record(processor):
    records = []
    for settings in SETTINGS:
        photos = []
        for path in PHOTOS:
            out = processor.image_processor(photo(path), do_pan_and_scan=True, pan_and_scan_min_ratio_to_activate=1.2,
                                            **{"pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                                               **settings},
                                            do_rescale=False, do_normalize=False, return_tensors="pt")
            views = out.pixel_values
            (crops,) = out.num_crops.tolist()
            assert views.shape == (1 + crops, 3, 32, 32), views.shape
            record = dict(image=path, num_crops=crops)
            if settings and path in VIEWED:
                data = views.numpy()
                assert (data == data.round()).all() and data.min() >= 0 and data.max() <= 255
                record["views"] = [base64.b64encode(view.astype("uint8").tobytes()).decode() for view in data]
            photos.append(record)
        records.append(dict(settings=settings, photos=photos))
    return records


def config_is_ignored(processor):
    """Pan and scan switched on (with small crops) in preprocessor_config.json changes nothing: the processor's own
    call-time defaults win, on or off."""
    with tempfile.TemporaryDirectory() as directory:
        for name in os.listdir(TINY):
            shutil.copy(os.path.join(TINY, name), directory)
        path = os.path.join(directory, "processor_config.json")
        with open(path) as file:
            settings = json.load(file)
        settings["image_processor"].update(do_pan_and_scan=True, pan_and_scan_min_crop_size=64,
                                           pan_and_scan_max_num_crops=3, pan_and_scan_min_ratio_to_activate=1.2)
        with open(path, "w") as file:
            json.dump(settings, file)
        configured = AutoProcessor.from_pretrained(directory)
        for call in ({}, dict(do_pan_and_scan=True)):
            ours = configured(images=[[photo(WIDE)]], text=["<start_of_image>"], return_tensors="pt", **call)
            theirs = processor(images=[[photo(WIDE)]], text=["<start_of_image>"], return_tensors="pt", **call)
            assert ours.input_ids.tolist() == theirs.input_ids.tolist()
            assert torch.equal(ours.pixel_values, theirs.pixel_values)


def request_record(model, processor, settings, images, prompt, image_token_index):
    messages = None
    if not isinstance(prompt, str):
        messages, prompt = prompt, processor.apply_chat_template(prompt, add_generation_prompt=True)
    inputs = processor(images=[[photo(p) for p in images]], text=[prompt], return_tensors="pt", do_pan_and_scan=True,
                       **settings)
    crops = [processor.image_processor(photo(p), do_pan_and_scan=True, pan_and_scan_min_ratio_to_activate=1.2,
                                       **{"pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                                          **settings}).num_crops[0] for p in images]
    assert inputs.pixel_values.shape[0] == len(images) + sum(crops)
    ids = inputs.input_ids[0].tolist()
    with torch.no_grad():
        features = model.model.get_image_features(inputs.pixel_values).pooler_output
        logits = model(**inputs).logits[0]
    image_positions = [i for i, token in enumerate(ids) if token == image_token_index]
    assert len(image_positions) == features.shape[0] * features.shape[1]
    view = features.shape[1]
    positions = [image_positions[view], image_positions[-1] + 1, len(ids) - 1]
    record = dict(settings=settings, prompt=prompt, images=images, num_crops=crops, input_ids=ids,
                  token_type_ids=inputs.token_type_ids[0].tolist(),
                  image_features=[feature.tolist() for feature in features], logits_positions=positions,
                  logits=logits[positions].tolist(), greedy=greedy(model, processor, inputs, NEW_TOKENS, strip=True))
    return record if messages is None else dict(messages=messages, **record)


def compact(value):
    """`value` with every float cut to 9 significant digits (float32 round-trips through them)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    return value


def main():
    processor = AutoProcessor.from_pretrained(TINY)
    model = Gemma3ForConditionalGeneration.from_pretrained(TINY, dtype=torch.float32).eval()
    config_is_ignored(processor)
    crops = crops_record(processor)
    requests = [request_record(model, processor, settings, images, prompt, model.config.image_token_index)
                for settings, images, prompt in REQUESTS]
    assert [r["num_crops"] for r in requests] == [[2], [2, 0], [3]], [r["num_crops"] for r in requests]
    chat = dict(messages=CONVERSATION, **answer(model, processor, CONVERSATION, do_pan_and_scan=True))
    session = session_record(model, processor, SESSION, do_pan_and_scan=True)
    margins = [r["greedy"]["min_margin"] for r in requests] + [chat["min_margin"]] + [t["min_margin"] for t in session]
    assert min(margins) > 1e-3, f"near-tie ({min(margins)})"
    path = os.path.join(OUT, "pan-and-scan.json")
    with open(path, "w") as file:
        json.dump(compact(dict(crops=crops, requests=requests, chat=chat, session=session)), file, separators=(",", ":"))
    for setting in crops:
        print(setting["settings"], {p["image"]: p["num_crops"] for p in setting["photos"]})
    for r in requests:
        print("request", r["images"], r["num_crops"], f"{len(r['input_ids'])} tokens", r["greedy"])
    print("chat", f"{len(chat['input_ids'])} tokens", chat["ids"], repr(chat["text"]))
    for t in session:
        print("session", t["images"], f"{len(t['input_ids'])} tokens", repr(t["answer"]))
    print(f"min margin {min(margins):.4f}", os.path.relpath(path, FIXTURES), os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
