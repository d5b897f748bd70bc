#!/usr/bin/env python3
"""1 -> 2 thread scaling of `refit bench codec`, robust to a shared machine: runs one or two
refit binaries alternately ROUNDS times on the same workload and prints, per encoding, the median
encode / apply GB/s at 1 and 2 threads and the median of each run's own 2/1 ratio.

  scripts/bench_thread_scaling.py --rounds 6 --refit build/bin/refit [--before OLD/refit] -- \\
      --pair A.safetensors B.safetensors --reps 20
Arguments after -- go to `refit bench codec` (--threads 1 --threads 2 are added)."""
import argparse, json, os, statistics, subprocess, tempfile


def run(exe, bench_args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([exe, "bench", "codec", *bench_args, "--threads", "1", "--threads", "2",
                        "--json", f.name], check=True, stdout=subprocess.DEVNULL)
        report = json.load(open(f.name))
    rows = {}
    for w in report["workloads"]:
        for e in w["encodings"]:
            rows[(w["name"], e["encoding"], e["threads"])] = (e["encode_gbps"], e.get("apply_gbps"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--refit", required=True)
    ap.add_argument("--before", help="a second refit binary, run alternately with --refit")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    bins = ([("before", a.before)] if a.before else []) + [("after" if a.before else "refit", a.refit)]
    bench_args = [x for x in a.bench_args if x != "--"]
    samples, loads = {}, []
    for _ in range(a.rounds):
        for label, exe in bins:
            rows = run(exe, bench_args)
            loads.append(os.getloadavg()[0])
            for (w, enc, t), v in rows.items():
                samples.setdefault((w, enc, label), []).append((t, v))
    med = lambda xs: statistics.median(xs) if xs else float("nan")
    print(f"{a.rounds} rounds, load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'workload':28} {'encoding':12} {'binary':7} {'enc 1':>6} {'enc 2':>6} {'2/1':>5} "
          f"{'app 1':>6} {'app 2':>6} {'2/1':>5}")
    for (w, enc, label), runs in samples.items():
        by_t = {1: [v for t, v in runs if t == 1], 2: [v for t, v in runs if t == 2]}
        enc_r = [b[0] / a_[0] for a_, b in zip(by_t[1], by_t[2])]
        app_r = [b[1] / a_[1] for a_, b in zip(by_t[1], by_t[2]) if a_[1] and b[1]]
        app = lambda t: med([v[1] for v in by_t[t] if v[1]])
        print(f"{w[:28]:28} {enc:12} {label:7} {med([v[0] for v in by_t[1]]):6.2f} "
              f"{med([v[0] for v in by_t[2]]):6.2f} {med(enc_r):5.2f} {app(1):6.2f} {app(2):6.2f} "
              f"{med(app_r):5.2f}")


if __name__ == "__main__":
    main()
