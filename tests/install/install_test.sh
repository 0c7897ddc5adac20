#!/usr/bin/env bash
# [install] tier: the worker SDK embedded the way a user does it, from an install tree that
# was moved after `cmake --install` (both ddprun.pc and the CMake package are relocatable).
#   tests/install/install_test.sh BUILD_DIR
# 1. cmake --install BUILD_DIR into a temporary prefix, then move that prefix elsewhere;
#    no installed file may name the original prefix.
# 2. g++ $(pkg-config --cflags --libs ddprun), PKG_CONFIG_PATH in the moved tree.
# 3. find_package(ddprun) + ddprun::worker_sdk (consumer/CMakeLists.txt), CMAKE_PREFIX_PATH
#    at the moved tree.
# 4. Both programs run with LD_LIBRARY_PATH at the moved lib dir, load the moved library, and
#    print the SDK's error outside ddprun (exit 3); under BUILD_DIR/bin/ddprun they print a rank.
# 5. The installed Python module loads the moved library by itself (no LD_LIBRARY_PATH).
set -euo pipefail
build=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(realpath "$(mktemp -d)")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
step() { echo "install_test: $*"; }

step "cmake --install into $tmp/staged"
cmake --install "$build" --prefix "$tmp/staged" >"$tmp/install.log" ||
  { cat "$tmp/install.log"; fail "cmake --install"; }
mkdir "$tmp/moved"
mv "$tmp/staged" "$tmp/moved/ddprun"
prefix=$tmp/moved/ddprun
step "moved to $prefix"
if grep -rl "$tmp/staged" "$prefix"; then fail "the files above name the original prefix"; fi

pc=$(find "$prefix" -name ddprun.pc)
[[ -n "$pc" ]] || fail "no ddprun.pc under $prefix"
pcdir=$(dirname "$pc")
libdir=$(realpath "$pcdir/..")
[[ -e "$libdir/libddprun_worker_sdk.so" ]] || fail "no libddprun_worker_sdk.so in $libdir"

step "pkg-config: $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs ddprun)"
export PKG_CONFIG_PATH=$pcdir
[[ $(realpath "$(pkg-config --variable=libdir ddprun)") == "$libdir" ]] ||
  fail "pkg-config libdir $(pkg-config --variable=libdir ddprun) is not $libdir"
[[ $(realpath "$(pkg-config --variable=includedir ddprun)") == "$prefix/include" ]] ||
  fail "pkg-config includedir $(pkg-config --variable=includedir ddprun) is not $prefix/include"
# shellcheck disable=SC2046  # the flags are meant to split
g++ -o "$tmp/consumer_pc" "$here/consumer/main.cc" $(pkg-config --cflags --libs ddprun) ||
  fail "g++ with pkg-config"
unset PKG_CONFIG_PATH

step "find_package(ddprun) with CMAKE_PREFIX_PATH=$prefix"
cmake -S "$here/consumer" -B "$tmp/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "configure"; }
found=$(sed -n 's/^ddprun_DIR:PATH=//p' "$tmp/consumer-build/CMakeCache.txt")
[[ $(realpath "$found") == "$libdir/cmake/ddprun" ]] || fail "found ddprun in $found, not in $prefix"
cmake --build "$tmp/consumer-build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build"; }

for exe in "$tmp/consumer_pc" "$tmp/consumer-build/consumer"; do
  name=${exe#"$tmp"/}
  lib=$(LD_LIBRARY_PATH=$libdir ldd "$exe" | awk '/libddprun_worker_sdk/ {print $3}')
  [[ $(realpath "$lib") == "$libdir"/* ]] || fail "$name loads $lib, not the moved library"
  # Outside ddprun: the SDK's error, not a crash. A clean environment, whatever ctest has.
  rc=0
  env -i PATH="$PATH" LD_LIBRARY_PATH="$libdir" "$exe" >"$tmp/out" 2>&1 || rc=$?
  step "$name outside ddprun (exit $rc): $(head -1 "$tmp/out")"
  [[ $rc -eq 3 ]] || { cat "$tmp/out"; fail "$name: exit $rc outside ddprun, expected 3"; }
  grep -q 'not started by ddprun' "$tmp/out" || { cat "$tmp/out"; fail "$name: not the SDK's error"; }
  # Under the launcher: the environment is read.
  rc=0
  LD_LIBRARY_PATH=$libdir "$build/bin/ddprun" --nproc_per_node=1 --no_python "$exe" \
    >"$tmp/out" 2>&1 || rc=$?
  step "$name under ddprun (exit $rc): $(grep consumer: "$tmp/out" | head -1)"
  [[ $rc -eq 0 ]] && grep -q 'consumer: rank 0 of 1' "$tmp/out" ||
    { cat "$tmp/out"; fail "$name under ddprun"; }
done

step "python module from the moved tree"
env -i PATH="$PATH" /usr/bin/python3 - "$libdir/ddprun/python" "$prefix/" <<'PY' || fail "python module"
import sys
sys.path.insert(0, sys.argv[1])
import ddprun_sdk
lib = ddprun_sdk._lib._name
assert lib.startswith(sys.argv[2]), "loaded %s, not the moved library" % lib
try:
    ddprun_sdk.init()
    sys.exit("init() outside ddprun did not raise")
except ddprun_sdk.Error as e:
    assert "not started by ddprun" in str(e), str(e)
    print("install_test: python loaded %s; init() outside ddprun: %s" % (lib, str(e).splitlines()[0]))
ddprun_sdk.step(8)  # monitoring calls: no-ops outside ddprun
assert ddprun_sdk.scalar("loss", 1.0) is False
PY
[[ -f "$libdir/ddprun/python/ddprun_hook/sitecustomize.py" && -f "$libdir/ddprun/python/ddprun_metrics.py" ]] ||
  fail "the Python start-up hook is not installed"
step "ddprun.checkpoint from the moved tree"
env -i PATH="$PATH" PYTHONPATH="$libdir/ddprun/python" /usr/bin/python3 -c '
import ddprun.checkpoint as c
try:
    c.save({}, 0)
    raise SystemExit("save outside ddprun did not raise")
except c.Error as e:
    assert "DDPRUN_CKPT_FD is unset" in str(e), str(e)' || fail "ddprun.checkpoint is not installed"
step "PASS"
