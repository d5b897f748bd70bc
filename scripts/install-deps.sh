#!/usr/bin/env bash
# Installs the Debian 12 packages refit builds and tests with. Idempotent and fast when everything
# is already present (one dpkg query, no apt-get). Run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  libgtest-dev libgmock-dev
  nlohmann-json3-dev libtoml11-dev libcli11-dev libxxhash-dev libdlpack-dev
  libzstd-dev liblz4-dev libboost-dev libssl-dev
  # `refit serve` (cpp-httplib) and the metrics tests' parser (prometheus_client).
  libcpp-httplib-dev python3-prometheus-client
  # The s3 transport (plugins/transports/s3); without it that plugin is not built.
  libcurl4-openssl-dev
  # The ucx transport (plugins/transports/ucx); without it that plugin and its tests are skipped.
  libucx-dev
  python3-dev pybind11-dev python3-numpy python3-torch
  clang llvm libclang-rt-14-dev
  # The libtorch adapter (adapters/torch, refit_torch) and its test; without it they are skipped.
  # About 90 s more of apt on a fresh machine.
  libtorch-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
