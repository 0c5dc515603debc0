"""Generation fixtures: transformers' logits processors, beam search and stop strings on the tiny Llama checkpoints.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/llama.py:

    python oracle/generation.py

Writes Tests/Fixtures/generation/:
- processors.json: fixed random logits and sequences through the processor list `generate` builds
  (`_get_logits_processor`) for several generation configs; -inf is written as null.
- beam.json: beam search (`num_beams`, `length_penalty`, `early_stopping`, several eos ids, `num_return_sequences`)
  on the tiny Llama cases, with each returned sequence's new tokens and its `sequences_scores`.
- stop_strings.json: greedy generation on gqa-untied stopped by a stop string, decoded with the real SmolLM2
  tokenizer (its first 160 ids are bytes and short merges, so the tiny model's tokens decode to text).
"""
import json
import math
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(ROOT, "Tests", "Fixtures", "llama")
OUT = os.path.join(ROOT, "Tests", "Fixtures", "generation")
SMOLLM2_TOKENIZER = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "smollm2")
PROMPTS = [[1, 17, 45, 99, 3, 150, 12], [1, 8], [1, 60, 61, 62, 5]]


def finite_or_none(values):
    return [None if math.isinf(v) and v < 0 else v for v in values]


def left_pad(prompts, pad=0):
    length = max(map(len, prompts))
    ids = [[pad] * (length - len(p)) + p for p in prompts]
    mask = [[0] * (length - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def load(case):
    return AutoModelForCausalLM.from_pretrained(os.path.join(LLAMA, case), dtype=torch.float32).eval()


PROCESSOR_CASES = [
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.7),
    dict(min_new_tokens=5, eos_token_id=[3, 7]),
    dict(min_length=13, eos_token_id=4),
    dict(do_sample=True, temperature=0.7, top_k=0),
    dict(do_sample=True, top_k=5),
    dict(do_sample=True, top_k=0, top_p=0.8),
    dict(do_sample=True, top_k=0, min_p=0.1),
    dict(do_sample=True, temperature=0.6, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.2, min_new_tokens=5,
         eos_token_id=[3]),
    # Beam sampling keeps (eos count + 1) tokens in every warper.
    dict(do_sample=True, num_beams=2, top_k=1, top_p=0.1, min_p=0.9, eos_token_id=[3, 7]),
    # Without do_sample the warpers are not applied at all.
    dict(temperature=0.5, top_k=3, top_p=0.5),
]


def processors(model):
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt_length, total = 9, 12
    ids = torch.randint(0, 40, (3, total), generator=generator)
    mask = torch.ones(3, prompt_length, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :5] = 0
    ids[1, :3] = 0
    ids[2, :5] = 0
    scores = torch.randn(3, vocab, generator=generator) * 3
    cases = []
    for settings in PROCESSOR_CASES:
        config = GenerationConfig(**settings)
        config, _ = model._prepare_generation_config(config)
        model._prepare_special_tokens(config, False, device="cpu")
        chain = model._get_logits_processor(
            generation_config=config, input_ids_seq_length=prompt_length, encoder_input_ids=ids[:, :prompt_length],
            prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(), device="cpu",
            model_kwargs={"attention_mask": mask})
        processed = chain(ids, scores.clone())
        cases.append(dict(config=settings, processors=[type(p).__name__ for p in chain],
                          processed=[finite_or_none(row) for row in processed.tolist()]))
        print(settings, cases[-1]["processors"])
    return dict(prompt_length=prompt_length, input_ids=ids.tolist(), attention_mask=mask.tolist(),
                scores=scores.tolist(), cases=cases)


BEAM_CASES = [
    dict(num_beams=3, num_return_sequences=2, max_new_tokens=8),
    dict(num_beams=4, num_return_sequences=3, max_new_tokens=10, early_stopping=True, length_penalty=0.5),
    dict(num_beams=2, max_new_tokens=9, early_stopping="never", length_penalty=2.0, repetition_penalty=1.2),
    dict(num_beams=3, num_return_sequences=3, max_new_tokens=7, early_stopping="never", length_penalty=-1.0,
         min_new_tokens=3),
]


def greedy_tokens(model, ids, mask, count):
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=count, do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def beams(case):
    model = load(case)
    ids, mask = left_pad(PROMPTS)
    probe = greedy_tokens(model, ids, mask, 6)
    # Eos ids the beams actually produce, so that beams finish early as well as at max length.
    eos = sorted({probe[0][2], probe[1][3], probe[2][1]})
    results = []
    for settings in BEAM_CASES:
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, eos_token_id=eos, pad_token_id=0,
                             return_dict_in_generate=True, output_scores=True, **settings)
        lengths = (out.beam_indices != -1).sum(-1).tolist()
        sequences = [row[ids.shape[1]:ids.shape[1] + n] for row, n in zip(out.sequences.tolist(), lengths)]
        results.append(dict(config=dict(settings, eos_token_id=eos), sequences=sequences,
                            scores=out.sequences_scores.tolist()))
        print(case, settings, [len(s) for s in sequences], out.sequences_scores.tolist())
    return dict(prompts=PROMPTS, cases=results)


def stop_strings():
    model = load("gqa-untied")
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_TOKENIZER)
    prompt = torch.tensor([PROMPTS[0]])
    free = greedy_tokens(model, prompt, torch.ones_like(prompt), 20)[0]
    # A two-character stop string of printable ASCII that straddles a boundary between new tokens.
    def printable(text):
        return text != "" and text.isascii() and text.isprintable()
    for split in range(3, 15):
        before, after = tokenizer.decode(free[:split]), tokenizer.decode(free[:split + 1])
        stop = before[-1:] + after[len(before):][:1]
        if len(stop) == 2 and printable(stop) and stop not in before:
            break
    else:
        raise AssertionError(tokenizer.decode(free))
    out = model.generate(input_ids=prompt, max_new_tokens=20, do_sample=False, pad_token_id=0, stop_strings=[stop, "never here"],
                         tokenizer=tokenizer)
    new = out[0, prompt.shape[1]:].tolist()
    print("stop", repr(stop), len(free), len(new), repr(tokenizer.decode(new)))
    assert len(new) < len(free)
    return dict(prompt=PROMPTS[0], stop_strings=[stop, "never here"], max_new_tokens=20, unstopped=free, new_tokens=new)


def main():
    os.makedirs(OUT, exist_ok=True)
    json.dump(processors(load("gqa-untied")), open(os.path.join(OUT, "processors.json"), "w"))
    json.dump({case: beams(case) for case in ["gqa-untied", "llama3-tied"]}, open(os.path.join(OUT, "beam.json"), "w"))
    json.dump(stop_strings(), open(os.path.join(OUT, "stop_strings.json"), "w"))


if __name__ == "__main__":
    main()
