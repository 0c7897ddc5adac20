#!/usr/bin/env bash
# Runs every benchmark; the figures go into docs/benchmarks.md by hand, with this command.
#   bash scripts/bench.sh            (after `make`)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# The peers measured next to ddprun (mpirun, MPI_Allreduce); the tests never need them.
bash scripts/install-deps.sh --bench ||
  echo "bench: OpenMPI could not be installed; its columns will be empty" >&2
echo "## launch latency (ddprun vs torchrun vs mpirun, same run)"
python3 bench/launch_latency.py --ddprun "$BUILD_DIR/bin/ddprun"
echo
echo "## rendezvous time for N agents"
"$BUILD_DIR/bin/rendezvous_bench" 4096
echo
echo "## worker SDK allreduce and ResNet-50 gradient set (SDK vs torch Gloo vs OpenMPI, same run)"
bash bench/allreduce_bench.sh "$BUILD_DIR"
echo
echo "## worker SDK allreduce at 2, 4 and 8 ranks on one host (SDK vs OpenMPI, same run)"
bash bench/allreduce_ranks.sh "$BUILD_DIR" 2 4 8
echo
echo "## failure recovery (worker death, agent kill -9, daemon restart)"
python3 bench/restart_latency.py --build "$BUILD_DIR"
echo
echo "## checkpoints in memory vs torch.save/torch.load (2 ranks x 1 GiB, same run)"
python3 bench/checkpoint_bench.py --build "$BUILD_DIR" --size 1GiB --reps 2
echo
echo "## monitoring: one ddprund, 1024 nodes x 8 ranks reporting every second (idle peer, same run)"
"$BUILD_DIR/bin/metrics_bench" --nodes 1024 --nproc 8 --seconds 20 --idle 5
