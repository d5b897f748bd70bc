#!/usr/bin/env bash
# The s3 transport's manual acceptance run (not part of ctest): a ~1 GB BF16 synthetic model
# (~510M parameters) and one step of it at lr 1e-6, synced bit-exact through a local moto server
# (SigV4 checked) by `refit send` and `refit recv` processes with the default part_bytes (16 MiB:
# every 64 MiB payload of the full sync is a 4-part multipart upload). Prints the wall time of each
# send and recv and the payload bytes of each version. Needs ~5 GB of memory and ~5 GB of disk.
#   [VERIFY_PUTS=false] bash tests/s3/acceptance_1g.sh [BUILD_DIR] [PARAMS]
# VERIFY_PUTS sets [sender] verify_puts (default true: every payload is read back in 1 MiB ranges).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
params=${2:-500000000}
work=$(mktemp -d /tmp/refit-s3-accept-XXXXXX)
trap 'python3 "$here/moto_server.py" stop --state "$work/server.txt"; rm -rf "$work"' EXIT

cmake --build "$build" --target refit_cli refit_plugin_s3 refit_s3_synthetic_pair >/dev/null
"$build/tests/s3/refit_s3_synthetic_pair" "$params" 1e-6 "$work/w1.safetensors" "$work/w2.safetensors"
python3 "$here/moto_server.py" start --state "$work/server.txt" --log "$work/moto.log" >/dev/null
get() { grep "^$1=" "$work/server.txt" | cut -d= -f2-; }
cat > "$work/refit.toml" <<TOML
[sender]
state_dir = "$work/sender"
receivers = ["r0"]
verify_puts = ${VERIFY_PUTS:-true}
[receiver]
id = "r0"
state_dir = "$work/receiver"
[transport]
name = "s3"
[transport.s3]
endpoint = "$(get endpoint)"
bucket = "$(get bucket)"
prefix = "accept"
access_key_id = "$(get access_key_id)"
secret_access_key = "$(get secret_access_key)"
encode_slash_in_query = false
TOML

timed() {  # timed LABEL CMD...: runs CMD, prints LABEL and its wall time
  local label=$1 start end
  shift
  start=$(date +%s.%N)
  "$@" >"$work/refit.log" 2>&1 || { cat "$work/refit.log"; exit 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" -v what="$label" 'BEGIN { printf "%-6s %8.2f s\n", what, b - a }'
  sed 's/^/         /' "$work/refit.log"  # refit's own summary
}
for v in 1 2; do
  timed send "$build/bin/refit" send --config "$work/refit.toml" --weights "$work/w$v.safetensors"
  timed recv "$build/bin/refit" recv --config "$work/refit.toml"
  python3 - "$work" "$v" "$(get endpoint)" "$(get access_key_id)" "$(get secret_access_key)" <<'PY'
import json, struct, sys, boto3
work, v, endpoint, key_id, secret = sys.argv[1:]
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n)); header.pop("__metadata__", None)
        for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            f.seek(8 + n + t["data_offsets"][0])
            yield name, t["dtype"], t["shape"], f.read(t["data_offsets"][1] - t["data_offsets"][0])
want = {name: rest for name, *rest in tensors(f"{work}/w{v}.safetensors")}
got = {name: rest for name, *rest in tensors(f"{work}/receiver/model.safetensors")}
assert got == want, f"version {v}: the receiver's model differs from the sender's weights"
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                  aws_secret_access_key=secret)
pages = s3.get_paginator("list_objects_v2").paginate(Bucket="refit-test", Prefix="accept")
objs = [o for p in pages for o in p.get("Contents", []) if f"v{int(v):08d}/payload." in o["Key"]]
parts = [o["ETag"].strip('"').partition("-")[2] or "1" for o in objs]
print(f"version {v}: bit-exact, {sum(o['Size'] for o in objs)} payload bytes in {len(objs)} "
      f"payloads (parts per payload: {' '.join(parts)})")
PY
done
