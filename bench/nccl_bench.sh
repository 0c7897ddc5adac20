#!/bin/bash
# The worker SDK's NCCL backend against raw NCCL, under ddprun (bench/nccl_bench.cc).
#   bench/nccl_bench.sh [build-dir] [mode]     (defaults: build, all)
# NPROC=N runs N ranks (one GPU each; default 1). Prints the bench's lines
# (nccl allreduce ... sdk_ms=.. raw_ms=.. overhead_pct=..), or one line
# "SKIPPED: ..." and exit 0 where there is no GPU or no CUDA build.
set -euo pipefail
B=${1:-build}
MODE=${2:-all}
NPROC=${NPROC:-1}
if [ ! -x "$B/bin/nccl_bench" ]; then
  echo "SKIPPED: no CUDA build ($B/bin/nccl_bench is not built: configure with -DDDPRUN_WITH_CUDA=ON)"
  exit 0
fi
"$B/bin/ddprun" --nproc_per_node="$NPROC" --no_python "$B/bin/nccl_bench" "$MODE" |
  grep -E '^(nccl|SKIPPED)'
