"""Fixtures for the chat-template interpreter (Tests/Fixtures/chat-templates).

Run by hand: python oracle/chat_templates.py

models.json: real chat templates rendered by transformers' `apply_chat_template(..., tokenize=False)` with the tiny CLIP
tokenizer in Tests/Fixtures/clip (its special tokens become the bos/eos/unk/pad variables).
language.json: small templates, one Jinja feature each, rendered by the jinja2 environment transformers builds
(`_compile_jinja_template`: sandboxed, trim_blocks, lstrip_blocks, loopcontrols, its tojson/raise_exception/namespace),
with the same variables apply_chat_template passes (messages, tools=None, documents=None, add_generation_prompt).
"""

import inspect
import json
from pathlib import Path

import jinja2
from transformers import AutoTokenizer
from transformers.models.llama4 import processing_llama4
from transformers.models.smolvlm import processing_smolvlm
from transformers.utils.chat_template_utils import _compile_jinja_template

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "Tests" / "Fixtures" / "chat-templates"
TOKENIZER = ROOT / "Tests" / "Fixtures" / "clip" / "tiny-quickgelu-argmax"

# --- Real templates -------------------------------------------------------------------------------------------------

TEMPLATES = {
    # LLAVA_CHAT_TEMPLATE of TRL's examples/scripts/vsft_llava.py (trl 0.8.4) and transformers' LLaVA fine-tuning docs.
    "llava": (
        "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the user's questions. {% for message in messages %}"
        "{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
        "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] }}"
        "{% elif item['type'] == 'image' %}<image>{% endif %}{% endfor %}"
        "{% if message['role'] == 'user' %} {% else %}{{eos_token}}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
    ),
    # llava-hf/llava-1.5-7b-hf chat_template.json.
    "llava-1.5-hf": (
        "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
        "{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', "
        "'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}"
        "{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', "
        "'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] "
        "| selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}"
        "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
    ),
    # llava-hf/llava-v1.6-mistral-7b-hf chat_template.json (its '<\\s> ' is in the original).
    "llava-next-mistral": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<<SYS>>\n' + "
        "message['content'][0]['text'] + '\n<</SYS>>\n\n' }}{% elif message['role'] == 'user' %}{{ '[INST] ' }}"
        "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', "
        "'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% for content in message['content'] | "
        "selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}{{' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'][0]['text'] + '<\\\\s> '}}"
        "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
    ),
    # HuggingFaceTB/SmolLM2-*-Instruct tokenizer_config.json (ChatML).
    "smollm2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json.
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
        "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"
    ),
    # meta-llama/Llama-3.2-1B-Instruct tokenizer_config.json (tools, date_string, strftime_now).
    "llama3.2": (
        "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n"
        "{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n"
        "{%- if not date_string is defined %}\n    {%- if strftime_now is defined %}\n        {%- set date_string = "
        "strftime_now(\"%d %b %Y\") %}\n    {%- else %}\n        {%- set date_string = \"26 Jul 2024\" %}\n"
        "    {%- endif %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n"
        "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
        "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
        "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n"
        "{#- System message #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
        "{%- if tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n"
        "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
        "{%- if tools is not none and not tools_in_user_message %}\n"
        "    {{- \"You have access to the following functions. To call a function, please respond with JSON for a "
        "function call.\" }}\n    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of "
        "argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n"
        "        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n"
        "{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n"
        "{#- Custom tools are passed in a user message with some extra guidance #}\n"
        "{%- if tools_in_user_message and not tools is none %}\n"
        "    {#- Extract the first user message so we can plug it in here #}\n"
        "    {%- if messages | length != 0 %}\n        {%- set first_user_message = messages[0]['content']|trim %}\n"
        "        {%- set messages = messages[1:] %}\n    {%- else %}\n        {{- raise_exception(\"Cannot put tools "
        "in the first user message when there's no first user message!\") }}\n{%- endif %}\n"
        "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
        "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
        "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
        "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
        "value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n"
        "        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- endfor %}\n"
        "    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n{%- for message in messages %}\n"
        "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
        "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
        "'<|eot_id|>' }}\n    {%- elif 'tool_calls' in message %}\n"
        "        {%- if not message.tool_calls|length == 1 %}\n            {{- raise_exception(\"This model only "
        "supports single tool-calls at once!\") }}\n        {%- endif %}\n"
        "        {%- set tool_call = message.tool_calls[0].function %}\n"
        "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
        "        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n        {{- '\"parameters\": ' }}\n"
        "        {{- tool_call.arguments | tojson }}\n        {{- \"}\" }}\n        {{- \"<|eot_id|>\" }}\n"
        "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
        "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
        "        {%- if message.content is mapping or message.content is iterable %}\n"
        "            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n"
        "        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n"
    ),
    # transformers' models/llama4/processing_llama4.py, verbatim.
    "llama4": processing_llama4.chat_template,
    # Qwen/Qwen2-VL-7B-Instruct chat_template.json.
    "qwen2-vl": (
        "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
        "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
        "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
        "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or "
        "'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
        "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
        "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
        "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    # HuggingFaceM4/Idefics3-8B-Llama3 tokenizer_config.json.
    "idefics3": (
        "<|begin_of_text|>{% for message in messages %}{{message['role'] | capitalize}}"
        "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
        "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
        "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    ),
    # transformers' models/smolvlm/processing_smolvlm.py DEFAULT_CHAT_TEMPLATE, verbatim.
    "smolvlm": processing_smolvlm.DEFAULT_CHAT_TEMPLATE,
}


def text(t):
    return {"type": "text", "text": t}


IMAGE = {"type": "image"}

# Conversations with list-of-parts content; `as_strings` below turns them into string content for text-only templates.
CONVERSATIONS = [
    [{"role": "user", "content": [text("What is shown in this picture?")]}],
    [{"role": "user", "content": [IMAGE, text("Describe the image.")]}],
    [
        {"role": "system", "content": [text("You are a careful visual assistant.")]},
        {"role": "user", "content": [IMAGE, text("What animal is this?")]},
        {"role": "assistant", "content": [text("It is a cat.")]},
        {"role": "user", "content": [text("What colour is it?")]},
    ],
    [{"role": "user", "content": [text("Compare the first image"), IMAGE, text("with the second"), IMAGE]}],
    [{"role": "user", "content": [IMAGE, IMAGE, text("Which one is a rocket?")]}],
    [{"role": "user", "content": [text("")]}, {"role": "assistant", "content": [text("")]}],
    [
        {"role": "user", "content": [text("Hi")]},
        {"role": "assistant", "content": [text("Hello! How can I help?")]},
        {"role": "user", "content": [IMAGE, text("Count the coffee cups.")]},
        {"role": "assistant", "content": [text("There is one cup.")]},
        {"role": "user", "content": [text("Thanks.")]},
    ],
    [{"role": "user", "content": [text("héllo — 你好 👋 \"quotes\" 'single' \\ backslash\nnew line\ttab")]}],
    [{"role": "user", "content": [text("  padded text with spaces  \n\n")]}, {"role": "assistant", "content": [text("\tok ")]}],
    [{"role": "system", "content": [text("System only.")]}],
    [{"role": "user", "content": [IMAGE]}],
    [
        {"role": "user", "content": [text("Look"), IMAGE], "name": None},
        {"role": "assistant", "content": [text("Seen.")], "tool_calls": None},
    ],
    [{"role": "tool", "content": [text("tool output")]}],
]


def as_strings(conversation):
    result = []
    for message in conversation:
        parts = message["content"]
        content = "".join(p["text"] for p in parts if p["type"] == "text")
        result.append({**message, "content": content})
    return result


LLAMA_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather at a place — in °C.",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string", "description": "City, e.g. \"Paris\""},
                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["location"],
            },
        },
    }
]

TOOL_CONVERSATION = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "content": {"temperature": 21.5, "sky": "clear"}},
    {"role": "tool", "content": "plain text result"},
    {"role": "assistant", "content": "It is 21.5 °C and clear."},
]

# Which conversation forms each template takes: "parts", "strings" or both.
FORMS = {
    "llava": ["parts"], "llava-1.5-hf": ["parts"], "llava-next-mistral": ["parts"], "smollm2": ["strings"],
    "llama3": ["strings"], "llama3.2": ["strings"], "llama4": ["parts", "strings"], "qwen2-vl": ["parts", "strings"],
    "idefics3": ["parts"], "smolvlm": ["parts"],
}


def render_case(tokenizer, template, messages, add_generation_prompt, extra):
    case = {"messages": messages, "add_generation_prompt": add_generation_prompt, "extra": extra}
    kwargs = dict(extra)
    tools = kwargs.pop("tools", None)
    try:
        case["expected"] = tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
            tools=tools, **kwargs)
    except jinja2.exceptions.TemplateError as error:
        case["raised"] = str(error)
    return case


def model_fixtures():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    specials = dict(tokenizer.special_tokens_map)
    models = []
    for name, template in TEMPLATES.items():
        cases = []
        for form in FORMS[name]:
            for conversation in CONVERSATIONS:
                messages = conversation if form == "parts" else as_strings(conversation)
                extra = {"date_string": "05 Mar 2025"} if name in ("llama3.2", "llama4") else {}
                if name == "qwen2-vl" and len(cases) % 4 == 2:
                    extra = {"add_vision_id": True}
                for add_generation_prompt in (False, True):
                    cases.append(render_case(tokenizer, template, messages, add_generation_prompt, extra))
        if name in ("llama3.2", "llama4"):
            for extra in ({"date_string": "05 Mar 2025", "tools": LLAMA_TOOLS},
                          {"date_string": "05 Mar 2025", "tools": LLAMA_TOOLS, "tools_in_user_message": False}):
                for add_generation_prompt in (False, True):
                    cases.append(render_case(tokenizer, template, TOOL_CONVERSATION[:1] + TOOL_CONVERSATION[1:],
                                             add_generation_prompt, extra))
        models.append({"name": name, "template": template, "special_tokens": specials, "cases": cases})
    return models


# --- The language, one feature at a time --------------------------------------------------------------------------

D = {"messages_like": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
     "d": {"b": 2, "a": 1, "items": "key named items", "nested": {"x": [1, 2, {"y": "deep"}]}},
     "xs": [3, 1, 2], "words": ["banana", "Apple", "cherry", "apple"], "s": "  Hello, World  ", "n": 7, "f": 2.5,
     "e": "", "z": 0, "t": True, "none_value": None, "u": "héllo wörld ß ǅ"}

LANGUAGE = [
    # Whitespace control.
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nend", {}),
    ("lstrip_blocks", "  {% if true %}\n  body\n  {% endif %}\nafter", {}),
    ("lstrip_not_variables", "  {{ 'x' }}\n  {% if true %}y{% endif %}", {}),
    ("dash_strips", "a   \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n\n  c", {}),
    ("plus_keeps", "  {%+ if true %}x{% endif +%}\nz", {}),
    ("variable_dash", "a \n {{- 'b' -}} \n c", {}),
    ("comment_trim", "a\n  {# comment #}\nb {#- c -#} d", {}),
    ("trailing_newline_dropped", "line\n", {}),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}!", {}),
    ("lstrip_mid_line", "text {% if true %}x{% endif %}", {}),
    # Literals and printing.
    ("literals", "{{ none }}|{{ None }}|{{ true }}|{{ False }}|{{ 1 }}|{{ 1.0 }}|{{ 1.50 }}|{{ 1e3 }}|{{ 1_000 }}|{{ 0x1F }}", {}),
    ("float_printing", "{{ 10 / 2 }}|{{ 1 / 3 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ -0.0 }}|{{ 2 ** -1 }}|{{ 1e100 }}", {}),
    ("containers_print", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}|{{ (1,) }}|{{ (1, 2) }}|{{ {} }}|{{ [] }}", {}),
    ("string_escapes", "{{ 'a\\nb\\t\\'c\\' \\\\ \\x41\\u00e9\\U0001F600 \\q' }}|{{ \"dq \\\"x\\\"\" }}|{{ 'con' 'cat' }}", {}),
    ("repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\t', 'nl\\n'] }}", {}),
    # Arithmetic and operators.
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2.0 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ true + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ not true or true }} {{ 1 ~ 2 * 3 }}", {}),
    ("concat_binds_tighter_than_plus", "{{ 1 ~ 2 + 3 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ 2.0 ~ undefined_name ~ [1] }}", {}),
    ("comparisons", "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 2 }} {{ 'abc' >= 'abd' }} {{ true == 1 }}", {}),
    ("in_operator", "{{ 'ell' in 'hello' }} {{ 2 in xs }} {{ 'a' in d }} {{ 'zz' not in d }} {{ 'x' in undefined_name }}", {}),
    ("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }} {{ '' and 1 }}", {}),
    ("conditional_expression", "{{ 'yes' if n > 5 else 'no' }}|{{ 'yes' if n > 50 }}|{{ 'a' if false else 'b' if true else 'c' }}", {}),
    ("truthiness", "{% for v in [0, 0.0, '', [], {}, none, 'x', [0], 1, -1] %}{{ 'T' if v else 'F' }}{% endfor %}", {}),
    # Access.
    ("indexing", "{{ xs[0] }} {{ xs[-1] }} {{ d['a'] }} {{ d.b }} {{ d.nested.x[2].y }} {{ 'abc'[1] }} {{ xs.1 }} {{ d['items'] }}", {}),
    ("slicing", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ 'hello'[1:4] }} {{ 'hello'[::2] }} {{ xs[5:] }} {{ 'héllo'[-3:] }}", {}),
    ("undefined_attribute", "[{{ d.missing }}][{{ xs[10] }}][{{ undefined_name }}]", {}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys() | list }}|{{ d.get('a') }}|{{ d.get('zz', 'dflt') }}|{{ d.get('zz') }}", {}),
    ("iterate_dict", "{% for k in d %}{{ k }},{% endfor %}", {}),
    ("iterate_string", "{% for c in 'héy' %}[{{ c }}]{% endfor %}", {}),
    # Statements.
    ("for_loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}", {}),
    ("loop_cycle_depth", "{% for x in xs %}{{ loop.cycle('odd', 'even') }}{{ loop.depth }}{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in xs if x > 5 %}{{ x }}{% else %}none matched{% endfor %}", {}),
    ("for_filter", "{% for x in xs if x != 1 %}{{ x }}{{ loop.length }}{% endfor %}", {}),
    ("for_unpack", "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}{% for k, v in {'p': 1}.items() %}{{ k }}{{ v }}{% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("scoping", "{% set y = 1 %}{% for i in range(3) %}{{ y }}{% set y = i * 10 %}{{ y }}|{% endfor %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% if x == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    ("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("set_block", "{% set block %}  inner {{ n }}  {% endset %}[{{ block }}]{% set up | upper %}shout{% endset %}{{ up }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }} {{ greet(name='Cy') }}", {}),
    ("macro_recursion", "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %}", {}),
    ("macro_outer_variable", "{% macro m() %}{{ later }}{% endmacro %}{% set later = 'seen' %}{{ m() }}", {}),
    ("filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("generation_block", "{% for m in messages_like %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}", {}),
    ("recursive_loop", "{% for item in [{'n': 'a', 'c': [{'n': 'b', 'c': []}]}] recursive %}{{ item.n }}{{ loop.depth }}({{ loop(item.c) }}){% endfor %}", {}),
    # Tests.
    ("tests", "{{ undefined_name is defined }} {{ n is defined }} {{ none_value is none }} {{ 'x' is string }} {{ d is mapping }} {{ xs is iterable }} {{ 'x' is iterable }} {{ n is number }} {{ f is number }} {{ xs is sequence }} {{ t is boolean }} {{ n is integer }} {{ f is float }} {{ 1 is boolean }}", {}),
    ("tests_args", "{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'a' is equalto 'a' }} {{ 2 is eq 3 }} {{ 2 is in xs }} {{ n is not none }} {{ undefined_name is undefined }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 3 is gt 2 }} {{ 3 is le 2 }}", {}),
    # Filters.
    ("string_filters", "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello wORLD-foo (bar' | title }}|{{ 'hELLO world' | capitalize }}|{{ s | length }}|{{ 'x.y' | trim('x.') }}|{{ u | upper }}|{{ u | title }}", {}),
    ("default_filter", "{{ undefined_name | default('d') }}|{{ e | default('d') }}|{{ e | default('d', true) }}|{{ undefined_name | d('dd') }}|{{ none_value | default('x') }}", {}),
    ("join_map", "{{ xs | join(', ') }}|{{ messages_like | map(attribute='role') | join('+') }}|{{ xs | map('string') | list }}|{{ [1, 2] | join }}|{{ messages_like | join(', ', attribute='content') }}", {}),
    ("select_reject", "{{ xs | select('odd') | list }}|{{ xs | reject('odd') | list }}|{{ messages_like | selectattr('role', 'equalto', 'user') | list }}|{{ messages_like | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}|{{ [0, 1, '', 'a'] | select | list }}", {}),
    ("filters_on_falsy_values", "{{ none_value | selectattr('type', 'equalto', 'x') | list }}|{{ undefined_name | map('upper') | list }}|{{ 0 | select | list }}|{{ e | reject('odd') | list }}|{{ none_value | rejectattr('a') | list }}|{{ undefined_name | map(attribute='a') | list }}|{{ none_value | selectattr('type') | list | length > 0 }}", {}),
    ("first_last_list", "{{ xs | first }} {{ xs | last }} {{ 'abc' | list }} {{ 'abc' | first }} {{ [] | first }}", {}),
    ("numeric_filters", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ '3.5' | float }} {{ 3 | float }} {{ -3 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ xs | sum }} {{ xs | max }} {{ xs | min }}", {}),
    ("replace_filter", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc' | replace('', '-') }}", {}),
    ("sort_unique", "{{ xs | sort }} {{ xs | sort(reverse=true) }} {{ words | sort }} {{ words | sort(case_sensitive=true) }} {{ words | unique | list }} {{ messages_like | sort(attribute='role', reverse=true) | map(attribute='role') | join }}", {}),
    ("items_dictsort", "{{ d | dictsort | map('first') | join(',') }}|{% for k, v in {'b': 1, 'a': 2} | items %}{{ k }}{{ v }}{% endfor %}|{{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}", {}),
    ("indent_filter", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}", {}),
    ("string_and_list_filters", "{{ xs | string }}|{{ xs | reverse | list }}|{{ 'abc' | reverse }}|{{ xs | length }}|{{ d | count }}|{{ 'a b  c' | wordcount }}|{{ '<a href=\"x\">&</a>' | e }}|{{ '<b>' | safe }}|{{ xs | batch(2) | list }}|{{ 'abc' | center(9) }}", {}),
    ("tojson", "{{ d | tojson }}|{{ 'héllo \"q\" \\n <tag> & \\u2028' | tojson }}|{{ [1, 2.0, none, true] | tojson }}|{{ {} | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}", {}),
    ("tojson_indent", "{{ d | tojson(indent=2) }}|{{ [[], {}, [1]] | tojson(indent=4) }}|{{ d | tojson(separators=(',', ':'), sort_keys=true) }}|{{ xs | tojson(indent='\\t') }}", {}),
    # Generators: map, select, reject, selectattr, rejectattr, items, unique and batch are lazy and one-pass.
    ("generator_one_pass", "{% set g = xs | select('odd') %}{{ g | list }}{{ g | list }}|{% set g = xs | map('string') %}{{ g | first }}{{ g | join(',') }}|{% set g = xs | reject('odd') %}{{ 2 in g }}{{ g | list }}", {}),
    ("generator_loop", "{% set g = xs | select %}{% for x in g %}{{ x }}{% break %}{% endfor %}{{ g | list }}|{% for x in xs | select if x > 1 %}{{ x }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{% endfor %}", {}),
    ("generator_observed", "{{ xs | select is iterable }} {{ xs | select is sequence }} {{ 'T' if [] | select else 'F' }} {{ (xs | map('string') | string)[:27] }} {{ (xs | selectattr('x') ~ '')[:34] }} {{ (d | items | string)[:26] }} {{ (xs | unique | string)[:32] }} {{ xs | batch(2) | list }} {{ xs | batch(0) | list }} {{ xs | batch(2, 0) | list }}", {}),
    ("generator_lazy_errors", "{% set g = xs | map('no_such_filter') %}{% set h = 1 | items %}{% set k = xs | selectattr %}ok", {}),
    ("generator_no_length", "{{ xs | select | length }}", {}),
    ("generator_not_json", "{{ messages_like | map(attribute='role') | tojson }}", {}),
    ("generator_not_reversible", "{{ xs | select | last }}", {}),
    # Markup, from safe and escape: its + and methods HTML-escape their plain operands; ~ and join build plain strings.
    ("markup_concat", "{{ '<a>' | safe + '<b>\"&\\'' }}|{{ '<b>' + '<a>' | safe }}|{{ ('<a>' | safe + '<b>') + '<c>' }}|{{ '<a>' | safe ~ '<b>' }}|{{ ('<a>' | safe + '<b>') ~ '<c>' }}|{{ '<a>' | safe ~ [1, '<'] }}|{{ '<a>' | safe * 2 + '<' }}", {}),
    ("markup_propagates", "{{ '<a>' | safe | string + '<' }}|{{ '<a>' | safe | upper + '<' }}|{{ ('<a>' | safe)[0] + '<' }}|{{ ('<a>' | safe)[1:] + '<' }}|{{ ('<a>' | safe).strip() + '<' }}|{{ ('<a> <b>' | safe).split() }}|{{ ['<a>' | safe] }}|{{ '<a>' | safe | trim + '<' }}|{{ '<a>' | safe | title + '<' }}|{{ '<a>' | safe | replace('a', 'b') + '<' }}|{{ '<a>' | safe | center(5) + '<' }}|{{ '<a>' | safe | reverse + '<' }}", {}),
    ("markup_format_join", "{{ ('{}<' | safe).format('<b>') }}|{{ ('<' | safe).join(['<a>', '<b>' | safe, 1]) }}|{{ ['<a>' | safe, '<b>'] | join('<') }}|{{ ['<a>', '<b>'] | join('<' | safe) + '<' }}|{{ '{}<'.format('<b>' | safe) + '<' }}|{{ ('a-b' | safe).replace('-', '<') }}|{{ '-'.join(['<a>' | safe]) + '<' }}", {}),
    ("markup_escape", "{{ '<a>' | e }}|{{ '<a>' | e + '<b>' }}|{{ '<a>' | escape | escape }}|{{ '<a>' | safe | e }}|{{ '<a>' | safe | forceescape }}|{{ none | e }}|{{ 1 | safe + '<' }}|{{ '<a>' | safe is escaped }} {{ '<a>' is escaped }} {{ '<a>' | safe is string }} {{ '<a>' | safe == '<a>' }} {{ '<a>' | safe | length }} {{ ('<a>' | safe) in 'x<a>' }} {{ '<a>' | safe | tojson }}|{{ '<a>' | safe | list }}|{{ '<a>' | safe | first + '<' }}", {}),
    ("markup_printed_plain", "{% set m = '<a>' | safe %}{{ m }}{{ '<b>' }}{% for c in m %}{{ c + '&' }}{% endfor %}{% macro k() %}<i>{% endmacro %}{{ k() + '<' }}{% set b %}<p>{% endset %}{{ b + '<' }}", {}),
    ("markup_plus_int", "{{ '<a>' | safe + 1 }}", {}),
    # Methods on strings.
    ("string_methods", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ 'a,b,,c'.split(',') }}][{{ ' a  b '.split() }}][{{ 'a b c'.split(' ', 1) }}][{{ 'a b c'.rsplit(' ', 1) }}]", {}),
    ("string_methods_2", "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'hello world'.title() }} {{ \"they're bill's\".title() }} {{ 'aXb'.replace('X', '-') }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'banana'.count('an') }} {{ '-'.join(['a', 'b']) }} {{ 'x\\ny'.splitlines() }} {{ '{} and {name}'.format(1, name='n') }} {{ '123'.isdigit() }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'hello'.capitalize() }}", {}),
    ("builtins", "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ namespace(a=1).a }}", {}),
    # transformers' additions and error paths.
    ("raise_exception", "{% if n > 5 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}", {}),
    ("strftime_defined", "{{ strftime_now is defined }} {{ strftime_now('%Y') | length }}", {}),
    ("undefined_attribute_of_undefined", "{{ undefined_name.attr }}", {}),
    ("undefined_arithmetic", "{{ undefined_name + 1 }}", {}),
    ("type_error", "{{ 'a' + 1 }}", {}),
    ("unsafe_method", "{{ xs.append(4) }}", {}),
    ("unsafe_method_printed", "[{{ xs.append }}]", {}),
    ("namespace_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}", {}),
    ("range_too_big", "{{ range(1000000) | length }}", {}),
    ("syntax_unclosed_block", "{% if true %}never closed", {}),
    ("syntax_unknown_tag", "line one\n{% frobnicate %}", {}),
    ("syntax_bad_expression", "{{ 1 + }}", {}),
    ("syntax_unclosed_variable", "text {{ x ", {}),
    ("syntax_unclosed_comment", "{# never", {}),
    ("syntax_mismatched_end", "{% for x in xs %}{% endif %}", {}),
]


def language_fixtures():
    cases = []
    for name, source, context in LANGUAGE:
        variables = {**D, **context}
        case = {"name": name, "template": source, "context": variables}
        try:
            compiled = _compile_jinja_template(source)
        except jinja2.exceptions.TemplateSyntaxError as error:
            case["error"] = "syntax"
            case["line"] = error.lineno
            cases.append(case)
            continue
        try:
            case["expected"] = compiled.render(messages=[], tools=None, documents=None, add_generation_prompt=False, **variables)
            if name == "strftime_defined":
                assert case["expected"] == "True 4", case["expected"]
        except jinja2.exceptions.TemplateError as error:
            # raise_exception raises the base TemplateError; jinja2's own errors are its subclasses.
            case["error"] = "raised" if type(error) is jinja2.exceptions.TemplateError else "render"
            case["message"] = str(error)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError) as error:
            case["error"] = "render"
            case["message"] = str(error)
        cases.append(case)
    return cases


def cli_fixture():
    """A tokenizer directory with SmolLM2's ChatML template as chat_template.jinja, for `vlm tokenize --chat`."""
    out = OUT / "cli"
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.save_pretrained(out)
    (out / "chat_template.jinja").write_text(TEMPLATES["smollm2"], encoding="utf-8")
    messages = [{"role": "user", "content": "What is in this photo?"},
                {"role": "assistant", "content": "A cat, lying on a rug."},
                {"role": "user", "content": "Ünïcödé: and its colour?"}]
    (out / "messages.json").write_text(json.dumps(messages, ensure_ascii=False, indent=1), encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    with open(out / "expected.json", "w", encoding="utf-8") as file:
        json.dump({"text": text, "ids": ids}, file, ensure_ascii=False)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    cli_fixture()
    for filename, data in (("models.json", model_fixtures()), ("language.json", language_fixtures())):
        with open(OUT / filename, "w", encoding="utf-8") as file:
            json.dump(data, file, ensure_ascii=False, indent=1)
            file.write("\n")
        print(filename, (OUT / filename).stat().st_size, "bytes")


if __name__ == "__main__":
    main()
