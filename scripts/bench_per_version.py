#!/usr/bin/env python3
"""Per-version cost of `refit send` / `refit recv` against the codec alone, in one run.

For a trajectory of checkpoints (ckpt_00.safetensors, ckpt_01, ...: ../shared/data/trajectory-small,
or `refit bench trajectory --out DIR`), publishes each with `refit send --json` and applies it with
`refit recv --json` over the disk transport with the default (durable) settings, timing each
process's wall clock (process start and plugin loading included). For every delta it then runs
`refit bench codec --pair PREV CUR` with the encoding the sender used and the sender's thread count,
and prints send / (1.5 x bench diff+encode + 30 ms) and recv / (1.5 x bench apply + 30 ms): the
targets of docs/benchmarks.md ("Per-version cost") are ratios <= 1.

Before each timed process it waits for the machine's dirty pages to be written back (sync(2)):
sender and receiver share this machine, and the kernel's writeback of what the other process (or
the previous version) left dirty would otherwise run on the same cores, which it does not on
separate machines with an RL step between versions. --no-settle times them back to back.

  scripts/bench_per_version.py --refit build/bin/refit --checkpoints DIR [--rounds N] [--work DIR]
      [--chunk-bytes SIZE]
      [--json FILE]
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, settle=False):
    if settle:
        os.sync()
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"bench_per_version: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout, seconds


def codec_row(report, encoding, threads):
    """(model bytes, encode seconds, apply seconds) of `encoding` at `threads` in a codec report."""
    found = []

    def walk(node, model_bytes):
        if isinstance(node, dict):
            model_bytes = node.get("model_bytes", model_bytes)
            if node.get("encoding") == encoding and node.get("threads") == threads:
                found.append((model_bytes, node))
            for v in node.values():
                walk(v, model_bytes)
        elif isinstance(node, list):
            for v in node:
                walk(v, model_bytes)

    walk(report, None)
    if not found or not found[0][0]:
        sys.exit(f"bench_per_version: no '{encoding}' row at {threads} threads in the codec report")
    model_bytes, row = found[0]
    encode_s = model_bytes / (row["encode_gbps"] * 1e9)
    apply_s = model_bytes / (row["apply_gbps"] * 1e9) if row.get("apply_gbps") else float("nan")
    return model_bytes, encode_s, apply_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", default="build/bin/refit")
    ap.add_argument("--checkpoints", required=True, help="directory of ckpt_NN.safetensors")
    ap.add_argument("--work", help="work directory to keep (default: a temp dir, removed)")
    ap.add_argument("--encoding", default="auto")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--chunk-bytes", help="sender.chunk_bytes (e.g. 4MiB) for the sender and the "
                    "codec bench alike (default: the sender's default)")
    ap.add_argument("--json", help="write the rows as JSON to this file")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the whole trajectory this many times (fresh state each) and print "
                         "the median ratio per version")
    ap.add_argument("--no-settle", action="store_true",
                    help="do not wait for dirty pages to be written back before each process")
    a = ap.parse_args()
    ckpts = sorted(glob.glob(os.path.join(a.checkpoints, "ckpt_*.safetensors")))
    if len(ckpts) < 2:
        sys.exit(f"bench_per_version: fewer than 2 ckpt_*.safetensors in {a.checkpoints}")
    # A trainer's checkpoint was just written: it is in the page cache, not on disk.
    for ckpt in ckpts:
        with open(ckpt, "rb") as f:
            while f.read(1 << 24):
                pass
    rows = []
    for round_index in range(a.rounds):
        if a.rounds > 1:
            print(f"round {round_index + 1} of {a.rounds}")
        rows += one_round(a, ckpts, round_index)
    if a.rounds > 1:
        summarize(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def one_round(a, ckpts, round_index):
    """Publishes and applies every checkpoint in a new work directory; the rows of this round."""
    work = a.work or tempfile.mkdtemp(prefix="refit-per-version-")
    if a.work:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    config = os.path.join(work, "refit.toml")
    with open(config, "w") as f:
        f.write(f'[sender]\nstate_dir = "{work}/sender"\nencoding = "{a.encoding}"\n'
                f'threads = {a.threads}\nreceivers = ["r0"]\n'
                + (f'chunk_bytes = "{a.chunk_bytes}"\n' if a.chunk_bytes else '') + '\n'
                f'[receiver]\nid = "r0"\nstate_dir = "{work}/receiver"\nthreads = {a.threads}\n\n'
                f'[transport]\nname = "disk"\n\n[transport.disk]\ndir = "{work}/sync"\n')
    rows = []
    print(f"{'version':>7} {'kind':>5} {'send s':>8} {'codec enc s':>11} {'send/target':>11} "
          f"{'recv s':>8} {'codec apply s':>13} {'recv/target':>11}")
    for i, ckpt in enumerate(ckpts):
        settle = not a.no_settle
        out, send_s = run([a.refit, "send", "--config", config, "--weights", ckpt, "--json"], settle)
        sent = json.loads(out)
        out, recv_s = run([a.refit, "recv", "--config", config, "--json"], settle)
        applied = json.loads(out.splitlines()[-1])
        row = {"round": round_index, "version": sent["version"], "full": sent["full"],
               "send_seconds": send_s, "recv_seconds": recv_s, "send": sent, "recv": applied}
        if i > 0:
            report_path = os.path.join(work, f"codec_{i:02d}.json")
            # The sender's config: the codec cuts records as the sender does.
            run([a.refit, "bench", "codec", "--pair", ckpts[i - 1], ckpt, "--encoding", a.encoding,
                 "--threads", str(a.threads), "--config", config, "--json", report_path])
            with open(report_path) as f:
                _, enc_s, apply_s = codec_row(json.load(f), a.encoding, a.threads)
            row.update(codec_encode_seconds=enc_s, codec_apply_seconds=apply_s,
                       send_over_target=send_s / (1.5 * enc_s + 0.03),
                       recv_over_target=recv_s / (1.5 * apply_s + 0.03))
            print(f"{row['version']:>7} {'delta':>5} {send_s:8.3f} {enc_s:11.3f} "
                  f"{row['send_over_target']:11.2f} {recv_s:8.3f} {apply_s:13.3f} "
                  f"{row['recv_over_target']:11.2f}")
        else:
            print(f"{row['version']:>7} {'full':>5} {send_s:8.3f} {'-':>11} {'-':>11} "
                  f"{recv_s:8.3f} {'-':>13} {'-':>11}")
        sys.stdout.flush()
        rows.append(row)
    if not a.work:
        shutil.rmtree(work)
    return rows


def summarize(rows):
    """Per delta version: the median over rounds of each ratio, and its range."""
    print("median over rounds (min - max):")
    print(f"{'version':>7} {'send/target':>22} {'recv/target':>22}")
    for version in sorted({r["version"] for r in rows if not r["full"]}):
        of = [r for r in rows if r["version"] == version and not r["full"]]
        cells = []
        for key in ("send_over_target", "recv_over_target"):
            v = sorted(r[key] for r in of)
            cells.append(f"{statistics.median(v):.2f} ({v[0]:.2f} - {v[-1]:.2f})")
        print(f"{version:>7} {cells[0]:>22} {cells[1]:>22}")

if __name__ == "__main__":
    main()
