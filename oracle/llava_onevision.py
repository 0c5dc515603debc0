"""LLaVA-OneVision fixtures: what transformers' LlavaOnevisionImageProcessorPil makes of real photos (each image alone,
tiled by anyres, and a conversation's images together, each padded to a square and not tiled), and tiny random-init
LlavaOnevisionForConditionalGeneration checkpoints (SigLIP vision tower, Qwen2 language model) saved with their
LlavaOnevisionProcessor, with what transformers computes with them.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/llava_next.py
(whose crops of scikit-image's rocket.jpg these reuse) and oracle/llava.py (whose SmolLM2 tokenizer one checkpoint
links to):

    python oracle/llava_onevision.py    # → Tests/Fixtures/llava-onevision/

image_processor.json: per processor config ("defaults": the class defaults, 384-pixel tiles over its 36 pinpoints;
"tiny": the checkpoints' 28-pixel tiles over 1×1 … 6×6 tiles, SigLIP's mean and std 0.5) and per layout ("single":
the photos as a flat list, so each is its own prompt's only image and is tiled; "conversation": the photos as one
conversation's images, `[[...]]`, so each is padded to a square with the mean colour and read whole): the config as
transformers saves it, pixel_values' shape, image_sizes, batch_num_images, a checksum of each image's float32 pixel
values (padding tiles included: two wrapping 64-bit sums of their bit patterns, plain and weighted by position from
1, in hex) and 64 sampled values, and the number of image tokens LlavaOnevisionProcessor expands each `<image>`
into (num_image_tokens (size / patch)², "full", the case's vision_aspect_ratio).

Checkpoints (SigLIP towers at 28 pixels with 7-pixel patches, 16 features a view; the tiny pinpoints, so that
anyres_max's bilinear downscaling of large grids happens):
- "qwen2-smollm2-bf16": SmolLM2's tokenizer with `<image>` (Tests/Fixtures/llava/qwen2-layers-full-bf16's, linked),
  a ChatML template that renders each message's images first (oracle/image_chat.py's), Qwen2 with tied embeddings,
  vision_feature_layer -1, anyres_max_9, bf16 weights as transformers 5.23 saves them.
- "qwen2-layers-fp16": Tests/Fixtures/tokenizers/llama-style's tokenizer with `<image>`, Qwen2 with its own lm_head,
  vision_feature_layer [1, -1] (concatenated), SiLU projector without biases, anyres_max_4, fp16 weights rewritten
  into the published llava-hf layout (`vision_tower.vision_model.…`, checked to load to the same logits).

expected.json: per request (photos and a prompt with one `<image>` per photo, run as `processor(text=[prompt],
images=[photos])`, one sample, as the chat template path does): input_ids, image_sizes, batch_num_images,
pixel_values' shape, the number of image tokens per image, the image features (`get_image_features(...)
.pooler_output`, [tokens, hidden] per image), logits at a few positions (first, middle and last image token, the last
position) over the whole vocabulary (the SmolLM2 one: its first 512 entries, which
read the whole of the last hidden state through the tied embeddings), and the greedy continuation (max_new_tokens 10) with its text and its smallest
top-1/top-2 margin. The SmolLM2 checkpoint also has "chat": conversations through
`processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)` + greedy `generate`, and a session
built turn by turn (one image, then a second, which makes transformers read both base-only, then none), as
oracle/image_chat.py records them, and "single_turns": one user turn with one or two images and no system message.
"""
import json
import os
import shutil

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                          LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor, PreTrainedTokenizerFast)
from transformers.processing_utils import ProcessorMixin

# Videos are out of scope, and the video processor needs torchvision, which the oracle venv does not have: the
# processors here are built without one.
_check_argument = ProcessorMixin.check_argument_for_proper_class
ProcessorMixin.check_argument_for_proper_class = (
    lambda self, name, argument: None if name == "video_processor" and argument is None else _check_argument(self, name, argument))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "llava-onevision")
SMOLLM2 = os.path.join(FIXTURES, "llava", "qwen2-layers-full-bf16")
LLAMA_STYLE = os.path.join(FIXTURES, "tokenizers", "llama-style", "tokenizer.json")
NEW_TOKENS = 10
CHAT_TOKENS = 8

PHOTOS = ["photos/camera.png", "photos/chelsea.png", "llava-next/photos/wide.png", "llava-next/photos/tall.png",
          "llava-next/photos/half.png"]

TINY_PINPOINTS = [[28 * i, 28 * j] for i in range(1, 7) for j in range(1, 7)]
TINY_PROCESSOR = dict(size={"height": 28, "width": 28}, image_grid_pinpoints=TINY_PINPOINTS,
                      image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
PROCESSOR_CASES = {"defaults": ({}, 14, "anyres_max_9"), "tiny": (TINY_PROCESSOR, 7, "anyres_max_9")}

VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=28,
              patch_size=7, model_type="siglip_vision_model", vision_use_head=False)

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}"
    "{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CHATML = "<|im_start|>user\n<image>\nWhat is shown in this image?<|im_end|>\n<|im_start|>assistant\n"
PLAIN = "<image>\nWhat is shown in this image?"
CASES = {
    "qwen2-smollm2-bf16": dict(
        dtype=torch.bfloat16, published_layout=False, seed=3, logits_vocabulary=512, tokenizer="smollm2", template=CHATML_TEMPLATE,
        text=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=4096, tie_word_embeddings=True),
        tie=True, vision_feature_layer=-1, act="gelu", bias=True, aspect="anyres_max_9",
        requests=[([photo], CHATML) for photo in PHOTOS[:3]]
        + [([PHOTOS[3], PHOTOS[4]], "<|im_start|>user\n<image>\n<image>\nCompare them.<|im_end|>\n<|im_start|>assistant\n")]),
    "qwen2-layers-fp16": dict(
        dtype=torch.float16, published_layout=True, seed=4, logits_vocabulary=None, tokenizer="llama-style", template=None,
        text=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False),
        tie=False, vision_feature_layer=[1, -1], act="silu", bias=False, aspect="anyres_max_4",
        requests=[([photo], PLAIN) for photo in (PHOTOS[0], PHOTOS[3], PHOTOS[4])]
        + [([PHOTOS[2], PHOTOS[1]], "<image>\n<image>\nWhat differs?")]),
}


def image(path):
    return {"type": "image", "path": path}


def text(value):
    return {"type": "text", "text": value}


def user(*parts):
    return {"role": "user", "content": list(parts)}


def assistant(value):
    return {"role": "assistant", "content": [text(value)]}


SYSTEM = "You are terse."
CONVERSATIONS = [
    [user(image(PHOTOS[1]), text("What is in this picture?"))],
    [user(image(PHOTOS[0]), text("Describe it.")), assistant("A camera man."),
     user(image(PHOTOS[2]), text("And this one?"))],
    [user(text("Hello.")), assistant("Hi! Show me a picture."),
     user(image(PHOTOS[3]), image(PHOTOS[4]), text("Compare them."))],
]
# One user turn holding the images then the text, without a system message: what `vlm generate --image … --prompt`
# sends.
SINGLE_TURNS = [[user(image(PHOTOS[1]), text("What is in this picture?"))],
                [user(image(PHOTOS[3]), image(PHOTOS[4]), text("Compare them."))]]
SESSION = [([PHOTOS[1]], "What is in this picture?"), ([PHOTOS[2]], "And this one?"), ([], "Which do you like more?")]


def photo(name):
    return Image.open(os.path.join(FIXTURES, name)).convert("RGB")


def checksum(array):
    """Two wrapping 64-bit sums of the float32 bit patterns, plain and weighted by position (1, 2, …)."""
    bits = np.ascontiguousarray(array, dtype="<f4").reshape(-1).view("<u4").astype(np.uint64)
    weights = np.arange(1, bits.size + 1, dtype=np.uint64)
    return [f"{int(bits.sum(dtype=np.uint64)):016x}", f"{int((bits * weights).sum(dtype=np.uint64)):016x}"]


def smollm2_tokenizer():
    return PreTrainedTokenizerFast.from_pretrained(SMOLLM2)


def llama_style_tokenizer():
    tok = PreTrainedTokenizerFast(tokenizer_file=LLAMA_STYLE, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tok


def make_processor(image_processor, tok, patch_size, aspect, template=None):
    size = image_processor.size["height"]
    return LlavaOnevisionProcessor(image_processor=image_processor, tokenizer=tok,
                                   num_image_tokens=(size // patch_size) ** 2, vision_feature_select_strategy="full",
                                   vision_aspect_ratio=aspect, chat_template=template)


def make_processor_cases():
    cases = []
    generator = np.random.default_rng(0)
    for name, (settings, patch_size, aspect) in PROCESSOR_CASES.items():
        image_processor = LlavaOnevisionImageProcessorPil(**settings)
        processor = make_processor(image_processor, llama_style_tokenizer(), patch_size, aspect)
        for layout in ["single", "conversation"]:
            photos = [photo(p) for p in PHOTOS]
            out = image_processor(photos if layout == "single" else [photos], return_tensors="pt")
            pixel_values = out.pixel_values.numpy()
            assert pixel_values.dtype == np.float32
            flat = pixel_values.reshape(-1)
            positions = sorted(generator.choice(flat.size, 64, replace=False).tolist())
            counts = [len(processor.replace_image_token(out, i)) // len(processor.image_token) for i in range(len(PHOTOS))]
            cases.append(dict(name=name, layout=layout, config=json.loads(image_processor.to_json_string()),
                              images=PHOTOS, shape=list(pixel_values.shape), image_sizes=out.image_sizes.tolist(),
                              batch_num_images=out.batch_num_images.tolist(),
                              checksums=[checksum(image) for image in pixel_values],
                              samples=[[p, float(flat[p])] for p in positions], patch_size=patch_size,
                              vision_aspect_ratio=aspect, num_image_tokens=counts))
            print(name, layout, pixel_values.shape, out.image_sizes.tolist(), counts)
    with open(os.path.join(OUT, "image_processor.json"), "w") as file:
        json.dump(dict(cases=cases), file, indent=1)


def save_processor(processor, directory):
    """What `processor.save_pretrained` writes, which it cannot without a video processor: the tokenizer files,
    the image processor nested in processor_config.json with the processor's own settings, chat_template.jinja."""
    processor.tokenizer.save_pretrained(directory)
    settings = json.loads(processor.to_json_string())
    settings.pop("video_processor", None)
    settings["image_processor"] = json.loads(processor.image_processor.to_json_string())
    with open(os.path.join(directory, "processor_config.json"), "w") as file:
        json.dump(settings, file, indent=2, sort_keys=True)
    if processor.chat_template:
        with open(os.path.join(directory, "chat_template.jinja"), "w") as file:
            file.write(processor.chat_template)


def load_processor(directory):
    with open(os.path.join(directory, "processor_config.json")) as file:
        settings = json.load(file)
    template = os.path.join(directory, "chat_template.jinja")
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessorPil(**settings["image_processor"]),
        tokenizer=PreTrainedTokenizerFast.from_pretrained(directory),
        num_image_tokens=settings["num_image_tokens"],
        vision_feature_select_strategy=settings["vision_feature_select_strategy"],
        vision_aspect_ratio=settings["vision_aspect_ratio"],
        chat_template=open(template).read() if os.path.exists(template) else None)


def randomize(model, generator):
    """Every parameter drawn, norms near 1 (transformers' init leaves the towers' biases at zero)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_((0.5 if "language_model" in name or "lm_head" in name or "newline" in name else 0.2) * noise)


def published_layout(name):
    """A key as transformers 5.23 saves it → as the published llava-hf checkpoints have it."""
    if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
        return "vision_tower.vision_model." + name[len("vision_tower."):]
    return name


def margin_of(logits):
    return min((top[:, 0] - top[:, 1]).min().item() for top in (step.topk(2, dim=-1).values for step in logits))


def request_record(model, processor, images, prompt, image_token, vocabulary):
    # One sample holding all its images, as apply_chat_template passes them: several images are read base-only.
    inputs = processor(images=[[photo(p) for p in images]], text=[prompt], return_tensors="pt")
    ids = inputs.input_ids[0].tolist()
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=inputs.pixel_values, image_sizes=inputs.image_sizes,
                                                  batch_num_images=inputs.batch_num_images).pooler_output
        logits = model(**inputs).logits[0]
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    image_positions = [i for i, token in enumerate(ids) if token == image_token]
    assert len(image_positions) == sum(f.shape[0] for f in features)
    positions = sorted({image_positions[0], image_positions[len(image_positions) // 2], image_positions[-1], len(ids) - 1})
    new = out.sequences[0, len(ids):].tolist()
    return dict(images=images, prompt=prompt, input_ids=ids, image_sizes=inputs.image_sizes.tolist(),
                batch_num_images=inputs.batch_num_images.tolist(), pixel_shape=list(inputs.pixel_values.shape),
                num_image_tokens=[feature.shape[0] for feature in features],
                image_features=[feature.tolist() for feature in features],
                logits_positions=positions, logits=logits[positions, :vocabulary].tolist(),
                greedy=dict(ids=new, text=processor.decode(new, skip_special_tokens=True).strip(),
                            min_margin=margin_of(out.logits)))


def absolute(messages):
    return [dict(m, content=[dict(p, path=os.path.join(FIXTURES, p["path"])) if p["type"] == "image" else p
                             for p in m["content"]]) for m in messages]


def answer(model, processor, messages):
    inputs = processor.apply_chat_template(absolute(messages), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    length = inputs.input_ids.shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=CHAT_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    ids = out.sequences[0, length:].tolist()
    margin = margin_of(out.logits)
    assert margin > 1e-3, f"near-tie ({margin}) in {messages}"
    return dict(prompt=prompt, input_ids=inputs.input_ids[0].tolist(), batch_num_images=inputs.batch_num_images.tolist(),
                ids=ids, text=processor.decode(ids, skip_special_tokens=True), min_margin=margin)


def chat_record(model, processor):
    opening = [{"role": "system", "content": [text(SYSTEM)]}]
    conversations = []
    for messages in CONVERSATIONS:
        messages = opening + messages
        conversations.append(dict(messages=messages, greedy=answer(model, processor, messages)))
    messages, turns = list(opening), []
    for images, question in SESSION:
        messages.append(user(*[image(p) for p in images], text(question)))
        record = answer(model, processor, messages)
        turns.append(dict(images=images, text=question, input_ids=record["input_ids"], ids=record["ids"],
                          answer=record["text"], min_margin=record["min_margin"]))
        messages.append(assistant(record["text"]))
    single_turns = [dict(messages=messages, greedy=answer(model, processor, messages)) for messages in SINGLE_TURNS]
    return dict(max_new_tokens=CHAT_TOKENS, system=SYSTEM, conversations=conversations, session=turns,
                single_turns=single_turns)


def build(name, case):
    directory = os.path.join(OUT, name)
    shutil.rmtree(directory, ignore_errors=True)
    tok = smollm2_tokenizer() if case["tokenizer"] == "smollm2" else llama_style_tokenizer()
    image_processor = LlavaOnevisionImageProcessorPil(**TINY_PROCESSOR)
    processor = make_processor(image_processor, tok, VISION["patch_size"], case["aspect"], case["template"])
    text_config = dict(case["text"], model_type="qwen2", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    config = LlavaOnevisionConfig(vision_config=VISION, text_config=text_config,
                                  image_token_index=tok.convert_tokens_to_ids("<image>"),
                                  video_token_index=tok.convert_tokens_to_ids("<image>"),
                                  projector_hidden_act=case["act"], vision_feature_layer=case["vision_feature_layer"],
                                  vision_feature_select_strategy="full", multimodal_projector_bias=case["bias"],
                                  image_grid_pinpoints=TINY_PINPOINTS, vision_aspect_ratio=case["aspect"],
                                  tie_word_embeddings=case["tie"])
    torch.manual_seed(case["seed"])
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(case["seed"]))
    if case["tie"]:
        model.tie_weights()
    model.to(case["dtype"]).save_pretrained(directory)
    save_processor(processor, directory)
    model = LlavaOnevisionForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = load_processor(directory)
    tied = model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert tied == case["tie"], f"{name}: lm_head tied {tied}"

    requests = [request_record(model, processor, images, prompt, config.image_token_index, case["logits_vocabulary"])
                for images, prompt in case["requests"]]
    margin = min(r["greedy"]["min_margin"] for r in requests)
    assert margin > 1e-3, f"{name}: near-tie ({margin}), pick another seed"
    expected = dict(max_new_tokens=NEW_TOKENS, image_token_index=config.image_token_index,
                    logits_vocabulary=case["logits_vocabulary"], requests=requests)
    if case["template"]:
        expected["chat"] = chat_record(model, processor)

    if case["published_layout"]:
        path = os.path.join(directory, "model.safetensors")
        save_file({published_layout(k): v for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
        reloaded = LlavaOnevisionForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
        images, prompt = case["requests"][0]
        inputs = processor(images=[[photo(p) for p in images]], text=[prompt], return_tensors="pt")
        with torch.no_grad():
            assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits), f"{name}: the published layout loads differently"

    if case["tokenizer"] == "smollm2":
        # The same tokenizer as the LLaVA fixture's: linked, not copied.
        with open(os.path.join(directory, "tokenizer.json")) as a, open(os.path.join(SMOLLM2, "tokenizer.json")) as b:
            assert json.load(a) == json.load(b), "the SmolLM2 tokenizer saved differently"
        os.remove(os.path.join(directory, "tokenizer.json"))
        os.symlink(os.path.join("..", "..", "llava", "qwen2-layers-full-bf16", "tokenizer.json"),
                   os.path.join(directory, "tokenizer.json"))
    else:
        with open(os.path.join(directory, "tokenizer.json")) as file:
            content = json.load(file)
        with open(os.path.join(directory, "tokenizer.json"), "w") as file:
            json.dump(content, file, ensure_ascii=False, separators=(",", ":"))

    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file, separators=(",", ":"))
    print(name, f"margin {margin:.4f}", [r["num_image_tokens"] for r in requests],
          [t["answer"] for t in expected.get("chat", {}).get("session", [])],
          {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    make_processor_cases()
    for name, case in CASES.items():
        build(name, case)
