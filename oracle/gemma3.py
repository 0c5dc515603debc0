"""Gemma 3 fixtures: a tiny random-init Gemma3ForConditionalGeneration (model_type "gemma3": a SigLIP vision tower,
Gemma3MultiModalProjector's 2×2 average pool + soft-embedding RMSNorm + projection, a Gemma 3 text decoder) saved with
its Gemma3Processor, and what transformers computes with it on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/gemma3.py    # → Tests/Fixtures/gemma3/

tiny/: the checkpoint as transformers 5.23 saves it (`model.save_pretrained` + `processor.save_pretrained`):
- config.json: Gemma3Config. Vision: SigLIP, 32-pixel images in 4-pixel patches (8×8 = 64 patches), 16 wide, 2 layers,
  no head. Text: Gemma 3, 16 wide, 3 layers (sliding, full, sliding; an 8-token window, so that a 16-token image
  block is longer than the window: the sliding layers' mask is AND(window, OR(causal, same image block))), 2 query
  heads over 1 key/value head of 8, query_pre_attn_scalar 8, tied embeddings. mm_tokens_per_image 16: the 8×8 patches
  pooled 2×2 → 4×4 = 16 soft tokens per image. fp32 weights, every parameter drawn (see `randomize`).
- generation_config.json: what save_pretrained writes.
- tokenizer.json, tokenizer_config.json: a GemmaTokenizer (transformers 5's tokenizers-backed class, which the
  published Gemma 3 checkpoints name) built from the vocabulary and merges of
  Tests/Fixtures/siglip2/tiny-naflex-fp16/tokenizer.json (a small Gemma-style byte-fallback BPE) with add_bos_token
  on, `<start_of_turn>`/`<end_of_turn>` (already in that vocabulary, ids 5 and 6) made special added tokens, and Gemma
  3's image tokens added as named model-specific special tokens (`extra_special_tokens={"boi_token": ...}`: ids 1161,
  1162, 1163, inside vocab_size 1164), which transformers saves as top-level `boi_token`, `eoi_token`, `image_token`
  keys of tokenizer_config.json. tokenizer_config.json records no add_bos_token: the bos comes from tokenizer.json's
  TemplateProcessing post-processor, which GemmaTokenizer keeps on loading while it rebuilds the rest of the pipeline
  (BPE from the file's vocab and merges, its own normalizer, pre-tokenizer and decoder).
- processor_config.json: Gemma3Processor's settings (image_seq_length 16) with the image processor nested (32×32,
  bilinear, mean and std 0.5, no pan-and-scan; saved as "Gemma3ImageProcessor", which AutoProcessor loads as
  Gemma3ImageProcessorPil without torchvision).
- chat_template.jinja: Gemma 3's chat template as published for google/gemma-3-*-it (that file is not available
  offline: it is written out here as GEMMA3_TEMPLATE, the published layout: bos, the system message folded into the
  first user turn followed by a blank line, "assistant" renamed "model", `<start_of_image>` for each image part, text
  parts trimmed).

tiny-published-layout/: the same weights under the names the published google/gemma-3-4b-it safetensors use
(`language_model.model.…`, `vision_tower.vision_model.…`, `multi_modal_projector.…`, no lm_head since it is tied;
tiny/ differs only in lacking the vision tower's `vision_model.` level, see `published_layout`), checked to load
through transformers' checkpoint conversion mapping to the same weights and logits identical to tiny/'s; every other
file a relative symlink to ../tiny/….

expected.json (compact; ids, and floats as transformers computes them in fp32):
- image_token_index, boi_token_index, eoi_token_index, mm_tokens_per_image, max_new_tokens (requests), chat_tokens.
- "image_processor": per photo (each processed alone): its path (relative to Tests/Fixtures), pixel_values' shape and
  its 3·32·32 values flattened.
- "requests": per request (photos and a prompt, run as `processor(images=[[photos]], text=[prompt])`: one sample
  holding its images; the processor replaces each `<start_of_image>` with "\n\n<start_of_image>" + 16 ×
  "<image_soft_token>" + "<end_of_image>\n\n" before tokenizing, so those newlines merge with their neighbours):
  messages (the two templated ones), prompt, images, input_ids, token_type_ids (1 at the image soft tokens),
  image_features (`model.model.get_image_features(pixel_values).pooler_output`, a [16, 16] list per image),
  logits_positions (the first, middle and last image token of the first image, the token right after that image block,
  the last position), logits at those positions over the whole vocabulary, causal_logits: the same positions from a
  forward pass without token_type_ids (the plain causal / sliding mask, no bidirectional image blocks; checked to
  differ), and greedy (`generate(**inputs, max_new_tokens=10, do_sample=False)`, token_type_ids included): new ids,
  text (skip_special_tokens, stripped) and the smallest top-1/top-2 logit margin over the steps. Request (a)'s prompt
  is the chat template's rendering, which begins with "<bos>"; the tokenizer adds its own, so its input_ids start with
  two bos ids, as transformers gives (the chat path below does not: apply_chat_template turns add_special_tokens off
  when the rendered prompt starts with bos).
- "chat": conversations through `processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
  return_dict=True)` + greedy generate of 8 tokens: messages (image paths relative to Tests/Fixtures), the rendered
  prompt, input_ids, token_type_ids, new ids, text (not stripped: a chat reply as decoded), min margin.
- "session": a conversation built turn by turn, the model's own greedy answers fed back as assistant turns (no system
  message): per turn its images, text, input_ids, ids, answer, min margin.
"""
import json
import os
import shutil
import sys

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (AddedToken, AutoProcessor, AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration,
                          Gemma3ImageProcessorPil, Gemma3Processor, GemmaTokenizer)
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from image_chat import absolute, assistant, image, text, user  # noqa: E402  (the chat messages' shape)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "gemma3")
TINY = os.path.join(OUT, "tiny")
PUBLISHED = os.path.join(OUT, "tiny-published-layout")
SOURCE_TOKENIZER = os.path.join(FIXTURES, "siglip2", "tiny-naflex-fp16", "tokenizer.json")
SEED = 3
NEW_TOKENS = 10
CHAT_TOKENS = 8
IMAGE_SEQ_LENGTH = 16

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
TURN_TOKENS = ["<start_of_turn>", "<end_of_turn>"]

VISION = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=2, image_size=32, patch_size=4, layer_norm_eps=1e-6, vision_use_head=False)
TEXT = dict(model_type="gemma3_text", hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8, sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], max_position_embeddings=512)
IMAGE_PROCESSOR = dict(size={"height": 32, "width": 32}, resample=2, image_mean=[0.5, 0.5, 0.5],
                       image_std=[0.5, 0.5, 0.5])

CHELSEA, CAMERA, WIDE, TALL = ("photos/chelsea.png", "photos/camera.png", "llava-next/photos/wide.png",
                               "llava-next/photos/tall.png")
PHOTOS = [CHELSEA, CAMERA, WIDE, TALL]  # camera.png is greyscale


def system(value):
    return {"role": "system", "content": [text(value)]}


# Requests run through `processor(images=..., text=...)`; a prompt given as messages is first rendered by the chat
# template (tokenize=False), a string is used as it is.
REQUESTS = [
    ([CHELSEA], [user(image(CHELSEA), text("What is shown in this image?"))]),
    ([WIDE, CAMERA], [user(image(WIDE), image(CAMERA), text("What differs between these?"))]),
    ([TALL], "<start_of_image> Describe."),
]
CONVERSATIONS = [
    [system("You are terse."), user(image(CHELSEA), text("What is in this picture?"))],
    [user(image(CAMERA), text("Describe it.")), assistant("A camera man."), user(image(WIDE), text("And this one?"))],
    [user(text("Hello.")), assistant("Hi! Show me a picture."),
     user(image(TALL), image(CHELSEA), text("Compare them."))],
]
SESSION = [([CHELSEA], "What is in this picture?"), ([WIDE], "And this one?"), ([], "Which do you like more?")]


def photo(name):
    return Image.open(os.path.join(FIXTURES, name))


def make_tokenizer():
    with open(SOURCE_TOKENIZER) as file:
        model = json.load(file)["model"]
    tok = GemmaTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]], add_bos_token=True,
                         add_eos_token=False, extra_special_tokens=IMAGE_TOKENS)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in TURN_TOKENS])
    return tok


def randomize(model, generator):
    """Every parameter drawn. Gemma's RMSNorms scale by (1 + weight), so theirs around 0; SigLIP's LayerNorms around 1.
    The embeddings (tied to lm_head; the decoder multiplies them by √hidden_size = 4) smaller than the decoder's other
    matrices: scales and SEED picked for varied greedy answers whose top-1/top-2 margins all stay above 0.01."""
    gemma_norms = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, Gemma3RMSNorm)}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name in gemma_norms:
                parameter.copy_(0.3 * noise)
            elif "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                parameter.copy_(0.2 * noise)
            elif "language_model" in name:
                parameter.copy_(noise)
            else:
                parameter.copy_(0.5 * noise)


def published_layout(name):
    """A key as transformers 5.23 saves it → as the published google/gemma-3-4b-it safetensors name it.

    In memory the keys are `model.language_model.…`, `model.vision_tower.…` (SiglipVisionModel without its
    `vision_model` level), `model.multi_modal_projector.…`, `lm_head.weight`; save_pretrained reverses the checkpoint
    conversion mapping (gemma3 → llava's: `^language_model.model` ↔ `model.language_model`, `^vision_tower` ↔
    `model.vision_tower`, `^multi_modal_projector` ↔ `model.multi_modal_projector`), so it writes
    `language_model.model.…`, `vision_tower.…`, `multi_modal_projector.…` and no lm_head (tied). It does not put back
    the `vision_model.` level that SiglipVisionModel's mapping (CLIPVisionModel's: remove the prefix `vision_model`)
    strips on load, which the published files have."""
    assert name.startswith(("language_model.model.", "vision_tower.", "multi_modal_projector.")), name
    if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
        return "vision_tower.vision_model." + name[len("vision_tower."):]
    return name


def margin_of(logits):
    return min((top[:, 0] - top[:, 1]).min().item() for top in (step.topk(2, dim=-1).values for step in logits))


def greedy(model, processor, inputs, max_new_tokens, strip):
    """The greedy continuation, its text stripped where SwiftVLM's captions are (chat replies are not)."""
    length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    ids = out.sequences[0, length:].tolist()
    margin = margin_of(out.logits)
    text = processor.decode(ids, skip_special_tokens=True)
    return dict(ids=ids, text=text.strip() if strip else text, min_margin=margin)


def image_processor_record(processor):
    records = []
    for path in PHOTOS:
        pixel_values = processor.image_processor(photo(path), return_tensors="pt").pixel_values
        assert pixel_values.dtype == torch.float32
        records.append(dict(image=path, shape=list(pixel_values.shape), pixel_values=pixel_values.reshape(-1).tolist()))
    return records


def request_record(model, processor, images, prompt, config):
    messages = None
    if not isinstance(prompt, str):
        messages, prompt = prompt, processor.apply_chat_template(prompt, add_generation_prompt=True)
    inputs = processor(images=[[photo(p) for p in images]], text=[prompt], return_tensors="pt")
    ids = inputs.input_ids[0].tolist()
    token_types = inputs.token_type_ids[0].tolist()
    with torch.no_grad():
        features = model.model.get_image_features(inputs.pixel_values).pooler_output
        logits = model(**inputs).logits[0]
        causal = model(**{k: v for k, v in inputs.items() if k != "token_type_ids"}).logits[0]
    image_positions = [i for i, token in enumerate(ids) if token == config.image_token_index]
    assert image_positions == [i for i, t in enumerate(token_types) if t == 1]
    assert len(image_positions) == features.shape[0] * features.shape[1] == IMAGE_SEQ_LENGTH * len(images)
    first = image_positions[:IMAGE_SEQ_LENGTH]
    assert ids[first[0] - 1] == config.boi_token_index and ids[first[-1] + 1] == config.eoi_token_index
    positions = [first[0], first[len(first) // 2], first[-1], first[-1] + 1, len(ids) - 1]
    difference = (logits[positions] - causal[positions]).abs().max().item()
    assert difference > 1e-2, f"the bidirectional image mask changes nothing ({difference})"
    record = dict(prompt=prompt, images=images, input_ids=ids, token_type_ids=token_types,
                  image_features=[feature.tolist() for feature in features], logits_positions=positions,
                  logits=logits[positions].tolist(), causal_logits=causal[positions].tolist(),
                  greedy=greedy(model, processor, inputs, NEW_TOKENS, strip=True))
    if messages is not None:
        record = dict(messages=messages, **record)
    return record, difference


def answer(model, processor, messages, **processor_kwargs):
    inputs = processor.apply_chat_template(absolute(messages), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt", **processor_kwargs)
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    ids = inputs.input_ids[0].tolist()
    assert ids[:2] != [processor.tokenizer.bos_token_id] * 2, "the chat path doubled bos"
    assert "token_type_ids" in inputs
    return dict(prompt=prompt, input_ids=ids, token_type_ids=inputs.token_type_ids[0].tolist(),
                **greedy(model, processor, inputs, CHAT_TOKENS, strip=False))


def session_record(model, processor, session=SESSION, **processor_kwargs):
    messages, turns = [], []
    for images, question in session:
        messages.append(user(*[image(p) for p in images], text(question)))
        record = answer(model, processor, messages, **processor_kwargs)
        turns.append(dict(images=images, text=question, prompt=record["prompt"], input_ids=record["input_ids"],
                          ids=record["ids"], answer=record["text"], min_margin=record["min_margin"]))
        messages.append(assistant(record["text"]))
    return turns


def build_checkpoint():
    shutil.rmtree(TINY, ignore_errors=True)
    tok = make_tokenizer()
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(**IMAGE_PROCESSOR), tokenizer=tok,
                                chat_template=GEMMA3_TEMPLATE, image_seq_length=IMAGE_SEQ_LENGTH)
    text_config = dict(TEXT, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)
    config = Gemma3Config(vision_config=VISION, text_config=text_config, mm_tokens_per_image=IMAGE_SEQ_LENGTH,
                          boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id,
                          image_token_index=tok.image_token_id)
    torch.manual_seed(SEED)
    model = Gemma3ForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(SEED))
    model.tie_weights()
    model.save_pretrained(TINY)
    processor.save_pretrained(TINY)
    with open(os.path.join(TINY, "chat_template.jinja")) as file:
        assert file.read() == GEMMA3_TEMPLATE
    # Compact tokenizer.json (the same content).
    path = os.path.join(TINY, "tokenizer.json")
    with open(path) as file:
        content = json.load(file)
    with open(path, "w") as file:
        json.dump(content, file, ensure_ascii=False, separators=(",", ":"))


def build_published_layout(model, processor):
    shutil.rmtree(PUBLISHED, ignore_errors=True)
    os.makedirs(PUBLISHED)
    for name in sorted(os.listdir(TINY)):
        if name != "model.safetensors":
            os.symlink(os.path.join("..", "tiny", name), os.path.join(PUBLISHED, name))
    weights = load_file(os.path.join(TINY, "model.safetensors"))
    assert not any(k.startswith("lm_head") for k in weights), "lm_head saved although tied"
    save_file({published_layout(k): v for k, v in weights.items()}, os.path.join(PUBLISHED, "model.safetensors"),
              metadata={"format": "pt"})
    reloaded = Gemma3ForConditionalGeneration.from_pretrained(PUBLISHED, dtype=torch.float32).eval()
    reloaded_state, state = reloaded.state_dict(), model.state_dict()
    assert reloaded_state.keys() == state.keys()
    assert all(torch.equal(reloaded_state[k], state[k]) for k in state), "a weight loads differently"
    _, messages = REQUESTS[0]
    inputs = processor.apply_chat_template(absolute(messages), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits), "the published layout loads differently"


def main():
    os.makedirs(OUT, exist_ok=True)
    build_checkpoint()
    # Everything below from what a user loading the directory gets.
    processor = AutoProcessor.from_pretrained(TINY)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    model = Gemma3ForConditionalGeneration.from_pretrained(TINY, dtype=torch.float32).eval()
    config = model.config
    tied = model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert tied, "lm_head not tied"
    assert type(processor) is Gemma3Processor, type(processor)
    for tok in (processor.tokenizer, tokenizer):
        assert (tok.boi_token_id, tok.eoi_token_id, tok.image_token_id) == (
            config.boi_token_index, config.eoi_token_index, config.image_token_index)
        assert tok.convert_tokens_to_ids(TURN_TOKENS) == [5, 6]
    assert config.image_token_index < config.text_config.vocab_size

    requests, differences = [], []
    for images, prompt in REQUESTS:
        record, difference = request_record(model, processor, images, prompt, config)
        requests.append(record)
        differences.append(difference)
    chat = [dict(messages=messages, **answer(model, processor, messages)) for messages in CONVERSATIONS]
    session = session_record(model, processor)
    margins = ([r["greedy"]["min_margin"] for r in requests] + [c["min_margin"] for c in chat]
               + [t["min_margin"] for t in session])
    assert min(margins) > 1e-3, f"near-tie ({min(margins)}), pick another seed"

    build_published_layout(model, processor)

    expected = dict(image_token_index=config.image_token_index, boi_token_index=config.boi_token_index,
                    eoi_token_index=config.eoi_token_index, mm_tokens_per_image=config.mm_tokens_per_image,
                    max_new_tokens=NEW_TOKENS, chat_tokens=CHAT_TOKENS,
                    image_processor=image_processor_record(processor), requests=requests, chat=chat, session=session)
    with open(os.path.join(OUT, "expected.json"), "w") as file:
        json.dump(expected, file, separators=(",", ":"))

    print("tokenizer:", type(tokenizer).__name__, "(AutoTokenizer),", type(processor.tokenizer).__name__,
          "(processor),", type(processor.image_processor).__name__, f"vocab {len(tokenizer)}",
          f"boi/eoi/image {config.boi_token_index}/{config.eoi_token_index}/{config.image_token_index}",
          "'\\n\\n' →", tokenizer("\n\n", add_special_tokens=False).input_ids)
    for r in requests:
        print("request", r["images"], f"{len(r['input_ids'])} tokens", f"causal diff {differences.pop(0):.3f}",
              r["greedy"])
    for c in chat:
        print("chat", f"{len(c['input_ids'])} tokens", c["ids"], repr(c["text"]), f"margin {c['min_margin']:.4f}")
    for t in session:
        print("session", t["images"], f"{len(t['input_ids'])} tokens", repr(t["answer"]),
              f"margin {t['min_margin']:.4f}")
    print(f"min margin {min(margins):.4f}")
    for directory in (OUT, TINY, PUBLISHED):
        print(os.path.relpath(directory, FIXTURES),
              {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))
               if os.path.isfile(os.path.join(directory, f)) and not os.path.islink(os.path.join(directory, f))})


if __name__ == "__main__":
    main()
