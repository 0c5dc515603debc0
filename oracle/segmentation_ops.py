"""Fixtures for the VLMTensor ops CLIPSeg brought (sigmoid, transposed convolution, interpolation, FiLM modulation,
channels-first tokens, .npy writing): small random inputs and what PyTorch and NumPy make of them.

Writes Tests/Fixtures/tensor/segmentation_ops.json and segmentation_ops.bin in tensor_ops.py's layout (which
OpFixtures reads together with tensor_ops.*), and Tests/Fixtures/tensor/npy/*.npy written by numpy.save. A file of
its own, so that these cases can be regenerated without recomputing tensor_ops.py's outputs, whose last bits depend
on the CPU they were computed on.

Run: python oracle/segmentation_ops.py
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


# Sigmoid (segmentation logits to probabilities); transposed convolutions: a decoder's non-overlapping upsampling
# (kernel = stride) with and without bias, overlapping kernels, padding.
x = randn(4, 257, scale=3)
case("activation_sigmoid", "activation", {"x": x}, {"y": torch.sigmoid(x)}, activation="sigmoid")
for name, cin, cout, k, stride, padding, bias, height, width in [
    ("conv_transpose_patch", 8, 1, 4, 4, 0, True, 3, 3),
    ("conv_transpose_patch_no_bias", 6, 3, 2, 2, 0, False, 5, 4),
    ("conv_transpose_overlapping", 5, 4, 3, 2, 1, True, 4, 6),
    ("conv_transpose_kernel_4_stride_2", 3, 2, 4, 2, 0, True, 3, 5),
]:
    layer = torch.nn.ConvTranspose2d(cin, cout, k, stride=stride, padding=padding, bias=bias)
    x = randn(2, cin, height, width)
    inputs = {"x": x, "weight": layer.weight}
    if bias:
        inputs["bias"] = layer.bias
    case(name, "convTranspose2d", inputs, {"y": layer(x)}, stride=stride, padding=padding)

# interpolate(align_corners=False): bicubic as CLIPSeg resizes a position-embedding grid (7x7 to 22x22, 2x2 to 5x3),
# and shrinking; bilinear up and down by uneven factors, as a probability map is resized to a photo.
for name, mode, shape, size in [
    ("interpolate_bicubic_positions", "bicubic", (1, 6, 7, 7), (22, 22)),
    ("interpolate_bicubic_tiny_grid", "bicubic", (1, 3, 2, 2), (5, 3)),
    ("interpolate_bicubic_down", "bicubic", (2, 2, 9, 11), (4, 6)),
    ("interpolate_bilinear_up", "bilinear", (1, 1, 8, 8), (37, 23)),
    ("interpolate_bilinear_down", "bilinear", (2, 13, 17), (5, 7)),
    ("interpolate_bilinear_one_pixel", "bilinear", (1, 1, 1), (3, 4)),
]:
    x = randn(*shape)
    batched = x if x.dim() == 4 else x[None]
    y = F.interpolate(batched, size=size, mode=mode, align_corners=False)
    case(name, "interpolate", {"x": x}, {"y": y if x.dim() == 4 else y[0]}, mode=mode, height=size[0], width=size[1])

# FiLM: each batch item's tokens scaled and shifted by its own vectors.
x, scale, shift = randn(3, 5, 8), randn(3, 8), randn(3, 8)
case("modulated", "modulated", {"x": x, "scale": scale, "shift": shift}, {"y": x * scale[:, None] + shift[:, None]})
x = randn(2, 6, 5)
case("channels_first", "channelsFirst", {"x": x}, {"y": x.movedim(-1, 1)})

# .npy files as numpy.save writes them, for Tensor.npyBytes to match byte for byte: scalar, vector, matrix, a first
# axis with more digits (less growth padding), rank 4.
os.makedirs(os.path.join(OUT, "npy"), exist_ok=True)
for name, shape in [("npy_scalar", ()), ("npy_vector", (5,)), ("npy_matrix", (3, 4)), ("npy_long_axis", (1200, 2)),
                    ("npy_rank4", (1, 2, 3, 2))]:
    x = torch.randn(shape)
    np.save(os.path.join(OUT, "npy", name + ".npy"), x.numpy().astype("<f4"))
    case(name, "npy", {"x": x}, {})

os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "segmentation_ops.bin"), "wb") as f:
    f.write(b"".join(blob))
with open(os.path.join(OUT, "segmentation_ops.json"), "w") as f:
    json.dump({"generator": "oracle/segmentation_ops.py", "torch": torch.__version__, "cases": cases}, f, indent=1)
print(f"{len(cases)} cases, {offset * 4} bytes")
