#!/usr/bin/env bash
# Monitoring's end-to-end cost (docs/benchmarks.md): the same job with the
# workers' monitoring on and off, alternating, REPEATS times each, medians.
#   SDK trainer:  build/bin/metrics_trainer, 2 ranks, STEPS steps of STEP_MS ms
#                 plus one all-reduce of 4 KiB each; off = no DDPRUN_METRICS_FILE
#                 in the worker (ddp::metrics and the collective recording are
#                 then one branch each).
#   PyTorch DDP:  tests/fixtures/hang_ddp.py on gloo, 2 ranks, a 10 ms sleep
#                 per step; off = --no_python_hook (no start-up hook).
# Then the micro-benchmarks of bench/monitoring_bench.cc and the start-up
# hook's cost on `python3 -c pass`.
#   bench/monitoring_overhead.sh [BUILD_DIR] [REPEATS] [STEPS]
set -euo pipefail
B=${1:-build}
R=${2:-5}
STEPS=${3:-300}
PY=${PYTHON_EXEC:-/usr/bin/python3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
elapsed() { grep -o 'elapsed [0-9.]*' | awk '{print $2}'; }

sdk() {  # $1: on|off
  local unset=()
  [ "$1" = off ] && unset=(-u DDPRUN_METRICS_FILE)
  "$B/bin/ddprun" --standalone --nproc_per_node=2 --no_python \
    env "${unset[@]}" STEPS="$STEPS" STEP_MS=10 PRINT_TIME=1 "$B/bin/metrics_trainer" 2>/dev/null | elapsed
}
torch() {  # $1: on|off
  local flag=()
  [ "$1" = off ] && flag=(--no_python_hook)
  STEPS="$STEPS" STEP_S=0.01 PRINT_TIME=1 PYTHON_EXEC="$PY" \
    "$B/bin/ddprun" --standalone --nproc_per_node=2 "${flag[@]}" "$SRC/tests/fixtures/hang_ddp.py" 2>/dev/null | elapsed
}

for job in sdk torch; do
  : > /tmp/mon_on.$$; : > /tmp/mon_off.$$
  for i in $(seq "$R"); do
    $job on >> /tmp/mon_on.$$
    $job off >> /tmp/mon_off.$$
  done
  on=$(median < /tmp/mon_on.$$); off=$(median < /tmp/mon_off.$$)
  awk -v j=$job -v on="$on" -v off="$off" -v s="$STEPS" -v r="$R" 'BEGIN {
    printf "%-6s %d steps, median of %d: monitoring on %.3f s (%.3f ms/step), off %.3f s (%.3f ms/step), overhead %+.2f %%\n",
      j, s, r, on, 1000*on/s, off, 1000*off/s, 100*(on-off)/off }'
  rm -f /tmp/mon_on.$$ /tmp/mon_off.$$
done

"$B/bin/monitoring_bench" 8 200

# The hook's start-up cost and memory: python3 -c pass with and without it.
ch=$(mktemp); "$PY" -c "
import struct, math
b = bytearray(34176); b[0:8] = b'DDPRMET1'; struct.pack_into('<II', b, 8, 1, 34176)
open('$ch', 'wb').write(b)"
hook=(env DDPRUN_METRICS_FILE="$ch" DDPRUN_STACK_FILE=/dev/null PYTHONPATH="$B/python/ddprun_hook:$B/python")
for i in $(seq 10); do /usr/bin/time -f "%e %M" "$PY" -c pass 2>&1 >/dev/null; done | sort -g | head -5 | tail -1 > /tmp/mon_plain.$$
for i in $(seq 10); do /usr/bin/time -f "%e %M" "${hook[@]}" "$PY" -c pass 2>&1 >/dev/null; done | sort -g | head -5 | tail -1 > /tmp/mon_hook.$$
read -r t0 m0 < /tmp/mon_plain.$$; read -r t1 m1 < /tmp/mon_hook.$$
echo "python3 -c pass (median of 10): ${t0} s, max RSS ${m0} KiB; with the hook: ${t1} s, ${m1} KiB"
"${hook[@]}" "$PY" -c "
import os, timeit, ddprun_metrics as m
ch = m.channel()
n = 100000
print('python step() %.2f us, scalar() %.2f us per call' % (
    1e6 * min(timeit.repeat(lambda: ch.step(32), number=n, repeat=3)) / n,
    1e6 * min(timeit.repeat(lambda: ch.scalar('loss', 0.5), number=n, repeat=3)) / n))"
rm -f "$ch" /tmp/mon_plain.$$ /tmp/mon_hook.$$
