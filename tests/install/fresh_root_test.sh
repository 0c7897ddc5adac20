#!/usr/bin/env bash
# [freshroot] tier: the wheel on a machine that has never seen the build (issue 27 item 3).
#   tests/install/fresh_root_test.sh BUILD_DIR
# 1. A minimal Debian 12 root with only python3 and python3-venv (mmdebstrap --variant=minbase),
#    made once and cached as a tarball in $DDPRUN_ROOT_CACHE (default /var/cache/ddprun-tests);
#    the first run downloads from the machine's apt mirror, later runs only unpack it.
# 2. The wheel (scripts/packaging/build_wheel.py from BUILD_DIR) installed with pip --no-index
#    into a venv inside that root; then, chrooted, with a clean environment: `python -m ddprun
#    --version`, a 2-worker Python job on the venv's ddprun, and the C++ SDK example
#    (BUILD_DIR/examples/train_mlp, against the wheel's libddprun_worker_sdk.so) on 2 workers.
# 3. `make deb`'s package installed with apt-get into a second such root (its Depends from the
#    mirror): ddprun --version (the gRPC module loads), ddprund --help, a 2-worker job.
#    Not yet: the SDK from the .deb (find_package(ddprun) needs a compiler in the root, and a
#    build with the NCCL backend needs CUDA's libcudart and libnccl there; docs/install.md).
# Runs as root (chroot, mounts); the mounts live in a private mount namespace (unshare), so
# they end with the test whatever happens.
set -euo pipefail
build=$(realpath "$1")
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
cache=${DDPRUN_ROOT_CACHE:-/var/cache/ddprun-tests}
fail() { echo "fresh_root_test: FAIL: $*" >&2; exit 1; }
step() { echo "fresh_root_test: $*"; }
[[ $(id -u) -eq 0 ]] || fail "needs root (chroot); run it as root"
command -v mmdebstrap >/dev/null || fail "mmdebstrap not found; run scripts/install-deps.sh"
tmp=$(realpath "$(mktemp -d)")
trap 'rm -rf "$tmp"' EXIT

tarball=$cache/bookworm-python3-venv.tar
if [[ ! -f "$tarball" ]]; then
  step "creating $tarball (once; minutes)"
  mkdir -p "$cache"
  mmdebstrap --quiet --variant=minbase --format=tar --include=python3,python3-venv bookworm \
    "$tarball.tmp" >"$tmp/mmdebstrap.log" 2>&1 || { tail -20 "$tmp/mmdebstrap.log"; fail "mmdebstrap"; }
  mv "$tarball.tmp" "$tarball"
fi
root=$tmp/root
mkdir "$root"
tar -C "$root" -xf "$tarball" || fail "unpacking $tarball"
# Nothing of the build may be there: no compiler, no gRPC, no ddprun.
for absent in usr/bin/g++ usr/bin/cmake usr/lib/x86_64-linux-gnu/libgrpc++.so.1.51 usr/bin/ddprun; do
  [[ ! -e "$root/$absent" ]] || fail "the fresh root has /$absent"
done

step "the wheel"
wheel=$(python3 "$source_dir/scripts/packaging/build_wheel.py" --build "$build" --out "$tmp/dist") ||
  fail "build_wheel.py"
mkdir -p "$root/work"
cp "$wheel" "$root/work/"
cp "$build/examples/train_mlp" "$root/work/train_mlp" || fail "no $build/examples/train_mlp"
cat >"$root/work/worker.py" <<'PY'
import os, sys
import ddprun
pg = ddprun.init()
pg.barrier()
# One write per line: the two workers share the console.
os.write(1, ("worker rank=%s prefix=%s\n" % (os.environ["RANK"], sys.prefix)).encode())
PY
cat >"$root/work/run.sh" <<'SH'
set -eu
python3 -m venv /opt/venv
/opt/venv/bin/python -m pip install -q --no-index --no-cache-dir /work/ddprun-*.whl
export PATH=/opt/venv/bin:/usr/bin:/bin
python -m ddprun --version
ddprun --nproc_per_node=2 --max_restarts=0 /work/worker.py
lib=$(python -c 'import ddprun, os; print(os.path.join(os.path.dirname(ddprun.__file__), "lib"))')
LD_LIBRARY_PATH=$lib ddprun --nproc_per_node=2 --max_restarts=0 --no_python /work/train_mlp
SH
step "chroot: venv, pip install, --version, 2-worker Python job, C++ SDK example"
unshare --mount --propagation private bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  mount -t tmpfs tmpfs "$1/tmp"
  exec chroot "$1" /usr/bin/env -i HOME=/root PATH=/usr/bin:/bin /bin/sh /work/run.sh' \
  _ "$root" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; fail "the run in the fresh root"; }
version=$(cat "$build/ddprun_version.txt")
grep -q "^ddprun $version\$" "$tmp/run.log" || { cat "$tmp/run.log"; fail "no 'ddprun $version'"; }
for rank in 0 1; do
  grep -q "worker rank=$rank prefix=/opt/venv\$" "$tmp/run.log" ||
    { cat "$tmp/run.log"; fail "rank $rank did not run on the venv's interpreter"; }
done

# 3. The .deb (make deb in the source tree) into a second fresh root: apt-get resolves its
#    Depends from the machine's mirror; then ddprun --version, ddprund --help and a 2-worker job.
step "the .deb into a second fresh root"
make -C "$source_dir" --no-print-directory deb >"$tmp/deb.log" 2>&1 || { tail -30 "$tmp/deb.log"; fail "make deb"; }
deb=$source_dir/dist/ddprun_$(cat "$source_dir/build-demo/ddprun_version.txt")_amd64.deb
[[ -f "$deb" ]] || fail "make deb made no $deb"
root2=$tmp/root2
mkdir "$root2"
tar -C "$root2" -xf "$tarball" || fail "unpacking $tarball"
cp "$deb" "$root2/tmp/"
cp /etc/resolv.conf "$root2/etc/resolv.conf"
cat >"$root2/run.sh" <<'SH'
set -eu
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends /tmp/ddprun_*_amd64.deb >/tmp/apt.log 2>&1 ||
  { tail -20 /tmp/apt.log; exit 1; }
ddprun --version
ddprund --help >/dev/null
ddprun --nproc_per_node=2 --max_restarts=0 --no_python /bin/sh -c 'echo "deb worker rank=$RANK"'
SH
unshare --mount --propagation private bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  exec chroot "$1" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive /bin/sh /run.sh' \
  _ "$root2" >"$tmp/run2.log" 2>&1 || { cat "$tmp/run2.log"; fail "the .deb in the fresh root"; }
grep -q "^gRPC module: loaded$" "$tmp/run2.log" || { cat "$tmp/run2.log"; fail "ddprun --version"; }
for rank in 0 1; do
  grep -q "^deb worker rank=$rank$" "$tmp/run2.log" || { cat "$tmp/run2.log"; fail "deb rank $rank"; }
done
step "PASS"
