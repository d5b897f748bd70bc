"""Sender -> Receiver in one process: versions land in the attached tensors' own memory."""

import unittest

import numpy as np
import torch

import refit
from refit_test_util import TempDirTest, same_bits


def trainer_weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 32, generator=g).bfloat16(),
        "layers.0.mlp.weight": torch.randn(32, 96, generator=g).bfloat16(),
        "layers.0.norm.weight": torch.randn(32, generator=g),
        "lm_head.bias": torch.randn(64, generator=g).half(),
        "positions": torch.arange(40, dtype=torch.int64),
        "mask": torch.rand(17, generator=g) > 0.5,
    }


def step(weights, seed):
    """An optimizer-like step: a few elements of every float tensor change."""
    g = torch.Generator().manual_seed(seed)
    for tensor in weights.values():
        if tensor.is_floating_point():
            flat = tensor.view(-1)
            idx = torch.randint(0, flat.numel(), (5,), generator=g)
            flat[idx] = (flat[idx].float() + 0.5).to(tensor.dtype)


class SyncTest(TempDirTest):
    def test_receiver_writes_into_the_attached_tensors_own_storage(self):
        weights = trainer_weights()
        sender = refit.Sender(self.config())
        receiver = refit.Receiver(self.config())
        engine = {name: torch.zeros_like(t) for name, t in weights.items()}
        pointers = {name: t.data_ptr() for name, t in engine.items()}
        receiver.attach(engine)
        self.assertIsNone(receiver.poll())

        stats = sender.publish(weights)
        self.assertEqual((stats.version, stats.full, stats.base_version), (1, True, None))
        applied = receiver.poll()
        self.assertEqual((applied.version, applied.full), (1, True))
        for version in (2, 3):
            step(weights, version)
            stats = sender.publish(weights)
            self.assertEqual((stats.version, stats.full, stats.base_version),
                             (version, False, version - 1))  # fmt: skip
            self.assertGreater(stats.density, 0)
            self.assertLess(stats.density, 0.2)
            self.assertLess(stats.dense_fraction, 0.5)
            self.assertGreater(stats.payload_bytes, 0)
            applied = receiver.poll()
            self.assertEqual((applied.version, applied.full), (version, False))
            for name, tensor in engine.items():
                self.assertTrue(same_bits(tensor, weights[name]), name)
                self.assertEqual(tensor.data_ptr(), pointers[name], "written elsewhere: " + name)
        self.assertEqual(receiver.version, 3)
        sender.wait(5)
        self.assertEqual(sender.baseline_version, 3)
        self.assertEqual([(a.receiver, a.version) for a in sender.acks], [("r0", 3)])

    def test_sender_metrics_text_and_metrics_file(self):
        from prometheus_client.parser import text_string_to_metric_families

        weights = trainer_weights()
        config = self.config(sender_extra=f'metrics_file = "{self.path("sender-{rank}.prom")}"')
        sender = refit.Sender(config)
        receiver = refit.Receiver(self.config())
        receiver.attach({name: torch.zeros_like(t) for name, t in weights.items()})
        payload_bytes = 0
        for version in (1, 2, 3):
            step(weights, version)
            payload_bytes += sender.publish(weights).payload_bytes
            receiver.poll()
        text = sender.metrics()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        rank0 = (("rank", "0"),)
        self.assertEqual(samples[("refit_sender_versions_published_total", rank0)], 3)
        self.assertEqual(samples[("refit_sender_full_versions_published_total", rank0)], 1)
        self.assertEqual(samples[("refit_sender_payload_bytes_total", rank0)], payload_bytes)
        self.assertEqual(samples[("refit_sender_version", rank0)], 3)
        self.assertIn(("refit_sender_stage_seconds_total", (("rank", "0"), ("stage", "diff"))),
                      samples)  # fmt: skip
        with open(self.path("sender-0.prom"), encoding="utf-8") as f:
            self.assertEqual(f.read(), text)

    def test_named_parameters_of_modules_on_both_sides(self):
        torch.manual_seed(1)
        trainer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
        engine = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
        sender = refit.Sender(self.config())
        receiver = refit.Receiver(self.config())
        receiver.attach(engine.named_parameters())  # parameters that require grad
        for _ in range(2):
            sender.publish(trainer.named_parameters())
            receiver.poll()
            for (name, a), (_, b) in zip(trainer.named_parameters(), engine.named_parameters()):
                self.assertTrue(same_bits(a.detach(), b.detach()), name)
            with torch.no_grad():
                trainer[0].weight[0, :3] += 1

    def test_numpy_arrays_on_both_sides(self):
        rng = np.random.default_rng(3)
        weights = {
            "w": rng.standard_normal((50, 20)).astype(np.float32),
            "h": rng.standard_normal(33).astype(np.float16),
            "ids": np.arange(12, dtype=np.int32),
            "flags": np.array([True, False, True]),
        }
        engine = {name: np.zeros_like(a) for name, a in weights.items()}
        addresses = {name: a.ctypes.data for name, a in engine.items()}
        sender = refit.Sender(self.config())
        receiver = refit.Receiver(self.config())
        receiver.attach(list(engine.items()))
        for version in (1, 2):
            sender.publish(weights)
            self.assertEqual(receiver.poll().version, version)
            for name, a in engine.items():
                self.assertEqual(a.tobytes(), weights[name].tobytes(), name)
                self.assertEqual(a.ctypes.data, addresses[name], name)
            weights["w"][3, 4] = 7.0

    def test_a_restarted_engine_that_declares_its_version_continues_with_deltas(self):
        weights = trainer_weights()
        sender = refit.Sender(self.config())
        engine = {name: torch.zeros_like(t) for name, t in weights.items()}
        first = refit.Receiver(self.config())
        first.attach(engine)
        sender.publish(weights)
        first.poll()
        del first
        restarted = refit.Receiver(self.config())
        restarted.attach(engine, loaded_version=1)
        step(weights, 9)
        self.assertFalse(sender.publish(weights).full)
        applied = restarted.poll()
        self.assertEqual((applied.version, applied.full), (2, False))
        self.assertTrue(all(same_bits(engine[n], weights[n]) for n in weights))

    def test_model_digest_is_of_names_dtypes_shapes_and_bits(self):
        weights = trainer_weights()
        copy = {name: t.clone() for name, t in weights.items()}
        self.assertEqual(refit.model_digest(weights), refit.model_digest(reversed(copy.items())))
        copy["embed.weight"].view(torch.int16)[0, 0] ^= 1
        self.assertNotEqual(refit.model_digest(weights), refit.model_digest(copy))

    def test_config_from_a_path_text_or_object_with_overrides(self):
        path = self.path("refit.toml")
        with open(path, "w") as f:
            f.write(self.config())
        for config in (path, self.config(), refit.Config.from_file(path)):
            self.assertEqual(refit.load_config(config).get("receiver.id"), "r0")
        config = refit.Config.from_string(self.config(), "mine.toml")
        config.set("sender.ack_timeout_s", 2.5)
        config.set("sender.receivers", ["r0", "r1"])
        self.assertEqual(config.get("sender.ack_timeout_s"), 2.5)
        self.assertEqual(config.get("sender.receivers"), ["r0", "r1"])
        self.assertIsNone(config.get("sender.nothing"))
        self.assertEqual(config.label, "mine.toml")


class WaitTest(TempDirTest):
    """Receiver.wait between polls: woken by what the sender pushes (ucx), a sleep elsewhere."""

    def ucx_config(self):
        return f"""
[sender]
state_dir = "{self.dir}/sender"
receivers = ["r0"]
ack_timeout_s = 30

[receiver]
id = "r0"
state_dir = "{self.dir}/receiver"

[transport]
name = "ucx"

[transport.ucx]
rendezvous_file = "{self.dir}/sender.addr"
spool_dir = "{self.dir}/spool"
spool_fsync = false
tls = "tcp"
"""

    def test_over_disk_a_wait_is_a_sleep(self):
        receiver = refit.Receiver(self.config())
        self.assertFalse(receiver.wait(0.01))

    def test_over_ucx_what_the_sender_publishes_wakes_the_receiver(self):
        try:
            sender = refit.Sender(self.ucx_config())
        except refit.ConfigError as e:
            self.skipTest(f"no ucx transport here: {e}")
        receiver = refit.Receiver(self.ucx_config())
        weights = trainer_weights()
        engine = {name: torch.zeros_like(t) for name, t in weights.items()}
        receiver.attach(engine)
        for _ in range(100):  # what arrived when the two met
            if not receiver.wait(0.02):
                break
        for version in (1, 2, 3):
            if version > 1:
                step(weights, version)
            sender.publish(weights)
            applied = receiver.poll()
            for _ in range(100):  # each wake is an arrival: a payload, the manifest, the commit
                if applied is not None:
                    break
                # 60 s: a receiver that is not woken returns False long before anything else ends
                self.assertTrue(receiver.wait(60.0), f"version {version}: no wake")
                applied = receiver.poll()
            self.assertIsNotNone(applied, f"version {version}")
            self.assertEqual(applied.version, version)
            for name, tensor in engine.items():
                self.assertTrue(same_bits(tensor, weights[name]), name)
            sender.wait(30.0)


if __name__ == "__main__":
    unittest.main()
