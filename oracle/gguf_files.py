"""GGUF reader fixtures: files written by the `gguf` package (llama.cpp's gguf-py) and broken variants of them.

Run by hand:  python oracle/gguf_files.py
Writes Tests/Fixtures/gguf/:
  every_type.gguf       every metadata value type (arrays of each, nested, empty string) and F32, F16, BF16,
                        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and Q2_K tensors (Q2_K: a type the reader
                        cannot dequantize)
  aligned64.gguf        general.alignment = 64
  expected.json         metadata with gguf-py's value types; per tensor the ggml type, dims and gguf-py's
                        dequantized values as fp32 bit patterns (gguf.quants.dequantize)
  broken/*.gguf         corrupt copies of a small file, each with the error the reader must name (broken.json)
  matmul.json           per quantized format and F16, BF16, a 37-row matrix of random blocks (base64) and the
                        product of 17 activation rows with its gguf-py dequantization, in float64 (for the quantized
                        Linear tests)
"""

import base64
import json
import struct
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V

OUT = Path(__file__).resolve().parent.parent / "Tests" / "Fixtures" / "gguf"
rng = np.random.default_rng(4)


def bits(values: np.ndarray) -> list[int]:
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32).tolist()


def typed(value, vtype, sub_type=None):
    if vtype == V.ARRAY:
        return {"type": "ARRAY", "elements": [typed(v, sub_type) if not isinstance(v, tuple) else typed(*v) for v in value]}
    if vtype in (V.FLOAT32, V.FLOAT64):
        return {"type": vtype.name, "value": float(np.float32(value)) if vtype == V.FLOAT32 else float(value)}
    return {"type": vtype.name, "value": value}


K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
BLOCK_BYTES = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.Q8_0: 34, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}
BLOCK_ELEMENTS = {q: (256 if q in K_QUANTS else 32) for q in BLOCK_BYTES}


def random_blocks(qtype, rows, columns):
    """Random quantized blocks whose fp16 scales (and minimums) are small finite numbers, so values stay sane."""
    blocks = rows * columns // BLOCK_ELEMENTS[qtype]
    data = rng.integers(0, 256, (blocks, BLOCK_BYTES[qtype]), dtype=np.uint8)

    def put_half(offset, low, high):
        data[:, offset:offset + 2] = rng.uniform(low, high, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2)

    if qtype == Q.Q6_K:
        put_half(208, 0.001, 0.01)
    else:
        put_half(0, -0.05 if qtype not in K_QUANTS else 0.001, 0.05 if qtype not in K_QUANTS else 0.01)
        if qtype in (Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K):
            put_half(2, -0.05 if qtype not in K_QUANTS else 0.001, 0.05 if qtype not in K_QUANTS else 0.02)
    return data.reshape(rows, -1)


def write_matmul():
    """Rows and columns chosen so that row groups have a remainder, and 32-element formats end on a partial chunk."""
    rows, samples = 37, 17

    def case(qtype, stored, columns):
        weight = gguf.quants.dequantize(stored, qtype).astype(np.float64)
        x = rng.standard_normal((samples, columns)).astype(np.float32)
        return {
            "rows": rows, "columns": columns,
            "blocks": base64.b64encode(stored.tobytes()).decode(),
            "x": base64.b64encode(x.tobytes()).decode(),
            "y": (x.astype(np.float64) @ weight.T).reshape(-1).tolist(),
        }

    cases = {}
    for qtype in BLOCK_BYTES:
        columns = 512 if qtype in K_QUANTS else 320
        cases[qtype.name] = case(qtype, random_blocks(qtype, rows, columns), columns)
    # F16 and BF16 matrices, which SwiftVLM also multiplies as stored (in blocks of 32 values).
    for qtype in (Q.F16, Q.BF16):
        values = rng.standard_normal((rows, 320)).astype(np.float32) * 0.1
        cases[qtype.name] = case(qtype, gguf.quants.quantize(values, qtype), 320)
    return cases


def write_every_type():
    writer = gguf.GGUFWriter(OUT / "every_type.gguf", arch="llama")
    metadata = {"general.architecture": typed("llama", V.STRING)}
    scalars = [
        ("test.uint8", 200, V.UINT8), ("test.int8", -100, V.INT8), ("test.uint16", 60000, V.UINT16),
        ("test.int16", -30000, V.INT16), ("test.uint32", 4000000000, V.UINT32), ("test.int32", -2000000000, V.INT32),
        ("test.float32", 0.1, V.FLOAT32), ("test.bool_true", True, V.BOOL), ("test.bool_false", False, V.BOOL),
        ("test.string", "héllo, wörld ✓", V.STRING), ("test.empty_string", "", V.STRING),
        ("test.uint64", 18000000000000000000, V.UINT64), ("test.int64", -9000000000000000000, V.INT64),
        ("test.float64", 2.718281828459045, V.FLOAT64),
    ]
    for key, value, vtype in scalars:
        writer.add_key_value(key, value, vtype)
        metadata[key] = typed(value, vtype)
    arrays = [
        ("test.array_uint8", [1, 2, 255], V.UINT8), ("test.array_int32", [-1, 0, 7], V.INT32),
        ("test.array_float32", [0.5, -1.25], V.FLOAT32), ("test.array_bool", [True, False], V.BOOL),
        ("test.array_string", ["a", "", "<|im_end|>"], V.STRING), ("test.array_uint64", [1, 2 ** 40], V.UINT64),
        ("test.array_float64", [1e-300], V.FLOAT64)
    ]
    for key, value, sub in arrays:
        writer.add_key_value(key, value, V.ARRAY, sub_type=sub)
        metadata[key] = typed(value, V.ARRAY, sub)
    # Arrays of arrays: gguf-py infers element types for nested lists.
    writer.add_key_value("test.array_nested", [[1, 2], [3]], V.ARRAY, sub_type=V.ARRAY)
    metadata["test.array_nested"] = {"type": "ARRAY", "elements": [
        {"type": "ARRAY", "elements": [typed(1, V.INT32), typed(2, V.INT32)]},
        {"type": "ARRAY", "elements": [typed(3, V.INT32)]}]}

    tensors = {}

    def add(name, data, qtype, shape):
        if qtype == Q.Q2_K:
            # The bytes only need the right size for a type the reader refuses.
            writer.add_tensor(name, np.zeros((shape[0], 84 * shape[1] // 256), np.uint8), raw_dtype=qtype)
            expected = None
        elif qtype in K_QUANTS:
            # gguf-py cannot quantize K-quants: random blocks with sane scales, dequantized by gguf-py.
            quantized = random_blocks(qtype, shape[0], shape[1])
            writer.add_tensor(name, quantized, raw_dtype=qtype)
            expected = gguf.quants.dequantize(quantized, qtype)
        elif qtype == Q.BF16:
            as_bits = data.astype(np.float32).view(np.uint32)
            quantized = ((as_bits + 0x7FFF + ((as_bits >> 16) & 1)) >> 16).astype(np.uint16)
            writer.add_tensor(name, quantized.view(np.uint8), raw_shape=None, raw_dtype=Q.BF16)
            expected = (quantized.astype(np.uint32) << 16).view(np.float32)
        elif qtype in (Q.F32, Q.F16):
            quantized = gguf.quants.quantize(data, qtype)
            writer.add_tensor(name, quantized)
            expected = gguf.quants.dequantize(quantized, qtype)
        else:
            quantized = gguf.quants.quantize(data, qtype)
            writer.add_tensor(name, quantized, raw_dtype=qtype)
            expected = gguf.quants.dequantize(quantized, qtype)
        entry = {"type": qtype.name, "shape": list(shape), "dims": list(reversed(shape))}
        if expected is not None:
            entry["bits"] = bits(expected)
        tensors[name] = entry

    add("plain.f32", rng.standard_normal((3, 5)).astype(np.float32), Q.F32, (3, 5))
    add("plain.f16", rng.standard_normal((2, 3, 4)).astype(np.float32), Q.F16, (2, 3, 4))
    add("plain.bf16", rng.standard_normal((4, 6)).astype(np.float32), Q.BF16, (4, 6))
    for qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        add(f"quant.{qtype.name.lower()}", (rng.standard_normal((3, 64)) * 2 + 0.3).astype(np.float32), qtype, (3, 64))
    for qtype in K_QUANTS:
        add(f"quant.{qtype.name.lower()}", None, qtype, (2, 512))
    add("quant.q2_k", None, Q.Q2_K, (1, 256))
    add("rank4.f32", rng.standard_normal((2, 1, 2, 3)).astype(np.float32), Q.F32, (2, 1, 2, 3))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"metadata": metadata, "metadata_keys": list(metadata), "tensors": tensors, "alignment": 32, "version": 3}


def write_aligned64():
    writer = gguf.GGUFWriter(OUT / "aligned64.gguf", arch="llama")
    writer.add_custom_alignment(64)
    first = rng.standard_normal(3).astype(np.float32)
    second = rng.standard_normal((2, 2)).astype(np.float32)
    writer.add_tensor("first", first)
    writer.add_tensor("second", second)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"alignment": 64, "tensors": {"first": bits(first), "second": bits(second)}}


# Broken files are hand-packed so that every field's offset is known; the valid base is checked against gguf-py.

def pack_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def pack_file(*, magic=b"GGUF", version=3, tensor_count=None, kv_count=None, kvs=None, infos=None, data=None,
              alignment=32):
    kvs = kvs if kvs is not None else [pack_string(b"general.architecture") + struct.pack("<I", 8) + pack_string(b"llama")]
    if infos is None:
        infos = [pack_string(b"weight") + struct.pack("<I", 2) + struct.pack("<QQ", 4, 2) + struct.pack("<I", 0) + struct.pack("<Q", 0)]
    data = data if data is not None else np.arange(8, dtype=np.float32).tobytes()
    head = magic + struct.pack("<I", version)
    head += struct.pack("<Q", len(infos) if tensor_count is None else tensor_count)
    head += struct.pack("<Q", len(kvs) if kv_count is None else kv_count)
    body = head + b"".join(kvs) + b"".join(infos)
    body += b"\0" * ((-len(body)) % alignment)
    return body + data


def info(name, dims, ggml_type, offset):
    return pack_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<I", ggml_type) + struct.pack("<Q", offset)


def write_broken():
    directory = OUT / "broken"
    directory.mkdir(parents=True, exist_ok=True)
    valid = pack_file()
    reader = gguf.GGUFReader(_write(directory / "valid.gguf", valid))
    assert [t.name for t in reader.tensors] == ["weight"]
    assert reader.tensors[0].data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]

    huge = 1 << 62
    cases = {
        "empty": (b"", None, "shorter than the 24-byte GGUF header"),
        "bad_magic": (pack_file(magic=b"GGML"), None, "bad magic"),
        "version1": (pack_file(version=1), None, "version 1"),
        "version4": (pack_file(version=4), None, "version 4"),
        "big_endian": (pack_file(version=3 << 24), None, "big-endian"),
        "truncated_header": (valid[:20], None, "truncated"),
        "truncated_metadata": (valid[:40], None, "truncated"),
        "truncated_data": (valid[:-8], "weight", "past the end"),
        "truncated_q4_1": (pack_file(infos=[info(b"blk.0.ffn_up.weight", [64, 2], 3, 0)], data=bytes(79)),
                           "blk.0.ffn_up.weight", "past the end"),
        "absurd_tensor_count": (pack_file(tensor_count=huge), None, "tensor count"),
        "absurd_kv_count": (pack_file(kv_count=huge), None, "metadata key count"),
        "absurd_string_length": (pack_file(kvs=[struct.pack("<Q", huge) + b"general"]), None, "length of metadata key 0"),
        "absurd_array_length": (pack_file(kvs=[pack_string(b"a") + struct.pack("<IIQ", 9, 8, huge)]), None, "length of 'a'"),
        "deep_array": (pack_file(kvs=[pack_string(b"deep") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 9 + struct.pack("<IQ", 0, 0)]),
                       None, "nests arrays"),
        "unknown_value_type": (pack_file(kvs=[pack_string(b"odd") + struct.pack("<I", 13) + b"\0" * 8]), None, "unknown value type 13"),
        "bad_bool": (pack_file(kvs=[pack_string(b"flag") + struct.pack("<I", 7) + b"\x02"]), None, "bool stored as 2"),
        "duplicate_key": (pack_file(kvs=[pack_string(b"k") + struct.pack("<IB", 0, 1)] * 2), None, "appears twice"),
        "bad_alignment": (pack_file(kvs=[pack_string(b"general.alignment") + struct.pack("<II", 4, 24)]), None, "power of two"),
        "five_dims": (pack_file(infos=[info(b"weight", [2, 1, 1, 2, 2], 0, 0)]), "weight", "5 dimensions"),
        "offset_past_end": (pack_file(infos=[info(b"weight", [4, 2], 0, 1 << 40)]), "weight", "past the end"),
        "misaligned_offset": (pack_file(infos=[info(b"weight", [2], 0, 4)]), "weight", "not a multiple of the alignment"),
        "unknown_tensor_type": (pack_file(infos=[info(b"weight", [4, 2], 99, 0)]), "weight", "unknown tensor type 99"),
        "partial_block": (pack_file(infos=[info(b"weight", [16], 2, 0)]), "weight", "not a multiple of Q4_0's block"),
        "huge_dims": (pack_file(infos=[info(b"weight", [1 << 31, 1 << 31, 1 << 31, 1 << 31], 0, 0)]), "weight", "out of range"),
        "overflowing_dims": (pack_file(infos=[info(b"weight", [(1 << 31) - 1] * 4, 0, 0)]), "weight", "past the end"),
        "overlapping": (pack_file(infos=[info(b"a", [4], 0, 0), info(b"b", [4], 0, 0)]), "b", "overlaps tensor 'a'"),
        "duplicate_tensor": (pack_file(infos=[info(b"a", [4], 0, 0), info(b"a", [4], 0, 32)],
                                       data=np.zeros(16, np.float32).tobytes()), "a", "appears twice"),
    }
    expected = {}
    for name, (content, tensor, message) in cases.items():
        _write(directory / f"{name}.gguf", content)
        expected[name] = {"tensor": tensor, "message": message}
    return expected


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    expected = write_every_type()
    # Cross-check against gguf-py's own reader: offsets, types and shapes must round-trip.
    reader = gguf.GGUFReader(OUT / "every_type.gguf")
    for tensor in reader.tensors:
        entry = expected["tensors"][tensor.name]
        assert tensor.tensor_type.name == entry["type"], tensor.name
        assert list(tensor.shape) == entry["dims"], (tensor.name, tensor.shape)
        entry["data_offset"] = int(tensor.data_offset)  # from the start of the file
    for key, entry in expected["metadata"].items():
        assert reader.fields[key].types[0].name == entry["type"], key
    expected["aligned64"] = write_aligned64()
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    (OUT / "broken.json").write_text(json.dumps(write_broken(), indent=1) + "\n")
    (OUT / "matmul.json").write_text(json.dumps(write_matmul()) + "\n")


if __name__ == "__main__":
    main()
