"""BLIP-2 fixtures: tiny random-init Blip2ForConditionalGeneration checkpoints (OPT language models) and what
transformers computes with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/blip2.py [CASE...]    # → Tests/Fixtures/blip2/<case>/ (every case without arguments;
                                        #   the cases are those of CASES, "blip-vision" and "retrieval")

Each case directory is a checkpoint SwiftVLM loads as is (config.json + model.safetensors) plus:

- expected.safetensors: `pixel_values` (two photos through BlipImageProcessorPil at the tiny image size) and every
  stage's output for them: `vision_last_hidden_state`, `vision_pooler_output`, `qformer_last_hidden_state`,
  `image_embeds` (the language projection's output), and `logits` for the prompt below;
- expected.json: the prompt (`num_query_tokens` image tokens, then bos and text ids, as Blip2Processor lays them out;
  the second row left-padded), greedy continuations of that prompt and of no prompt (generate() then starts from
  image tokens + bos) with the smallest top-1/top-2 logit margin seen, and beam search (num_beams=3,
  num_return_sequences=3) with `sequences` (prompt included, as generate returns them for a decoder-only language
  model) and `sequences_scores`.

The "retrieval" case is a `Blip2ForImageTextRetrieval` (the Q-Former reading text as well: its text embeddings and
text feed-forward, `use_qformer_text_input`), fp32, with three right-padded texts in synthetic ids: expected.json has
every image's ITM probability for every text (`softmax(logits_per_image)[:, 1]` with the matching head, the image
repeated per text) and the ITC scores (`logits_per_image` without it: the best cosine over the query outputs);
expected.safetensors the pixels, the vision tower's last hidden state, the ITC image and text embeddings, and the ITM
logits.

The "blip-vision" case is BLIP's own vision tower (`BlipVisionModel`, `blip_vision_model`, its defaults for what
the config leaves out), saved on its own, with its last hidden state and pooled output in expected.safetensors.

Random init draws every parameter (transformers' own init leaves the query tokens and the vision tower's weights at
zero or 1e-10, which would test nothing). Weights are stored in the case's dtype; transformers computes in fp32 from
the same rounded weights. The "hub-layout" case stores the vision attention biases as `q_bias`/`v_bias`, as the
Salesforce BLIP-2 checkpoints on the Hub do (transformers 5.23 saves one fused `qkv.bias` instead); its expected
outputs come from the model before the file is rewritten, with the key third of the fused bias zero as the two
separate biases imply.
"""
import json
import os
import shutil
import sys

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (Blip2Config, Blip2ForConditionalGeneration, Blip2ForImageTextRetrieval, BlipImageProcessorPil,
                          BlipVisionConfig, BlipVisionModel)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "blip2")
PHOTOS = [os.path.join(ROOT, "Tests", "Fixtures", "photos", name) for name in ("chelsea.png", "coffee.png")]
VOCAB = 120
IMAGE_TOKEN = 110
BOS, EOS, PAD = 2, 2, 1
TEXTS = [[BOS, 17, 45, 99, 3], [BOS, 8, 60]]
NEW_TOKENS = 10
BEAM_TOKENS = 8

OPT = dict(vocab_size=VOCAB, hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
           max_position_embeddings=64, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)

CASES = {
    # Cross-attention in every Q-Former layer, 5.23's fused qkv.bias (key third nonzero: BLIP's layout), tied
    # embeddings, fp16 weights.
    "cross1-fp16": dict(
        dtype=torch.float16, hub_layout=False, num_query_tokens=4,
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                    patch_size=8, qkv_bias=True),
        qformer=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     cross_attention_frequency=1),
        text=dict(OPT),
    ),
    # Cross-attention every second layer of three, the Hub's q_bias/v_bias layout, a wider vision tower than the
    # Q-Former, untied lm_head, bf16 weights.
    "hub-layout-bf16": dict(
        dtype=torch.bfloat16, hub_layout=True, num_query_tokens=6,
        vision=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6, image_size=48,
                    patch_size=16, qkv_bias=True),
        qformer=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                     cross_attention_frequency=2),
        text=dict(OPT, tie_word_embeddings=False),
    ),
    # No vision attention biases, quick_gelu in the vision tower, OPT-350m-style post-norm decoder, fp32 weights.
    "no-qkv-bias-fp32": dict(
        dtype=torch.float32, hub_layout=False, num_query_tokens=3,
        vision=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                    patch_size=14, qkv_bias=False, hidden_act="quick_gelu"),
        qformer=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                     cross_attention_frequency=2, layer_norm_eps=1e-6),
        text=dict(OPT, hidden_size=24, ffn_dim=40, num_attention_heads=3, do_layer_norm_before=False),
    ),
}


class NearTie(Exception):
    pass


def randomize(model, generator, hub_layout):
    """Draws every parameter: norms' weights near 1, biases N(0, 0.1²), other weights N(0, 0.2²), or N(0, 0.5²) in
    the language model, whose greedy continuations at 0.2 repeat one token."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            lower = name.lower()
            if ("norm" in lower) and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_((0.5 if name.startswith("language_model.") else 0.2) * noise)
            if hub_layout and name.endswith("self_attn.qkv.bias"):
                third = parameter.shape[0] // 3
                parameter[third:2 * third] = 0


def pixel_values(size):
    processor = BlipImageProcessorPil(size={"height": size, "width": size})
    images = [Image.open(path).convert("RGB") for path in PHOTOS]
    return processor(images=images, return_tensors="pt")["pixel_values"]


def prompt(num_query_tokens):
    """Blip2Processor's layout: image tokens then the text's ids; shorter rows padded on the left."""
    rows = [[IMAGE_TOKEN] * num_query_tokens + text for text in TEXTS]
    length = max(map(len, rows))
    ids = [[PAD] * (length - len(row)) + row for row in rows]
    mask = [[0] * (length - len(row)) + [1] * len(row) for row in rows]
    return torch.tensor(ids), torch.tensor(mask)


def greedy(model, pixels, ids, mask):
    """New tokens of greedy decoding (no eos) and the smallest top-1/top-2 logit margin over all steps."""
    with torch.no_grad():
        out = model.generate(pixel_values=pixels, input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=None, pad_token_id=PAD, output_logits=True,
                             return_dict_in_generate=True)
    # generate() hands back the prompt ids in front of the new tokens, also the image tokens + bos it makes up
    # when given no prompt.
    prompt_length = model.config.num_query_tokens + 1 if ids is None else ids.shape[1]
    sequences = out.sequences.tolist()
    margins = [(top[:, 0] - top[:, 1]).min().item() for top in (logits.topk(2, dim=-1).values for logits in out.logits)]
    return sequences, prompt_length, min(margins)


def build_case(name, spec, seed):
    torch.manual_seed(seed)
    config = Blip2Config(vision_config=spec["vision"], qformer_config=spec["qformer"], text_config=spec["text"],
                         num_query_tokens=spec["num_query_tokens"], image_token_index=IMAGE_TOKEN)
    model = Blip2ForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(seed), spec["hub_layout"])
    directory = os.path.join(FIXTURES, name)
    shutil.rmtree(directory, ignore_errors=True)
    model.to(spec["dtype"]).save_pretrained(directory)
    generation_config = os.path.join(directory, "generation_config.json")
    if os.path.exists(generation_config):
        os.remove(generation_config)
    # Compute from the stored (rounded) weights, in fp32.
    model = Blip2ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()

    pixels = pixel_values(spec["vision"]["image_size"])
    ids, mask = prompt(spec["num_query_tokens"])
    tensors = {"pixel_values": pixels}
    with torch.no_grad():
        vision = model.vision_model(pixel_values=pixels)
        tensors["vision_last_hidden_state"] = vision.last_hidden_state
        tensors["vision_pooler_output"] = vision.pooler_output
        features = model.get_image_features(pixel_values=pixels)
        tensors["qformer_last_hidden_state"] = features.qformer_outputs.last_hidden_state
        tensors["image_embeds"] = features.pooler_output
        tensors["logits"] = model(pixel_values=pixels, input_ids=ids, attention_mask=mask).logits
    expected = dict(input_ids=ids.tolist(), attention_mask=mask.tolist(), image_token_index=IMAGE_TOKEN,
                    max_new_tokens=NEW_TOKENS)

    generations = []
    for prompted in (True, False):
        sequences, prompt_length, margin = greedy(model, pixels, ids if prompted else None, mask if prompted else None)
        generations.append(dict(prompted=prompted, sequences=sequences, prompt_length=prompt_length, min_margin=margin))
    if min(g["min_margin"] for g in generations) <= 1e-3:
        raise NearTie(name)
    expected["greedy"] = generations

    # Stop on a token the first greedy continuation produces early, so that some beams finish before the limit.
    first = generations[0]["sequences"][0][generations[0]["prompt_length"]:]
    eos = [first[2]]
    with torch.no_grad():
        out = model.generate(pixel_values=pixels, input_ids=ids, attention_mask=mask, max_new_tokens=BEAM_TOKENS,
                             do_sample=False, num_beams=3, num_return_sequences=3, eos_token_id=eos, pad_token_id=PAD,
                             output_scores=True, return_dict_in_generate=True)
    expected["beam"] = dict(num_beams=3, num_return_sequences=3, max_new_tokens=BEAM_TOKENS, eos=eos, pad=PAD,
                            sequences=out.sequences.tolist(), sequences_scores=out.sequences_scores.tolist())

    save_file({key: value.contiguous() for key, value in tensors.items()}, os.path.join(directory, "expected.safetensors"))
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file)
    if spec["hub_layout"]:
        to_hub_layout(os.path.join(directory, "model.safetensors"))
    sizes = {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))}
    print(name, "seed", seed, "margins", [round(g["min_margin"], 4) for g in generations], sizes)


BLIP_VISION = "blip-vision"


def build_blip_vision(seed=100):
    """BLIP's vision tower alone: layer_norm_eps left at BlipVisionConfig's 1e-5, a fully biased qkv, fp32."""
    torch.manual_seed(seed)
    config = BlipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8)
    model = BlipVisionModel(config).eval()
    randomize(model, torch.Generator().manual_seed(seed), hub_layout=False)
    directory = os.path.join(FIXTURES, BLIP_VISION)
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory)
    pixels = pixel_values(config.image_size)
    with torch.no_grad():
        out = model(pixel_values=pixels)
    save_file({"pixel_values": pixels, "last_hidden_state": out.last_hidden_state.contiguous(),
               "pooler_output": out.pooler_output.contiguous()}, os.path.join(directory, "expected.safetensors"))
    print(BLIP_VISION, {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


RETRIEVAL = "retrieval"
# [CLS] … [SEP] in the Q-Former's own vocabulary (BERT's layout), right-padded with 0 as Blip2Processor's BertTokenizer
# pads them.
CLS, SEP = 81, 82
RETRIEVAL_TEXTS = [[CLS, 23, 8, 77, SEP], [CLS, 61, 3, 19, 40, 55, 14, SEP], [CLS, 50, SEP]]


def build_retrieval(seed=100):
    """Cross-attention in layers 0 and 2 of three, 4 heads of 8, 5 queries, a 16-wide shared space."""
    torch.manual_seed(seed)
    config = Blip2Config(
        vision_config=dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8, qkv_bias=True),
        qformer_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                            cross_attention_frequency=2, vocab_size=90, max_position_embeddings=16,
                            use_qformer_text_input=True),
        num_query_tokens=5, image_text_hidden_size=16)
    model = Blip2ForImageTextRetrieval(config).eval()
    randomize(model, torch.Generator().manual_seed(seed), hub_layout=False)
    directory = os.path.join(FIXTURES, RETRIEVAL)
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory)
    model = Blip2ForImageTextRetrieval.from_pretrained(directory, dtype=torch.float32).eval()
    pixels = pixel_values(config.vision_config.image_size)
    length = max(map(len, RETRIEVAL_TEXTS))
    ids = torch.tensor([text + [0] * (length - len(text)) for text in RETRIEVAL_TEXTS])
    mask = torch.tensor([[1] * len(text) + [0] * (length - len(text)) for text in RETRIEVAL_TEXTS])
    expected = dict(input_ids=ids.tolist(), attention_mask=mask.tolist(), itm_probabilities=[])
    tensors = {"pixel_values": pixels}
    with torch.no_grad():
        tensors["vision_last_hidden_state"] = model.vision_model(pixel_values=pixels).last_hidden_state
        for image in range(len(PHOTOS)):
            repeated = pixels[image:image + 1].repeat(len(RETRIEVAL_TEXTS), 1, 1, 1)
            output = model(pixel_values=repeated, input_ids=ids, attention_mask=mask, use_image_text_matching_head=True)
            tensors[f"itm_logits_{image}"] = output.logits_per_image
            expected["itm_probabilities"].append(output.logits_per_image.softmax(dim=-1)[:, 1].tolist())
        output = model(pixel_values=pixels, input_ids=ids, attention_mask=mask, use_image_text_matching_head=False)
        expected["itc_similarities"] = output.logits_per_image.tolist()
        tensors["itc_image_embeds"] = output.image_embeds
        tensors["itc_text_embeds"] = output.text_embeds
    save_file({key: value.contiguous() for key, value in tensors.items()}, os.path.join(directory, "expected.safetensors"))
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file)
    print(RETRIEVAL, expected, {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


def to_hub_layout(path):
    """Rewrites each vision layer's fused `qkv.bias` as the Hub checkpoints' `q_bias` and `v_bias`."""
    weights = load_file(path)
    for key in [k for k in weights if k.endswith("self_attn.qkv.bias")]:
        fused = weights.pop(key)
        third = fused.shape[0] // 3
        assert torch.all(fused[third:2 * third] == 0), key
        prefix = key[:-len("qkv.bias")]
        weights[prefix + "q_bias"] = fused[:third].clone()
        weights[prefix + "v_bias"] = fused[2 * third:].clone()
    save_file(weights, path, metadata={"format": "pt"})


def main():
    unknown = set(sys.argv[1:]) - set(CASES) - {BLIP_VISION, RETRIEVAL}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; the cases are {list(CASES) + [BLIP_VISION, RETRIEVAL]}")
    os.makedirs(FIXTURES, exist_ok=True)
    if not sys.argv[1:] or BLIP_VISION in sys.argv[1:]:
        build_blip_vision()
    if not sys.argv[1:] or RETRIEVAL in sys.argv[1:]:
        build_retrieval()
    for name, spec in CASES.items():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        # A checkpoint whose greedy continuations pass through a near-tie is redrawn with the next seed.
        for seed in range(100, 120):
            try:
                build_case(name, spec, seed)
                break
            except NearTie:
                print(name, "seed", seed, "has a near-tie; redrawing")
        else:
            raise SystemExit(f"{name}: no seed without near-ties")


if __name__ == "__main__":
    main()
