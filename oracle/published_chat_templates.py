"""Fixture for the chat-template interpreter on templates nobody here wrote (Tests/Fixtures/chat-templates/published.json).

Run by hand: python oracle/published_chat_templates.py

The templates are llama.cpp's collection of published chat templates (Tests/Fixtures/chat-templates/published/*.jinja,
see the README there). Each one renders a few conversations (two of them also with TOOLS), with and without the
generation prompt, through transformers' `render_jinja_template`, the function that
`apply_chat_template(..., tokenize=False)` calls: the jinja2 environment (`_compile_jinja_template`) and the variables
(messages, tools, documents=None, add_generation_prompt, the special tokens) are exactly apply_chat_template's. Message
keys whose value is None are dropped first, as apply_chat_template does.

`strftime_now` reads the clock (`datetime.now()` in transformers' chat_template_utils): the oracle fixes it at NOW so
that templates printing today's date (Llama 3.x, Mistral Small 3.2, Granite, gpt-oss, …) render deterministically; the
Swift test fixes its clock at the same local time. Where jinja2 raises, the case records the exception's type and text.
"""

import json
from datetime import datetime
from pathlib import Path

from transformers.utils import chat_template_utils

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "Tests" / "Fixtures" / "chat-templates"
TEMPLATES = OUT / "published"

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
# A local time, as `datetime.now()` returns it (naive).
NOW = datetime(2025, 3, 5, 14, 30, 15)


class FixedClock(datetime):
    """transformers' strftime_now calls `datetime.now()`; this one always answers NOW."""

    @classmethod
    def now(cls, tz=None):
        return NOW


CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello! What can you do?"}],
    "system-user": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colours."},
    ],
    "user-assistant-user": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
    "system-multi-turn": [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "  Tell me about \"quotes\", ünïcödé 👋 and\nnew lines.  "},
    ],
    # Reasoning templates print or drop an earlier turn's reasoning; transformers aliases it as `thinking` too.
    "reasoning": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4.", "reasoning_content": "Two plus two is four."},
        {"role": "user", "content": "And 3 + 3?"},
    ],
    "text-parts": [
        {"role": "user", "content": [{"type": "text", "text": "Describe this in two parts."}]},
    ],
    # A tool call and its result, in the form transformers documents: arguments as a dict, the result as a "tool" turn
    # (Mistral's templates want call ids of nine alphanumerics).
    "tool-call": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call00001", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}},
        ]},
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."},
        {"role": "user", "content": "Thanks!"},
    ],
}

# The tools passed with the conversations in TOOL_CONVERSATIONS (`tools=None` for the others).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather at a place.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City, e.g. \"Paris\""},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location"],
            },
        },
    }
]
TOOL_CONVERSATIONS = ["system-user", "tool-call"]

# Replies begun by the caller, rendered with `continue_final_message=True` (no generation prompt): the text ends where
# the last message's does, trailing whitespace and all when the template keeps it.
CONTINUATIONS = {
    "prefill": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "The weather in Paris is"},
    ],
    "prefill-call": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "<tool_call>\n"},
    ],
    "prefill-parts": [
        {"role": "user", "content": "Describe Paris."},
        {"role": "assistant", "content": [{"type": "text", "text": "Paris is"}]},
    ],
}


def render(template, messages, tools, add_generation_prompt, continue_final_message=False):
    messages = [{key: value for key, value in message.items() if value is not None} for message in messages]
    try:
        rendered, _ = chat_template_utils.render_jinja_template(
            conversations=[messages], tools=tools, documents=None, chat_template=template,
            add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
            bos_token=BOS_TOKEN, eos_token=EOS_TOKEN)
        return {"expected": rendered[0]}
    except Exception as error:  # jinja2's errors, and the TypeErrors and ValueErrors of Python code it runs
        return {"error": f"{type(error).__name__}: {error}"}


def main():
    chat_template_utils.datetime = FixedClock
    templates = []
    for path in sorted(TEMPLATES.glob("*.jinja")):
        # newline="" keeps the text as the file holds it; jinja2 normalizes line endings itself.
        with open(path, encoding="utf-8", newline="") as file:
            template = file.read()
        cases = []
        runs = [(name, False) for name in CONVERSATIONS] + [(name, True) for name in TOOL_CONVERSATIONS]
        for name, with_tools in runs:
            for add_generation_prompt in (False, True):
                case = {"conversation": name, "tools": with_tools, "add_generation_prompt": add_generation_prompt}
                case.update(render(template, CONVERSATIONS[name], TOOLS if with_tools else None, add_generation_prompt))
                cases.append(case)
        for name, messages in CONTINUATIONS.items():
            case = {"conversation": name, "tools": False, "add_generation_prompt": False, "continue_final_message": True}
            case.update(render(template, messages, None, False, continue_final_message=True))
            cases.append(case)
        templates.append({"name": path.name, "cases": cases})

    llama = next(t for t in templates if t["name"] == "meta-llama-Llama-3.2-3B-Instruct.jinja")
    assert "Today Date: 05 Mar 2025" in llama["cases"][0]["expected"], "the fixed clock is not the one strftime_now reads"

    fixture = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "now": NOW.isoformat(),
        "conversations": {**CONVERSATIONS, **CONTINUATIONS},
        "tools": TOOLS,
        "templates": templates,
    }
    with open(OUT / "published.json", "w", encoding="utf-8") as file:
        json.dump(fixture, file, ensure_ascii=False, indent=1)
        file.write("\n")
    cases = [case for t in templates for case in t["cases"]]
    errors = sum("error" in case for case in cases)
    print(f"published.json: {len(templates)} templates, {len(cases)} cases, {errors} raise")


if __name__ == "__main__":
    main()
