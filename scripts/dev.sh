#!/usr/bin/env bash
# One entry point for the README's quick start and for CI:
#   scripts/dev.sh demo [refit demo flags...]   install what is missing, build, run `refit demo`
#   scripts/dev.sh test [ctest flags...]        install what is missing, build, run every test
#   scripts/dev.sh build                        install what is missing, build
# Build dir: $REFIT_BUILD_DIR (default ./build). Jobs: $REFIT_JOBS (default: number of cores).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${REFIT_BUILD_DIR:-$root/build}
jobs=${REFIT_JOBS:-$(nproc)}
cmd=${1:-build}
shift || true

bash "$root/scripts/install-deps.sh"

configure_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
                -DREFIT_WERROR=${REFIT_WERROR:-ON})
if [[ ! -f "$build/CMakeCache.txt" || ! -f "$build/build.ninja" ]]; then
  cmake "${configure_args[@]}" >/dev/null
fi
cmake --build "$build" -j "$jobs"

case "$cmd" in
  build) ;;
  demo) exec "$build/bin/refit" demo "$@" ;;
  test)
    cd "$build"
    exec ctest --output-on-failure -j "$jobs" --timeout 600 "$@"
    ;;
  *) echo "usage: scripts/dev.sh demo|test|build" >&2; exit 2 ;;
esac
