#!/usr/bin/env bash
# A third-party plugin, end to end, against the INSTALLED refit:
#   1. cmake --install the build tree into a temporary prefix T;
#   2. configure and build tests/loader/out_of_tree (find_package(refit), SDK only) against T,
#      with the installed encoding conformance suite (refit_add_conformance_tests) run on it;
#   3. load it through a config file ([plugins] load = [...]) with T/bin/refit:
#      `refit plugins` lists it, `refit diff --encoding oot_overwrite` + `refit apply` reproduce B
#      byte for byte.
#
# usage: out_of_tree_test.sh CMAKE BUILD_DIR PLUGIN_SOURCE_DIR CXX_COMPILER
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 CMAKE BUILD_DIR PLUGIN_SOURCE_DIR CXX_COMPILER" >&2
  exit 2
fi
cmake_bin=$1
build_dir=$2
plugin_src=$3
cxx=$4

work=$(mktemp -d "${TMPDIR:-/tmp}/refit-oot-XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() {
  echo "out_of_tree_test: FAIL: $*" >&2
  exit 1
}
step() { echo "== $*"; }

# Only the installed tree may be used: no plugin path or library path from the environment.
unset REFIT_PLUGIN_PATH LD_LIBRARY_PATH

step "install $build_dir into $prefix"
"$cmake_bin" --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }
refit=$prefix/bin/refit
[[ -x $refit ]] || fail "no bin/refit in the installed tree"
[[ -x $prefix/bin/refit-serve ]] || fail "no bin/refit-serve (what refit serve execs) in the installed tree"
# `refit serve` reaches the installed refit-serve: a missing config is its usage error (exit 2).
set +e
"$refit" serve --config "$work/no-such.toml" 2>"$work/serve.err"
serve_status=$?
set -e
[[ $serve_status == 2 ]] && grep -q "no such config file" "$work/serve.err" ||
  { cat "$work/serve.err" >&2; fail "refit serve did not run the installed refit-serve"; }
libdir=$(dirname "$(find "$prefix" -name 'librefit.so' | head -n 1)")
[[ -f $libdir/librefit.so ]] || fail "no librefit.so in the installed tree"
for f in include/refit/plugin_abi.h include/refit/sdk/plugin.hpp include/refit/status.h \
         include/refit/registry.h include/refit/kernels/diff.h \
         include/refit/conformance/encoding_suite.h include/refit/conformance/transport_suite.h \
         include/refit/conformance/layout_suite.h share/refit/conformance/conformance_main.cc; do
  [[ -f $prefix/$f ]] || fail "missing installed header $f"
done
for f in refitConfig.cmake refitConfigVersion.cmake refitTargets.cmake; do
  [[ -f $libdir/cmake/refit/$f ]] || fail "missing $libdir/cmake/refit/$f"
done
[[ -f $libdir/librefit_kernels.a ]] || fail "missing $libdir/librefit_kernels.a"
if find "$prefix" -name '*_internal.h' | grep -q .; then fail "internal headers were installed"; fi
if find "$prefix" -name 'libfixture_*' | grep -q .; then fail "loader fixtures were installed"; fi

step "build the out-of-tree plugin against the installed package"
"$cmake_bin" -S "$plugin_src" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring the plugin against $prefix failed"; }
"$cmake_bin" --build "$work/build" -j 2 >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "building the plugin failed"; }
plugin=$work/build/liboot.so
[[ -f $plugin ]] || fail "the plugin build produced no liboot.so"
# A plugin links the SDK only, never the core library, and exports one symbol.
if readelf -d "$plugin" | grep -q 'librefit'; then fail "liboot.so links librefit"; fi
exported=$(nm -D --defined-only "$plugin" | awk '$2 == "T" { print $3 }')
[[ $exported == refit_plugin_entry_v1 ]] || fail "liboot.so exports: $exported"

step "the installed encoding conformance suite on liboot.so"
suite=$work/build/oot_encoding_conformance
[[ -x $suite ]] || fail "refit_add_conformance_tests built no oot_encoding_conformance"
"$suite" --gtest_brief=1 >"$work/conformance.log" 2>&1 ||
  { cat "$work/conformance.log" >&2; fail "liboot.so fails the encoding conformance suite"; }
# Every dtype x every test ran, and only oot_overwrite was tested (not refit's builtins).
grep -E '^\[  PASSED  \] [0-9]+ tests' "$work/conformance.log" ||
  { cat "$work/conformance.log" >&2; fail "no passing conformance tests reported"; }
listed=$("$suite" --gtest_list_tests | grep -c '/oot_overwrite_' || true)
[[ $listed -ge 70 ]] || fail "the conformance suite lists $listed oot_overwrite tests"
if "$suite" --gtest_list_tests | grep -q '/dense_'; then fail "the suite tested a builtin"; fi

cat >"$work/cfg.toml" <<TOML
[plugins]
load = ["$plugin"]
TOML

step "refit plugins --config cfg.toml"
"$refit" plugins --config "$work/cfg.toml" >"$work/plugins.txt" 2>&1 ||
  { cat "$work/plugins.txt" >&2; fail "refit plugins failed"; }
grep -q 'oot_overwrite' "$work/plugins.txt" ||
  { cat "$work/plugins.txt" >&2; fail "refit plugins does not list oot_overwrite"; }

step "make safetensors A and B (B differs in a few elements)"
python3 - "$work/A.safetensors" "$work/B.safetensors" <<'PY'
import json, random, struct, sys

def write(path, tensors):
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for tensor in tensors:
            f.write(tensor[3])

rng = random.Random(20240611)
specs = [("model.embed.weight", "BF16", [16, 8], 2), ("model.norm.weight", "F16", [33], 2),
         ("lm_head.weight", "F32", [4, 5], 4)]
a = [(n, d, s, bytes(rng.getrandbits(8) for _ in range(s[0] * (s[1] if len(s) > 1 else 1) * w)))
     for n, d, s, w in specs]
b = []
for (name, dtype, shape, data), (_, _, _, width) in zip(a, specs):
    changed = bytearray(data)
    for index in rng.sample(range(len(data) // width), 3):
        for k in range(width):  # new bits, never equal to the old ones
            changed[index * width + k] ^= 0xA5 if k == 0 else rng.getrandbits(8)
    b.append((name, dtype, shape, bytes(changed)))
write(sys.argv[1], a)
write(sys.argv[2], b)
PY

step "refit diff A B -o D --encoding oot_overwrite; refit apply A D -o C"
"$refit" diff "$work/A.safetensors" "$work/B.safetensors" -o "$work/D" \
  --encoding oot_overwrite --config "$work/cfg.toml" || fail "refit diff failed"
"$refit" apply "$work/A.safetensors" "$work/D" -o "$work/C.safetensors" \
  --config "$work/cfg.toml" || fail "refit apply failed"

step "compare C with B tensor by tensor"
python3 - "$work/B.safetensors" "$work/C.safetensors" <<'PY'
import json, struct, sys

def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    header.pop("__metadata__", None)
    base = 8 + size
    return {name: (t["dtype"], t["shape"], blob[base + t["data_offsets"][0]:base + t["data_offsets"][1]])
            for name, t in header.items()}

want, got = read(sys.argv[1]), read(sys.argv[2])
if sorted(want) != sorted(got):
    sys.exit(f"tensor names differ: {sorted(want)} vs {sorted(got)}")
for name, (dtype, shape, data) in want.items():
    if got[name][0] != dtype or got[name][1] != shape:
        sys.exit(f"{name}: {got[name][0]}{got[name][1]} instead of {dtype}{shape}")
    if got[name][2] != data:
        sys.exit(f"{name}: bytes differ")
print(f"{len(want)} tensors bit-identical")
PY

step "without the config the plugin is unknown"
if "$refit" diff "$work/A.safetensors" "$work/B.safetensors" -o "$work/D2" \
     --encoding oot_overwrite 2>"$work/err.txt"; then
  fail "refit diff succeeded without loading the plugin"
fi
grep -q 'oot_overwrite' "$work/err.txt" || { cat "$work/err.txt" >&2; fail "error does not name the encoding"; }

echo "out_of_tree_test: OK"
