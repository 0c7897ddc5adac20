#!/bin/bash
# Worker SDK vs torch.distributed (Gloo) vs OpenMPI (MPI_Allreduce) in the same run,
# 2 ranks on this node, from the repository root. The SDK runs twice: on its default
# path for ranks of one host (shared memory, "sdk") and on Gloo's TCP transport like
# torch (DDP_SHM=0, "tcp"). The SDK's all-reduce buffers come from ProcessGroup::AllocMemory
# (on one host: shared memory that the all-reduce folds in place, as `ddprun bench` times it);
# BUFFERS=heap gives it heap buffers (the staged path, what a trainer's own buffers get):
#   bench/allreduce_bench.sh [build-dir]     (default: build)
# BIND=1 runs the SDK and torch with --cpu_bind=core (local rank i on its own core), as
# mpirun -np 2 binds OpenMPI by default (--bind-to core); BIND=0 with --cpu_bind=none
# (unbound, as torchrun starts workers). Without BIND, ddprun's default (--cpu_bind=none).
# Prints every peer's lines, then the allreduce table with the ratios (peer time / SDK
# time: > 1 means the SDK is faster). OpenMPI is installed when missing
# (scripts/install-deps.sh --bench) and build-dir/bin/allreduce_mpi built when absent;
# without MPI the mpi columns are '-'.
set -eu
B=${1:-build}
export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
here=$(dirname "$0")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

bash "$here/../scripts/install-deps.sh" --bench >&2 ||
  echo "allreduce_bench: could not install OpenMPI; the mpi columns will be '-'" >&2
if [[ ! -x "$B/bin/allreduce_mpi" ]] && command -v mpicc >/dev/null; then
  # MPI may have been installed after this build was configured: configure again.
  { cmake "$B" && cmake --build "$B" --target allreduce_mpi; } >"$out/mpi-build.log" 2>&1 ||
    { tail -20 "$out/mpi-build.log" >&2; echo "allreduce_bench: allreduce_mpi did not build" >&2; }
fi
mpirun_args=(-np 2)
[[ $(id -u) -eq 0 ]] && mpirun_args+=(--allow-run-as-root)

pin=()
case ${BIND:-} in
  1) pin=(--cpu_bind=core) ;;
  0) pin=(--cpu_bind=none) ;;
esac

for mode in allreduce resnet50; do
  "$B/bin/ddprun" --nproc_per_node=2 "${pin[@]}" --no_python "$B/bin/allreduce_bench" $mode |
    grep '^sdk' | tee "$out/sdk.$mode"
  DDP_SHM=0 "$B/bin/ddprun" --nproc_per_node=2 "${pin[@]}" --no_python "$B/bin/allreduce_bench" $mode |
    grep '^sdk' | sed 's/^sdk /tcp /' | tee "$out/tcp.$mode"
  "$B/bin/ddprun" --nproc_per_node=2 "${pin[@]}" --no_python "$PYTHON_EXEC" bench/allreduce_bench_torch.py $mode 2>/dev/null |
    grep '^torch' | tee "$out/torch.$mode"
  if [[ $mode == allreduce && -x "$B/bin/allreduce_mpi" ]] && command -v mpirun >/dev/null; then
    # OpenMPI's defaults (shared memory, cross-memory attach for large messages); where a
    # container forbids the attach (ptrace scope), again without it.
    mpirun "${mpirun_args[@]}" "$B/bin/allreduce_mpi" 2>"$out/mpi.err" | grep '^mpi' | tee "$out/mpi.$mode"
    if [[ ${PIPESTATUS[0]} -ne 0 ]]; then
      mpirun "${mpirun_args[@]}" --mca btl_vader_single_copy_mechanism none "$B/bin/allreduce_mpi" \
        2>>"$out/mpi.err" | grep '^mpi' | tee "$out/mpi.$mode"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || cat "$out/mpi.err" >&2
    fi
  fi
done
echo "--- allreduce: bytes, sdk ms, tcp ms, torch ms, mpi ms, torch/sdk, torch/tcp, mpi/sdk"
sed -nE 's/^(sdk|tcp|torch|mpi) allreduce bytes=([0-9]+) .*median_ms=([0-9.]+).*/\2 \1 \3/p' \
    "$out"/*.allreduce | sort -n -k1,1 | awk '
  !($1 in seen) { seen[$1] = 1; sizes[++n] = $1 }
  { ms[$1, $2] = $3 }
  function cell(b, p) { return ((b, p) in ms) ? sprintf("%9.3f", ms[b, p]) : sprintf("%9s", "-") }
  function ratio(b, p, q) {
    if (!((b, p) in ms) || !((b, q) in ms) || ms[b, q] <= 0) return sprintf("%7s", "-")
    return sprintf("%7.2f", ms[b, p] / ms[b, q])
  }
  END {
    for (i = 1; i <= n; ++i) {
      b = sizes[i]
      printf "%10d %s %s %s %s %s %s %s\n", b, cell(b, "sdk"), cell(b, "tcp"), cell(b, "torch"),
             cell(b, "mpi"), ratio(b, "torch", "sdk"), ratio(b, "torch", "tcp"), ratio(b, "mpi", "sdk")
    }
  }'
