"""Safetensors checkpoints for VLMCheckpointTests, good and deliberately broken.

Good files are written by the `safetensors` library itself, and every expected value is what torch makes of them
(`.float()`), stored as fp32 bit patterns so NaN, infinities and -0 survive JSON. Broken files are built byte by byte,
each with exactly one thing wrong, named for that thing.

Run by hand: python oracle/checkpoint_files.py
"""
import json
import os
import shutil
import struct

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "Fixtures", "checkpoint")


def from_bits16(bits, dtype):
    """A torch f16/bf16 tensor holding exactly these 16-bit patterns."""
    return torch.from_numpy(np.array(bits, dtype=np.uint16).view(np.int16).copy()).view(dtype)


def fp32_bits(tensor):
    return [int(b) for b in tensor.float().contiguous().view(torch.int32).numpy().view(np.uint32).reshape(-1)]


def expected_entry(tensor):
    entry = {"dtype": {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}[tensor.dtype],
             "shape": list(tensor.shape)}
    if tensor.dtype in (torch.float32, torch.float16, torch.bfloat16):
        entry["bits"] = fp32_bits(tensor)
    return entry


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def single_checkpoint(generator):
    """A one-file checkpoint with every dtype path, special f16/bf16 values, a scalar and an empty tensor."""
    out = os.path.join(ROOT, "single")
    os.makedirs(out)
    f16_specials = [
        0x0000, 0x8000,  # ±0
        0x0001, 0x8001, 0x0200, 0x03FF,  # subnormals, smallest to largest
        0x0400, 0x7BFF, 0xFBFF,  # smallest normal, ±65504
        0x7C00, 0xFC00,  # ±inf
        0x7E00, 0xFE00, 0x7C01,  # quiet, negative and signalling NaN
        0x3C00, 0x3555,  # 1 and ~1/3
    ]
    bf16_specials = [0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x3F80, 0xC2F7]
    tensors = {
        "vision_model.embeddings.patch_embedding.weight": torch.randn(4, 3, 2, 2, generator=generator),
        "vision_model.encoder.layers.0.mlp.fc1.weight": from_bits16(f16_specials, torch.float16).reshape(2, 8),
        "vision_model.encoder.layers.0.mlp.fc1.bias": from_bits16(bf16_specials, torch.bfloat16),
        "text_model.embeddings.token_embedding.weight": torch.randn(5, 3, generator=generator).to(torch.float16),
        "text_model.embeddings.position_ids": torch.arange(3, dtype=torch.int64).reshape(1, 3),
        "text_model.empty": torch.zeros(0, 4),
        "logit_scale": torch.tensor(2.6592),
    }
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out, "expected.json"), {name: expected_entry(t) for name, t in tensors.items()})

    # config.json exactly as transformers saves it, with a couple of non-default sizes.
    config = transformers.CLIPConfig(
        text_config={"hidden_size": 32, "num_hidden_layers": 2},
        vision_config={"hidden_size": 48, "image_size": 30, "patch_size": 2},
        projection_dim=16,
    )
    config.save_pretrained(out)

    # A sparse vision config and the values transformers fills in for the absent keys.
    sparse = {"hidden_size": 48, "patch_size": 2}
    write_json(os.path.join(out, "vision_config_sparse.json"), sparse)
    filled = transformers.CLIPVisionConfig(**sparse)
    write_json(os.path.join(out, "vision_config_filled.json"), {
        key: getattr(filled, key)
        for key in ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
                    "patch_size", "hidden_act", "layer_norm_eps"]
    })


def sharded_checkpoint(generator):
    """Two shards and an index, as save_pretrained writes them for large models, plus a stray shard the index
    does not name (which must never be opened)."""
    out = os.path.join(ROOT, "sharded")
    os.makedirs(out)
    shards = {
        "model-00001-of-00002.safetensors": {
            "vision_model.embeddings.class_embedding": torch.randn(6, generator=generator),
            "vision_model.pre_layrnorm.weight": torch.randn(6, generator=generator).to(torch.bfloat16),
        },
        "model-00002-of-00002.safetensors": {
            "text_model.final_layer_norm.weight": torch.randn(2, 3, generator=generator).to(torch.float16),
            "logit_scale": torch.tensor(4.6052),
        },
    }
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, os.path.join(out, shard), metadata={"format": "pt"})
        weight_map.update({name: shard for name in tensors})
    write_json(os.path.join(out, "model.safetensors.index.json"),
               {"metadata": {"total_size": 0}, "weight_map": weight_map})
    with open(os.path.join(out, "model-stray.safetensors"), "wb") as f:
        f.write(b"not a safetensors file")
    transformers.CLIPConfig(projection_dim=16).save_pretrained(out)
    write_json(os.path.join(out, "expected.json"),
               {name: expected_entry(t) for tensors in shards.values() for name, t in tensors.items()})


def every_half():
    """All 65,536 f16 and bf16 bit patterns and torch's fp32 for each (its vectorised conversion)."""
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f16 = from_bits16(patterns, torch.float16)
    bf16 = from_bits16(patterns, torch.bfloat16)
    save_file({"f16": f16, "f16_as_f32": f16.float(), "bf16": bf16, "bf16_as_f32": bf16.float()},
              os.path.join(ROOT, "every_half.safetensors"))


def raw_file(name, header, data, header_length=None):
    """A safetensors file from a header (dict, or raw bytes) and data; header_length overrides the true one."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(header_bytes) if header_length is None else header_length
    with open(os.path.join(ROOT, "bad", name), "wb") as f:
        f.write(struct.pack("<Q", length) + header_bytes + data)


def unaligned_file(generator):
    """A valid file whose odd header length leaves every tensor misaligned."""
    f32 = torch.randn(3, generator=generator)
    f16 = torch.randn(5, generator=generator).to(torch.float16)
    data = f32.numpy().tobytes() + f16.view(torch.int16).numpy().tobytes()
    header = json.dumps({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                         "b": {"dtype": "F16", "shape": [5], "data_offsets": [12, 22]}}).encode()
    if len(header) % 2 == 0:
        header += b" "
    with open(os.path.join(ROOT, "unaligned.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)
    write_json(os.path.join(ROOT, "unaligned_expected.json"), {"a": expected_entry(f32), "b": expected_entry(f16)})


def bad_files():
    os.makedirs(os.path.join(ROOT, "bad"))
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    data = struct.pack("<4f", 1, 2, 3, 4)
    good_header = json.dumps(good).encode()

    with open(os.path.join(ROOT, "bad", "too_short.safetensors"), "wb") as f:
        f.write(b"\x10\x00\x00")
    raw_file("truncated_header.safetensors", good_header[: len(good_header) // 2], b"", header_length=len(good_header))
    raw_file("header_length_past_end.safetensors", good_header, data, header_length=len(good_header) + len(data) + 1)
    raw_file("header_length_huge.safetensors", good_header, data, header_length=1 << 62)
    raw_file("truncated_data.safetensors", good, data[:10])
    raw_file("offsets_past_end.safetensors",
             {"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}, data)
    raw_file("reversed_offsets.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [16, 8]}}, data)
    raw_file("shape_mismatch.safetensors", {"w": {"dtype": "F32", "shape": [3, 3], "data_offsets": [0, 16]}}, data)
    raw_file("negative_dimension.safetensors", {"w": {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]}}, data)
    raw_file("shape_overflow.safetensors",
             {"w": {"dtype": "F32", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 16]}}, data)
    # 2^60 elements, consistent with its own byte range: only the file size can expose it.
    raw_file("huge_tensor.safetensors",
             {"w": {"dtype": "F32", "shape": [1 << 30, 1 << 30], "data_offsets": [0, 1 << 62]}}, data)
    raw_file("fractional_dimension.safetensors", {"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}, data)
    raw_file("unknown_dtype.safetensors", {"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, data)
    raw_file("invalid_json.safetensors", b'{"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]', data)
    raw_file("header_not_object.safetensors", b"[1, 2, 3]", data)
    raw_file("missing_offsets.safetensors", {"w": {"dtype": "F32", "shape": [4]}}, data)
    raw_file("three_offsets.safetensors", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8, 16]}}, data)
    raw_file("overlapping.safetensors", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, data)


def bad_directories():
    base = os.path.join(ROOT, "bad_dirs")
    sharded = os.path.join(ROOT, "sharded")
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        index = json.load(f)

    def directory(name, weight_map=None, shards=(), index_text=None):
        out = os.path.join(base, name)
        os.makedirs(out)
        for shard in shards:
            shutil.copy(os.path.join(sharded, shard), out)
        if index_text is not None or weight_map is not None:
            text = index_text if index_text is not None else json.dumps({"metadata": {}, "weight_map": weight_map})
            with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
                f.write(text)
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write('{"model_type": "clip"}\n')

    directory("missing_shard", index["weight_map"], shards=[first])
    directory("escaping_shard", {**index["weight_map"], "logit_scale": "../sharded/" + second}, shards=[first, second])
    directory("absolute_shard", {**index["weight_map"], "logit_scale": "/etc/passwd"}, shards=[first, second])
    directory("tensor_not_in_shard", {**index["weight_map"], "vision_model.extra.weight": first}, shards=[first, second])
    directory("index_not_a_map", index_text='{"weight_map": ["model-00001-of-00002.safetensors"]}')
    directory("index_invalid_json", index_text='{"weight_map": {')
    directory("no_weights")

    # Both layouts at once: transformers loads model.safetensors and ignores the index.
    both = os.path.join(ROOT, "both")
    shutil.copytree(sharded, both)
    shutil.copy(os.path.join(ROOT, "single", "model.safetensors"), both)
    os.remove(os.path.join(both, "expected.json"))

    config_dir = os.path.join(base, "bad_config")
    os.makedirs(config_dir)
    with open(os.path.join(config_dir, "config.json"), "w") as f:
        f.write('{"architectures": ["CLIPModel"], "vision_config": {"hidden_size": "big", "patch_size": 2}}\n')
    with open(os.path.join(config_dir, "broken.json"), "w") as f:
        f.write('{"model_type": "clip",,}\n')


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    generator = torch.Generator().manual_seed(0)
    single_checkpoint(generator)
    sharded_checkpoint(generator)
    every_half()
    unaligned_file(generator)
    bad_files()
    bad_directories()


if __name__ == "__main__":
    main()
