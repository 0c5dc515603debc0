"""Writes Tests/Fixtures/chat-templates/response-templates.json: transformers' response parsing (the
`response_template` of tokenizer_config.json, `tokenizer.parse_response`, `ResponseParser` streaming) on the inputs
of a peer's own test suite, and on the fallback templates `transformers serve` uses for model types that ship none.

The peer suite is vLLM's tests/parser/test_chat_parsing.py (from PyPI's vllm 0.33.0 source package): transformers'
response-parsing tests as vLLM vendors them (cohere, ernie, gpt-oss, smollm3, qwen3, gemma4 and inkling templates,
streaming at fixed and random chunkings, prefixes, tool-argument casting, template validation). This script loads
that file with its `vllm.parser.chat_parsing` imports pointed at transformers' own `transformers.utils.chat_parsing`,
runs every test, and records each call the tests make (`parse_response`, each `ResponseParser`'s feeds and
finalize, `load_response_template`, `_coerce`, `_schema_types`) with what transformers returned or raised. vLLM's
copy has drifted a little from transformers 5.23 (its parser reports malformed regions as events and keeps going,
where transformers raises); the tests that check such vLLM-only behaviour are listed with their failure, and their
calls are still recorded with transformers' answers.

    /tmp/oracle-venv/bin/python oracle/response_templates.py [vllm-0.33.0.tar.gz]

(transformers==5.23.0; the source package is downloaded and its sha256 checked when no path is given.)
"""

import hashlib
import io
import json
import pathlib
import random
import sys
import tarfile
import types
import unittest
import urllib.request

import transformers
from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS
from transformers.utils.chat_parsing import response_parser as hf_parser
from transformers.utils.chat_parsing import response_templates as hf_templates

VLLM_URL = ("https://files.pythonhosted.org/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/"
            "vllm-0.33.0.tar.gz")
VLLM_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
TEST_MEMBER = "vllm-0.33.0/tests/parser/test_chat_parsing.py"
OUT = pathlib.Path(__file__).resolve().parent.parent / "Tests/Fixtures/chat-templates/response-templates.json"


def test_source(archive):
    if archive is None:
        data = urllib.request.urlopen(VLLM_URL).read()
    else:
        data = pathlib.Path(archive).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != VLLM_SHA256:
        sys.exit(f"vllm-0.33.0.tar.gz: unexpected sha256 {digest}")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.extractfile(TEST_MEMBER).read().decode(), digest


def plain(value):
    """A recorded value as JSON: Python's containers and scalars (tuples as lists)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, BaseException):
        return {"error": type(value).__name__, "message": str(value)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": repr(value)}
        return value
    raise TypeError(f"cannot record {type(value).__name__}")


def typed(value):
    """Like `plain`, but marks floats so that 1.0 and 1 stay apart in JSON."""
    if isinstance(value, dict):
        return {str(k): typed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    if isinstance(value, float):
        return {"float": repr(value)}
    return plain(value)


calls = []
current_test = [None]
specs = {}  # id(ResponseTemplate) -> the dict it was loaded from


def spec_of(template):
    if isinstance(template, hf_templates.ResponseTemplate):
        return specs[id(template)]
    return template


def error(exc):
    return {"error": type(exc).__name__, "message": str(exc)}


def load_response_template(spec):
    entry = {"test": current_test[0], "call": "load", "template": plain(spec_of(spec))}
    calls.append(entry)
    try:
        template = hf_templates.load_response_template(spec)
    except Exception as exc:
        entry["raised"] = error(exc)
        raise
    if not isinstance(spec, hf_templates.ResponseTemplate):
        specs[id(template)] = spec
    entry["loaded"] = True
    return template


def parse_response(text, template, *, prefix=None, tools=None):
    entry = {"test": current_test[0], "call": "parse", "template": plain(spec_of(template)), "text": text,
             "prefix": prefix, "tools": plain(tools)}
    calls.append(entry)
    try:
        result = hf_parser.parse_response(text, template, prefix=prefix, tools=tools)
    except Exception as exc:
        entry["raised"] = error(exc)
        raise
    entry["message"] = typed(result)
    return result


class ResponseParser(hf_parser.ResponseParser):
    def __init__(self, template, prefix=None, *, tools=None):
        self._entry = {"test": current_test[0], "call": "stream", "template": plain(spec_of(template)),
                       "prefix": prefix, "tools": plain(tools), "steps": []}
        calls.append(self._entry)
        try:
            super().__init__(template, prefix, tools=tools)
        except Exception as exc:
            self._entry["raised"] = error(exc)
            raise
        self._entry["initial_events"] = typed(self.initial_events)

    def feed(self, text):
        step = {"feed": text}
        self._entry["steps"].append(step)
        try:
            events = super().feed(text)
        except Exception as exc:
            step["raised"] = error(exc)
            raise
        step["events"] = typed(events)
        return events

    def finalize(self):
        step = {"finalize": True}
        self._entry["steps"].append(step)
        try:
            message, events = super().finalize()
        except Exception as exc:
            step["raised"] = error(exc)
            raise
        step["message"] = typed(message)
        step["events"] = typed(events)
        return message, events


def _coerce(raw, types_):
    result = hf_parser._coerce(raw, types_)
    calls.append({"test": current_test[0], "call": "coerce", "raw": raw, "types": list(types_), "value": typed(result)})
    return result


def _schema_types(schema):
    result = hf_parser._schema_types(schema)
    calls.append({"test": current_test[0], "call": "schema_types", "schema": plain(schema), "types": list(result)})
    return result


def install_fake_vllm():
    package = types.ModuleType("vllm.parser.chat_parsing")
    package.ResponseParser = ResponseParser
    package.parse_response = parse_response
    parser_module = types.ModuleType("vllm.parser.chat_parsing.response_parser")
    parser_module._coerce = _coerce
    parser_module._schema_types = _schema_types
    templates_module = types.ModuleType("vllm.parser.chat_parsing.response_templates")
    templates_module.load_response_template = load_response_template
    for name, module in {"vllm": types.ModuleType("vllm"), "vllm.parser": types.ModuleType("vllm.parser"),
                         "vllm.parser.chat_parsing": package,
                         "vllm.parser.chat_parsing.response_parser": parser_module,
                         "vllm.parser.chat_parsing.response_templates": templates_module}.items():
        sys.modules[name] = module


class Recorder(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = {}

    def startTest(self, test):
        super().startTest(test)
        current_test[0] = test.id().split(".", 1)[1]
        # Tests that draw random chunkings seed their own generators; this keeps anything else repeatable.
        random.seed(0)

    def addSuccess(self, test):
        self.outcomes.setdefault(current_test[0], "passed")

    def addFailure(self, test, err):
        self.outcomes[current_test[0]] = "failed: " + str(err[1]).splitlines()[0]

    def addError(self, test, err):
        self.outcomes[current_test[0]] = f"error: {type(err[1]).__name__}: {str(err[1]).splitlines()[0]}"

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self.outcomes[current_test[0]] = "failed: " + str(err[1]).splitlines()[0]


def serve_fallbacks():
    """transformers serve's templates for model types whose tokenizers ship none, each on outputs in its format."""
    outputs = {
        "qwen2": [
            ("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n",
             'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>'),
            ("<|im_start|>assistant\n", "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?<|im_end|>\n<|endoftext|>"),
            ("<|im_start|>assistant\n<think>\n", "plan first</think>\nanswer<|im_end|>"),
            ("", "Plain text without an end marker "),
            ("", 'Cut short <tool_call>\n{"name": "f", "argu'),
        ],
        "qwen3_5": [
            ("<|im_start|>assistant\n<think>\n\n</think>\n\n",
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
             "</function>\n</tool_call><|im_end|>"),
            ("<|im_start|>assistant\n<think>\n", "Thinking.\n</think>\n\nDone.<|im_end|>\n<|endoftext|>"),
        ],
        "gemma4": [
            ("<|turn>model\n", '<|channel>thought\nLook it up<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>'),
            ('<|turn>model\n<|tool_call>call:f{}<tool_call|><|tool_response>response:f{ok:true}<tool_response|>',
             "It is sunny.<turn|>"),
        ],
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    cases = []
    for model_types, template in _RESPONSE_TEMPLATE_FALLBACKS.items():
        for prefix, text in outputs[model_types[0]]:
            for with_tools in (False, True):
                entry = {"model_types": list(model_types), "template": plain(template), "prefix": prefix, "text": text,
                         "tools": tools if with_tools else None}
                try:
                    entry["message"] = typed(hf_parser.parse_response(text, template, prefix=prefix,
                                                                       tools=tools if with_tools else None))
                except Exception as exc:
                    entry["raised"] = error(exc)
                parser = hf_parser.ResponseParser(template, prefix=prefix, tools=tools if with_tools else None)
                entry["stream_initial_events"] = typed(parser.initial_events)
                steps = []
                try:
                    for i in range(0, len(text), 3):
                        steps.append({"feed": text[i:i + 3], "events": typed(parser.feed(text[i:i + 3]))})
                    message, events = parser.finalize()
                    steps.append({"finalize": True, "message": typed(message), "events": typed(events)})
                except Exception as exc:
                    steps.append({"raised": error(exc)})
                entry["stream_steps"] = steps
                cases.append(entry)
    return cases


def compact(fixture):
    """Shares each template once (`templates`, referred to by index) and writes events as short arrays:
    `["open", field]`, `["chunk", field, text, dirty]`, `["close", field, value]`; the random-chunking tests
    alone would otherwise make the file several megabytes."""
    templates, index = [], {}

    def template_ref(template):
        key = json.dumps(template, sort_keys=True)
        if key not in index:
            index[key] = len(templates)
            templates.append(template)
        return index[key]

    def events(list_):
        out = []
        for event in list_:
            kind = event["type"]
            if kind == "region_open":
                out.append(["open", event["field"]])
            elif kind == "region_chunk":
                out.append(["chunk", event["field"], event["text"], event["dirty"]])
            elif kind == "region_close":
                out.append(["close", event["field"], event["value"]])
            else:
                raise ValueError(f"unexpected event {event}")
        return out

    def entry(call):
        call = dict(call)
        if "template" in call:
            call["template"] = template_ref(call["template"])
        for key in ("initial_events", "stream_initial_events", "events"):
            if key in call:
                call[key] = events(call[key])
        for key in ("steps", "stream_steps"):
            if key in call:
                call[key] = [entry(step) for step in call[key]]
        return call

    fixture["calls"] = [entry(call) for call in fixture["calls"]]
    fixture["serve_fallbacks"] = [entry(case) for case in fixture["serve_fallbacks"]]
    fixture["templates"] = templates
    return fixture


def main():
    source, digest = test_source(sys.argv[1] if len(sys.argv) > 1 else None)
    install_fake_vllm()
    module = types.ModuleType("test_chat_parsing")
    exec(compile(source, TEST_MEMBER, "exec"), module.__dict__)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = Recorder()
    suite.run(result)
    fixture = {
        "transformers": transformers.__version__,
        "suite": {"source": "vllm-0.33.0.tar.gz " + TEST_MEMBER.split("/", 1)[1], "sha256": digest},
        "outcomes": dict(sorted(result.outcomes.items())),
        "calls": calls,
        "serve_fallbacks": serve_fallbacks(),
    }
    OUT.write_text(json.dumps(compact(fixture), ensure_ascii=False, separators=(",", ":")) + "\n")
    failed = {k: v for k, v in result.outcomes.items() if v != "passed"}
    print(f"{len(result.outcomes)} tests, {len(failed)} not passing on transformers {transformers.__version__}; "
          f"{len(calls)} calls recorded -> {OUT}")
    for name, outcome in sorted(failed.items()):
        print(f"  {name}: {outcome}")


if __name__ == "__main__":
    main()
