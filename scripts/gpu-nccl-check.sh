#!/usr/bin/env bash
# The nccl transport on a machine with GPUs (this project's image plus CUDA devices), in one run
# of a few minutes: builds only what it needs, runs its tests (the GPU cases included) and the
# broadcast benchmark, and prints the numbers. Run from the repository root:
#   bash scripts/gpu-nccl-check.sh
# Env: REFIT_BUILD_DIR (default ./build-gpu), REFIT_JOBS (default: cores), REFIT_NCCL_PAYLOAD_MIB
# (default 1024), REFIT_NCCL_BUCKETS_MIB (default 4,16,64,256).
# One GPU runs the sender path only (NCCL allows one rank per GPU); the bit-exact broadcast cases
# need two or more and report a skip otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${REFIT_BUILD_DIR:-$root/build-gpu}
jobs=${REFIT_JOBS:-$(nproc)}
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

step "machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi not found"
ls /usr/local/cuda/include/nccl.h || { echo "no nccl.h: the nccl transport cannot be built"; exit 1; }

step "dependencies"
# Offline machines: a missing package is reported, and the build below says what it lacks.
bash "$root/scripts/install-deps.sh" || echo "warning: scripts/install-deps.sh failed"

step "build"
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREFIT_WERROR=ON \
  >"$build/configure.log" 2>&1 || { tail -30 "$build/configure.log"; exit 1; }
grep -i "nccl" "$build/configure.log" || true
timeout 420 cmake --build "$build" -j "$jobs" --target refit_cli refit_plugin_nccl \
  refit_nccl_tests refit_nccl_bench || { echo "build failed"; exit 1; }

# Two versions of a ~50M-parameter model through real `refit send` processes (sender on GPU 0)
# to a `refit recv --follow` process (receiver rank 1: GPU 1); the receiver's model must then
# hold exactly the bits of version 2.
e2e_check() {
  local work refit=$build/bin/refit
  work=$(mktemp -d)
  "$build/tests/s3/refit_s3_synthetic_pair" 50000000 1e-6 "$work/w1.safetensors" \
    "$work/w2.safetensors" || return 1
  cat >"$work/refit.toml" <<TOML
[sender]
state_dir = "$work/sender"
receivers = ["r0"]
verify_puts = false
ack_timeout_s = 120
[receiver]
id = "r0"
state_dir = "$work/receiver"
poll_interval_ms = 20
[transport]
name = "nccl"
[transport.nccl]
control_dir = "$work/control"
receivers = 1
fsync = false
TOML
  NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 300 "$refit" recv --config "$work/refit.toml" --follow \
    --until-version 2 --timeout 280 &
  local recv_pid=$! rc=0
  for v in 1 2; do
    /usr/bin/time -f "send v$v: %e s" timeout 240 "$refit" send --config "$work/refit.toml" \
      --weights "$work/w$v.safetensors" || rc=1
  done
  wait "$recv_pid" || rc=1
  python3 - "$work/receiver/model.safetensors" "$work/w2.safetensors" <<'PY' || rc=1
import json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}
got, want = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = sorted(k for k in want if got.get(k) != want[k]) + sorted(set(got) - set(want))
print(f"e2e: {len(want)} tensors, bit-exact: {'yes' if not bad else 'NO: ' + ', '.join(bad[:5])}")
sys.exit(1 if bad else 0)
PY
  rm -rf "$work"
  return $rc
}

status=0
step "refit plugins (the nccl row)"
"$build/bin/refit" plugins 2>&1 | grep -E -A8 "^transport +nccl " || { echo "nccl is not listed"; status=1; }

step "tests (GPU cases skip with the reason where the machine has too few devices)"
NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 300 "$build/tests/nccl/refit_nccl_tests" || status=1

step "broadcast benchmark"
NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 240 "$build/tests/nccl/refit_nccl_bench" \
  --payload-mib "${REFIT_NCCL_PAYLOAD_MIB:-1024}" --reps 3 \
  --buckets-mib "${REFIT_NCCL_BUCKETS_MIB:-4,16,64,256}"
rc=$?
[[ $rc -eq 0 || $rc -eq 77 ]] || status=1

step "end to end: refit send / refit recv --follow over nccl (2+ GPUs)"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
if [[ ${gpus:-0} -lt 2 ]]; then
  echo "skipped: ${gpus:-0} GPU(s); a sender and a receiver need one each"
elif ! timeout 300 cmake --build "$build" -j "$jobs" --target refit_s3_synthetic_pair >/dev/null; then
  echo "skipped: no weight generator (refit_s3_synthetic_pair is built only with libcurl)"
else
  e2e_check || status=1
fi

step "done: status $status"
exit $status
