#!/usr/bin/env bash
# Installs the Debian 12 packages ddprun needs, and only those that are
# missing: when everything is installed it does not touch apt. Uses sudo only
# when not root. Three tiers:
#   scripts/install-deps.sh --build   what building ddprun, ddprund, the SDK and the
#                                     demo needs (make, make demo, make wheel)
#   scripts/install-deps.sh           --build plus everything the tests drive (make test)
#   scripts/install-deps.sh --bench   benchmark peers only (OpenMPI's headers); the tests need only mpirun
set -euo pipefail

# The product build. etcd's v3 protos are vendored (proto/etcd/), so the
# build needs no etcd package.
build_packages=(
  build-essential cmake ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev libyaml-cpp-dev libgloo-dev libcli11-dev nlohmann-json3-dev
  libssl-dev zlib1g-dev
)
test_packages=(
  catch2 libspdlog-dev libfmt-dev
  python3-torch python3-numpy iproute2 openssl
  # Real peers the tests drive: a 3-member etcd (HA control plane;
  # golang-etcd-server-dev is the source proto/etcd/ was vendored from),
  # Prometheus (promtool and a real scrape of /metrics), headless Chromium (the
  # dashboard), gdb (native stacks of a hung worker).
  etcd-server etcd-client golang-etcd-server-dev prometheus chromium gdb
  # `ddprun check`: prlimit (util-linux) in its tests.
  util-linux
  # Packaging (docs/install.md): the wheel's RPATHs (patchelf), its fresh venv
  # (python3-venv), the .deb's man pages (help2man) and the fresh Debian roots
  # of the packaging test (mmdebstrap).
  patchelf python3-venv help2man mmdebstrap
  # The Kubernetes manifests' schema test (configs/k8s/, tests/k8s/).
  python3-jsonschema python3-yaml
  # The real Slurm cluster tier (tests/slurm/, label slurm_cluster): slurmctld,
  # slurmd and the client commands, munge for their authentication. The tests
  # start their own daemons; the packages' services are stopped and disabled
  # below, so none is left running or enabled by the install.
  slurmctld slurmd slurm-client munge
  # The real mpirun tier (tests/mpi/, label mpi_cluster): OpenMPI's mpirun
  # starting ddprun on namespaced hosts; it starts no service. Its headers
  # too: the OpenMPI all-reduce benchmark, the peer of bench/allreduce, needs
  # mpi.h (without it bench/allreduce_mpi.cmake says "not built" and goes on).
  openmpi-bin libopenmpi-dev
)
# Services that the packages above would start at boot; the tests start their own.
test_services=(slurmctld slurmd munge)
bench_packages=(openmpi-bin libopenmpi-dev)

case "${1:-}" in
  "") packages=("${build_packages[@]}" "${test_packages[@]}") ;;
  --build) packages=("${build_packages[@]}") ;;
  --bench) packages=("${bench_packages[@]}") ;;
  *) echo "usage: install-deps.sh [--build|--bench]" >&2; exit 2 ;;
esac

# Stops and disables the test tier's services (systemd or sysvinit), so that
# installing the packages leaves no Slurm or munge daemon running or enabled.
disable_test_services() {
  for s in "${test_services[@]}"; do
    if command -v systemctl >/dev/null; then
      # Works without a running systemd too (it removes the unit's links).
      "${sudo[@]}" systemctl disable "$s" >/dev/null 2>&1 || true
      if [[ -d /run/systemd/system ]]; then
        "${sudo[@]}" systemctl stop "$s" >/dev/null 2>&1 || true
      fi
    fi
    if [[ -x /etc/init.d/$s ]]; then
      if [[ ! -d /run/systemd/system ]]; then
        "${sudo[@]}" /etc/init.d/"$s" stop >/dev/null 2>&1 || true
      fi
      "${sudo[@]}" update-rc.d "$s" disable >/dev/null 2>&1 || true
    fi
  done
}

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
# --force-unsafe-io: dpkg skips its fsync before each file's rename. On a fresh machine the
# --build tier's 96 packages (604 MB, Boost's headers alone are thousands of files) took 155 s
# to install with it off and 48 s with it on, the download 1-2 s (2026-11-28,
# scripts/time-fresh-demo.sh). The cost: files of a package being installed when the machine
# loses power may be empty afterwards (apt-get install --reinstall repairs them), which is why
# Debian's container images use it too.
"${sudo[@]}" apt-get install -y -q --no-install-recommends \
  -o Dpkg::Options::=--force-unsafe-io "${missing[@]}"
if [[ -z "${1:-}" ]]; then
  disable_test_services
fi
