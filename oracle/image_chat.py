"""Image-chat fixtures: conversations with images rendered through a LLaVA checkpoint's chat template and answered by
transformers, as the "image-text-to-text" pipeline does (`processor.apply_chat_template(messages,
add_generation_prompt=True, tokenize=True, return_dict=True)`, then `model.generate`).

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/llava.py:

    python oracle/image_chat.py    # → Tests/Fixtures/image-chat/<case>/

Each case directory is a checkpoint: symbolic links to the files of a tiny LLaVA checkpoint in Tests/Fixtures/llava
(config, weights, tokenizer, processor config), its own chat_template.jinja (a published multimodal template), and
expected.json:

- "conversations": messages in transformers' format, image parts as `{"type": "image", "path": "photos/…"}` (relative
  to Tests/Fixtures), each with the rendered `prompt` text, the processor's `input_ids`, and the greedy new tokens
  (`max_new_tokens` of them; the smallest top-1/top-2 logit margin of the steps is checked here) with their text
  (decoded, special tokens skipped); the first one also with 3-beam search.
- "session": a conversation built turn by turn as a chat session does: each turn adds a user message (images first,
  then the text) and the greedy answer transformers gives for the whole conversation so far, added back as the
  assistant's message; per turn the `input_ids` and the answer's ids and text.

Cases:
- "llava-1.5": llava-hf/llava-1.5-7b-hf's template (`USER: <image>\\n… ASSISTANT:`, the one transformers' own LLaVA
  processor tests use) over llava/llama-default-fp16.
- "chatml": a ChatML template that renders each message's images first, as LLaVA-OneVision-style checkpoints do, over
  llava/qwen2-layers-full-bf16, with a system message.
"""
import json
import os
import shutil

import torch
from PIL import Image
from transformers import LlavaForConditionalGeneration, LlavaProcessor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
NEW_TOKENS = 8
LINKED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
          "processor_config.json"]

LLAVA_15_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}"
    "{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def image(path):
    return {"type": "image", "path": path}


def text(value):
    return {"type": "text", "text": value}


def user(*parts):
    return {"role": "user", "content": list(parts)}


def assistant(value):
    return {"role": "assistant", "content": [text(value)]}


CONVERSATIONS = [
    [user(image("photos/chelsea.png"), text("What is in this picture?"))],
    [user(image("photos/chelsea.png"), text("Describe it.")), assistant("A cat on a rug."),
     user(image("photos/coffee.png"), text("And this one?"))],
    [user(text("Hello.")), assistant("Hi! Show me a picture."),
     user(image("photos/camera.png"), image("photos/coffee.png"), text("Compare them."))],
]

SESSION = [(["photos/chelsea.png"], "What is in this picture?"), (["photos/coffee.png"], "And this one?"),
           ([], "Which do you like more?")]

CASES = {
    "llava-1.5": dict(checkpoint="llama-default-fp16", template=LLAVA_15_TEMPLATE, system=None),
    "chatml": dict(checkpoint="qwen2-layers-full-bf16", template=CHATML_TEMPLATE, system="You are terse."),
}


def absolute(messages):
    """The messages with image paths made absolute, as transformers loads them from the current directory."""
    return [dict(m, content=[dict(p, path=os.path.join(FIXTURES, p["path"])) if p["type"] == "image" else p
                             for p in m["content"]]) for m in messages]


def answer(model, processor, messages, beams=1):
    inputs = processor.apply_chat_template(absolute(messages), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    length = inputs.input_ids.shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=beams,
                             output_logits=beams == 1, return_dict_in_generate=True)
    ids = out.sequences[0, length:].tolist()
    record = dict(prompt=prompt, input_ids=inputs.input_ids[0].tolist(), ids=ids,
                  text=processor.decode(ids, skip_special_tokens=True))
    if beams == 1:
        margin = min((top[:, 0] - top[:, 1]).min().item()
                     for top in (logits.topk(2, dim=-1).values for logits in out.logits))
        assert margin > 1e-3, f"near-tie ({margin}) in {messages}"
        record["min_margin"] = margin
    return record


def build(name, case):
    directory = os.path.join(FIXTURES, "image-chat", name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    for file in LINKED:
        os.symlink(os.path.join("..", "..", "llava", case["checkpoint"], file), os.path.join(directory, file))
    with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
        f.write(case["template"])
    model = LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = LlavaProcessor.from_pretrained(directory)
    opening = [{"role": "system", "content": [text(case["system"])]}] if case["system"] else []

    conversations = []
    for index, messages in enumerate(CONVERSATIONS):
        messages = opening + messages
        record = dict(messages=messages, greedy=answer(model, processor, messages))
        if index == 0:
            record["beam"] = answer(model, processor, messages, beams=3)
        conversations.append(record)

    messages, turns = list(opening), []
    for images, question in SESSION:
        messages.append(user(*[image(p) for p in images], text(question)))
        record = answer(model, processor, messages)
        turns.append(dict(images=images, text=question, input_ids=record["input_ids"], ids=record["ids"],
                          answer=record["text"], min_margin=record["min_margin"]))
        messages.append(assistant(record["text"]))

    expected = dict(max_new_tokens=NEW_TOKENS, system=case["system"], conversations=conversations, session=turns)
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file, indent=1, ensure_ascii=False)
    print(name, [len(c["greedy"]["input_ids"]) for c in conversations], [t["answer"] for t in turns])


if __name__ == "__main__":
    for name, case in CASES.items():
        build(name, case)
