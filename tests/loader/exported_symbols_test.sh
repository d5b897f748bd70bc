#!/usr/bin/env bash
# librefit.so exports the public API only: every refit symbol it defines is declared in an
# installed header, and nothing internal (refit::internal, the apply journal, fault injection,
# kernels) leaks out for tests or tools to depend on.
# The C API: every function <refit.h> declares is exported under its plain C name.
# usage: exported_symbols_test.sh <librefit.so> <refit.h>
set -euo pipefail
lib=$1
c_header=$2
symbols=$(nm -DC --defined-only "$lib")
[[ -n "$symbols" ]] || { echo "no exported symbols in $lib"; exit 1; }
grep -q "refit::Sender::Make" <<<"$symbols" || { echo "refit::Sender::Make is not exported"; exit 1; }
leaks=$(grep -E "refit::internal|refit::kernels|Journal|Fault|KillPoint|refit::sdk" <<<"$symbols" || true)
if [[ -n "$leaks" ]]; then
  echo "librefit.so exports internal symbols:"
  echo "$leaks" | head -20
  exit 1
fi
c_functions=$(grep -oE '^REFIT_API [^(]*\brefit_[a-z0-9_]+\(' "$c_header" | grep -oE 'refit_[a-z0-9_]+\($' |
              tr -d '(')
[[ $(wc -l <<<"$c_functions") -ge 10 ]] || { echo "found too few C functions in $c_header"; exit 1; }
for fn in $c_functions; do
  grep -qE " T ${fn}\$" <<<"$symbols" || { echo "C API function $fn is not exported"; exit 1; }
done
echo "exported C API functions: $(wc -l <<<"$c_functions")"
echo "exported refit symbols: $(grep -c ' refit::' <<<"$symbols")"
