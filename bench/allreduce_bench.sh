#!/bin/bash
# Worker SDK vs torch.distributed (Gloo) in the same run, 2 ranks on this node.
#   bench/allreduce_bench.sh [build-dir]     (default: build)
# Prints both tables and the ratios (torch time / SDK time: > 1 means the SDK is faster).
set -eu
B=${1:-build}
export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
out=$(mktemp -d)
for mode in allreduce resnet50; do
  "$B/bin/ddprun" --nproc_per_node=2 --no_python "$B/bin/allreduce_bench" $mode | grep '^sdk' | tee "$out/sdk.$mode"
  "$B/bin/ddprun" --nproc_per_node=2 bench/allreduce_bench_torch.py $mode 2>/dev/null | grep '^torch' | tee "$out/torch.$mode"
done
echo "--- allreduce: bytes, sdk ms, torch ms, torch/sdk"
join -j1 <(sed -E 's/.*bytes=([0-9]+).*median_ms=([0-9.]+).*/\1 \2/' "$out/sdk.allreduce" | sort -n) \
         <(sed -E 's/.*bytes=([0-9]+).*median_ms=([0-9.]+).*/\1 \2/' "$out/torch.allreduce" | sort -n) 2>/dev/null |
  sort -n | awk '{printf "%10d %9.3f %9.3f %6.2f\n", $1, $2, $3, $3/$2}' || true
rm -rf "$out"
