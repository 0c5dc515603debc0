"""T5 fixtures: tiny random-init T5ForConditionalGeneration checkpoints and what transformers computes with them.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/t5.py [CASE...]    # → Tests/Fixtures/t5/<case>/ (every case without arguments)

Each case directory is a checkpoint SwiftVLM loads as is (config.json + model.safetensors with fp16 weights, to keep
the fixtures small; transformers computes in fp32 from the same rounded weights) plus expected.json:

- "buckets": `_relative_position_bucket` for relative positions -300...300, bidirectional (encoder) and causal
  (decoder), with this case's bucket count and maximum distance and with T5's defaults (32, 128);
- "encoder": two prompts of different lengths (ids from the T5-style Unigram tokenizer in
  Tests/Fixtures/tokenizers/t5-style, right-padded with pad_token_id as T5's tokenizer pads) and the encoder's
  last_hidden_state at every position, padding included;
- "decoder": teacher-forced logits for decoder_input_ids over that encoder batch;
- "embeds": logits when the encoder takes inputs_embeds (BLIP-2 feeds it image features that way);
- "generations": greedy continuations from `generate` (do_sample=False) with the smallest top-1/top-2 logit margin
  seen, so that a near-tie cannot make a test flaky (a checkpoint with a near-tie, whose continuations cycle through
  fewer than 4 tokens, or whose fp32 logits differ from fp64 ones by more than 2e-5 is redrawn with the next seed); `new_tokens` are `sequences` without the leading
  decoder_start_token_id, cut after the first eos;
- "beam": beam search (num_beams=3, num_return_sequences=3) for two length penalties: `sequences` (starting with
  decoder_start_token_id, padded with pad_token_id after eos) and `sequences_scores`.

Cases:
- "flan-t5": T5 v1.1 / Flan-T5's shape: gated-gelu MLP, an lm_head of its own (stored as `lm_head.weight`, config.json
  with tie_word_embeddings false and no scale_decoder_outputs, as Flan-T5 checkpoints on the Hub are), so decoder
  outputs are not rescaled; T5's default 32 buckets up to distance 128.
- "t5": the original T5's shape: ReLU MLP, lm_head tied to the shared embedding with decoder outputs scaled by
  d_model**-0.5 (config.json as transformers 5.23 saves it: tie_word_embeddings and scale_decoder_outputs true), a
  decoder deeper than the encoder, heads·d_kv narrower than d_model, and 8 buckets up to distance 12 so that short
  sequences reach the logarithmic and the clamped buckets. Its continuations are generated without a cache:
  transformers 5.23's generate sizes the decoder's cache by num_layers and fails on a deeper decoder.
"""
import copy
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import T5Config, T5ForConditionalGeneration
from transformers.models.t5.modeling_t5 import T5Attention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "t5")
TOKENIZER = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "t5-style", "tokenizer.json")

# The T5-style tokenizer: <unk> 0, <s> 1, </s> 2 in a vocabulary of 800. T5 pads with 0 and starts decoding from it.
VOCAB = 800
PAD = 0
EOS = 2
BASE = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, pad_token_id=PAD,
            eos_token_id=EOS, decoder_start_token_id=PAD)
# Value, output and MLP weights are multiplied by this after transformers' initialization, so that the context, not
# just the last token, decides the next one (continuations would otherwise repeat one token), while the query-key
# products, which T5 does not scale, stay small enough for fp32 to agree with fp64 to about 1e-5.
AMPLIFIED = (".v.", ".o.", "DenseReluDense")
AMPLIFICATION = 3.0

CASES = {
    "flan-t5": dict(BASE, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    "t5": dict(BASE, d_kv=6, num_decoder_layers=3, feed_forward_proj="relu", relative_attention_num_buckets=8,
               relative_attention_max_distance=12),
}

TEXTS = ["Translate to German: the house is wonderful.", "The cat sat."]
DECODER_INPUTS = [[PAD, 5, 17, 99, 3, 150], [PAD, 44, 8, 9, 310, 12]]
NEW_TOKENS = 12
BEAM_TOKENS = 10
BEAM_SETTINGS = [dict(length_penalty=1.0, early_stopping=True), dict(length_penalty=0.5, early_stopping=False)]


def compact(values):
    # 7 significant digits: far below the 1e-4 tolerance, a third of the JSON of full float reprs.
    return [float(f"{v:.7g}") for v in values]


def rounded(tensor):
    # Inputs stored in expected.json are the compact values the oracle computed with.
    return torch.tensor(compact(tensor.flatten().tolist())).view(tensor.shape)


def encoder_batch():
    tokenizer = Tokenizer.from_file(TOKENIZER)
    prompts = [tokenizer.encode(text).ids for text in TEXTS]
    length = max(map(len, prompts))
    ids = [p + [PAD] * (length - len(p)) for p in prompts]
    mask = [[1] * len(p) + [0] * (length - len(p)) for p in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def buckets(num_buckets, max_distance):
    relative = torch.arange(-300, 301)
    return {
        "num_buckets": num_buckets, "max_distance": max_distance,
        "bidirectional": T5Attention._relative_position_bucket(relative, True, num_buckets, max_distance).tolist(),
        "causal": T5Attention._relative_position_bucket(relative, False, num_buckets, max_distance).tolist(),
    }


def uses_cache(model):
    # transformers 5.23's generate sizes the decoder's cache by num_layers, which fails for a decoder of another
    # depth; without a cache each step recomputes the whole decoder sequence, the same numbers.
    return model.config.num_decoder_layers == model.config.num_layers


def greedy(model, ids, mask, eos):
    """Greedy continuations without the decoder start token, cut after their first eos, and the smallest
    top-1/top-2 margin of the rows still going."""
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=eos, pad_token_id=PAD, output_logits=True, return_dict_in_generate=True,
                         use_cache=uses_cache(model))
    new = out.sequences[:, 1:].tolist()
    margins = []
    for step, logits in enumerate(out.logits):
        top = logits.topk(2, dim=-1).values
        for row in range(ids.shape[0]):
            if not any(t in eos for t in new[row][:step]):
                margins.append((top[row, 0] - top[row, 1]).item())
    rows = []
    for row in new:
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows, min(margins)


class Redraw(Exception):
    """A checkpoint that would make a weak or flaky test."""


def save_checkpoint(name, model, settings):
    """Writes the fp16 checkpoint; the untied case as Flan-T5 is on the Hub: its own lm_head.weight, and config.json
    with tie_word_embeddings false and no scale_decoder_outputs (which transformers 5.23 derives from it)."""
    directory = os.path.join(FIXTURES, name)
    shutil.rmtree(directory, ignore_errors=True)
    model.half().save_pretrained(directory)
    if settings.get("tie_word_embeddings", True) is False:
        path = os.path.join(directory, "model.safetensors")
        weights = load_file(path)
        weights["lm_head.weight"] = torch.randn(weights["shared.weight"].shape).half()
        save_file(weights, path, metadata={"format": "pt"})
        config_path = os.path.join(directory, "config.json")
        config = json.load(open(config_path))
        config.pop("scale_decoder_outputs")
        config["tie_word_embeddings"] = False
        json.dump(config, open(config_path, "w"), indent=2)
    model = T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    untied = model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()
    assert untied == (settings.get("tie_word_embeddings", True) is False), name
    assert model.config.scale_decoder_outputs == (not untied), name
    return directory, model


def check_conditioning(model):
    """Redraws a checkpoint whose fp32 logits stray from fp64 ones by more than 2e-5: a test tolerance of 1e-4 must
    be far above what fp32 rounding alone can cause."""
    ids, mask = encoder_batch()
    decoder_ids = torch.tensor(DECODER_INPUTS)
    with torch.no_grad():
        single = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        double = copy.deepcopy(model).double()(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    if (single.double() - double).abs().max().item() > 2e-5:
        raise Redraw("is ill-conditioned in fp32")


def build_case(name, settings, seed):
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(T5Config(**settings)).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if any(part in parameter_name for part in AMPLIFIED):
                parameter.mul_(AMPLIFICATION)
    directory, model = save_checkpoint(name, model, settings)
    check_conditioning(model)
    config = model.config
    expected = dict(buckets=[buckets(config.relative_attention_num_buckets, config.relative_attention_max_distance),
                             buckets(32, 128)])
    ids, mask = encoder_batch()
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        expected["encoder"] = dict(input_ids=ids.tolist(), attention_mask=mask.tolist(), shape=list(encoded.shape),
                                   last_hidden_state=compact(encoded.flatten().tolist()))
        decoder_ids = torch.tensor(DECODER_INPUTS)
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        expected["decoder"] = dict(decoder_input_ids=DECODER_INPUTS, logits=compact(logits.flatten().tolist()))
        embeds = rounded(torch.randn(1, 6, config.d_model, generator=torch.Generator().manual_seed(7)))
        decoder_ids = torch.tensor([DECODER_INPUTS[0][:3]])
        logits = model(inputs_embeds=embeds, decoder_input_ids=decoder_ids).logits
        expected["embeds"] = dict(inputs_embeds=compact(embeds.flatten().tolist()), shape=list(embeds.shape),
                                  decoder_input_ids=decoder_ids.tolist(), logits=compact(logits.flatten().tolist()))

    generations = []
    single, margin = greedy(model, ids[:1], mask[:1], [EOS])
    generations.append(dict(rows=1, eos=[EOS], new_tokens=single, min_margin=margin))
    # Stop the batch on two tokens no row produces among its first 4, taken from late in the continuations, so that
    # rows stop at different steps.
    probe, _ = greedy(model, ids, mask, [EOS])
    early = {t for row in probe for t in row[:4]}
    eos = []
    for token in probe[0][5:] + probe[1][8:]:
        if token not in early and token not in eos and len(eos) < 2:
            eos.append(token)
    batch, margin = greedy(model, ids, mask, eos)
    generations.append(dict(rows=2, eos=eos, new_tokens=batch, min_margin=margin))
    if min(g["min_margin"] for g in generations) <= 1e-3:
        raise Redraw("has a near-tie")
    if any(len(set(row)) < 4 for row in probe):
        raise Redraw("repeats a few tokens")
    expected["generations"] = generations
    expected["max_new_tokens"] = NEW_TOKENS

    # Beam search over the batch, stopping on tokens the probe produced early so that beams finish.
    beam_eos = [probe[0][2], probe[1][3]]
    beams = []
    for setting in BEAM_SETTINGS:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=BEAM_TOKENS, do_sample=False,
                                 num_beams=3, num_return_sequences=3, eos_token_id=beam_eos, pad_token_id=PAD,
                                 output_scores=True, return_dict_in_generate=True, use_cache=uses_cache(model),
                                 **setting)
        beams.append(dict(setting, num_beams=3, num_return_sequences=3, max_new_tokens=BEAM_TOKENS, eos=beam_eos,
                          sequences=out.sequences.tolist(), sequences_scores=out.sequences_scores.tolist()))
    expected["beam"] = beams
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file)
    print(name, "seed", seed, [round(g["min_margin"], 4) for g in generations],
          [list(map(len, g["new_tokens"])) for g in generations],
          os.path.getsize(os.path.join(directory, "model.safetensors")), os.path.getsize(os.path.join(directory, "expected.json")))


def main():
    unknown = set(sys.argv[1:]) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; the cases are {list(CASES)}")
    os.makedirs(FIXTURES, exist_ok=True)
    for name, settings in CASES.items():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        for seed in range(100, 120):
            try:
                build_case(name, settings, seed)
                break
            except Redraw as reason:
                print(name, "seed", seed, reason, "; redrawing")
        else:
            raise SystemExit(f"{name}: no usable seed")


if __name__ == "__main__":
    main()
