"""Safetensors files and synthetic BF16 models for the transport tests that drive real `refit`
processes (tests/s3, tests/ucx): written and read with the standard library only."""
import json
import random
import struct


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, data in tensors:
            f.write(data)


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {name: (t["dtype"], t["shape"], blob[base + t["data_offsets"][0]:base + t["data_offsets"][1]])
            for name, t in header.items()}


def make_model(element_counts, seed):
    """BF16 tensors of random bits (plus one F32), each a list of (name, dtype, shape, bytearray)."""
    rng = random.Random(seed)
    tensors = [(f"model.layers.{i}.weight", "BF16", [n], bytearray(rng.randbytes(2 * n)))
               for i, n in enumerate(element_counts)]
    tensors.append(("model.norm.weight", "F32", [64], bytearray(rng.randbytes(256))))
    return tensors


def step(tensors, version):
    """Like a small optimizer step on BF16: flips the low mantissa bit of ~1.5% of elements."""
    stride, out = 61 + version, []
    for name, dtype, shape, data in tensors:
        data = bytearray(data)
        sl = slice(version % stride * 2, None, stride * 2)
        data[sl] = bytes(b ^ 1 for b in data[sl])
        out.append((name, dtype, shape, data))
    return out
