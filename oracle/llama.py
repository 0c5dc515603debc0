"""Llama fixtures: tiny random-init checkpoints and what transformers computes with them; SmolLM2 GGUF expectations.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/llama.py                      # tiny checkpoints → Tests/Fixtures/llama/<case>/
    python oracle/llama.py --smollm2 PATH.gguf  # also Tests/Fixtures/llama/smollm2.json from the real GGUF, and
                                                # smollm2-f16-cache.json: the same with an fp16 KV cache

gqa-untied.gguf is that case converted as llama.cpp does (permuted Q/K, quantized MLP), with gqa-untied.gguf.json the
logits transformers computes from the GGUF; qwen2-tiny.gguf(.json) likewise for a tiny random Qwen2 written as
llama.cpp writes qwen2 (see qwen2_tiny_gguf), and qwen2-mixed.gguf(.json) one with every projection quantized (see
qwen2_mixed_gguf), qwen3-mixed.gguf(.json) a tiny random Qwen3 the same way (see qwen3_mixed_gguf), and
smollm3-mixed.gguf(.json) a tiny random SmolLM3 (see smollm3_mixed_gguf), gemma3-mixed.gguf(.json) a tiny random Gemma
3 (see gemma3_mixed_gguf). To remake only those, without touching the other fixtures:

    python -c 'import sys; sys.path.insert(0, "oracle"); import llama; llama.qwen2_tiny_gguf(); llama.qwen2_mixed_gguf(); llama.qwen3_mixed_gguf(); llama.smollm3_mixed_gguf(); llama.gemma3_mixed_gguf()'

Each tiny case directory is a checkpoint SwiftVLM loads as is (config.json + model.safetensors) plus expected.json:
full-sequence logits for a forward pass (with the attention mask and position ids given), and greedy continuations
from `generate` (KV cache, do_sample=False), with the smallest top-1/top-2 logit margin seen while generating so that
a near-tie cannot make the test flaky.
"""
import argparse
import copy
import json
import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "llama")
VOCAB = 160
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2)

CASES = {
    # Grouped-query attention (4 query heads over 2 key/value heads), untied lm_head, default RoPE.
    "gqa-untied": dict(num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5),
    # Llama 3.1 RoPE scaling with a small original context so every band (scaled, smoothed, kept) occurs; tied.
    "llama3-tied": dict(num_key_value_heads=4, tie_word_embeddings=True,
                        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0, original_max_position_embeddings=16)),
    # Linear RoPE scaling, biases on attention and MLP, one key/value head, head_dim unlike hidden/heads; the
    # config.json is rewritten in the legacy rope_theta + rope_scaling form older checkpoints use.
    "linear-bias-mqa": dict(num_key_value_heads=1, head_dim=8, attention_bias=True, mlp_bias=True,
                            tie_word_embeddings=False, legacy_rope=dict(rope_theta=1000.0, rope_scaling={"type": "linear", "factor": 2.0})),
}

PROMPTS = [[1, 17, 45, 99, 3, 150, 12], [1, 8], [1, 60, 61, 62, 5]]
NEW_TOKENS = 16


def left_pad(prompts, pad):
    length = max(map(len, prompts))
    ids = [[pad] * (length - len(p)) + p for p in prompts]
    mask = [[0] * (length - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def generation_positions(mask):
    # What generate() derives from a left-padded mask: count real tokens, pads at 0.
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 0)


def greedy(model, ids, mask, eos, **extra):
    """Greedy continuations cut after their first eos, and the smallest top-1/top-2 margin of the rows still going."""
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=eos, pad_token_id=0, output_logits=True, return_dict_in_generate=True, **extra)
    new = out.sequences[:, ids.shape[1]:].tolist()
    margins = []
    for step, logits in enumerate(out.logits):
        top = logits.topk(2, dim=-1).values
        for row in range(ids.shape[0]):
            # Only rows still generating matter; finished rows are padded by generate.
            if eos is None or not any(t in eos for t in new[row][:step]):
                margins.append((top[row, 0] - top[row, 1]).item())
    rows = []
    for row in new:
        cut = next((i + 1 for i, t in enumerate(row) if eos is not None and t in eos), len(row))
        rows.append(row[:cut])
    return rows, min(margins)


def build_case(name, overrides):
    torch.manual_seed(len(name))
    overrides = dict(overrides)
    legacy = overrides.pop("legacy_rope", None)
    config = LlamaConfig(**BASE, **copy.deepcopy(overrides), **copy.deepcopy(legacy or {}))
    model = LlamaForCausalLM(config).eval()
    directory = os.path.join(FIXTURES, name)
    model.save_pretrained(directory)
    if legacy:
        path = os.path.join(directory, "config.json")
        saved = json.load(open(path))
        saved.pop("rope_parameters")
        saved.update(legacy)
        json.dump(saved, open(path, "w"), indent=2)
        reloaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        assert reloaded.config.rope_parameters == model.config.rope_parameters, reloaded.config.rope_parameters
        model = reloaded
    expected = {}

    with torch.no_grad():
        # One unpadded prompt, default positions.
        ids = torch.tensor([PROMPTS[0]])
        expected["single"] = dict(input_ids=ids.tolist(), logits=model(input_ids=ids).logits[0].flatten().tolist())
        # Left-padded batch with generate()'s positions.
        ids, mask = left_pad(PROMPTS, 0)
        positions = generation_positions(mask)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        expected["batch"] = dict(input_ids=ids.tolist(), attention_mask=mask.tolist(), position_ids=positions.tolist(),
                                 logits=[logits[b][mask[b].bool()].flatten().tolist() for b in range(len(PROMPTS))])
        # inputs_embeds as a VLM splices them: arbitrary vectors, not rows of the table.
        embeds = torch.randn(1, 5, config.hidden_size, generator=torch.Generator().manual_seed(7))
        expected["embeds"] = dict(inputs_embeds=embeds.flatten().tolist(),
                                  logits=model(inputs_embeds=embeds).logits[0].flatten().tolist())

    generations = []
    single, margin = greedy(model, torch.tensor([PROMPTS[0]]), torch.ones(1, len(PROMPTS[0]), dtype=torch.long), None)
    generations.append(dict(prompts=[PROMPTS[0]], eos=[], new_tokens=single, min_margin=margin))
    # Stop on two eos ids: the 6th token of the first continuation and a token of the second row's.
    probe, _ = greedy(model, *left_pad(PROMPTS, 0), None)
    eos = [probe[0][5], probe[1][10]]
    batch, margin = greedy(model, *left_pad(PROMPTS, 0), eos)
    generations.append(dict(prompts=PROMPTS, eos=eos, new_tokens=batch, min_margin=margin))
    for generation in generations:
        assert generation["min_margin"] > 1e-3, (name, generation)
    expected["generations"] = generations
    expected["max_new_tokens"] = NEW_TOKENS
    json.dump(expected, open(os.path.join(directory, "expected.json"), "w"))
    print(name, [g["min_margin"] for g in generations], [list(map(len, g["new_tokens"])) for g in generations])


def llama_cpp_permute(weights, heads):
    # convert_hf_to_gguf.py's LlamaModel.permute: interleave each head's two rotary halves.
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def add_shape(writer, config):
    """The metadata every converter writes for a decoder's shape."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)


def write_gguf(model, path, arch, types, permute, name=None, tokenizer=None):
    """Writes `model` as llama.cpp's converter would for `arch`: its metadata keys, GGUF tensor names, the ggml type
    `types` gives each HF module (F32 for norms and biases, which the converter never quantizes), and Q/K rows
    interleaved where `permute` (llama's rotary layout; qwen2 keeps Hugging Face's)."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    config = model.config
    writer = gguf.GGUFWriter(path, arch=arch)
    if name is not None:
        writer.add_name(name)
    add_shape(writer, config)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if arch == "llama":
        # LlamaModel's converter adds the rotary width; Qwen2's does not (and transformers ignores it for qwen2).
        writer.add_rope_dimension_count(config.head_dim)
    if arch == "qwen3":
        # The converter writes a config's head_dim as the key and value widths.
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    if tokenizer is not None:
        writer.add_tokenizer_model(tokenizer)
    names = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm", "lm_head.weight": "output"}
    modules = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    tied = config.tie_word_embeddings
    stored = {}
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        data = tensor.numpy()
        module, kind = hf_name.rsplit(".", 1)
        if module + ".weight" in names:
            short = names[module + ".weight"]
            target = f"{short}.{kind}"
        else:
            _, _, layer, module = module.split(".", 3)
            short = modules[module]
            target = f"blk.{layer}.{short}.{kind}"
            if permute and short == "attn_q":
                data = llama_cpp_permute(data, config.num_attention_heads)
            elif permute and short == "attn_k":
                data = llama_cpp_permute(data, config.num_key_value_heads)
        qtype = types.get(module, Q.F32) if data.ndim == 2 else Q.F32
        quantized = gguf.quants.quantize(np.ascontiguousarray(data), qtype)
        writer.add_tensor(target, quantized, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)
        # Rows are quantized independently, so rounding the unpermuted rows gives the file's values in HF order.
        in_order = gguf.quants.quantize(np.ascontiguousarray(tensor.numpy()), qtype)
        stored[hf_name] = torch.from_numpy(gguf.quants.dequantize(in_order, qtype).astype(np.float32)).reshape(tensor.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # What the file holds, in Hugging Face's names and row order: the model as rounded to the file's types.
    rounded = copy.deepcopy(model)
    rounded.load_state_dict(stored, strict=not tied)
    return rounded


def gguf_logits(model, case):
    """The logits transformers computes after loading Tests/Fixtures/llama/<case>.gguf, checked against those of
    `model`, the source rounded to the file's types (write_gguf's result)."""
    loaded = AutoModelForCausalLM.from_pretrained(FIXTURES, gguf_file=f"{case}.gguf", dtype=torch.float32).eval()
    assert type(loaded) is type(model), type(loaded)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        logits = loaded(input_ids=ids).logits[0]
        reference = model(input_ids=ids).logits[0]
    # The same weights in the same order: only float rounding apart (a wrong Q/K order would move whole units).
    drift = (logits - reference).abs().max().item()
    assert drift < 1e-4, drift
    print(f"{case}.gguf: transformers' GGUF logits differ from the rounded checkpoint's by", drift)
    return loaded, dict(input_ids=[PROMPTS[0]], logits=logits.flatten().tolist())


def tiny_gguf(case):
    """The case's checkpoint as llama.cpp's converter would write it (Q/K permuted; F16 embeddings, Q8_0 MLP,
    F32 rest), and the logits transformers computes after loading that GGUF."""
    from gguf import GGMLQuantizationType as Q
    model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, case), dtype=torch.float32)
    types = {"model.embed_tokens": Q.F16, "mlp.gate_proj": Q.Q8_0, "mlp.up_proj": Q.Q8_0, "mlp.down_proj": Q.Q8_0}
    rounded = write_gguf(model, os.path.join(FIXTURES, f"{case}.gguf"), "llama", types, permute=True)
    _, expected = gguf_logits(rounded, case)
    json.dump(expected, open(os.path.join(FIXTURES, f"{case}.gguf.json"), "w"))


def random_qwen2(seed, positions, tied):
    """A tiny random Qwen2 (grouped-query attention, 4 query heads over 2 key/value heads) with its q/k/v biases made
    non-zero, as Qwen2 checkpoints have them."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=positions, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                         rope_parameters=dict(rope_type="default", rope_theta=1000000.0), initializer_range=0.2)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_(std=0.5)
    return model


def qwen2_tiny_gguf():
    """qwen2-tiny.gguf: a tiny random Qwen2 (grouped-query attention, q/k/v biases made non-zero, tied embeddings)
    written as llama.cpp's converter writes Qwen2 (no Q/K permutation: llama.cpp runs it with NEOX rotary, which is
    Hugging Face's layout; F16 embeddings, Q5_0 attention, F32 MLP), with the logits and a greedy continuation that
    transformers computes from the GGUF. It has no sliding window: GGUF metadata carries none, so transformers takes
    Qwen2Config's use_sliding_window=False."""
    from gguf import GGMLQuantizationType as Q
    model = random_qwen2(seed=2, positions=64, tied=True)
    types = {"model.embed_tokens": Q.F16, "self_attn.q_proj": Q.Q5_0, "self_attn.k_proj": Q.Q5_0,
             "self_attn.v_proj": Q.Q5_0, "self_attn.o_proj": Q.Q5_0}
    rounded = write_gguf(model, os.path.join(FIXTURES, "qwen2-tiny.gguf"), "qwen2", types, permute=False, name="qwen2-tiny")
    loaded, expected = gguf_logits(rounded, "qwen2-tiny")
    assert loaded.config.sliding_window is None and loaded.config.tie_word_embeddings
    new_tokens, margin = greedy(loaded, torch.tensor([PROMPTS[0]]), torch.ones(1, len(PROMPTS[0]), dtype=torch.long), None)
    assert margin > 1e-3, margin
    expected.update(new_tokens=new_tokens[0], max_new_tokens=NEW_TOKENS, min_margin=margin)
    json.dump(expected, open(os.path.join(FIXTURES, "qwen2-tiny.gguf.json"), "w"))


def decoding_expectations(model):
    """What the fully quantized fixtures record beside the prompt's logits: `model`'s greedy continuation of the prompt
    (no near tie) and its logits at some positions of a 160-token sequence (the prompt, then pseudo-random tokens),
    long enough that a decoding step's attention splits each head's keys into parts (from 128 keys on)."""
    prompt = torch.tensor([PROMPTS[0]])
    new_tokens, margin = greedy(model, prompt, torch.ones_like(prompt), None)
    assert margin > 1e-3, margin
    sequence = PROMPTS[0] + torch.randint(3, VOCAB, (160 - len(PROMPTS[0]),), generator=torch.Generator().manual_seed(4)).tolist()
    positions = [len(PROMPTS[0]), 63, 64, 127, 128, 129, 159]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sequence])).logits[0]
    return dict(new_tokens=new_tokens[0], max_new_tokens=NEW_TOKENS, min_margin=margin, sequence=sequence,
                positions=positions, position_logits=[logits[p].tolist() for p in positions])


def qwen2_mixed_gguf():
    """qwen2-mixed.gguf: a tiny random Qwen2 whose every projection is quantized, each in another 32-element block
    format (so q/k/v and gate/up cannot stack: SwiftVLM's fused decoding step runs them as separate products), q/k/v
    biases made non-zero, an untied F16 head, 256 positions; with what transformers computes from the GGUF: a greedy
    continuation of the prompt, and the logits at some positions of a 160-token sequence (the prompt, then
    pseudo-random tokens), long enough that a decoding step's attention splits each head's keys into parts (from 128
    keys on)."""
    from gguf import GGMLQuantizationType as Q
    model = random_qwen2(seed=3, positions=256, tied=False)
    types = {"model.embed_tokens": Q.F16, "lm_head": Q.F16, "self_attn.q_proj": Q.Q5_0, "self_attn.k_proj": Q.Q8_0,
             "self_attn.v_proj": Q.Q4_1, "self_attn.o_proj": Q.Q5_1, "mlp.gate_proj": Q.Q8_0, "mlp.up_proj": Q.Q4_0,
             "mlp.down_proj": Q.Q5_0}
    rounded = write_gguf(model, os.path.join(FIXTURES, "qwen2-mixed.gguf"), "qwen2", types, permute=False, name="qwen2-mixed")
    loaded, expected = gguf_logits(rounded, "qwen2-mixed")
    assert not loaded.config.tie_word_embeddings
    expected.update(decoding_expectations(loaded))
    json.dump(expected, open(os.path.join(FIXTURES, "qwen2-mixed.gguf.json"), "w"))


def qwen3_mixed_gguf():
    """qwen3-mixed.gguf: a tiny random Qwen3 (2 query heads over 1 key/value head of 128, the width transformers
    always gives a Qwen3 GGUF) whose every projection is quantized, each in another block format (so SwiftVLM's fused
    decoding step runs them, with each query and key head normalized before the rotation), q_norm and k_norm drawn
    around 1, an untied F16 head, 256 positions; what transformers computes from the GGUF as for qwen2-mixed.gguf."""
    from gguf import GGMLQuantizationType as Q
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(5)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=128, max_position_embeddings=256, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                         initializer_range=0.2)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.normal_(1.0, 0.3)
            layer.self_attn.k_norm.weight.normal_(1.0, 0.3)
    types = {"model.embed_tokens": Q.F16, "lm_head": Q.F16, "self_attn.q_proj": Q.Q8_0, "self_attn.k_proj": Q.Q5_0,
             "self_attn.v_proj": Q.Q4_1, "self_attn.o_proj": Q.Q5_1, "mlp.gate_proj": Q.Q4_0, "mlp.up_proj": Q.Q8_0,
             "mlp.down_proj": Q.Q4_1}
    rounded = write_gguf(model, os.path.join(FIXTURES, "qwen3-mixed.gguf"), "qwen3", types, permute=False, name="qwen3-mixed")
    loaded, expected = gguf_logits(rounded, "qwen3-mixed")
    assert loaded.config.head_dim == 128 and not loaded.config.tie_word_embeddings
    expected.update(decoding_expectations(loaded))
    json.dump(expected, open(os.path.join(FIXTURES, "qwen3-mixed.gguf.json"), "w"))


def smollm3_mixed_gguf():
    """smollm3-mixed.gguf: a tiny random SmolLM3 of 4 layers (the fourth a NoPE layer: llama.cpp leaves every fourth
    layer of a smollm3 file unrotated, SmolLM3Config's default) written as llama.cpp's converter writes SmolLM3 (its
    LlamaModel: Q/K rows interleaved, the rotary width), every projection quantized, each in another block format,
    norms drawn around 1, tied embeddings. transformers reads no smollm3 GGUF, so the expectations are transformers'
    on the checkpoint rounded to the file's types (what the file holds, in Hugging Face's order): a greedy
    continuation and the logits at some positions of a 160-token sequence, as for qwen2-mixed.gguf. The file also
    names a vocabulary-less tokenizer ("none"), so that llama.cpp itself loads it."""
    from gguf import GGMLQuantizationType as Q
    from transformers import SmolLM3Config, SmolLM3ForCausalLM
    torch.manual_seed(6)
    config = SmolLM3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                           rope_parameters=dict(rope_type="default", rope_theta=5000000.0), initializer_range=0.2,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    assert config.no_rope_layers == [1, 1, 1, 0], config.no_rope_layers
    model = SmolLM3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(1.0, 0.3)
    types = {"model.embed_tokens": Q.Q8_0, "self_attn.q_proj": Q.Q5_0, "self_attn.k_proj": Q.Q8_0,
             "self_attn.v_proj": Q.Q4_1, "self_attn.o_proj": Q.Q5_1, "mlp.gate_proj": Q.Q8_0, "mlp.up_proj": Q.Q4_0,
             "mlp.down_proj": Q.Q5_0}
    path = os.path.join(FIXTURES, "smollm3-mixed.gguf")
    rounded = write_gguf(model, path, "smollm3", types, permute=True, name="smollm3-mixed", tokenizer="none")
    with torch.no_grad():
        prompt_logits = rounded(input_ids=torch.tensor([PROMPTS[0]])).logits[0]
    expected = dict(input_ids=[PROMPTS[0]], logits=prompt_logits.flatten().tolist(), **decoding_expectations(rounded))
    json.dump(expected, open(path + ".json", "w"))


def write_gemma3_gguf(model, path, types, name, tokenizer=None):
    """Writes a Gemma3ForCausalLM as llama.cpp's converter writes Gemma 3: every norm weight stored plus one (its
    norm_shift), the head width as key and value length, the sliding window, the ggml type `types` gives each module
    (F32 for norms), no Q/K permutation, the head tied to the embedding."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    config = model.config
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    writer = gguf.GGUFWriter(path, arch="gemma3")
    writer.add_name(name)
    add_shape(writer, config)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["full_attention"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_sliding_window(config.sliding_window)
    writer.add_vocab_size(config.vocab_size)
    writer.add_uint32("tokenizer.ggml.bos_token_id", config.bos_token_id)
    writer.add_uint32("tokenizer.ggml.eos_token_id", config.eos_token_id)
    if tokenizer is not None:
        writer.add_tokenizer_model(tokenizer)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight":
            continue
        module, kind = hf_name.rsplit(".", 1)
        if module == "model.embed_tokens":
            target = "token_embd.weight"
        elif module == "model.norm":
            target = "output_norm.weight"
        else:
            _, _, layer, short = module.split(".", 3)
            target = f"blk.{layer}.{names[short]}.{kind}"
        data = tensor.numpy().astype(np.float32)
        if "norm" in hf_name:
            data = data + 1  # the converter's norm_shift
        qtype = types.get(module if module == "model.embed_tokens" else module.split(".", 3)[-1], Q.F32) if data.ndim == 2 else Q.F32
        writer.add_tensor(target, gguf.quants.quantize(np.ascontiguousarray(data), qtype),
                          raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gemma3_mixed_gguf():
    """gemma3-mixed.gguf: a tiny random Gemma 3 text decoder written as llama.cpp's converter writes Gemma 3 (every
    norm weight stored plus one, the head width as key_length, the sliding window; no Q/K permutation), six layers so
    that the sixth is a full-attention layer (the pattern llama.cpp and transformers both take for GGUF files), heads
    of 256 (where llama.cpp's 1/sqrt(head_dim) and transformers' default query_pre_attn_scalar agree), a 4-token
    window, every projection quantized in another block format, tied Q8_0 embeddings; with what transformers computes
    after loading the file, as for qwen2-mixed.gguf. A vocabulary-less tokenizer ("none") lets llama.cpp load it too."""
    from gguf import GGMLQuantizationType as Q
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(7)
    config = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=1,
                              num_key_value_heads=1, head_dim=256, max_position_embeddings=256, sliding_window=4,
                              initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0, 0.3)
    types = {"model.embed_tokens": Q.Q8_0, "self_attn.q_proj": Q.Q8_0, "self_attn.k_proj": Q.Q5_0, "self_attn.v_proj": Q.Q4_1,
             "self_attn.o_proj": Q.Q5_1, "mlp.gate_proj": Q.Q4_0, "mlp.up_proj": Q.Q8_0, "mlp.down_proj": Q.Q5_0}
    path = os.path.join(FIXTURES, "gemma3-mixed.gguf")
    write_gemma3_gguf(model, path, types, name="gemma3-mixed", tokenizer="none")
    loaded = AutoModelForCausalLM.from_pretrained(FIXTURES, gguf_file="gemma3-mixed.gguf", dtype=torch.float32).eval()
    assert type(loaded) is Gemma3ForCausalLM and loaded.config.head_dim == 256 and loaded.config.sliding_window == 4
    assert loaded.config.layer_types == ["sliding_attention"] * 5 + ["full_attention"], loaded.config.layer_types
    with torch.no_grad():
        prompt_logits = loaded(input_ids=torch.tensor([PROMPTS[0]])).logits[0]
    expected = dict(input_ids=[PROMPTS[0]], logits=prompt_logits.flatten().tolist(), **decoding_expectations(loaded))
    json.dump(expected, open(path + ".json", "w"))


# transformers' bar for the real model: 64 greedy tokens, plain prompts and chats.
MAX_NEW_TOKENS = 64


def smollm2(path):
    from transformers import AutoTokenizer
    directory, file = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32).eval()
    plain = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "The three primary colors are",
             "import numpy as np\n", "Water boils at"]
    chats = [[{"role": "user", "content": "What is 2+2?"}],
             [{"role": "user", "content": "Write a haiku about the sea."}],
             [{"role": "user", "content": "Name three fruits."}],
             [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Say hello."}],
             [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
              {"role": "user", "content": "What is the weather like on Mars?"}],
             [{"role": "user", "content": "Translate 'good morning' to French."}]]
    texts = plain + [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for chat in chats]
    cases = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            last = model(input_ids=ids).logits[0, -1]
        top = last.topk(10)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                             eos_token_id=[2], pad_token_id=2, output_logits=True, return_dict_in_generate=True)
        margins = [(l[0].topk(2).values[0] - l[0].topk(2).values[1]).item() for l in out.logits]
        new = out.sequences[0, ids.shape[1]:].tolist()
        # The last generated step's logits come from one-token decoding over the KV cache, which SwiftVLM runs on
        # other kernels than a prompt.
        final = out.logits[-1][0]
        final_top = final.topk(10)
        cases.append(dict(text=text, input_ids=ids[0].tolist(), top_ids=top.indices.tolist(),
                          top_logits=top.values.tolist(), logits_head=last[:64].tolist(), new_tokens=new,
                          final_top_ids=final_top.indices.tolist(), final_top_logits=final_top.values.tolist(),
                          final_logits_head=final[:64].tolist(), continuation=tokenizer.decode(new),
                          min_margin=min(margins)))
        print(repr(text), repr(tokenizer.decode(new)), min(margins))
    import gguf, transformers
    json.dump(dict(file=file, eos=[2], max_new_tokens=MAX_NEW_TOKENS, versions=dict(
        torch=torch.__version__, transformers=transformers.__version__, gguf=gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0"),
        cases=cases), open(os.path.join(FIXTURES, "smollm2.json"), "w"), indent=1)


def round_cache_layers():
    """Makes transformers' cache layers round every key and value they store to fp16 (to nearest, ties to even), read
    back as fp32, as llama.cpp keeps its cache by default. Returns the jitter setting: {"scale": s} multiplies keys
    and values by 1 + s·N(0, 1) before rounding (fp32 arithmetic that differs from PyTorch's in the last bits moves a
    few of them across a rounding boundary, a whole half-ulp)."""
    from transformers import cache_utils
    jitter = {"scale": 0.0}

    def jittered(x):
        return x * (1 + jitter["scale"] * torch.randn_like(x)) if jitter["scale"] else x

    for layer in (cache_utils.DynamicLayer, cache_utils.DynamicSlidingWindowLayer):
        def rounding(update):
            return lambda self, key, value, *args, **kwargs: update(
                self, jittered(key).half().float(), jittered(value).half().float(), *args, **kwargs)
        layer.update = rounding(layer.update)
    return jitter


def rounding_sensitivity(model, ids, logits, jitter):
    """How far the last position's `logits` (of `ids`, through the rounding cache) move when the keys and values move
    by 3e-7 of themselves before rounding, the largest of three draws: the spread any fp32 implementation's fp16
    cache shows against this one."""
    jitter["scale"] = 3e-7
    with torch.no_grad():
        moved = max((model(input_ids=ids, use_cache=True).logits[0, -1] - logits).abs().max().item() for _ in range(3))
    jitter["scale"] = 0.0
    return moved


def smollm2_half_cache(path):
    """Tests/Fixtures/llama/smollm2-f16-cache.json: smollm2()'s prompts with a KV cache kept in fp16, as llama.cpp keeps
    its cache by default: transformers' cache layers round every key and value they store to fp16 (to nearest, ties to
    even) and attention reads them back as fp32, the prompt's own included. The prompt logits, the greedy continuation,
    its last step's logits and whether it is the fp32 cache's continuation (smollm2.json)."""
    from transformers import AutoTokenizer
    directory, file = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32).eval()
    jitter = round_cache_layers()
    fp32 = json.load(open(os.path.join(FIXTURES, "smollm2.json")))
    torch.manual_seed(0)
    cases = []
    for reference in fp32["cases"]:
        ids = torch.tensor([reference["input_ids"]])
        with torch.no_grad():
            last = model(input_ids=ids, use_cache=True).logits[0, -1]
        sensitivity = rounding_sensitivity(model, ids, last, jitter)
        top = last.topk(10)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=fp32["max_new_tokens"],
                             do_sample=False, eos_token_id=[2], pad_token_id=2, output_logits=True,
                             return_dict_in_generate=True)
        margins = [(l[0].topk(2).values[0] - l[0].topk(2).values[1]).item() for l in out.logits]
        new = out.sequences[0, ids.shape[1]:].tolist()
        final = out.logits[-1][0]
        final_top = final.topk(10)
        # The same for the last step's logits, from one pass over the prompt and the continuation.
        final_sensitivity = rounding_sensitivity(model, out.sequences[:, :-1], final, jitter)
        cases.append(dict(text=reference["text"], input_ids=reference["input_ids"], top_ids=top.indices.tolist(),
                          top_logits=top.values.tolist(), logits_head=last[:64].tolist(), new_tokens=new,
                          final_top_ids=final_top.indices.tolist(), final_top_logits=final_top.values.tolist(),
                          final_logits_head=final[:64].tolist(), continuation=tokenizer.decode(new),
                          min_margin=min(margins), same_as_fp32_cache=new == reference["new_tokens"],
                          prompt_logits_head_change=(last[:64] - torch.tensor(reference["logits_head"])).abs().max().item(),
                          rounding_sensitivity=sensitivity, final_rounding_sensitivity=final_sensitivity))
        print(repr(reference["text"]), new == reference["new_tokens"], min(margins), cases[-1]["prompt_logits_head_change"],
              sensitivity, final_sensitivity)
    import gguf, transformers
    json.dump(dict(file=file, eos=[2], max_new_tokens=fp32["max_new_tokens"], cache="fp16", versions=dict(
        torch=torch.__version__, transformers=transformers.__version__, gguf=gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0"),
        cases=cases), open(os.path.join(FIXTURES, "smollm2-f16-cache.json"), "w"), indent=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smollm2", help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()
    os.makedirs(FIXTURES, exist_ok=True)
    for name, overrides in CASES.items():
        build_case(name, overrides)
    tiny_gguf("gqa-untied")
    qwen2_tiny_gguf()
    qwen2_mixed_gguf()
    qwen3_mixed_gguf()
    smollm3_mixed_gguf()
    gemma3_mixed_gguf()
    if args.smollm2:
        smollm2(args.smollm2)
        smollm2_half_cache(args.smollm2)


if __name__ == "__main__":
    main()
