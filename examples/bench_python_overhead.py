#!/usr/bin/env python3
"""What the Python path adds to refit's own time, on the same syncs.

A bf16 model of --params parameters (torch tensors) is published by refit.Sender and applied by a
refit.Receiver attached to a second copy, in this process, over the disk transport. For every
delta the wall time of sender.publish() and receiver.poll() as Python sees it is compared with the
time the C++ library measured inside the same call (SyncStats.seconds: the whole Publish;
ApplyStats.seconds: the whole PollOnce). The ratio is the binding's cost: DLPack conversion of
every tensor, argument checks, releasing and taking the GIL.

    PYTHONPATH=build/python python3 examples/bench_python_overhead.py --params 500M
"""
import argparse
import statistics
import tempfile
import time

import torch

import refit


def parse_count(text):
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def make_model(params, seed):
    """Llama-like shapes: a few large matrices and many small vectors."""
    gen = torch.Generator().manual_seed(seed)
    hidden = 2048
    tensors = {"embed": torch.randn(32000, hidden, generator=gen).to(torch.bfloat16)}
    layer = 0
    while sum(t.numel() for t in tensors.values()) < params:
        for name, shape in (("q", (hidden, hidden)), ("k", (hidden // 4, hidden)),
                            ("v", (hidden // 4, hidden)), ("o", (hidden, hidden)),
                            ("up", (5632, hidden)), ("down", (hidden, 5632)),
                            ("norm", (hidden,))):
            tensors[f"layers.{layer}.{name}"] = torch.randn(*shape, generator=gen).to(torch.bfloat16)
        layer += 1
    return tensors


def step(tensors, density, seed):
    """Moves ~density of every tensor's elements by one bf16 ulp, as a small lr step does."""
    gen = torch.Generator().manual_seed(seed)
    for t in tensors.values():
        bits = t.view(torch.int16)
        mask = torch.rand(bits.shape, generator=gen) < density
        bits[mask] += 1


def config(work):
    return (f'[sender]\nstate_dir = "{work}/sender"\nreceivers = ["r0"]\n\n'
            f'[receiver]\nid = "r0"\nstate_dir = "{work}/receiver"\n\n'
            f'[transport]\nname = "disk"\n\n[transport.disk]\ndir = "{work}/sync"\nfsync = false\n')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="500M", help="model size (bf16 parameters)")
    ap.add_argument("--versions", type=int, default=4, help="deltas to time")
    ap.add_argument("--density", type=float, default=0.015, help="fraction changed per step")
    args = ap.parse_args()
    trainer = make_model(parse_count(args.params), seed=1)
    engine = {name: torch.zeros_like(t) for name, t in trainer.items()}
    total = sum(t.numel() for t in trainer.values())
    with tempfile.TemporaryDirectory(prefix="refit-py-overhead-") as work:
        sender = refit.Sender(config(work))
        receiver = refit.Receiver(config(work))
        receiver.attach(engine)
        publish_ratio, poll_ratio = [], []
        print(f"{total / 1e6:.1f}M bf16 parameters ({2 * total / 1e9:.2f} GB), "
              f"{len(trainer)} tensors, density {args.density}")
        print(f"{'version':>7}  {'publish py':>10}  {'publish c++':>11}  {'poll py':>8}  "
              f"{'poll c++':>8}")
        for v in range(1, args.versions + 2):
            if v > 1:
                step(trainer, args.density, seed=v)
            t0 = time.perf_counter()
            sync = sender.publish(trainer)
            publish_wall = time.perf_counter() - t0
            t0 = time.perf_counter()
            applied = receiver.poll()
            poll_wall = time.perf_counter() - t0
            sender.wait(60)
            assert applied is not None and applied.version == sync.version
            assert all(torch.equal(engine[n].view(torch.int16), t.view(torch.int16))
                       for n, t in trainer.items()), "not bit-exact"
            if v == 1:
                continue  # the full sync
            publish_ratio.append(publish_wall / sync.seconds)
            poll_ratio.append(poll_wall / applied.seconds)
            print(f"{sync.version:>7}  {publish_wall:>9.3f}s  {sync.seconds:>10.3f}s  "
                  f"{poll_wall:>7.3f}s  {applied.seconds:>7.3f}s")
        print(f"bit-exact every version; Python wall / C++ time, median: publish "
              f"{statistics.median(publish_ratio):.3f}x, poll {statistics.median(poll_ratio):.3f}x")


if __name__ == "__main__":
    main()
