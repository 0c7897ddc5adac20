// The [gpu] tier: the worker SDK's NCCL backend under the real ddprun.
// Each case runs build/bin/ddprun --nproc_per_node=N gpu_worker <filter> at
// world size 1, and at 2..4 ranks when that many CUDA devices are visible;
// the Catch2 checks run on every rank (tests/gpu/worker/gpu_worker.cc).
//
// Without a CUDA device, or in a build without DDPRUN_WITH_CUDA, every case
// skips (support/skip.h) and CTest reports the test as Skipped.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>

#include "ddp/ddp.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

#ifndef DDPRUN_GPU_WORKER_BUILT
#define DDPRUN_GPU_WORKER_BUILT 0
#endif

// The SDK's own count (worker_sdk/src/backend.h, exported by the library;
// it honours CUDA_VISIBLE_DEVICES).
namespace ddp::detail {
int CudaDeviceCount();
}

namespace {

// How many ranks can run (one GPU each), or 0 after printing why none.
int VisibleGpus() {
  if (!DDPRUN_GPU_WORKER_BUILT) {
    SkipCase("gpu", "this build has no CUDA/NCCL (DDPRUN_WITH_CUDA=OFF)");
    return 0;
  }
  if (!ddp::CudaAvailable()) {
    SkipCase("gpu", "no CUDA device visible (CUDA_VISIBLE_DEVICES?)");
    return 0;
  }
  return ddp::detail::CudaDeviceCount();
}

void RunRanks(int n, const std::string& filter, double timeout_s = 300) {
  Harness h;
  // CatchRun: a filter that matches no case fails the job.
  Proc& p = h.StartDdprun("ddprun",
                          Concat({"--nproc_per_node=" + std::to_string(n), "--no_python"},
                                 CatchRun(Bin("gpu_worker"), filter)),
                          {{"DDP_TIMEOUT_SEC", "60"}, {"DDP_BACKEND", "nccl"}});
  const int rc = h.Wait(p, timeout_s);
  INFO("world size " << n << ", filter " << filter << "\nstdout:\n"
                     << p.Out() << "\nstderr:\n"
                     << p.Err());
  REQUIRE(rc == 0);
}

// World size 1, then 2..min(4, GPUs).
void RunOnGpus(const std::string& filter) {
  const int gpus = VisibleGpus();
  if (gpus == 0) return;
  for (int n = 1; n <= std::min(gpus, 4); ++n) {
    DYNAMIC_SECTION("world size " << n) { RunRanks(n, filter); }
  }
  if (gpus == 1) WARN("[gpu] " << filter << ": 1 CUDA device visible, so world size 1 only");
}

}  // namespace

TEST_CASE("GPU: every NCCL collective, dtype and op against a local reference", "[gpu]") {
  RunOnGpus("[gpu-collectives]");
}

TEST_CASE("GPU: collectives wait for the caller's stream; Work::Synchronize on a user stream",
          "[gpu]") {
  RunOnGpus("[gpu-stream]");
}

TEST_CASE("GPU: the Reducer on NCCL (bit for bit, averaging, no_sync, compression kernels)",
          "[gpu]") {
  RunOnGpus("[gpu-reducer]");
}

TEST_CASE("GPU: NCCL collectives show up in the worker's metrics channel", "[gpu]") {
  RunOnGpus("[gpu-metrics]");
}

TEST_CASE("GPU: an aborted NCCL group refuses every later call", "[gpu]") {
  RunOnGpus("[gpu-abort]");
}

TEST_CASE(
    "GPU: under --restart_policy=inplace, survivors of a peer killed with SIGKILL get "
    "PeerLostError within 5 s",
    "[gpu]") {
  const int gpus = VisibleGpus();
  if (gpus == 0) return;
  if (gpus < 2) {
    return SkipCase("gpu",
                    "a peer to kill needs 2 CUDA devices; " + std::to_string(gpus) + " visible");
  }
  Harness h;
  Proc& help = h.StartDdprun("help", {"--help"});
  h.Wait(help, 30);
  if (help.Out().find("--restart_policy") == std::string::npos) {
    return SkipCase("gpu", "this ddprun has no --restart_policy (the in-place agent)");
  }
  const int n = std::min(gpus, 4);
  const std::string result = h.dir() + "/result";
  Proc& p = h.StartDdprun(
      "ddprun",
      Concat({"--nproc_per_node=" + std::to_string(n), "--no_python", "--restart_policy=inplace",
              "--max_restarts=1", "--grace_period=20"},
             CatchRun(Bin("gpu_worker"), "[gpu-peer-lost]")),
      {{"DDP_TIMEOUT_SEC", "60"}, {"DDP_BACKEND", "nccl"}, {"GPU_RESULT_FILE", result}});
  h.Wait(p, 180);
  for (int r = 0; r + 1 < n; ++r) {
    const std::string report = ReadFile(result + "." + std::to_string(r));
    INFO("rank " << r << ": " << report << "\nddprun stderr:\n" << p.Err());
    REQUIRE(report.rfind("peer lost after ", 0) == 0);
    REQUIRE(std::stod(report.substr(16)) < 5.0);
  }
}
