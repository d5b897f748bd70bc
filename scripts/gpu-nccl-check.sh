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

status=0
step "refit plugins (the nccl row)"
"$build/bin/refit" plugins 2>&1 | grep -i nccl || { echo "nccl is not listed"; status=1; }

step "tests (GPU cases skip with the reason where the machine has too few devices)"
NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 300 "$build/tests/nccl/refit_nccl_tests" || status=1

step "broadcast benchmark"
NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 240 "$build/tests/nccl/refit_nccl_bench" \
  --payload-mib "${REFIT_NCCL_PAYLOAD_MIB:-1024}" --reps 3 \
  --buckets-mib "${REFIT_NCCL_BUCKETS_MIB:-4,16,64,256}"
rc=$?
[[ $rc -eq 0 || $rc -eq 77 ]] || status=1

step "done: status $status"
exit $status
