#!/usr/bin/env bash
# Times `make demo` on a machine that has never seen the build (issue 27 item 4; the figure is
# in README.md). Not part of `make test`: it downloads ~100 packages and compiles without a cache.
#   sudo scripts/time-fresh-demo.sh [GIT_REF]        (default: HEAD of this checkout)
# 1. A minimal Debian 12 root (mmdebstrap --variant=minbase) plus make and git only, made once
#    and cached as a tarball in $DDPRUN_ROOT_CACHE (default /var/cache/ddprun-tests). Not timed:
#    it stands for the fresh machine.
# 2. `git clone` of this checkout at GIT_REF into the root's /src (not timed: the user's clone).
# 3. Timed, chrooted with a clean environment and network to Debian's mirror:
#    `CCACHE_DISABLE=1 make demo` in /src, i.e. scripts/install-deps.sh --build (apt-get update
#    and install), configure build-demo/, build the product targets, run the 4-worker demo.
#    Each output line is stamped with the seconds since the start, so the phases' split (apt,
#    configure, compile, demo) is read from the log.
# Prints the phases and the total; the log and the stamped output stay in the printed folder.
# Runs as root (chroot, mounts); the mounts live in a private mount namespace (unshare).
set -euo pipefail
ref=${1:-HEAD}
source_dir=$(cd "$(dirname "$0")/.." && pwd)
cache=${DDPRUN_ROOT_CACHE:-/var/cache/ddprun-tests}
fail() { echo "time-fresh-demo: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "needs root (chroot, mounts); run it with sudo"
command -v mmdebstrap >/dev/null || fail "mmdebstrap not found; run scripts/install-deps.sh"
work=$(mktemp -d /var/tmp/ddprun-fresh-demo.XXXXXX)
echo "time-fresh-demo: working in $work"

tarball=$cache/bookworm-make-git.tar
if [[ ! -f "$tarball" ]]; then
  echo "time-fresh-demo: creating $tarball (once)"
  mkdir -p "$cache"
  mmdebstrap --quiet --variant=minbase --format=tar --include=make,git bookworm \
    "$tarball.tmp" >"$work/mmdebstrap.log" 2>&1 || { tail -20 "$work/mmdebstrap.log"; fail "mmdebstrap"; }
  mv "$tarball.tmp" "$tarball"
fi
root=$work/root
mkdir "$root"
tar -C "$root" -xf "$tarball"
for absent in usr/bin/g++ usr/bin/cmake usr/bin/ccache usr/include/grpcpp; do
  [[ ! -e "$root/$absent" ]] || fail "the fresh root has /$absent"
done
git clone -q --no-hardlinks "$source_dir" "$root/src"
git -C "$root/src" checkout -q "$(git -C "$source_dir" rev-parse "$ref")"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# Each line stamped with the seconds since the start, in bash alone (minbase has no bc).
cat >"$root/run.sh" <<'SH'
set -u
cd /src
start=${EPOCHREALTIME/./}
stamp() { local now=${EPOCHREALTIME/./}; local d=$(( (now - start) / 100000 )); printf '%d.%d' $((d / 10)) $((d % 10)); }
CCACHE_DISABLE=1 make demo 2>&1 | while IFS= read -r line; do printf '%7s %s\n' "$(stamp)" "$line"; done
rc=${PIPESTATUS[0]}
echo "$(stamp) make demo exit $rc"
# CPU time of everything make demo ran (apt, compilers, the demo): with the wall time and the
# machine's load, what an idle machine of this many CPUs would take.
times >/tmp/times.txt  # in this shell: its children's line is the second
echo "$(stamp) cpu user+sys of make demo's processes: $(tail -1 /tmp/times.txt)"
exit "$rc"
SH
echo "time-fresh-demo: CCACHE_DISABLE=1 make demo in the fresh root ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
rc=0
unshare --mount --propagation private bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  mount -t tmpfs tmpfs "$1/tmp"
  exec chroot "$1" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    /bin/bash /run.sh' _ "$root" >"$work/demo.log" 2>&1 || rc=$?
echo "time-fresh-demo: load after: $(cut -d' ' -f1-3 /proc/loadavg)"
# The phases, from the stamps: apt until cmake's first line, configure until the first compile,
# compile until the demo starts, the demo until the end.
awk '
  /install-deps: installing/ && !apt { apt = $1 }
  /cmake -S / && !cfg { cfg = $1 }
  /Building (CXX|CUDA) object/ && !cc { cc = $1 }
  /--nproc_per_node=4 examples\/hello.sh/ && !demo { demo = $1 }
  /make demo exit/ { end = $1; status = $NF }
  END {
    printf "packages (install-deps --build): %.0f s\nconfigure: %.0f s\ncompile: %.0f s\ndemo: %.0f s\n",
      cfg, cc - cfg, demo - cc, end - demo
    printf "total: %.0f s (%d min %d s), make demo exit %s\n", end, int(end / 60), end % 60, status
  }' "$work/demo.log"
grep -c "Building CXX object" "$work/demo.log" | sed 's/^/translation units compiled: /'
grep -o "cpu user+sys.*" "$work/demo.log" || true
[[ $rc -eq 0 ]] || { tail -30 "$work/demo.log"; fail "make demo failed in the fresh root (log: $work/demo.log)"; }
echo "time-fresh-demo: log $work/demo.log (remove $work when done)"
