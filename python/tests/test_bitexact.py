"""Bit-exact through a full sync and deltas, with the values arithmetic gets wrong: NaNs with
payloads and signs, -0.0, infinities, subnormals (bf16, f16, f32; torch and numpy)."""

import unittest

import numpy as np
import torch

import refit
from refit_test_util import TempDirTest, bits, same_bits

# Adversarial bit patterns per width: NaNs (quiet, signalling, payloads, negative), +-0, +-inf,
# the smallest and largest subnormals, the largest finite values.
SPECIAL16 = {
    torch.bfloat16: [0x7FC0, 0x7F81, 0x7FAB, 0xFFC1, 0xFF80, 0x7F80, 0x8000, 0x0000, 0x0001,
                     0x007F, 0x8001, 0x7F7F, 0xFF7F],
    torch.float16: [0x7E00, 0x7C01, 0x7D55, 0xFE01, 0xFC00, 0x7C00, 0x8000, 0x0000, 0x0001,
                    0x03FF, 0x8001, 0x7BFF, 0xFBFF],
}  # fmt: skip
SPECIAL32 = [0x7FC00000, 0x7F800001, 0x7FA5A5A5, 0xFFC00001, 0xFF800000, 0x7F800000, 0x80000000,
             0x00000000, 0x00000001, 0x007FFFFF, 0x80000001, 0x7F7FFFFF]  # fmt: skip


def adversarial(dtype, n, seed):
    """n elements of `dtype`: random bits with the special patterns planted throughout."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.float32:
        raw = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64)
        raw = raw.to(torch.int32)
        special = torch.tensor([s - (1 << 32) if s >= 1 << 31 else s for s in SPECIAL32],
                               dtype=torch.int32)  # fmt: skip
    else:
        raw = torch.randint(-(2**15), 2**15 - 1, (n,), generator=g, dtype=torch.int64)
        raw = raw.to(torch.int16)
        special = torch.tensor([s - (1 << 16) if s >= 1 << 15 else s for s in SPECIAL16[dtype]],
                               dtype=torch.int16)  # fmt: skip
    positions = torch.randperm(n, generator=g)[: 4 * special.numel()]
    raw[positions] = special.repeat(4)
    return raw.view(dtype)


def mutate(tensor, seed):
    """Moves ~2% of the elements to other adversarial patterns (NaN payloads swap, +0 <-> -0)."""
    g = torch.Generator().manual_seed(seed)
    flat = bits(tensor).view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 50)]
    replacement = bits(adversarial(tensor.dtype, idx.numel(), seed + 1000))
    flat[idx] = replacement
    flat[idx[:4]] ^= 1  # lowest mantissa bit: a NaN payload or a subnormal changes by one ulp


class BitExactTest(TempDirTest):
    def sync_and_check(self, weights, engine, versions=3):
        sender = refit.Sender(self.config())
        receiver = refit.Receiver(self.config())
        receiver.attach(engine)
        for version in range(1, versions + 1):
            stats = sender.publish(weights)
            self.assertEqual(stats.full, version == 1)
            self.assertEqual(receiver.poll().version, version)
            for name, tensor in weights.items():
                if isinstance(tensor, np.ndarray):
                    self.assertEqual(engine[name].tobytes(), tensor.tobytes(), name)
                else:
                    self.assertTrue(same_bits(engine[name], tensor), f"{name} v{version}")
            for i, tensor in enumerate(weights.values()):
                mutate(torch.from_numpy(tensor) if isinstance(tensor, np.ndarray) else tensor,
                       100 * version + i)  # fmt: skip

    def test_torch_bf16_f16_f32(self):
        weights = {
            "bf16": adversarial(torch.bfloat16, 40_000, 1).view(200, 200),
            "f16": adversarial(torch.float16, 30_000, 2),
            "f32": adversarial(torch.float32, 20_000, 3).view(100, 200),
        }
        engine = {name: torch.full_like(t, float("nan")) for name, t in weights.items()}
        self.sync_and_check(weights, engine)

    def test_numpy_f16_f32(self):
        weights = {
            "f16": adversarial(torch.float16, 30_000, 4).numpy(),
            "f32": adversarial(torch.float32, 20_000, 5).view(200, 100).numpy(),
        }
        engine = {name: np.zeros_like(a) for name, a in weights.items()}
        self.sync_and_check(weights, engine)


if __name__ == "__main__":
    unittest.main()
