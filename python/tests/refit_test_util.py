"""Shared helpers of the Python tests: a temp-dir test case, a one-sender-one-receiver config
over the disk transport, bit views and a minimal safetensors writer."""

import json
import os
import shutil
import struct
import tempfile
import unittest

import torch

# Same-size integer dtypes: tensors are compared by their bits, never by value (NaN != NaN).
_BITS = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def bits(tensor):
    """The tensor's bits as integers of the same size."""
    return tensor.view(_BITS.get(tensor.dtype, tensor.dtype))


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def config_text(root, sender_extra="", receiver_extra=""):
    """TOML for one sender and one receiver ("r0") under `root`, fsync off (tests only)."""
    return f"""
[sender]
state_dir = "{root}/sender"
receivers = ["r0"]
ack_timeout_s = 10
{sender_extra}

[receiver]
id = "r0"
state_dir = "{root}/receiver"
poll_interval_ms = 10
{receiver_extra}

[transport]
name = "disk"

[transport.disk]
dir = "{root}/sync"
fsync = false
"""


_SAFETENSORS_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
}


def write_safetensors(path, tensors):
    """Writes {name: CPU tensor} as a safetensors file (the format's header, then the bytes)."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        data = bits(tensor.contiguous()).numpy().tobytes()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class TempDirTest(unittest.TestCase):
    """A test case with a fresh directory in self.dir."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="refit-py-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def config(self, **extra):
        return config_text(self.dir, **extra)
