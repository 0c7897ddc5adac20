// [integration] The CPU group and the Reducer on Gloo's TCP transport over
// loopback, with 2-4 ranks as threads of this process over one InMemoryStore
// (tests/support/thread_ranks.h, shared_memory off). It opens sockets, so it
// is not in the unit tier, which runs the same checks on the shared memory
// path (tests/unit/worker_sdk/thread_group_test.cc). No ddprun, no process.
#include <catch2/catch.hpp>

#include "support/group_checks.h"

using namespace ddprun::test;
using namespace std::chrono_literals;

namespace {

ddp::InitOptions TcpOptions() {
  ddp::InitOptions o;
  o.shared_memory = false;
  o.timeout = 30s;
  return o;
}

}  // namespace

TEST_CASE("gloo over threads: allreduce on the sync and async contexts at 2-4 ranks",
          "[integration][threads]") {
  for (int world = 2; world <= 4; ++world) {
    DYNAMIC_SECTION("world size " << world) {
      ThreadRanks ranks(world, TcpOptions());
      // Small (the sync-mode rings: plain at 2 ranks, chunked at 3-4) and
      // large (300007 x 8 bytes: above SyncAllreduceMaxBytes, Gloo's async
      // all-reduce).
      CheckAllreduce(ranks, {0, 1, 1001, 300007});
    }
  }
}

TEST_CASE("gloo over threads: broadcast, allgather, reduce_scatter, barrier",
          "[integration][threads]") {
  for (int world = 2; world <= 4; ++world) {
    DYNAMIC_SECTION("world size " << world) {
      ThreadRanks ranks(world, TcpOptions());
      CheckBroadcast(ranks, 1001);
      CheckAllgatherReduceScatter(ranks, 13);
      CheckBarrier(ranks, 5);
    }
  }
}

TEST_CASE("gloo over threads: the Reducer at 2 and 3 ranks", "[integration][threads]") {
  for (int world = 2; world <= 3; ++world) {
    DYNAMIC_SECTION("world size " << world) {
      ThreadRanks ranks(world, TcpOptions());
      CheckReducerBucketing(ranks);
      CheckReducerAveragingAndViews(ranks);
    }
  }
}

TEST_CASE("gloo over threads: a collective a peer never joins times out and aborts the group",
          "[integration][threads]") {
  ddp::InitOptions o = TcpOptions();
  o.timeout = 1s;
  ThreadRanks ranks(2, o);
  float x = 1;
  // Only rank 0 issues the all-reduce.
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_AS(ranks.group(0)->Allreduce(&x, 1, ddp::DType::kFloat32).Wait(),
                    ddp::TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < 15s);
  CHECK(ranks.group(0)->aborted());
  REQUIRE_THROWS_AS(ranks.group(0)->Barrier().Wait(), ddp::StateError);
}

// A group of one has no shared memory to set up: it takes the TCP path (a
// Gloo device, no pairs), so it is here and not in the unit tier.
TEST_CASE("thread ranks: a group of one needs no peer", "[integration][threads]") {
  ThreadRanks ranks(1, TcpOptions());
  REQUIRE(ranks.group(0)->size() == 1);
  REQUIRE(ranks.group(0)->Fence() == "[job local round 0 rank 0] ");
  CheckAllreduce(ranks, {0, 5});
  CheckBarrier(ranks, 2);
}

TEST_CASE("gloo over threads: the agent's break fails a blocked collective fast",
          "[integration][threads]") {
  CheckAgentBreakFailsFast(3, TcpOptions(), {1024, 1 << 20});
}

TEST_CASE(
    "gloo over threads: a rank that leaves mid-collective is PeerLostError on every other "
    "rank, naming it",
    "[integration][threads]") {
  // Rank 2's connections close (its group is destroyed, as a killed
  // process's sockets close) while ranks 0, 1 and 3 all-reduce: its
  // neighbours see the close, record rank 2 in the store and close theirs,
  // so every survivor fails at once, naming rank 2, well within the 30 s
  // timeout. Small (sync ring) and large (async) all-reduces.
  using Clock = std::chrono::steady_clock;
  for (std::size_t count : {std::size_t(1024), std::size_t(1) << 20}) {
    ddp::InitOptions o = TcpOptions();
    o.timeout = 30s;
    ThreadRanks ranks(4, o);
    struct Seen {
      int lost_rank = -2;
      std::string error;
      Clock::duration took{};
    };
    const auto t0 = Clock::now();
    std::vector<Seen> seen = ranks.Run([&](int r) {
      Seen s;
      if (r == 2) {
        ranks.Drop(2);
        return s;
      }
      std::vector<float> v(count, 1.0f);
      try {
        ranks.group(r)->Allreduce(std::span<float>(v)).Wait();
        s.error = "no error";
      } catch (const ddp::PeerLostError& e) {
        s.lost_rank = e.rank();
        s.error = e.what();
      } catch (const std::exception& e) {
        s.error = std::string("another error: ") + e.what();
      }
      s.took = Clock::now() - t0;
      return s;
    });
    for (int r : {0, 1, 3}) {
      INFO(count << " floats, rank " << r << ": " << seen[r].error);
      REQUIRE(seen[r].lost_rank == 2);
      REQUIRE(seen[r].error.find("rank 2 is gone") != std::string::npos);
      REQUIRE(seen[r].took < 5s);
    }
  }
}
