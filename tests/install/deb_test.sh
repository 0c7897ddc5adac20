#!/usr/bin/env bash
# [install] tier: the Debian package as `make deb` builds it (docs/install.md).
#   tests/install/deb_test.sh SOURCE_DIR
# 1. Runs `make deb` in SOURCE_DIR (its build-demo/ tree: prefix /usr, no tests, no
#    benchmarks; incremental, and through ccache with the same paths as make demo and make
#    wheel) and takes dist/ddprun_<version>_amd64.deb.
# 2. The package holds the commands, the gRPC module beside bin/, the SDK (headers, library,
#    CMake package, ddprun.pc), man pages, bash and zsh completion, the ddprund unit and its
#    config under /etc/ddprun (a conffile).
# 3. Depends names run-time packages only: no -dev package, no compiler, no cmake; nothing of
#    CUDA or NCCL in Depends, in the files or in the ELFs' NEEDED entries.
# 4. The unit passes `systemd-analyze verify` (when systemd-analyze exists), its ExecStart
#    pointed at the package's own ddprund (this machine has no /usr/bin/ddprund).
set -euo pipefail
src=$(realpath "$1")
tmp=$(realpath "$(mktemp -d)")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }
step() { echo "deb_test: $*"; }

step "make deb in $src"
rm -f "$src"/dist/ddprun_*_amd64.deb
make -C "$src" --no-print-directory deb >"$tmp/make.log" 2>&1 || { tail -30 "$tmp/make.log"; fail "make deb"; }
version=$(cat "$src/build-demo/ddprun_version.txt")
deb=$src/dist/ddprun_${version}_amd64.deb
[[ -f "$deb" ]] || fail "make deb made no $deb: $(ls "$src"/dist)"

step "contents of $(basename "$deb")"
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$tmp/files"
for f in /usr/bin/ddprun /usr/bin/ddprund /usr/lib/libddprun_grpc.so /usr/include/ddp/ddp.h \
  /usr/lib/x86_64-linux-gnu/libddprun_worker_sdk.so.0 \
  /usr/lib/x86_64-linux-gnu/cmake/ddprun/ddprunConfig.cmake \
  /usr/lib/x86_64-linux-gnu/pkgconfig/ddprun.pc \
  /usr/lib/x86_64-linux-gnu/ddprun/python/ddprun_sdk.py \
  /usr/lib/x86_64-linux-gnu/ddprun/python/ddprun/__init__.py \
  /usr/share/man/man1/ddprun.1 /usr/share/man/man1/ddprund.1 \
  /usr/share/bash-completion/completions/ddprun /usr/share/zsh/vendor-completions/_ddprun \
  /lib/systemd/system/ddprund.service /etc/ddprun/ddprund.yaml; do
  grep -qx "$f" "$tmp/files" || fail "the package has no $f"
done
dpkg-deb -f "$deb" Depends >"$tmp/depends"
[[ -s "$tmp/depends" ]] || fail "the package has no Depends"
if grep -qE -- '-dev\b|\bg\+\+|\bcmake\b|\bgcc\b' "$tmp/depends"; then
  fail "Depends names build packages: $(cat "$tmp/depends")"
fi
# The SDK links its CUDA runtime statically and loads NCCL at run time (docs/gpu.md): no CUDA
# or NCCL in Depends, in the package's files, or in its ELFs' NEEDED entries.
if grep -qiE 'cuda|nccl' "$tmp/depends" || grep -qE '/lib(cudart|nccl|cuda)[.-]' "$tmp/files"; then
  fail "the package depends on or holds CUDA or NCCL: $(cat "$tmp/depends")"
fi
mkdir "$tmp/x"
dpkg-deb -x "$deb" "$tmp/x"
for elf in "$tmp/x/usr/bin/ddprun" "$tmp/x/usr/bin/ddprund" "$tmp/x/usr/lib/libddprun_grpc.so" \
  "$tmp/x/usr/lib/x86_64-linux-gnu/libddprun_worker_sdk.so.0"; do
  if readelf -dW "$(realpath "$elf")" | grep -E "NEEDED.*lib(cudart|nccl|cuda)\."; then
    fail "${elf#"$tmp/x"} needs CUDA or NCCL (above)"
  fi
done
dpkg-deb -e "$deb" "$tmp/control"
grep -qx /etc/ddprun/ddprund.yaml "$tmp/control/conffiles" || fail "ddprund.yaml is not a conffile"

if command -v systemd-analyze >/dev/null; then
  step "systemd-analyze verify ddprund.service"
  mkdir "$tmp/root"
  dpkg-deb -x "$deb" "$tmp/root"
  grep -q "^ExecStart=/usr/bin/ddprund --config /etc/ddprun/ddprund.yaml --state_dir /var/lib/ddprund$" \
    "$tmp/root/lib/systemd/system/ddprund.service" || fail "the unit's ExecStart"
  grep -qx "Restart=on-failure" "$tmp/root/lib/systemd/system/ddprund.service" || fail "no Restart=on-failure"
  sed -e "s|/usr/bin/ddprund|$tmp/root/usr/bin/ddprund|" -e "s|man:ddprund(1) ||" \
    "$tmp/root/lib/systemd/system/ddprund.service" >"$tmp/ddprund.service"
  systemd-analyze verify "$tmp/ddprund.service" >"$tmp/verify.log" 2>&1 ||
    { cat "$tmp/verify.log"; fail "systemd-analyze verify"; }
fi
step "PASS"
