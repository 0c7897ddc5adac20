#!/usr/bin/env bash
# Installs the Debian 12 packages ddprun needs to build and test, and only
# those that are missing: when everything is installed it does not touch apt.
# Uses sudo only when not root.
#   scripts/install-deps.sh           build and test dependencies
#   scripts/install-deps.sh --bench   benchmark peers only (OpenMPI); the tests never need them
set -euo pipefail

packages=(
  build-essential cmake ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev libyaml-cpp-dev catch2 libgloo-dev libcli11-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev
  python3-torch python3-numpy iproute2 pkg-config openssl libssl-dev
  # Real peers the tests drive: a 3-member etcd (HA control plane; the v3
  # protos come from golang-etcd-server-dev), Prometheus (promtool and a real
  # scrape of /metrics), headless Chromium (the dashboard), gdb (native
  # stacks of a hung worker).
  etcd-server etcd-client golang-etcd-server-dev prometheus chromium gdb
  # `ddprun check`: prlimit (util-linux) in its tests; libssl-dev above
  # (OpenSSL's SHA-256 of the script).
  util-linux
)
bench_packages=(openmpi-bin libopenmpi-dev)

case "${1:-}" in
  "") ;;
  --bench) packages=("${bench_packages[@]}") ;;
  *) echo "usage: install-deps.sh [--bench]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: missing ${missing[*]}; run this script as root or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
