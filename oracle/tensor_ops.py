"""Fixtures for VLMTensor's ops: small random inputs and what PyTorch computes from them.

Writes Tests/Fixtures/tensor/tensor_ops.json (one entry per case: op, parameters, and for every input and output
its shape and offset in floats) and tensor_ops.bin (all the float32 data, little-endian, back to back).
Attention follows transformers' eager_attention_forward: (q @ k^T) * scale + mask, softmax, @ v, with masks built as
transformers builds them (0 where attending, torch.finfo(float32).min where not).

Run: python oracle/tensor_ops.py
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(__file__), "..", "Tests", "Fixtures", "tensor")
torch.manual_seed(0)

cases = []
blob = []
offset = 0


def store(tensor):
    global offset
    array = tensor.detach().to(torch.float32).contiguous().numpy().astype("<f4")
    entry = {"shape": list(array.shape), "offset": offset}
    blob.append(array.tobytes())
    offset += array.size
    return entry


def case(name, op, inputs, outputs, **params):
    cases.append({
        "name": name,
        "op": op,
        "params": params,
        "inputs": {key: store(value) for key, value in inputs.items()},
        "outputs": {key: store(value) for key, value in outputs.items()},
    })


def randn(*shape, scale=1.0, shift=0.0):
    return torch.randn(*shape) * scale + shift


ACTIVATIONS = {
    "identity": lambda x: x,
    "gelu": F.gelu,
    "geluTanh": lambda x: F.gelu(x, approximate="tanh"),
    "quickGelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "silu": F.silu,
}

# Elementwise and normalization.
for shape, eps in [((2, 5, 48), 1e-5), ((3, 768), 1e-6)]:
    x = randn(*shape, scale=3, shift=1)
    w, b = randn(shape[-1], scale=0.5, shift=1), randn(shape[-1], scale=0.2)
    case(f"layer_norm_{'x'.join(map(str, shape))}", "layerNorm", {"x": x, "weight": w, "bias": b},
         {"y": F.layer_norm(x, (shape[-1],), w, b, eps)}, eps=eps)

x = randn(4, 257, scale=3)
for kind, fn in ACTIVATIONS.items():
    if kind != "identity":
        case(f"activation_{kind}", "activation", {"x": x}, {"y": fn(x)}, activation=kind)

x = randn(3, 7, 50, scale=4)
case("softmax", "softmax", {"x": x}, {"y": F.softmax(x, dim=-1)})
case("scaled", "scaled", {"x": x}, {"y": x * 0.125}, factor=0.125)
a, b = randn(2, 3, 40), randn(2, 3, 40)
case("add_same_shape", "add", {"a": a, "b": b}, {"y": a + b})
b = randn(3, 40)
case("add_broadcast", "add", {"a": a, "b": b}, {"y": a + b})
x = randn(4, 512, scale=2)
case("l2_normalize", "l2Normalized", {"x": x}, {"y": x / x.norm(p=2, dim=-1, keepdim=True)})

a, b = randn(17, 33), randn(33, 29)
case("matmul", "matmul", {"a": a, "b": b}, {"y": a @ b}, transposeB=False)
b = randn(29, 33)
case("matmul_transposed", "matmul", {"a": a, "b": b}, {"y": a @ b.T}, transposeB=True)

# Linear: nn.Linear, then the activation, then the residual.
x = randn(2, 9, 64)
for name, bias, kind, residual in [
    ("linear_bias", True, "identity", False),
    ("linear_no_bias", False, "identity", False),
    ("linear_gelu_residual", True, "gelu", True),
    ("linear_quick_gelu", True, "quickGelu", False),
    ("linear_no_bias_residual", False, "identity", True),
    ("linear_silu_residual", True, "silu", True),
]:
    layer = torch.nn.Linear(64, 96, bias=bias)
    y = ACTIVATIONS[kind](layer(x))
    inputs = {"x": x, "weight": layer.weight}
    if bias:
        inputs["bias"] = layer.bias
    if residual:
        r = randn(2, 9, 96)
        inputs["residual"] = r
        y = y + r
    case(name, "linear", inputs, {"y": y}, activation=kind)

# Conv2d: a ViT-style patch embedding (kernel = stride, no bias) and a padded, strided 3x3.
for name, cin, cout, k, stride, padding, bias, size in [
    ("conv_patch", 3, 16, 8, 8, 0, False, 32),
    ("conv_3x3", 3, 8, 3, 2, 1, True, 13),
]:
    conv = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=padding, bias=bias)
    x = randn(2, cin, size, size)
    y = conv(x)
    inputs = {"x": x, "weight": conv.weight}
    if bias:
        inputs["bias"] = conv.bias
    case(name, "conv2d", inputs, {"y": y, "y_channels_last": y.permute(0, 2, 3, 1)}, stride=stride, padding=padding)


def eager_attention(q, k, v, heads, causal, padding, scale):
    batch, tq, width = q.shape
    tk = k.shape[1]
    d = width // heads
    split = lambda t: t.view(batch, -1, heads, d).transpose(1, 2)
    scores = torch.matmul(split(q), split(k).transpose(-1, -2)) * scale
    allowed = torch.ones(batch, 1, tq, tk, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
    if padding is not None:
        allowed &= padding.bool()[:, None, None, :]
    if causal or padding is not None:
        scores = scores + torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32)
    return torch.matmul(weights, split(v)).transpose(1, 2).reshape(batch, tq, width)


for name, batch, tq, tk, heads, width, causal, padded, scale in [
    ("attention_plain", 2, 7, 7, 2, 32, False, False, None),
    ("attention_causal", 2, 7, 7, 4, 32, True, False, None),
    ("attention_padding", 3, 6, 6, 1, 16, False, True, None),
    ("attention_causal_padding", 3, 9, 9, 3, 48, True, True, None),
    ("attention_causal_cached", 2, 3, 8, 2, 32, True, True, None),
    ("attention_clip_like", 2, 50, 50, 4, 128, False, False, None),
    ("attention_single_item_causal", 1, 5, 5, 2, 16, True, False, 0.3),
]:
    q, k, v = randn(batch, tq, width, scale=2), randn(batch, tk, width, scale=2), randn(batch, tk, width)
    padding = None
    if padded:
        padding = torch.ones(batch, tk)
        for item in range(batch):
            padding[item, tk - item:] = 0  # item b pads its last b keys
    used_scale = scale if scale is not None else (width // heads) ** -0.5
    out = eager_attention(q, k, v, heads, causal, padding, used_scale)
    inputs = {"query": q, "key": k, "value": v}
    if padding is not None:
        inputs["keyPaddingMask"] = padding
    params = {"heads": heads, "causal": causal}
    if scale is not None:
        params["scale"] = scale
    case(name, "attention", inputs, {"y": out}, **params)

# Indexing.
table = randn(11, 6)
ids = [3, 0, 10, 3]
case("embedding", "embedding", {"table": table}, {"y": F.embedding(torch.tensor(ids), table)}, ids=ids)
parts = [randn(2, 3, 4), randn(2, 1, 4), randn(2, 2, 4)]
case("concatenate_axis1", "concatenate", {f"part{i}": p for i, p in enumerate(parts)}, {"y": torch.cat(parts, dim=1)}, axis=1)
parts = [randn(2, 3, 4), randn(2, 3, 2)]
case("concatenate_last", "concatenate", {f"part{i}": p for i, p in enumerate(parts)}, {"y": torch.cat(parts, dim=-1)}, axis=-1)
x = randn(3, 5, 4)
positions = [0, 4, 2]
case("gather_tokens", "gatherTokens", {"x": x}, {"y": x[torch.arange(3), torch.tensor(positions)]}, positions=positions)

# Cases for the hand-written kernels, appended so the data of the cases above stays as it was. Layer norm over
# enough rows to be split between cores, with a feature count that is no multiple of the vector width.
x = randn(3, 50, 80, scale=2, shift=-3)
w, b = randn(80, scale=0.5, shift=1), randn(80, scale=0.2)
case("layer_norm_3x50x80", "layerNorm", {"x": x, "weight": w, "bias": b},
     {"y": F.layer_norm(x, (80,), w, b, 1e-5)}, eps=1e-5)


def padding_mask(batch, tk, left=False):
    """Item b masks b keys: its first b with left padding, its last b with right padding."""
    mask = torch.ones(batch, tk)
    for item in range(1, batch):
        if left:
            mask[item, :item] = 0
        else:
            mask[item, tk - item:] = 0
    return mask


# Head dims 32/64/80/128, cross attention with Tq != Tk, sequences long enough that the kernels work in query
# blocks, and left padding, which under a causal mask leaves the first queries with no key at all.
for name, batch, tq, tk, heads, width, causal, padding in [
    ("attention_head_dim_64_cross", 2, 5, 37, 2, 128, False, None),
    ("attention_head_dim_80", 2, 13, 13, 2, 160, False, "right"),
    ("attention_head_dim_128_causal", 2, 20, 20, 2, 256, True, "right"),
    ("attention_long", 1, 300, 333, 1, 64, False, None),
    ("attention_left_padding_causal", 3, 6, 6, 2, 64, True, "left"),
]:
    q, k, v = randn(batch, tq, width, scale=2), randn(batch, tk, width, scale=2), randn(batch, tk, width)
    mask = None if padding is None else padding_mask(batch, tk, left=padding == "left")
    inputs = {"query": q, "key": k, "value": v}
    if mask is not None:
        inputs["keyPaddingMask"] = mask
    out = eager_attention(q, k, v, heads, causal, mask, (width // heads) ** -0.5)
    case(name, "attention", inputs, {"y": out}, heads=heads, causal=causal)

# Packed [B, T, 3E] input, as a fused query-key-value projection produces it.
for name, batch, length, heads, width, causal, padded in [
    ("attention_packed_clip_like", 2, 50, 2, 128, False, False),
    ("attention_packed_causal_padding", 3, 11, 2, 64, True, True),
    ("attention_packed_long_causal_padding", 2, 301, 1, 32, True, True),
]:
    qkv = randn(batch, length, 3 * width, scale=2)
    q, k, v = qkv.split(width, dim=-1)
    mask = padding_mask(batch, length) if padded else None
    inputs = {"qkv": qkv}
    if mask is not None:
        inputs["keyPaddingMask"] = mask
    out = eager_attention(q.contiguous(), k.contiguous(), v.contiguous(), heads, causal, mask, (width // heads) ** -0.5)
    case(name, "attentionPacked", inputs, {"y": out}, heads=heads, causal=causal)

# Wider than one panel of the portable backend's GEMM (256 columns) and deeper (128), so its tiling is exercised.
# Appended last so the cases above keep their random inputs.
a, b = randn(3, 140), randn(140, 260)
case("matmul_panels", "matmul", {"a": a, "b": b}, {"y": a @ b}, transposeB=False)
b = randn(260, 140)
case("matmul_panels_transposed", "matmul", {"a": a, "b": b}, {"y": a @ b.T}, transposeB=True)

# A Linear whose sizes are not whole 16-row blocks and 64-column panels of oneDNN's packed fp32 layout, which the
# one-row product reads itself. Appended last so the cases above keep their random inputs.
x = randn(3, 70)
layer = torch.nn.Linear(70, 200)
r = randn(3, 200)
inputs = {"x": x, "weight": layer.weight, "bias": layer.bias, "residual": r}
case("linear_odd_sizes_gelu_residual", "linear", inputs, {"y": ACTIVATIONS["gelu"](layer(x)) + r}, activation="gelu")

os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "tensor_ops.bin"), "wb") as f:
    f.write(b"".join(blob))
with open(os.path.join(OUT, "tensor_ops.json"), "w") as f:
    json.dump({"generator": "oracle/tensor_ops.py", "torch": torch.__version__, "cases": cases}, f, indent=1)
print(f"{len(cases)} cases, {offset * 4} bytes")
