#!/usr/bin/env bash
# Runs every benchmark; the figures go into docs/benchmarks.md by hand, with this command.
#   bash scripts/bench.sh            (after `make`)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
echo "## launch latency (ddprun vs torchrun vs mpirun, same run)"
python3 bench/launch_latency.py --ddprun "$BUILD_DIR/bin/ddprun"
echo
echo "## rendezvous time for N agents"
"$BUILD_DIR/bin/rendezvous_bench" 4096
echo
echo "## failure recovery (worker death, agent kill -9, daemon restart)"
python3 bench/restart_latency.py --build "$BUILD_DIR"
