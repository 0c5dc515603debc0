"""LLaVA-1.5 and LLaVA-NeXT as llama.cpp's GGUF pairs (`--model LM.gguf --mmproj MMPROJ.gguf`), made by llama.cpp's
own converters from tiny random-init llava-hf-style checkpoints, with what transformers computes from those
checkpoints.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt) and llama.cpp's source tree (the
llama-cpp-python sdist on PyPI vendors it as vendor/llama.cpp):

    LLAMA_CPP=/path/to/llama.cpp LLAMA_CPP_PYTHON=/path/to/venv/bin/python python oracle/llava_gguf.py
    # → Tests/Fixtures/llava-gguf/

llama.cpp's scripts run under LLAMA_CPP_PYTHON, a venv with what llama.cpp pins for them
(tools/mtmd/requirements.txt: transformers==4.57.6, whose CLIPVisionModel still has the `vision_model` attribute
convert_image_encoder_to_gguf.py truncates; 5.23's has not), except convert_hf_to_gguf.py and gguf_new_metadata.py,
which run under this process's python (4.57.6 cannot read the tokenizer_config.json 5.23 saves, whose class is
TokenizersBackend); all with llama.cpp's gguf-py on PYTHONPATH. The expected values come from transformers 5.23 in
this process.

The LLaVA-1.5 checkpoint: LlavaForConditionalGeneration with a 3-layer CLIP tower (28-pixel images, 14-pixel
patches), vision_feature_layer -2, "default" strategy, a GELU projector with biases, a 2-layer Llama language model of
width 4 (intermediate 32, so that llama.cpp's q8_0 applies to ffn_down; narrower rows stay f16 as its converter falls
back) and the real SmolLM2 byte-level BPE plus `<image>`; weights drawn in fp16 and kept as fp32 values that fp16
holds exactly, so that the f16 tensors round nothing. Saved in the published llava-hf layout
(`vision_tower.vision_model.…`, `multi_modal_projector.…`), which llava_surgery_v2.py keys on: with 5.23's own
layout (`vision_tower.…`) the converter silently builds the tower from fresh weights, so check_mmproj compares the
mmproj's tensors with the checkpoint's.

Files, as llama.cpp's docs/multimodal/llava.md makes them:
- mmproj-f32.gguf: tools/mtmd/legacy-models/llava_surgery_v2.py -C (→ llava.clip, llava.projector), then a
  CLIPVisionModel directory (llava.clip as pytorch_model.bin, the vision config with vision_feature_layer) and
  convert_image_encoder_to_gguf.py --clip-model-is-vision --use-f32 (tower f32 but its patch conv f16, projector f16,
  as the script always writes those).
- lm-q8_0.gguf: convert_hf_to_gguf.py CKPT --outtype q8_0 (LlavaForConditionalGeneration converts as llama: vision
  tensors skipped, text_config read). Only ffn_down (rows of 32) is q8_0; the other matrices, rows of 4, fall back to
  f16, norms are f32, so one file covers f16 and q8_0. An f16 file would add another 2.1 MB, nearly all of it
  SmolLM2's vocabulary and merges in the metadata.
- mmproj-next-f32.gguf: LLaVA-NeXT by the LLaVA-1.6 recipe (the vision config given image_grid_pinpoints,
  image_aspect_ratio "anyres" and mm_patch_merge_type "spatial_unpad", as cmp-nct's config_vit.json gives them) from a
  LlavaNextForConditionalGeneration over the same tower, projector and language model (so lm-q8_0.gguf serves it too)
  with a learned image_newline, 28-pixel tiles over 1×2, 2×1, 2×2, 3×1 and 1×3 pinpoints.
- mmproj-no-feature-layer-f32.gguf: the LLaVA-1.5 tower and projector converted from a vision config without
  vision_feature_layer (the converter drops the last layer and writes no clip.vision.feature_layer): same features.
- mmproj-no-image-size.gguf: mmproj-f32.gguf less `clip.vision.image_size` (gguf-py's gguf_new_metadata.py), to be
  refused naming the key.

expected.json (transformers runs each checkpoint with ffn_down rounded through q8_0 by gguf-py's quantize and
dequantize, which is what lm-q8_0.gguf holds, so the pair must agree to fp32 rounding):
- `requests`: per request (a photo, a prompt with `<image>`): LlavaProcessor's `input_ids`, the prompt's
  last-position 32 largest logits and their ids, greedy new tokens (max_new_tokens 8) with text and the smallest
  top-1/top-2 margin; for the first request also `pixel_values` and the projector's output.
- `chat`: one user turn (chelsea.png and a question) as llama.cpp lays it out for the language model's own template
  (its parts joined into one text, the image's marker first), rendered, tokenized and answered by transformers.
- `next`, `next_chat`: the same for LLaVA-NeXT (with `image_sizes`; the first request's features as
  get_image_features gives them).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (AutoTokenizer, CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration,
                          LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextImageProcessorPil,
                          LlavaNextProcessor, LlavaProcessor)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "Tests", "Fixtures", "llava-gguf")
PHOTOS = os.path.join(ROOT, "Tests", "Fixtures", "photos")
SMOLLM2 = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "smollm2")
LLAMA_CPP = os.environ.get("LLAMA_CPP", "/tmp/llama-src")
LLAMA_CPP_PYTHON = os.environ.get("LLAMA_CPP_PYTHON", sys.executable)
NEW_TOKENS = 8
SEED = 7

REQUESTS = [("chelsea.png", "USER: <image>\nWhat is in this picture? ASSISTANT:"),
            ("coffee.png", "<image>\nA photo of")]
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=28,
              patch_size=14, projection_dim=8, hidden_act="quick_gelu", layer_norm_eps=1e-5)
TEXT = dict(model_type="llama", hidden_size=4, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=True)


def run(*args, python=LLAMA_CPP_PYTHON):
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    result = subprocess.run([python, *args], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def checkpoint(directory):
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1)
    text = dict(TEXT, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = LlavaConfig(vision_config=dict(VISION, model_type="clip_vision_model"), text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"), projector_hidden_act="gelu",
                         vision_feature_layer=-2, vision_feature_select_strategy="default",
                         multimodal_projector_bias=True)
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_((0.5 if "language_model" in name or name.startswith("lm_head") else 0.2) * noise)
    model.to(torch.float16).save_pretrained(directory)
    processor.save_pretrained(directory)
    # The published llava-hf layout, in fp32 (values fp16 holds) so that convert_hf_to_gguf's f32 keeps them.
    path = os.path.join(directory, "model.safetensors")
    renamed = {}
    for key, value in load_file(path).items():
        # 5.23 saves `vision_tower.…` without CLIPVisionModel's `vision_model.`, which the surgery keys on.
        if key.startswith("vision_tower."):
            key = "vision_tower.vision_model." + key[len("vision_tower."):]
        renamed[key] = value.float()
    save_file(renamed, path, metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json")) as file:
        saved = json.load(file)
    saved["dtype"] = "float32"
    with open(os.path.join(directory, "config.json"), "w") as file:
        json.dump(saved, file, indent=2)


def check_mmproj(mmproj, safetensors):
    """The converter fills what CLIPVisionModel does not find with fresh weights, silently: every mmproj tensor must
    be the checkpoint's."""
    sys.path.insert(0, os.path.join(LLAMA_CPP, "gguf-py"))
    import gguf
    source = load_file(safetensors)
    stored = {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(mmproj).tensors}
    pairs = {"v.pre_ln.weight": "vision_tower.vision_model.pre_layrnorm.weight",
             "v.class_embd": "vision_tower.vision_model.embeddings.class_embedding",
             "v.blk.1.ffn_down.weight": "vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight",
             "v.blk.0.attn_q.bias": "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.bias",
             "mm.2.weight": "multi_modal_projector.linear_2.weight"}
    for gguf_name, hf_name in pairs.items():
        assert np.array_equal(stored[gguf_name].reshape(-1), source[hf_name].numpy().reshape(-1)), gguf_name


def q8_0_roundtrip(model):
    """The checkpoint as lm-q8_0.gguf holds it: the tensors llama.cpp's converter quantizes (2-D `.weight`s whose
    rows are a multiple of 32 long, not norms) rounded through gguf-py's q8_0."""
    sys.path.insert(0, os.path.join(LLAMA_CPP, "gguf-py"))
    import gguf
    with torch.no_grad():
        for name, parameter in model.model.language_model.named_parameters():
            if parameter.ndim == 2 and parameter.shape[1] % 32 == 0 and "norm" not in name:
                data = parameter.numpy().astype(np.float32)
                rounded = gguf.quants.dequantize(gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                                                 gguf.GGMLQuantizationType.Q8_0)
                parameter.copy_(torch.from_numpy(rounded.reshape(data.shape)))
                print("q8_0:", name, tuple(parameter.shape))


def answers(model, processor, with_inputs):
    requests = []
    for index, (photo, prompt) in enumerate(REQUESTS):
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        inputs = processor(images=image, text=prompt, return_tensors="pt")
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        ids = out.sequences[0, inputs.input_ids.shape[1]:].tolist()
        margin = min((top[:, 0] - top[:, 1]).min().item()
                     for top in (step.topk(2, dim=-1).values for step in out.logits))
        record = dict(image=photo, prompt=prompt, input_ids=inputs.input_ids[0].tolist(),
                      last_top_ids=logits.topk(32).indices.tolist(),
                      last_top_logits=logits.topk(32).values.tolist(), greedy_ids=ids,
                      greedy_text=processor.decode(ids, skip_special_tokens=True).strip(), min_margin=margin)
        if with_inputs and index == 0:
            with torch.no_grad():
                features = model.model.get_image_features(pixel_values=inputs.pixel_values).pooler_output[0]
            record.update(pixel_values=inputs.pixel_values.tolist(), image_features=features.tolist())
        requests.append(record)
    return requests


def chat_answer(model, processor):
    """One user turn of an image and a question as llama.cpp hands it to the language model's own template (which
    reads text contents only): the parts joined into one text, the image as its marker, no newline next to it
    (common/chat.cpp's concat_content_parts); rendered by the checkpoint's template (the one the GGUF carries)."""
    messages = [{"role": "user", "content": "<image>What is in this picture?"}]
    text = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.open(os.path.join(PHOTOS, "chelsea.png")).convert("RGB")
    inputs = processor(images=image, text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    ids = out.sequences[0, inputs.input_ids.shape[1]:].tolist()
    margin = min((top[:, 0] - top[:, 1]).min().item() for top in (step.topk(2, dim=-1).values for step in out.logits))
    return dict(image="chelsea.png", question="What is in this picture?", rendered=text,
                input_ids=inputs.input_ids[0].tolist(), greedy_ids=ids,
                greedy_text=processor.decode(ids, skip_special_tokens=True).strip(), min_margin=margin)


NEXT_SEED = 4
NEXT_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]
NEXT_REQUESTS = [("chelsea.png", "USER: <image>\nWhat is in this picture? ASSISTANT:"),
                 ("coffee.png", "<image>\nA photo of")]


def next_checkpoint(llava_directory, directory):
    """LLaVA-NeXT over the same tower, projector and language model (so that lm-q8_0.gguf serves it too), with a
    learned image_newline and tiles of the tower's 28 pixels, in the published llava-hf layout."""
    llava = LlavaForConditionalGeneration.from_pretrained(llava_directory, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(llava_directory)
    config = LlavaNextConfig(vision_config=llava.config.vision_config.to_dict(),
                             text_config=llava.config.text_config.to_dict(),
                             image_token_index=llava.config.image_token_index, projector_hidden_act="gelu",
                             vision_feature_layer=-2, vision_feature_select_strategy="default",
                             image_grid_pinpoints=NEXT_PINPOINTS, tie_word_embeddings=True)
    model = LlavaNextForConditionalGeneration(config).eval()
    missing = model.load_state_dict(llava.state_dict(), strict=False)
    assert missing.missing_keys == ["model.image_newline"] and not missing.unexpected_keys, missing
    generator = torch.Generator().manual_seed(NEXT_SEED)
    with torch.no_grad():
        model.model.image_newline.copy_((0.5 * torch.randn(model.model.image_newline.shape, generator=generator)).half().float())
    model.save_pretrained(directory)
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28},
                                                 image_grid_pinpoints=NEXT_PINPOINTS)
    LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                       vision_feature_select_strategy="default", num_additional_image_tokens=1).save_pretrained(directory)
    path = os.path.join(directory, "model.safetensors")
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
               for k, v in load_file(path).items()}
    save_file(renamed, path, metadata={"format": "pt"})


def next_mmproj(directory, out):
    """The LLaVA-1.6 recipe of docs/multimodal/llava.md: surgery, then the tower as a CLIPVisionModel directory whose
    config carries the anyres settings (as cmp-nct's config_vit.json does), then the image encoder converter."""
    legacy = os.path.join(LLAMA_CPP, "tools", "mtmd", "legacy-models")
    run(os.path.join(legacy, "llava_surgery_v2.py"), "-C", "-m", directory)
    vit = os.path.join(directory, "vit")
    os.makedirs(vit)
    shutil.copy(os.path.join(directory, "llava.clip"), os.path.join(vit, "pytorch_model.bin"))
    shutil.copy(os.path.join(directory, "llava.projector"), os.path.join(vit, "llava.projector"))
    with open(os.path.join(directory, "config.json")) as file:
        config = json.load(file)
    vision = dict(config["vision_config"], architectures=["CLIPVisionModel"],
                  vision_feature_layer=config["vision_feature_layer"], image_grid_pinpoints=NEXT_PINPOINTS,
                  image_aspect_ratio="anyres", mm_patch_merge_type="spatial_unpad")
    with open(os.path.join(vit, "config.json"), "w") as file:
        json.dump(vision, file, indent=2)
    run(os.path.join(legacy, "convert_image_encoder_to_gguf.py"), "-m", vit, "--llava-projector",
        os.path.join(vit, "llava.projector"), "--output-dir", vit, "--clip-model-is-vision", "--use-f32")
    shutil.copy(os.path.join(vit, "mmproj-model-f32.gguf"), out)
    check_mmproj(out, os.path.join(directory, "model.safetensors"))
    sys.path.insert(0, os.path.join(LLAMA_CPP, "gguf-py"))
    import gguf
    stored = {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(out).tensors}
    assert np.array_equal(stored["model.image_newline"], load_file(os.path.join(directory, "model.safetensors"))["image_newline"].numpy())


def next_answers(model, processor):
    requests = []
    for index, (photo, prompt) in enumerate(NEXT_REQUESTS):
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        inputs = processor(images=image, text=prompt, return_tensors="pt")
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        ids = out.sequences[0, inputs.input_ids.shape[1]:].tolist()
        margin = min((top[:, 0] - top[:, 1]).min().item()
                     for top in (step.topk(2, dim=-1).values for step in out.logits))
        record = dict(image=photo, prompt=prompt, input_ids=inputs.input_ids[0].tolist(),
                      image_sizes=inputs.image_sizes[0].tolist(),
                      last_top_ids=logits.topk(32).indices.tolist(), last_top_logits=logits.topk(32).values.tolist(),
                      greedy_ids=ids, greedy_text=processor.decode(ids, skip_special_tokens=True).strip(),
                      min_margin=margin)
        if index == 0:
            with torch.no_grad():
                features = model.model.get_image_features(pixel_values=inputs.pixel_values,
                                                          image_sizes=inputs.image_sizes).pooler_output[0]
            record.update(image_features=features.tolist())
        requests.append(record)
    return requests


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    legacy = os.path.join(LLAMA_CPP, "tools", "mtmd", "legacy-models")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "llava-tiny")
        checkpoint(ckpt)
        # 1. llava_surgery_v2.py: the tower into llava.clip (names from `vision_model.` on), the projector into
        #    llava.projector.
        run(os.path.join(legacy, "llava_surgery_v2.py"), "-C", "-m", ckpt)
        # 2. The tower as a CLIPVisionModel directory, then the mmproj.
        vit = os.path.join(tmp, "vit")
        os.makedirs(vit)
        shutil.copy(os.path.join(ckpt, "llava.clip"), os.path.join(vit, "pytorch_model.bin"))
        shutil.copy(os.path.join(ckpt, "llava.projector"), os.path.join(vit, "llava.projector"))
        with open(os.path.join(ckpt, "config.json")) as file:
            llava_config = json.load(file)
        vision = dict(llava_config["vision_config"], architectures=["CLIPVisionModel"],
                      vision_feature_layer=llava_config["vision_feature_layer"])
        with open(os.path.join(vit, "config.json"), "w") as file:
            json.dump(vision, file, indent=2)
        run(os.path.join(legacy, "convert_image_encoder_to_gguf.py"), "-m", vit, "--llava-projector",
            os.path.join(vit, "llava.projector"), "--output-dir", vit, "--clip-model-is-vision", "--use-f32")
        shutil.copy(os.path.join(vit, "mmproj-model-f32.gguf"), os.path.join(OUT, "mmproj-f32.gguf"))
        check_mmproj(os.path.join(OUT, "mmproj-f32.gguf"), os.path.join(ckpt, "model.safetensors"))
        # The same tower converted from a vision config without vision_feature_layer: the converter then drops the
        # last layer and writes no clip.vision.feature_layer.
        plain = os.path.join(tmp, "vit-plain")
        os.makedirs(plain)
        for name in ("pytorch_model.bin", "llava.projector"):
            shutil.copy(os.path.join(vit, name), os.path.join(plain, name))
        with open(os.path.join(plain, "config.json"), "w") as file:
            json.dump({k: v for k, v in vision.items() if k != "vision_feature_layer"}, file, indent=2)
        run(os.path.join(legacy, "convert_image_encoder_to_gguf.py"), "-m", plain, "--llava-projector",
            os.path.join(plain, "llava.projector"), "--output-dir", plain, "--clip-model-is-vision", "--use-f32")
        shutil.copy(os.path.join(plain, "mmproj-model-f32.gguf"), os.path.join(OUT, "mmproj-no-feature-layer-f32.gguf"))
        # An mmproj without its image size, by gguf-py's own metadata editor, for the missing-metadata error.
        run(os.path.join(LLAMA_CPP, "gguf-py", "gguf", "scripts", "gguf_new_metadata.py"), "--force", "--remove-metadata",
            "clip.vision.image_size", os.path.join(OUT, "mmproj-f32.gguf"),
            os.path.join(OUT, "mmproj-no-image-size.gguf"), python=sys.executable)
        # 3. The language model.
        run(os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), ckpt, "--outtype", "q8_0",
            "--outfile", os.path.join(OUT, "lm-q8_0.gguf"), python=sys.executable)

        model = LlavaForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
        processor = LlavaProcessor.from_pretrained(ckpt)
        q8_0_roundtrip(model)
        expected = dict(max_new_tokens=NEW_TOKENS, image_token_index=model.config.image_token_index,
                        requests=answers(model, processor, True), chat=chat_answer(model, processor))

        next_directory = os.path.join(tmp, "llava-next-tiny")
        next_checkpoint(ckpt, next_directory)
        next_mmproj(next_directory, os.path.join(OUT, "mmproj-next-f32.gguf"))
        next_model = LlavaNextForConditionalGeneration.from_pretrained(next_directory, dtype=torch.float32).eval()
        q8_0_roundtrip(next_model)
        next_processor = LlavaNextProcessor.from_pretrained(next_directory)
        expected["next"] = next_answers(next_model, next_processor)
        expected["next_chat"] = chat_answer(next_model, next_processor)
    assert min(r["min_margin"] for r in expected["next"] + [expected["next_chat"]]) > 1e-3, "near-tie in LLaVA-NeXT's answers, pick another seed"
    assert min(r["min_margin"] for r in expected["requests"]) > 1e-3, "near-tie, pick another seed"
    assert expected["chat"]["min_margin"] > 1e-3, "near-tie in the chat answer, pick another seed"
    with open(os.path.join(OUT, "expected.json"), "w") as file:
        json.dump(expected, file, separators=(",", ":"))
    print({f: os.path.getsize(os.path.join(OUT, f)) for f in sorted(os.listdir(OUT))})


if __name__ == "__main__":
    main()
