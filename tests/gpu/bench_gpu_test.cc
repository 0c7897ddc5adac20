// `ddprun bench` on NCCL: every op at world size 1 (and 2 when two GPUs are
// visible), device buffers, #wrong 0, backend "nccl". Skipped visibly
// (support/skip.h) without a CUDA device or in a build without CUDA.
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

namespace ddp::detail {
int CudaDeviceCount();
}

TEST_CASE("GPU: ddprun bench runs every op on NCCL with #wrong 0, and --scaling", "[gpu]") {
  // The bench worker is built with CUDA exactly when gpu_worker is (DDPRUN_WITH_CUDA).
  if (!DDPRUN_GPU_WORKER_BUILT) {
    return SkipCase("gpu", "this build has no CUDA/NCCL (DDPRUN_WITH_CUDA=OFF)");
  }
  if (!ddp::CudaAvailable())
    return SkipCase("gpu", "no CUDA device visible (CUDA_VISIBLE_DEVICES?)");
  const int gpus = std::min(2, ddp::detail::CudaDeviceCount());
  for (int n = 1; n <= gpus; ++n) {
    Harness h;
    Proc& p = h.StartDdprun("ddprun",
                            {"bench", "--nproc_per_node=" + std::to_string(n), "--op=all",
                             "--sizes=4K:4M", "--iters=5", "--warmup=2", "--dtype=half"},
                            {{"DDP_TIMEOUT_SEC", "60"}});
    const int rc = h.Wait(p, 300);
    INFO("world size " << n << "\nstdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
    REQUIRE(rc == 0);
    CHECK(p.Out().find("backend nccl") != std::string::npos);
    CHECK(p.Out().find("# Out of bounds values : 0 OK") != std::string::npos);
    CHECK(p.Out().find("FAILED") == std::string::npos);
  }
  // The scaling table at one rank: the Reducer over device gradients.
  Harness h;
  Proc& p = h.StartDdprun(
      "ddprun",
      {"bench", "--scaling", "--nproc_per_node=1", "--compute_ms=10", "--iters=2", "--warmup=0"},
      {{"DDP_TIMEOUT_SEC", "60"}});
  const int rc = h.Wait(p, 300);
  INFO("scaling\nstdout:\n" << p.Out() << "\nstderr:\n" << p.Err());
  REQUIRE(rc == 0);
  CHECK(p.Out().find("backend nccl") != std::string::npos);
  CHECK(p.Out().find("100.0") != std::string::npos);
}
