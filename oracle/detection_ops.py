"""Fixtures for the VLMTensor ops OWL-ViT brought (ELU, a norm with epsilon, class-token scaling of patch tokens, a
per-row shift and scale): small random inputs and what PyTorch makes of them, as OWL-ViT's heads compute them.

Writes Tests/Fixtures/tensor/detection_ops.json and detection_ops.bin in tensor_ops.py's layout (which OpFixtures
reads together with the others). A file of its own, so that these cases are regenerated without recomputing the
others' outputs.

Run: python oracle/detection_ops.py
"""
import json
import os

import torch

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


# nn.ELU() (OWL-ViT's logit scale is elu(x) + 1), over both signs and large negatives.
x = torch.randn(4, 257) * 4
case("activation_elu", "activation", {"x": x}, {"y": torch.nn.ELU()(x)}, activation="elu")

# x / (‖x‖ + 1e-6), as the class head normalizes patch and query embeddings; a zero row stays zero.
x = torch.randn(3, 5, 24)
x[1, 2] = 0
case("l2_normalized_epsilon", "l2NormalizedEpsilon", {"x": x},
     {"y": x / (torch.linalg.norm(x, dim=-1, keepdim=True) + 1e-6)}, eps=1e-6)

# Patch tokens times their image's class token: image_embeds[:, 1:, :] * broadcast(image_embeds[:, :1, :]).
x = torch.randn(2, 7, 16)
factors = torch.randn(2, 16)
case("multiplying_tokens", "multiplyingTokens", {"x": x, "factors": factors}, {"y": x * factors[:, None, :]})

# (pred_logits + logit_shift) * logit_scale, both [B, P, 1].
x = torch.randn(2, 9, 4)
shift = torch.randn(2, 9, 1)
scale = torch.nn.ELU()(torch.randn(2, 9, 1)) + 1
case("shifted_and_scaled", "shiftedAndScaled", {"x": x, "shift": shift, "scale": scale}, {"y": (x + shift) * scale})

with open(os.path.join(OUT, "detection_ops.bin"), "wb") as f:
    f.write(b"".join(blob))
with open(os.path.join(OUT, "detection_ops.json"), "w") as f:
    json.dump({"generator": "oracle/detection_ops.py", "torch": torch.__version__, "cases": cases}, f, indent=1)
