#!/usr/bin/env bash
# librefit.so exports the public API only: every refit symbol it defines is declared in an
# installed header, and nothing internal (refit::internal, the apply journal, fault injection,
# kernels) leaks out for tests or tools to depend on.
# usage: exported_symbols_test.sh <librefit.so>
set -euo pipefail
lib=$1
symbols=$(nm -DC --defined-only "$lib")
[[ -n "$symbols" ]] || { echo "no exported symbols in $lib"; exit 1; }
grep -q "refit::Sender::Make" <<<"$symbols" || { echo "refit::Sender::Make is not exported"; exit 1; }
leaks=$(grep -E "refit::internal|refit::kernels|Journal|Fault|KillPoint|refit::sdk" <<<"$symbols" || true)
if [[ -n "$leaks" ]]; then
  echo "librefit.so exports internal symbols:"
  echo "$leaks" | head -20
  exit 1
fi
echo "exported refit symbols: $(grep -c ' refit::' <<<"$symbols")"
