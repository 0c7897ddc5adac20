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
#    mirror): ddprun --version (the gRPC module loads, NCCL is not there), ddprund --help, a
#    2-worker job.
# 4. The SDK from the .deb, in a third root: the same minimal one plus cmake, g++ and make only
#    (cached as its own tarball; the .deb's Depends come from the second root's apt cache): a
#    CMake project that does find_package(ddprun) and links ddprun::worker_sdk, built there with
#    the consumer (tests/install/consumer/main.cc) and the C++ SDK example
#    (examples/train_mlp.cc), both run on 2 workers.
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

# cached_root NAME PACKAGES: the tarball of a minimal Debian 12 root with PACKAGES
# (comma-separated), made once with mmdebstrap.
cached_root() {
  local tarball=$cache/$1.tar
  if [[ ! -f "$tarball" ]]; then
    step "creating $tarball (once; minutes)" >&2
    mkdir -p "$cache"
    # Written under a name of this run's, then renamed: another run making the
    # same root at the same time (another checkout's) never reads half a file.
    mmdebstrap --quiet --variant=minbase --format=tar --include="$2" bookworm "$tarball.$$.tmp" \
      >"$tmp/mmdebstrap-$1.log" 2>&1 ||
      { rm -f "$tarball.$$.tmp"; tail -20 "$tmp/mmdebstrap-$1.log" >&2; fail "mmdebstrap $1"; }
    mv "$tarball.$$.tmp" "$tarball"
  fi
  echo "$tarball"
}
tarball=$(cached_root bookworm-python3-venv python3,python3-venv)
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
grep -q "parameters identical on all 2 ranks: yes" "$tmp/run.log" ||
  { cat "$tmp/run.log"; fail "the C++ SDK example (train_mlp) against the wheel's SDK"; }

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

# 4. The SDK from the .deb: find_package(ddprun) in a CMake project, in a root with a compiler.
step "the .deb's SDK: find_package(ddprun), the consumer and train_mlp built and run in a third root"
tarball3=$(cached_root bookworm-cmake-gxx cmake,g++,make)
root3=$tmp/root3
mkdir "$root3"
tar -C "$root3" -xf "$tarball3" || fail "unpacking $tarball3"
for absent in usr/lib/x86_64-linux-gnu/libgrpc++.so.1.51 usr/bin/ddprun usr/local/cuda; do
  [[ ! -e "$root3/$absent" ]] || fail "the third root has /$absent"
done
# The second root's package lists and downloaded packages: no second download.
cp -a "$root2/var/lib/apt/lists/." "$root3/var/lib/apt/lists/"
cp "$root2"/var/cache/apt/archives/*.deb "$root3/var/cache/apt/archives/" 2>/dev/null || true
cp "$deb" "$root3/tmp/"
mkdir -p "$root3/work/sdk"
cp "$source_dir/tests/install/consumer/main.cc" "$root3/work/sdk/consumer.cc"
cp "$source_dir/examples/train_mlp.cc" "$root3/work/sdk/train_mlp.cc"
cat >"$root3/work/sdk/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(fresh_root_sdk LANGUAGES CXX)
find_package(ddprun REQUIRED)
add_executable(consumer consumer.cc)
target_link_libraries(consumer PRIVATE ddprun::worker_sdk)
add_executable(train_mlp train_mlp.cc)
target_link_libraries(train_mlp PRIVATE ddprun::worker_sdk)
CMAKE
cat >"$root3/run.sh" <<'SH'
set -eu
apt-get install -y -q --no-install-recommends /tmp/ddprun_*_amd64.deb >/tmp/apt.log 2>&1 ||
  { tail -20 /tmp/apt.log; exit 1; }
cmake -S /work/sdk -B /work/build -DCMAKE_BUILD_TYPE=Release >/tmp/cmake.log 2>&1 ||
  { cat /tmp/cmake.log; exit 1; }
sed -n 's/^ddprun_DIR:PATH=/ddprun_DIR=/p' /work/build/CMakeCache.txt
cmake --build /work/build >/tmp/build.log 2>&1 || { cat /tmp/build.log; exit 1; }
ldd /work/build/consumer | grep libddprun_worker_sdk
ddprun --nproc_per_node=2 --max_restarts=0 --no_python /work/build/consumer
ddprun --nproc_per_node=2 --max_restarts=0 --no_python /work/build/train_mlp
SH
unshare --mount --propagation private bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  exec chroot "$1" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive /bin/sh /run.sh' \
  _ "$root3" >"$tmp/run3.log" 2>&1 || { cat "$tmp/run3.log"; fail "the .deb's SDK in the third root"; }
grep -q "^ddprun_DIR=/usr/lib/x86_64-linux-gnu/cmake/ddprun$" "$tmp/run3.log" ||
  { cat "$tmp/run3.log"; fail "find_package(ddprun) did not find the package's CMake files"; }
grep -qE "libddprun_worker_sdk.so.0 => (/usr)?/lib/x86_64-linux-gnu/libddprun_worker_sdk.so.0" \
  "$tmp/run3.log" || { cat "$tmp/run3.log"; fail "the consumer does not load the package's SDK"; }
for rank in 0 1; do
  grep -q "consumer: rank $rank of 2" "$tmp/run3.log" ||
    { cat "$tmp/run3.log"; fail "consumer rank $rank"; }
done
grep -q "parameters identical on all 2 ranks: yes" "$tmp/run3.log" ||
  { cat "$tmp/run3.log"; fail "train_mlp against the package's SDK"; }
step "PASS"
