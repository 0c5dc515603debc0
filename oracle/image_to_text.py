"""Image-to-text fixtures at the level a user meets: checkpoints with real tokenizers and processor configs, as
transformers saves them, and what processor + generate + decoding give for real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/image_to_text.py    # → Tests/Fixtures/image-to-text/<case>/

"blip2-opt": a tiny random-init Blip2ForConditionalGeneration (OPT language model) with the real GPT-2 byte-level
BPE (Tests/Fixtures/tokenizers/real/gpt2, the vocabulary OPT's tokenizer is built on; bos/eos `<|endoftext|>` added
in front of a prompt as OPT's tokenizer adds `</s>`) plus the `<image>` token Blip2Processor adds, saved with
Blip2Processor.save_pretrained (BlipImageProcessor at the tiny image size, num_query_tokens).

expected.json lists, per request (one image, an optional prompt): the processor's input_ids (image tokens expanded
in front of the text), the new tokens of greedy decoding and of 3-beam search, and their text as the
image-text-to-text pipeline returns it (decoded with special tokens skipped, stripped).
"""
import json
import os
import shutil

import torch
from PIL import Image
from transformers import (AutoTokenizer, Blip2Config, Blip2ForConditionalGeneration, Blip2Processor,
                          BlipImageProcessorPil)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "image-to-text")
PHOTOS = os.path.join(ROOT, "Tests", "Fixtures", "photos")
GPT2 = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "gpt2")
NEW_TOKENS = 12

REQUESTS = [("chelsea.png", None), ("coffee.png", None), ("chelsea.png", "a photo of"),
            ("coffee.png", "Question: what is in the cup? Answer:")]


def randomize(model, generator):
    """Every parameter drawn (transformers' init leaves the query tokens and the vision tower near zero)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_((0.5 if name.startswith("language_model.") else 0.2) * noise)


def compact_json(path):
    """Rewrites a JSON file without indentation (tokenizer.json shrinks by a third)."""
    with open(path) as file:
        content = json.load(file)
    with open(path, "w") as file:
        json.dump(content, file, ensure_ascii=False, separators=(",", ":"))


def blip2_opt(seed=7):
    directory = os.path.join(FIXTURES, "blip2-opt")
    shutil.rmtree(directory, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(GPT2, add_bos_token=True)
    processor = Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": 32, "width": 32}),
                               tokenizer=tokenizer, num_query_tokens=4)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    eos = processor.tokenizer.eos_token_id
    config = Blip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8, qkv_bias=True),
        qformer_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                            cross_attention_frequency=1),
        text_config=dict(vocab_size=len(processor.tokenizer), hidden_size=16, word_embed_proj_dim=16, ffn_dim=32,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
                         bos_token_id=eos, eos_token_id=eos, pad_token_id=eos),
        num_query_tokens=4, image_token_index=image_token)
    torch.manual_seed(seed)
    model = Blip2ForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(seed))
    model.to(torch.float16).save_pretrained(directory)
    processor.save_pretrained(directory)
    compact_json(os.path.join(directory, "tokenizer.json"))
    model = Blip2ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = Blip2Processor.from_pretrained(directory)

    requests = []
    for photo, prompt in REQUESTS:
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        inputs = processor(images=image, text=prompt, return_tensors="pt")
        record = dict(image=photo, prompt=prompt)
        if prompt is not None:
            record["input_ids"] = inputs.input_ids[0].tolist()
        for mode, settings in (("greedy", dict(do_sample=False)), ("beam", dict(do_sample=False, num_beams=3))):
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, output_logits=mode == "greedy",
                                     return_dict_in_generate=True, **settings)
            # generate() returns the prompt (or the image tokens + bos it made up) in front of the new tokens.
            prompt_length = inputs.input_ids.shape[1] if prompt is not None else config.num_query_tokens + 1
            ids = out.sequences[0, prompt_length:].tolist()
            record[mode] = dict(ids=ids, text=processor.decode(ids, skip_special_tokens=True).strip())
            if mode == "greedy":
                margins = [(top[:, 0] - top[:, 1]).min().item()
                           for top in (logits.topk(2, dim=-1).values for logits in out.logits)]
                record[mode]["min_margin"] = min(margins)
        requests.append(record)
    assert min(r["greedy"]["min_margin"] for r in requests) > 1e-3, "near-tie: pick another seed"
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(dict(max_new_tokens=NEW_TOKENS, image_token_index=image_token, requests=requests), file, indent=1)
    print("blip2-opt", {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


if __name__ == "__main__":
    blip2_opt()
