#!/usr/bin/env bash
# Packs what the GPU tier and the NCCL benchmark need into .device/gpu (ignored
# by git, small enough for the device tool's carry limit of 64 MiB), for a GPU
# machine on which nothing can be installed:
#   bash scripts/gpu-bundle.sh [build-dir]        (here, after `make`)
#   bash .device/gpu/run.sh [STEP...]             (there, from the repository root)
# Steps (default: all of them, in this order): tests (the gpu_tests tier),
# nccl (bench/nccl_bench.cc), torch (tests/gpu/torch_under_ddprun.py: the
# target's PyTorch 2.x under ddprun), latency (bench/launch_latency.py and
# bench/restart_latency.py with the target's torchrun as the peer), features
# (ddprun bench and check on the GPU, the GPU gauges of /metrics); and, named
# only: compare (tests/gpu/torchrun_side_by_side.py), store
# (tests/gpu/store_dialect.py), recovery (tests/gpu/recovery_baselines.py). With $OUT
# set, each step's output is also appended to $OUT/steps.log.
# Executables and libraries are stripped copies. Not packed: glibc (the target
# must have glibc >= this machine's), the CUDA driver, and NCCL (218 MB here):
# run.sh takes NCCL from the target's PyTorch (its nvidia-nccl wheel) or from
# /usr/local/cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
out=.device/gpu
bins=(ddprun ddprund ddprun-bench-worker gpu_tests gpu_worker nccl_bench cuda_event_cost)
for f in "${bins[@]}"; do
  [[ -x "$B/bin/$f" ]] || { echo "gpu-bundle: $B/bin/$f is missing: build with DDPRUN_WITH_CUDA=ON first" >&2; exit 1; }
done
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
for f in "${bins[@]}"; do
  strip -o "$out/bin/$f" "$B/bin/$f"
done
# The workers' Python package (ddprun.checkpoint, ...): ddprun puts ../python beside its bin/ on
# their PYTHONPATH (agent/src/monitoring.cc).
tar -C "$B" --exclude=__pycache__ -cf - python | tar -C "$out" -xf -
# ddprun loads its gRPC half from ../lib beside its bin/ (agent/include/ddprun/agent/grpc_module.h).
strip -o "$out/lib/libddprun_grpc.so" "$B/lib/libddprun_grpc.so"
# Every shared library they load, except glibc's, the driver's and NCCL.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libnccl\.so)'
ldd "${bins[@]/#/$B/bin/}" "$B"/lib/libddprun_grpc.so | awk '/=> \//{print $1, $3}' | sort -u |
  while read -r name path; do
    [[ $name =~ $skip ]] && continue
    strip -o "$out/lib/$name" "$path" 2>/dev/null || cp -L "$path" "$out/lib/$name"
  done
# Two sets apart, so that the target's Python (torch and torchrun, run by the
# torch and latency steps under the same LD_LIBRARY_PATH) keeps its own: the
# C++ runtime (lib/cxx, used only where the target has none: a newer one
# serves our binaries too) and what only the SDK's workers load (lib/cuda:
# CUDA's runtime, which torch also brings in its own version).
mkdir -p "$out/lib/cxx" "$out/lib/cuda"
mv "$out"/lib/libstdc++.so.6 "$out"/lib/libgcc_s.so.1 "$out/lib/cxx/"
mv "$out"/lib/libcudart.so.* "$out"/lib/libddprun_worker_sdk.so.* "$out"/lib/libgloo.so.* "$out/lib/cuda/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the GPU steps from this bundle (see scripts/gpu-bundle.sh), from the
# repository root: bash .device/gpu/run.sh [tests] [nccl] [torch] [latency]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nccl=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null ||
       true)
[[ -n "$nccl" && -e "$nccl/libnccl.so.2" ]] || nccl=/usr/local/cuda/lib
libs=$here/lib
ldconfig -p 2>/dev/null | grep -q 'libstdc++\.so\.6 ' || libs=$libs:$here/lib/cxx
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sdk_libs="$here/lib/cuda:$nccl:$LD_LIBRARY_PATH"   # tests and nccl steps only
export DDPRUN_TEST_BIN_DIR="$here/bin" PYTHONUNBUFFERED=1
steps=("$@"); [[ ${#steps[@]} -gt 0 ]] || steps=(tests nccl torch latency features)
echo "== $(date -u +%FT%TZ) $(uname -n), $(nproc) CPUs"; nvidia-smi -L 2>/dev/null || echo "== nvidia-smi found no GPU (the GPU steps will skip or fail)"
echo "== NCCL from $nccl"; python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null ||
  echo "== python3 ($(command -v python3)) cannot import torch: the torch and latency steps need it"
missing=$(LD_LIBRARY_PATH=$sdk_libs ldd "$here"/bin/* "$here"/lib/libddprun_grpc.so 2>&1 | grep 'not found' | sort -u)
[[ -z "$missing" ]] || echo "== libraries missing here: $missing"
# The SDK loads NCCL at run time (docs/gpu.md, "Which NCCL"): which one the SDK's steps get.
echo "== $(LD_LIBRARY_PATH=$sdk_libs "$here/bin/ddprun" --version 2>&1 | grep -E '^(NCCL:|ddprun:)')"
rc=0
step() {  # step NAME COMMAND...: runs it, appends to $OUT/steps.log, remembers a failure
  local name=$1; shift
  echo "== $name: $*"
  # One file for every step: the device tool brings back at most 8 files.
  if [[ -n "${OUT:-}" ]]; then "$@" 2>&1 | tee -a "$OUT/steps.log"; else "$@"; fi
  local r=${PIPESTATUS[0]}; echo "== $name exit $r"; [[ $r -eq 0 ]] || rc=1
}
for s in "${steps[@]}"; do
  case $s in
    tests) step tests env LD_LIBRARY_PATH="$sdk_libs" "$here/bin/gpu_tests" --durations yes ;;
    nccl)  # then again with the worker's metrics channel off: the SDK's own cost per call
      step nccl env LD_LIBRARY_PATH="$sdk_libs" "$here/bin/ddprun" --nproc_per_node=1 --no_python "$here/bin/nccl_bench" all
      step nccl_unmonitored env LD_LIBRARY_PATH="$sdk_libs" "$here/bin/ddprun" --nproc_per_node=1 \
        --no_python env -u DDPRUN_METRICS_FILE "$here/bin/nccl_bench" allreduce
      step event_cost env LD_LIBRARY_PATH="$sdk_libs" "$here/bin/cuda_event_cost" ;;
    torch) step torch python3 tests/gpu/torch_under_ddprun.py --ddprun "$here/bin/ddprun" ;;
    latency)
      step launch env PYTHON_EXEC="$(command -v python3)" python3 bench/launch_latency.py \
        --ddprun "$here/bin/ddprun" --reps 5 --peer-reps 2 --sizes 1,8
      step restart env PYTHON_EXEC="$(command -v python3)" python3 bench/restart_latency.py \
        --build "$here" --reps 3 ;;
    features)  # ddprun bench / check on the GPU, and the GPU columns of a live NCCL job's /metrics
      step bench env LD_LIBRARY_PATH="$sdk_libs" "$here/bin/ddprun" bench --nproc_per_node=1 \
        --dashboard_port=off --op all --sizes 4K:256M --step_factor 4
      step scaling env LD_LIBRARY_PATH="$sdk_libs" "$here/bin/ddprun" bench --nproc_per_node=1 \
        --dashboard_port=off --scaling --compute_ms 20
      step check "$here/bin/ddprun" check --nproc_per_node=gpu examples/ddp_train.py --backend nccl
      step metrics "$here/features_metrics.sh" "$here/bin/ddprun" ;;
    compare)  # torch 2.x's own torchrun and ddprun on the same command lines, one probe worker each
      step compare python3 tests/gpu/torchrun_side_by_side.py --ddprun "$here/bin/ddprun" --out "${OUT:-.}" \
        ${COMPARE_ARGS:-} ;;
    store)  # this torch's TCPStore dialect: torch's server against ddprun's agent store; NCCL on it
      step store python3 tests/gpu/store_dialect.py --ddprun "$here/bin/ddprun" --out "${OUT:-.}" ;;
    recovery)  # the peers' figures for checkpoints of CUDA tensors and an NCCL group re-formed in place
      step recovery "$here/bin/ddprun" --nproc_per_node=1 --dashboard_port=off tests/gpu/recovery_baselines.py \
        "${OUT:-.}/recovery.json" ;;
    *) echo "run.sh: unknown step '$s' (tests, nccl, torch, latency, features, compare, store, recovery)" >&2; rc=2 ;;
  esac
done
exit $rc
RUN
chmod +x "$out/run.sh"
# features' last part: a 9 s NCCL job with the dashboard on a fixed port; its
# GPU gauges and the job document are read while it runs.
cat > "$out/features_metrics.sh" <<'METRICS'
#!/usr/bin/env bash
set -u
ddprun=$1 port=29888 loop=$(mktemp --suffix=.py)
cat > "$loop" <<'PY'
import time, torch, torch.distributed as dist
dist.init_process_group("nccl")
x, g = torch.randn(8192, 8192, device="cuda"), torch.ones(1 << 24, device="cuda")
end = time.time() + 9
while time.time() < end:
    y = x @ x; dist.all_reduce(g); torch.cuda.synchronize()
dist.destroy_process_group()
PY
timeout 30 "$ddprun" --nproc_per_node=1 --dashboard_port=$port "$loop" & job=$!
sleep 6
python3 - "$port" <<'PY'
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
m = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
print("\n".join(l for l in m.splitlines() if "gpu" in l and not l.startswith("#")))
print(json.dumps(json.loads(urllib.request.urlopen(base + "/api/v1/jobs", timeout=5).read())))
PY
r=$?; wait $job; j=$?; rm -f "$loop"; echo "scrape exit $r, job exit $j"; [[ $r -eq 0 && $j -eq 0 ]]
METRICS
chmod +x "$out/features_metrics.sh"
du -sh "$out"
