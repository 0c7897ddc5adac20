// [unit] The CPU group and the Reducer with 2-4 ranks as threads of this
// process over one InMemoryStore (tests/support/thread_ranks.h). Every rank is
// on this host, so the group takes the shared memory path: no socket, no
// other process. Gloo's TCP path over the same harness is in the integration
// tier (tests/integration/worker_sdk/gloo_threads_test.cc).
#include <catch2/catch.hpp>

#include "cpu_topology.h"
#include "ddprun/rendezvous/store/store.h"
#include "support/group_checks.h"

using namespace ddprun::test;
using namespace std::chrono_literals;

namespace {

ddp::InitOptions ShmOptions() {
  ddp::InitOptions o;
  o.shared_memory = true;
  o.timeout = 20s;
  return o;
}

}  // namespace

TEST_CASE("thread ranks on shared memory: allreduce of every dtype and op at 2-4 ranks",
          "[unit][threads]") {
  for (int world = 2; world <= 4; ++world) {
    DYNAMIC_SECTION("world size " << world) {
      ThreadRanks ranks(world, ShmOptions());
      // Zero, one, uneven, and above one shared memory step (1 MiB per rank).
      CheckAllreduce(ranks, {0, 1, 1001, 300007});
    }
  }
}

TEST_CASE("thread ranks on shared memory: broadcast, allgather, reduce_scatter, barrier",
          "[unit][threads]") {
  for (int world = 2; world <= 4; ++world) {
    DYNAMIC_SECTION("world size " << world) {
      ThreadRanks ranks(world, ShmOptions());
      CheckBroadcast(ranks, 1001);
      CheckAllgatherReduceScatter(ranks, 13);
      CheckBarrier(ranks, 5);
    }
  }
}

TEST_CASE("thread ranks on shared memory: the Reducer at 2 and 3 ranks", "[unit][threads]") {
  for (int world = 2; world <= 3; ++world) {
    DYNAMIC_SECTION("world size " << world) {
      ThreadRanks ranks(world, ShmOptions());
      CheckReducerBucketing(ranks);
      CheckReducerAveragingAndViews(ranks);
    }
  }
}

TEST_CASE("ConnectBackend: a rank whose peers never come fails after the timeout",
          "[unit][threads]") {
  auto store = std::make_shared<ddprun::rendezvous::InMemoryStore>();
  ddp::InitOptions o = ShmOptions();
  o.timeout = 300ms;
  o.backend = ddp::Backend::kGloo;
  auto backend =
      ddp::detail::ConnectBackend(ddp::detail::LocalWorkerInfo(0, 2), o, store, "ddp/pg0/");
  REQUIRE_FALSE(backend.ok());
  REQUIRE(backend.status().code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE(std::string(backend.status().message()).rfind("[job local round 0 rank 0] ", 0) == 0);
}

TEST_CASE("ConnectBackend: a later collective after an abort is refused, naming the reason",
          "[unit][threads]") {
  ThreadRanks ranks(2, ShmOptions());
  ranks.group(1)->Abort("the test aborts rank 1");
  float x = 1;
  REQUIRE_THROWS_AS(ranks.group(1)->Allreduce(&x, 1, ddp::DType::kFloat32).Wait(), ddp::StateError);
  REQUIRE_THROWS_WITH(ranks.group(1)->Barrier().Wait(), Catch::Contains("the test aborts rank 1"));
}

// ---- the CPU backend's seams ----

TEST_CASE("cpu topology: shared memory only where some host has several ranks", "[unit]") {
  using ddp::detail::ChooseCpuPath;
  using ddp::detail::CpuPath;
  using ddp::detail::WantSharedMemory;
  CHECK(WantSharedMemory(true, 4, 1));
  CHECK(WantSharedMemory(true, 4, 2));
  CHECK_FALSE(WantSharedMemory(true, 4, 4));   // one rank per host
  CHECK_FALSE(WantSharedMemory(false, 4, 1));  // DDP_SHM=0
  CHECK_FALSE(WantSharedMemory(true, 1, 1));   // nobody to share with
  CHECK(ChooseCpuPath(1, true) == CpuPath::kOneHostShm);
  CHECK(ChooseCpuPath(2, true) == CpuPath::kHierarchical);
  CHECK(ChooseCpuPath(1, false) == CpuPath::kTcp);
  CHECK(ChooseCpuPath(3, false) == CpuPath::kTcp);
}

TEST_CASE("cpu topology: the sync ring's size limit by world size and wmem_max", "[unit]") {
  using ddp::detail::SyncAllreduceMaxBytes;
  const std::size_t big = std::size_t(64) << 20;
  CHECK(SyncAllreduceMaxBytes(big, 2) == std::size_t(4) << 20);
  CHECK(SyncAllreduceMaxBytes(big, 3) == std::size_t(256) << 10);
  CHECK(SyncAllreduceMaxBytes(big, 4) == std::size_t(256) << 10);
  // Above the socket buffer's cap the blocking writes could deadlock.
  CHECK(SyncAllreduceMaxBytes(212992, 2) == 212992);
  CHECK(SyncAllreduceMaxBytes(212992, 3) == 212992);
  CHECK(ddp::detail::WmemMax() > 0);
}

TEST_CASE("ConnectBackend: the agent's break fails a blocked shared memory collective fast",
          "[unit][threads]") {
  ddp::InitOptions o;
  o.shared_memory = true;
  CheckAgentBreakFailsFast(3, o, {1024, 1 << 20});
}
