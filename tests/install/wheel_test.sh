#!/usr/bin/env bash
# [install] tier: the wheel as a PyTorch user gets it (docs/install.md).
#   tests/install/wheel_test.sh BUILD_DIR
# 1. scripts/packaging/build_wheel.py builds the wheel from BUILD_DIR, offline.
# 2. scripts/packaging/check_needed.py: every ELF in it needs only the base system
#    (glibc, libstdc++, libgcc, zlib) and what it bundles beside itself.
# 3. A fresh venv (Debian's python3 -m venv), pip install --no-index of the wheel.
# 4. With a clean environment (only the venv's bin/ on PATH, nothing activated):
#    `ddprun --version` and `python -m ddprun --version` print the same version;
#    a 2-worker job with the venv's `ddprun` whose workers run the venv's
#    interpreter and meet through `import ddprun` (barrier); `import ddprun`
#    outside a job loads, and ddprun.init() gives the SDK's error, not a
#    missing library; `import ddprun_sdk` still works.
# 2a. No ELF needs or bundles libcudart, libnccl or libcuda; bundled libraries have hashed names.
# 4a. DDP_BACKEND=nccl with DDP_NCCL_LIBRARY=libz.so.1: the worker fails at init with the
#    loader's line naming the missing function and the library.
# 5. A bundled library removed: `ddprun --version` says so in one line, exit 3.
set -euo pipefail
build=$(realpath "$1")
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(realpath "$(mktemp -d)")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "wheel_test: FAIL: $*" >&2; exit 1; }
step() { echo "wheel_test: $*"; }
python=/usr/bin/python3  # Debian's: python3-venv is for it

step "build_wheel.py --build $build"
wheel=$(python3 "$source_dir/scripts/packaging/build_wheel.py" --build "$build" --out "$tmp/dist") ||
  fail "build_wheel.py"
[[ -f "$wheel" ]] || fail "build_wheel.py printed '$wheel', which is not a file"
version=$(cat "$build/ddprun_version.txt")
[[ $(basename "$wheel") == ddprun-"$version"-py3-none-manylinux_2_*_x86_64.whl ]] ||
  fail "wheel name $(basename "$wheel") is not ddprun-$version-py3-none-manylinux_2_N_x86_64.whl"

step "check_needed.py $(basename "$wheel")"
python3 "$source_dir/scripts/packaging/check_needed.py" "$wheel" >"$tmp/needed.log" ||
  { cat "$tmp/needed.log"; fail "check_needed.py"; }
grep -q "^ddprun/bin/ddprund: NEEDED" "$tmp/needed.log" || fail "check_needed.py did not list ddprund"
# The SDK loads NCCL at run time and links its CUDA runtime statically (docs/gpu.md,
# "Which NCCL"): no libcudart, libnccl or libcuda is NEEDED by anything, nor bundled.
if grep -E "^ddprun/.*: NEEDED.*(libcudart|libnccl|libcuda)\." "$tmp/needed.log"; then
  fail "an ELF of the wheel needs CUDA's or NCCL's libraries (above)"
fi
python3 -m zipfile -l "$wheel" >"$tmp/files.log"
if grep -E "ddprun/lib/lib(cudart|nccl|cuda)[-.]" "$tmp/files.log"; then
  fail "the wheel bundles CUDA's or NCCL's libraries (above)"
fi
# Bundled libraries carry auditwheel's hashed names (libX-<8 hex>.so.N); only ours keep theirs.
unhashed=$(grep -oE "ddprun/lib/[^ ]+\.so[^ ]*" "$tmp/files.log" |
  grep -vE "ddprun/lib/(libddprun_[a-z_]+\.so(\.0)?|[^/]+-[0-9a-f]{8}\.so[^/]*)$" || true)
[[ -z "$unhashed" ]] || fail "bundled libraries without a hashed name: $unhashed"
grep -qE "ddprun/lib/libprotobuf-[0-9a-f]{8}\.so\.32 " "$tmp/files.log" ||
  fail "no hashed libprotobuf-<hash>.so.32 in the wheel"

step "venv + pip install --no-index"
"$python" -m venv "$tmp/venv" || fail "python3 -m venv"
venv=$tmp/venv
"$venv/bin/python" -m pip install -q --no-index --no-cache-dir "$wheel" >"$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log"; fail "pip install"; }
[[ -x "$venv/bin/ddprun" && -x "$venv/bin/ddprund" ]] || fail "no ddprun/ddprund in $venv/bin"

# A clean environment, the venv not activated: only its bin/ ahead of the system's.
clean=(env -i "PATH=$venv/bin:/usr/bin:/bin" "HOME=$tmp" "TMPDIR=/tmp")
out=$("${clean[@]}" ddprun --version) || fail "ddprun --version: $out"
[[ $(head -1 <<<"$out") == "ddprun $version" ]] || fail "ddprun --version said: $out"
grep -q "^gRPC: 1\." <<<"$out" || fail "ddprun --version names no gRPC version: $out"
grep -q "^gRPC module: loaded" <<<"$out" || fail "ddprun --version did not load the gRPC module: $out"
out=$("${clean[@]}" python -m ddprun --version) || fail "python -m ddprun --version: $out"
[[ $(head -1 <<<"$out") == "ddprun $version" ]] || fail "python -m ddprun --version said: $out"
"${clean[@]}" ddprund --help >/dev/null || fail "ddprund --help"

step "a 2-worker job with the venv's ddprun"
cat >"$tmp/worker.py" <<'PY'
import os, sys
import ddprun
pg = ddprun.init()
pg.barrier()
# One write per line: the two workers share the console.
os.write(1, ("worker rank=%s prefix=%s\n" % (os.environ["RANK"], sys.prefix)).encode())
PY
"${clean[@]}" ddprun --nproc_per_node=2 --max_restarts=0 "$tmp/worker.py" >"$tmp/job.log" 2>&1 ||
  { cat "$tmp/job.log"; fail "the 2-worker job"; }
for rank in 0 1; do
  grep -q "worker rank=$rank prefix=$venv\$" "$tmp/job.log" ||
    { cat "$tmp/job.log"; fail "rank $rank did not run with the venv's interpreter ($venv)"; }
done

if grep -q "^NCCL backend: built" <<<"$("${clean[@]}" ddprun --version)"; then
  step "the NCCL backend with DDP_NCCL_LIBRARY=libz.so.1: one line at init, not at load"
  rc=0
  "${clean[@]}" DDP_BACKEND=nccl DDP_NCCL_LIBRARY=libz.so.1 ddprun --nproc_per_node=1 \
    --max_restarts=0 "$tmp/worker.py" >"$tmp/nccl.log" 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || { cat "$tmp/nccl.log"; fail "DDP_BACKEND=nccl with libz.so.1 as NCCL succeeded"; }
  grep -q "libz.so.1 (DDP_NCCL_LIBRARY=libz.so.1) has no function ncclGetVersion" "$tmp/nccl.log" ||
    { cat "$tmp/nccl.log"; fail "DDP_BACKEND=nccl with libz.so.1: not the missing-function line"; }
fi

step "import ddprun outside a job"
rc=0
"${clean[@]}" python -c 'import ddprun_sdk, ddprun; ddprun.init()' >"$tmp/outside.log" 2>&1 || rc=$?
[[ $rc -ne 0 ]] || fail "ddprun.init() outside a job succeeded"
grep -q "ddprun_sdk.Error" "$tmp/outside.log" ||
  { cat "$tmp/outside.log"; fail "outside a job: not the SDK's error"; }
if grep -qi "cannot find libddprun_worker_sdk\|cannot open shared object" "$tmp/outside.log"; then
  cat "$tmp/outside.log"; fail "outside a job: a missing library"
fi

step "a bundled library removed"
site=$("${clean[@]}" python -c 'import ddprun, os; print(os.path.dirname(ddprun.__file__))')
victim=$(cd "$site/lib" && ls libgrpc++-*.so.* | head -1)
[[ -n "$victim" ]] || fail "no bundled libgrpc++ in $site/lib"
rm "$site/lib/$victim"
rc=0
err=$("${clean[@]}" ddprun --version 2>&1 >/dev/null) || rc=$?
[[ $rc -eq 3 ]] || fail "ddprun --version with $victim removed: exit $rc, not 3 ($err)"
[[ $(wc -l <<<"$err") -eq 1 && "$err" == *"broken install"*"$victim"* ]] ||
  fail "ddprun --version with $victim removed said: $err"
step "PASS"
