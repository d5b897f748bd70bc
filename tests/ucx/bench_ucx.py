#!/usr/bin/env python3
"""Wall time of `refit send --wait` over the ucx transport (not a test: a measurement for
docs/transports.md). Usage: REFIT_CLI=build/bin/refit bench_ucx.py TLS RECEIVERS MIB [K [LINK]]
(TLS "disk": the disk transport instead, for comparison; K: relay fan-out, the sender waiting for
every receiver before its first put; LINK: the ucx link_bandwidth of every connection, e.g. 50MB)
One full version of a MIB-sized random BF16 model, then one delta (~1.5% of the elements). With K,
also the sender's bytes out (its exit line) over the bytes it put for the version."""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ucx_transport_test as t  # noqa: E402


class Bench(t.UcxCase):
    def config(self, receivers, rid, extra="", name=None):
        path = super().config(receivers, rid, extra, name)
        if t.TLS == "disk":  # the same run over the disk transport, for comparison
            with open(path) as f:
                text = f.read().split("[transport]")[0]
            with open(path, "w") as f:
                f.write(text + f'[transport]\nname = "disk"\n[transport.disk]\n'
                        f'dir = "{self.dir}/channel"\nfsync = false\n')
        return path

    def runTest(self):
        receivers, mib = int(sys.argv[2]), int(sys.argv[3])
        k = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        link = f'link_bandwidth = "{sys.argv[5]}"\n' if len(sys.argv) > 5 else ""
        extra = f"k = {k}\n{link}"
        sender_extra = (f"await_receivers = {receivers}\nconnect_timeout_ms = 20000\n{extra}"
                        if k > 0 else extra)
        # Buckets well below the model: a relay forwards each one as it lands (pipelined).
        self.sender_extra = 'bucket_bytes = "8MiB"'
        v1 = t.make_model([mib << 16] * 8, seed=1)  # 8 BF16 tensors of mib/8 MiB
        vs = [v1, t.step(v1, 2)]
        rids = [f"r{i}" for i in range(receivers)]
        started = {rid: self.start_receiver(receivers, rid, 2, extra=extra) for rid in rids}
        for v, tensors in enumerate(vs, start=1):
            begin = time.monotonic()
            err = self.send(receivers, tensors, v, extra=sender_extra)
            took = time.monotonic() - begin
            out = t.BYTES_OUT.findall(err)
            put = t.RelayCase.version_bytes(self, v)
            ratio = f", sender out {int(out[-1][0])} B = {int(out[-1][0]) / put:.3f} x the " \
                    f"{put} B put ({out[-1]})" if out and t.TLS != "disk" else ""
            print(f"tls={t.TLS} receivers={receivers} k={k} {link.strip()} model={mib}MiB "
                  f"version {v} ({'full' if v == 1 else 'delta'}): send --wait {took:.2f} s"
                  f"{ratio}", flush=True)
            for rid in rids:
                self.assert_model_is(rid, tensors, f"version {v}")
        for rid in rids:
            self.finish(started[rid])


if __name__ == "__main__":
    t.TLS = sys.argv[1]
    result = unittest.TextTestRunner(verbosity=0).run(Bench())
    sys.exit(0 if result.wasSuccessful() else 1)
