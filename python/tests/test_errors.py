"""Errors: refit.Error subclasses per status code, carrying refit's message (which names the
tensor, file or key at fault)."""

import os
import unittest

import numpy as np
import torch

import refit
from refit_test_util import TempDirTest, write_safetensors

WEIGHTS = {"a.weight": torch.ones(8, 4).bfloat16(), "b.bias": torch.ones(6)}


class MismatchTest(TempDirTest):
    """The attached tensors must be the published ones: names, dtypes and shapes."""

    def assert_poll_refuses(self, engine, *fragments):
        sender = refit.Sender(self.config())
        receiver = refit.Receiver(self.config())
        receiver.attach(engine)
        sender.publish(WEIGHTS)
        with self.assertRaises(refit.InvalidArgumentError) as caught:
            receiver.poll()
        for fragment in fragments:
            self.assertIn(fragment, str(caught.exception))
        self.assertEqual(caught.exception.code, "invalid argument")
        self.assertIsInstance(caught.exception, ValueError)
        self.assertEqual(receiver.version, 0)

    def test_a_missing_name(self):
        self.assert_poll_refuses({"a.weight": torch.zeros(8, 4).bfloat16()}, "'b.bias'")

    def test_a_dtype_mismatch(self):
        self.assert_poll_refuses(
            {"a.weight": torch.zeros(8, 4).half(), "b.bias": torch.zeros(6)}, "'a.weight'"
        )

    def test_a_shape_mismatch(self):
        self.assert_poll_refuses(
            {"a.weight": torch.zeros(4, 8).bfloat16(), "b.bias": torch.zeros(6)}, "'a.weight'"
        )


class RefusedTensorsTest(TempDirTest):
    def test_non_contiguous_tensors_are_refused_by_name(self):
        sender = refit.Sender(self.config())
        receiver = refit.Receiver(self.config())
        transposed = {"a.weight": torch.zeros(4, 8).bfloat16().t(), "b.bias": torch.zeros(6)}
        for call in (sender.publish, receiver.attach):
            with self.assertRaisesRegex(refit.UnsupportedError, r"'a\.weight': not contiguous"):
                call(transposed)
        strided = {"x": np.zeros((4, 8), np.float32)[:, ::2]}
        for call in (sender.publish, receiver.attach):
            with self.assertRaisesRegex(refit.UnsupportedError, r"'x': not contiguous"):
                call(strided)

    def test_read_only_arrays_cannot_be_attached(self):
        array = np.zeros(4, np.float32)
        array.setflags(write=False)
        with self.assertRaisesRegex(refit.InvalidArgumentError, "'ro': read-only"):
            refit.Receiver(self.config()).attach({"ro": array})
        refit.Sender(self.config()).publish({"ro": array})  # reading it is fine

    def test_what_is_not_a_tensor_or_not_a_refit_dtype(self):
        sender = refit.Sender(self.config())
        with self.assertRaisesRegex(refit.InvalidArgumentError, "'l': a list is not a tensor"):
            sender.publish({"l": [1.0, 2.0]})
        with self.assertRaisesRegex(refit.UnsupportedError, "'c': numpy dtype <c8"):
            sender.publish({"c": np.zeros(3, np.complex64)})
        with self.assertRaisesRegex(refit.InvalidArgumentError, "'x' is given twice"):
            sender.publish([("x", torch.zeros(2)), ("x", torch.zeros(2))])
        with self.assertRaisesRegex(refit.InvalidArgumentError, "pairs"):
            sender.publish([torch.zeros(3)])


class StatusCodeTest(TempDirTest):
    def test_config_errors_name_the_file_line_and_key(self):
        with self.assertRaisesRegex(refit.ConfigError, r"<string>:\d+: unknown key 'sender.typo'"):
            refit.Sender(self.config(sender_extra="typo = 1"))
        missing = self.path("missing.toml")
        with self.assertRaises(refit.ConfigError) as caught:
            refit.Receiver(missing)
        self.assertIn(missing, str(caught.exception))
        self.assertEqual(caught.exception.code, "not found")
        with self.assertRaisesRegex(refit.ConfigError, "not a config"):
            refit.Sender(42)
        with self.assertRaisesRegex(refit.ConfigError, "'sender.x'"):
            refit.Config.from_string("").set("sender.x", object())

    def test_waiting_for_an_ack_that_never_comes_times_out(self):
        sender = refit.Sender(self.config())
        sender.publish(WEIGHTS)
        with self.assertRaisesRegex(refit.TimeoutError, "version 1 not acknowledged") as caught:
            sender.wait(0.2)
        self.assertIsInstance(caught.exception, TimeoutError)  # the builtin one too
        self.assertEqual(sender.baseline_version, 0)

    def test_offline_apply_on_the_wrong_base_or_a_damaged_delta(self):
        base, new, other = self.path("base.st"), self.path("new.st"), self.path("other.st")
        write_safetensors(base, WEIGHTS)
        write_safetensors(new, {"a.weight": WEIGHTS["a.weight"] * 2, "b.bias": WEIGHTS["b.bias"]})
        write_safetensors(other, {"a.weight": WEIGHTS["a.weight"] * 3, "b.bias": WEIGHTS["b.bias"]})
        delta, out = self.path("delta.st"), self.path("out.st")
        refit.diff(base, new, delta)
        with self.assertRaises(refit.VersionMismatchError) as caught:
            refit.apply(other, delta, out)
        self.assertIn("other.st", str(caught.exception))
        self.assertFalse(os.path.exists(out))

        with open(delta, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(size - 3)
            byte = f.read(1)
            f.seek(size - 3)
            f.write(bytes([byte[0] ^ 0x5A]))
        with self.assertRaises(refit.CorruptError) as caught:
            refit.apply(base, delta, out)
        self.assertIn("delta.st", str(caught.exception))
        self.assertFalse(os.path.exists(out))

        with self.assertRaises((refit.NotFoundError, refit.TransportError)) as caught:
            refit.apply(self.path("nothing.st"), delta, out)
        self.assertIn("nothing.st", str(caught.exception))

    def test_every_class_is_a_refit_error(self):
        for cls in (refit.ConfigError, refit.InvalidArgumentError, refit.NotFoundError,
                    refit.TransportError, refit.CorruptError, refit.UnsupportedError,
                    refit.VersionMismatchError, refit.AlreadyExistsError, refit.TimeoutError,
                    refit.InternalError):  # fmt: skip
            self.assertTrue(issubclass(cls, refit.Error), cls)
        self.assertTrue(issubclass(refit.TransportError, OSError))
        self.assertEqual(str(refit.TransportError("disk full")), "disk full")


if __name__ == "__main__":
    unittest.main()
