"""Assistant masks: what `apply_chat_template(..., return_assistant_tokens_mask=True)` marks, and the supervised
fine-tuning loss over the marked tokens.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/assistant_masks.py [--smollm2 PATH.gguf]   # → Tests/Fixtures/chat-templates/assistant-masks/

Two templates with `{% generation %}` blocks, written beside expected.json: ChatML with each assistant reply and
its end marker in a generation block (as transformers' chat-templating guide writes one), and a variant whose
assistant turns come from a macro. transformers records a block's start as the length of the template's output
yielded so far, which inside a macro is the output before the macro's call, so there the marks land before the
reply: SwiftVLM is checked against that too. The tokenizer is SmolLM2's real tokenizer.json
(Tests/Fixtures/tokenizers/real/smollm2). For each template and conversation: the rendered text, the generation
indices (Python str offsets), the ids and the assistant mask. With --smollm2, the loss of SmolLM2-135M-Instruct
Q4_1 (dequantized to fp32, as transformers loads GGUF files) on the first conversation with every unmarked label
set to -100, as supervised fine-tuning trains only on the assistant's tokens.
"""
import argparse
import json
import os

import torch
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "Tests", "Fixtures", "chat-templates", "assistant-masks")
TOKENIZER = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "smollm2")

TEMPLATES = {
    "chatml-generation.jinja": (
        "{%- for message in messages %}\n"
        "    {%- if message['role'] == 'assistant' %}\n"
        "        {{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>\\n' }}{% endgeneration %}\n"
        "    {%- else %}\n"
        "        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"),
    "macro-generation.jinja": (
        "{%- macro reply(content) %}<|im_start|>assistant\n{% generation %}{{ content }}<|im_end|>{% endgeneration %}\n"
        "{% endmacro %}\n"
        "{%- for message in messages %}\n"
        "    {%- if message['role'] == 'assistant' %}{{ reply(message['content']) }}\n"
        "    {%- else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"),
}

CONVERSATIONS = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."},
     {"role": "user", "content": "And of Italy?"},
     {"role": "assistant", "content": "Rome is the capital of Italy."}],
    [{"role": "user", "content": "Übersetze: good morning 🌅"},
     {"role": "assistant", "content": "Guten Morgen 🌅 — schön, dich zu sehen!"}],
    [{"role": "user", "content": "Say nothing."},
     {"role": "assistant", "content": ""}],
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smollm2", help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    cases = []
    for name, template in TEMPLATES.items():
        with open(os.path.join(OUT, name), "w") as f:
            f.write(template)
        for conversation in CONVERSATIONS:
            out = tokenizer.apply_chat_template(conversation, chat_template=template, tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)
            text = tokenizer.apply_chat_template(conversation, chat_template=template, tokenize=False)
            rendered, indices = render_jinja_template(conversations=[conversation], chat_template=template,
                                                      return_assistant_tokens_mask=True)
            assert rendered[0] == text
            cases.append(dict(template=name, messages=conversation, text=text, generation_indices=indices[0],
                              input_ids=out["input_ids"], assistant_masks=out["assistant_masks"]))
            print(name, sum(out["assistant_masks"]), "of", len(out["input_ids"]), "tokens marked", indices[0])
    expected = dict(tokenizer="Tests/Fixtures/tokenizers/real/smollm2", cases=cases)
    if args.smollm2:
        from transformers import AutoModelForCausalLM
        directory, file = os.path.split(args.smollm2)
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32).eval()
        case = cases[0]
        ids = torch.tensor([case["input_ids"]])
        labels = torch.tensor([[t if m else -100 for t, m in zip(case["input_ids"], case["assistant_masks"])]])
        with torch.no_grad():
            expected["smollm2_sft_loss"] = model(input_ids=ids, labels=labels).loss.item()
        print("SmolLM2 loss over the assistant's tokens", expected["smollm2_sft_loss"])
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
