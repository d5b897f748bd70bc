"""The GIL is released while refit works: another Python thread keeps counting during a long
publish, a long poll (apply) and a long offline diff and apply."""

import threading
import time
import unittest

import torch

import refit
from refit_test_util import TempDirTest, write_safetensors

ELEMENTS = 48 * 1024 * 1024  # 96 MiB of bf16: about half a second per call on a 2-core machine


class Counter:
    """A Python thread incrementing a counter as fast as the GIL lets it."""

    def __init__(self):
        self.value = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop:
            self.value += 1

    def __enter__(self):
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()


class GilTest(TempDirTest):
    def assert_counts_during(self, what, call):
        with Counter() as counter:
            before, start = counter.value, time.perf_counter()
            result = call()
            seconds, counted = time.perf_counter() - start, counter.value - before
        print(f"{what}: {seconds:.3f} s, the other thread counted {counted}")
        # With the GIL held the counter could not move at all during the call (a few counts at
        # its edges at most); released, a Python loop counts millions per second.
        self.assertGreater(counted, 10_000, f"{what} held the GIL for {seconds:.3f} s")
        return result

    def test_publish_and_poll_release_the_gil(self):
        weights = {"w": torch.randn(ELEMENTS // 4096, 4096).bfloat16()}
        engine = {"w": torch.zeros_like(weights["w"])}
        sender = refit.Sender(self.config(sender_extra='encoding = "indices"'))
        receiver = refit.Receiver(self.config())
        receiver.attach(engine)
        self.assert_counts_during("publish (full)", lambda: sender.publish(weights))
        self.assert_counts_during("poll (full)", receiver.poll)
        weights["w"].view(-1)[::7] += 1  # a dense-ish delta: every 7th element
        self.assert_counts_during("publish (delta)", lambda: sender.publish(weights))
        stats = self.assert_counts_during("poll (delta)", receiver.poll)
        self.assertFalse(stats.full)
        self.assertTrue(torch.equal(engine["w"].view(torch.int16), weights["w"].view(torch.int16)))

    def test_offline_diff_and_apply_release_the_gil(self):
        base = torch.randn(ELEMENTS // 4096, 4096).bfloat16()
        new = base.clone()
        new.view(-1)[::7] += 1
        write_safetensors(self.path("base.st"), {"w": base})
        write_safetensors(self.path("new.st"), {"w": new})
        self.assert_counts_during(
            "diff",
            lambda: refit.diff(self.path("base.st"), self.path("new.st"), self.path("d.st"),
                               encoding="indices"),  # fmt: skip
        )
        self.assert_counts_during(
            "apply", lambda: refit.apply(self.path("base.st"), self.path("d.st"), self.path("o.st"))
        )


if __name__ == "__main__":
    unittest.main()
