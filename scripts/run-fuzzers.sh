#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a while over a copy of its corpus.
#
#   scripts/run-fuzzers.sh [SECONDS] [TARGET...]      (default: 30 s, every target)
#
# Environment:
#   REFIT_FUZZ_BUILD     build dir, relative to the repo root or absolute (default build-fuzz,
#                        build-fuzz-cov with coverage)
#   REFIT_FUZZ_COVERAGE  1: instrument for llvm-cov and print line coverage of each target's sources
#   REFIT_FUZZ_ARGS      extra libFuzzer flags (e.g. "-max_len=65536 -jobs=2")
#   REFIT_FUZZ_JOBS      parallel build jobs (default 2)
#
# Exits non-zero if a target crashed (the reproducer is kept under <build>/fuzz-runs/<name>/).
# Targets are declared with refit_add_fuzzer() in tests/fuzz/CMakeLists.txt.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=30
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
  seconds="$1"
  shift
fi
wanted=("$@")
coverage="${REFIT_FUZZ_COVERAGE:-0}"
if [[ "$coverage" == 1 ]]; then
  build="${REFIT_FUZZ_BUILD:-build-fuzz-cov}"
else
  build="${REFIT_FUZZ_BUILD:-build-fuzz}"
fi
[[ "$build" = /* ]] || build="$root/$build"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cov_flag=OFF
[[ "$coverage" == 1 ]] && cov_flag=ON
CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DREFIT_FUZZ=ON -DREFIT_BUILD_TESTS=ON -DREFIT_FUZZ_COVERAGE="$cov_flag" >/dev/null

# One manifest per target, written by refit_add_fuzzer(): name, target, binary, corpus, dict, coverage.
declare -A target_of binary_of corpus_of dict_of sources_of
names=()
for manifest in "$build"/fuzz-targets/*.txt; do
  [[ -e "$manifest" ]] || continue
  unset name target binary corpus dict coverage_sources
  while IFS='=' read -r key value; do
    case "$key" in
      name) name="$value" ;;
      target) target="$value" ;;
      binary) binary="$value" ;;
      corpus) corpus="$value" ;;
      dict) dict="$value" ;;
      coverage) coverage_sources="$value" ;;
    esac
  done <"$manifest"
  names+=("$name")
  target_of[$name]="$target"
  binary_of[$name]="$binary"
  corpus_of[$name]="$corpus"
  dict_of[$name]="${dict:-}"
  sources_of[$name]="${coverage_sources:-}"
done
if [[ ${#names[@]} -eq 0 ]]; then
  echo "run-fuzzers: no fuzz targets declared (tests/fuzz/CMakeLists.txt)" >&2
  exit 1
fi
if [[ ${#wanted[@]} -eq 0 ]]; then
  wanted=("${names[@]}")
fi
build_targets=()
for name in "${wanted[@]}"; do
  name="${name#fuzz_}"
  if [[ -z "${target_of[$name]:-}" ]]; then
    echo "run-fuzzers: unknown target '$name' (known: ${names[*]})" >&2
    exit 2
  fi
  build_targets+=("${target_of[$name]}")
done
cmake --build "$build" --parallel "${REFIT_FUZZ_JOBS:-2}" --target "${build_targets[@]}"

llvm_tool() {  # llvm-profdata / llvm-cov matching clang's major version when installed
  local major
  major="$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)"
  if command -v "$1-$major" >/dev/null; then echo "$1-$major"; else echo "$1"; fi
}

failed=()
for name in "${wanted[@]}"; do
  name="${name#fuzz_}"
  binary="${binary_of[$name]}"
  work="$build/fuzz-runs/$name"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts" "$work/profiles"
  if [[ -d "${corpus_of[$name]}" ]]; then
    cp -R "${corpus_of[$name]}/." "$work/corpus/"
  fi
  args=(-max_total_time="$seconds" -timeout=25 -print_final_stats=1
        -artifact_prefix="$work/artifacts/")
  [[ -n "${dict_of[$name]}" ]] && args+=(-dict="${dict_of[$name]}")
  # shellcheck disable=SC2206  # word splitting of REFIT_FUZZ_ARGS is intended
  args+=(${REFIT_FUZZ_ARGS:-})
  echo "== fuzz_$name: ${seconds}s over a copy of ${corpus_of[$name]} (log: $work/fuzz.log)"
  rc=0
  LLVM_PROFILE_FILE="$work/profiles/fuzz-%p.profraw" \
    "$binary" "${args[@]}" "$work/corpus" >"$work/fuzz.log" 2>&1 || rc=$?
  grep -E '^Done [0-9]+ runs' "$work/fuzz.log" | tail -n1 || true
  grep -E 'stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$work/fuzz.log" || true
  if [[ $rc -ne 0 ]]; then
    echo "!! fuzz_$name failed (exit $rc); last lines of the log:"
    tail -n 40 "$work/fuzz.log"
    find "$work/artifacts" -type f -printf '   reproducer: %p\n'
    failed+=("$name")
    continue
  fi
  if [[ "$coverage" == 1 ]]; then
    # Replay the final corpus once so the profile reflects everything the fuzzer kept.
    LLVM_PROFILE_FILE="$work/profiles/replay-%p.profraw" \
      "$binary" -runs=0 "$work/corpus" >"$work/replay.log" 2>&1 || true
    "$(llvm_tool llvm-profdata)" merge -sparse "$work"/profiles/*.profraw -o "$work/merged.profdata"
    # shellcheck disable=SC2086  # the source list is space separated
    "$(llvm_tool llvm-cov)" report "$binary" -instr-profile="$work/merged.profdata" \
      ${sources_of[$name]}
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run-fuzzers: crashes in: ${failed[*]}" >&2
  exit 1
fi
echo "run-fuzzers: no crashes (${wanted[*]}, ${seconds}s each)"
