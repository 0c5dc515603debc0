"""OPT and GPT-2 with a KV cache kept in fp16 (llama.cpp's default, SwiftVLM's `--cache-type f16`), as transformers
computes it when its cache layers round every key and value they store to fp16 (to nearest, ties to even) and
attention reads them back as fp32, the prompt's own included (oracle/llama.py's smollm2_half_cache does the same for
SmolLM2). Reads oracle/decoders.py's checkpoints as they are.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/decoders.py:

    python oracle/half_cache_decoders.py    # → Tests/Fixtures/decoders/f16-cache.json

f16-cache.json: per case (checkpoint directory under Tests/Fixtures/decoders): the first of decoders.py's prompts,
its last position's logits with the rounding cache (`logits`), how far those move when keys and values move by 3e-7
of themselves before rounding (`rounding_sensitivity`, the largest of three draws: the spread any fp32
implementation's fp16 cache shows against this one), the greedy continuation (`new_tokens`, decoders.py's length)
with its smallest top-1/top-2 margin, and whether the fp32 cache's continuation (decoders.py's) is the same.
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoders import FIXTURES, PROMPTS  # noqa: E402
import llama  # noqa: E402

CASES = ["opt-pre", "opt-post-proj", "gpt2"]
def case_record(name, jitter):
    directory = os.path.join(FIXTURES, name)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with open(os.path.join(directory, "expected.json")) as file:
        fp32 = json.load(file)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=True).logits[0, -1]
        # The cache must be in the pass: without one, attention reads the unrounded keys and values.
        plain = model(input_ids=ids, use_cache=False).logits[0, -1]
    sensitivity = llama.rounding_sensitivity(model, ids, logits, jitter)
    moved = (logits - plain).abs().max().item()
    assert moved > 5 * sensitivity, f"{name}: the rounding moves logits by {moved}, no more than its noise {sensitivity}"
    (new,), margin = llama.greedy(model, ids, torch.ones_like(ids), None)
    single = next(g for g in fp32["generations"] if g["prompts"] == [PROMPTS[0]])
    return dict(case=name, input_ids=PROMPTS[0], logits=logits.tolist(), rounding_sensitivity=sensitivity,
                change_from_fp32=moved, new_tokens=new, min_margin=margin,
                same_as_fp32_cache=new == single["new_tokens"][0])


def main():
    torch.manual_seed(0)
    jitter = llama.round_cache_layers()
    records = [case_record(name, jitter) for name in CASES]
    for record in records:
        assert record["min_margin"] > 1e-3, f"{record['case']}: near-tie {record['min_margin']}"
        print(record["case"], "moved", f"{record['change_from_fp32']:.2e}", "sensitivity",
              f"{record['rounding_sensitivity']:.2e}", "margin", f"{record['min_margin']:.4f}",
              "same continuation as fp32:", record["same_as_fp32_cache"])
    with open(os.path.join(FIXTURES, "f16-cache.json"), "w") as file:
        json.dump(dict(max_new_tokens=llama.NEW_TOKENS, cases=records), file)


if __name__ == "__main__":
    main()
