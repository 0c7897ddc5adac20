#!/bin/bash
# The SDK's shared memory all-reduce against OpenMPI's MPI_Allreduce at several rank
# counts on this one host, in the same run, from the repository root:
#   bench/allreduce_ranks.sh [build-dir] [ranks...]     (default: build 2 4 8)
# MAX_BYTES (default 64 MiB) caps the sweep. Neither side is bound to cores
# (mpirun --bind-to none; ddprun --cpu_bind=none): with more ranks than cores both
# are oversubscribed, and OpenMPI then yields while it polls (it detects that).
# Prints one table per rank count: bytes, sdk ms, mpi ms, mpi/sdk (> 1: the SDK is
# faster), sdk and mpi busbw (GB/s). Needs build-dir/bin/allreduce_mpi
# (bench/allreduce_bench.sh builds it and installs OpenMPI when missing).
set -eu
B=${1:-build}
shift || true
ranks=("$@")
[[ ${#ranks[@]} -gt 0 ]] || ranks=(2 4 8)
max=${MAX_BYTES:-$((64 << 20))}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpirun_args=(--bind-to none --oversubscribe)
[[ $(id -u) -eq 0 ]] && mpirun_args+=(--allow-run-as-root)
for n in "${ranks[@]}"; do
  "$B/bin/ddprun" --nproc_per_node="$n" --cpu_bind=none --no_python "$B/bin/allreduce_bench" allreduce "$max" |
    grep '^sdk' | tee "$out/sdk.$n"
  if [[ -x "$B/bin/allreduce_mpi" ]] && command -v mpirun >/dev/null; then
    mpirun -np "$n" "${mpirun_args[@]}" "$B/bin/allreduce_mpi" "$max" 2>"$out/mpi.err" |
      grep '^mpi' | tee "$out/mpi.$n" || cat "$out/mpi.err" >&2
  fi
done
for n in "${ranks[@]}"; do
  echo "--- $n ranks: bytes, sdk ms, mpi ms, mpi/sdk, sdk busbw, mpi busbw"
  cat "$out/sdk.$n" "$out/mpi.$n" 2>/dev/null |
    sed -nE 's/^(sdk|mpi) allreduce bytes=([0-9]+) .*median_ms=([0-9.]+) busbw_GBps=([0-9.]+).*/\2 \1 \3 \4/p' |
    sort -n -k1,1 | awk '
    !($1 in seen) { seen[$1] = 1; sizes[++k] = $1 }
    { ms[$1, $2] = $3; bw[$1, $2] = $4 }
    function cell(a, b, p, f) { return ((b, p) in a) ? sprintf(f, a[b, p]) : sprintf("%9s", "-") }
    END {
      for (i = 1; i <= k; ++i) {
        b = sizes[i]
        r = sprintf("%7s", "-")
        if ((b, "sdk") in ms && (b, "mpi") in ms && ms[b, "sdk"] > 0) r = sprintf("%7.2f", ms[b, "mpi"] / ms[b, "sdk"])
        printf "%10d %s %s %s %s %s\n", b, cell(ms, b, "sdk", "%9.4f"), cell(ms, b, "mpi", "%9.4f"),
               r, cell(bw, b, "sdk", "%7.2f"), cell(bw, b, "mpi", "%7.2f")
      }
    }'
done
