// [integration] ConnectMeshes (worker_sdk/src/gloo_mesh.h): Gloo meshes from
// one exchange, with ranks as threads of this process over one InMemoryStore
// and Gloo's TCP transport on loopback.
#include "gloo_mesh.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "ddprun/rendezvous/store/store.h"
#include "gloo_loop_ticker.h"
#include "gloo_ops.h"
#include "group_factory.h"
#include "support/gloo_loopback.h"

using namespace std::chrono_literals;

using ::ddprun::test::LoopbackDevice;

TEST_CASE("ConnectMeshes: one exchange forms every rank's meshes and a subset's", "[integration]") {
  constexpr int kWorld = 4;
  auto store = std::make_shared<ddprun::rendezvous::InMemoryStore>();
  // The full mesh, its sync-mode twin, and one of ranks 0 and 2 only (as the
  // hosts' leaders are).
  const std::vector<ddp::detail::MeshSpec> specs{
      {{0, 1, 2, 3}, false}, {{0, 1, 2, 3}, true}, {{0, 2}, false}};
  std::vector<absl::StatusOr<ddp::detail::Meshes>> results(kWorld);
  std::vector<std::shared_ptr<gloo::transport::Device>> devices(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      devices[r] = LoopbackDevice();
      auto ticker = ddp::detail::LoopTicker::Attach(devices[r]);
      ddp::detail::LoopTicker::Ticking ticking(ticker.get());
      results[r] = ddp::detail::ConnectMeshes(ddp::detail::LocalWorkerInfo(r, kWorld), specs,
                                              devices[r], *store, "ddp/pg0/gloo/", 30s);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(results[r].ok());
    const auto& m = *results[r];
    REQUIRE(m.contexts.size() == 3);
    CHECK(m.contexts[0]->rank == r);
    CHECK(m.contexts[0]->size == kWorld);
    CHECK(m.contexts[1]->rank == r);
    if (r % 2 == 0) {
      REQUIRE(m.contexts[2] != nullptr);
      CHECK(m.contexts[2]->rank == r / 2);
      CHECK(m.contexts[2]->size == 2);
    } else {
      CHECK(m.contexts[2] == nullptr);
    }
    // Every other rank, and only those, owns some of the addresses a pair
    // may name its peer by.
    std::set<int> owners;
    for (const auto& [address, owner] : m.rank_of_address) owners.insert(owner);
    std::set<int> others;
    for (int o = 0; o < kWorld; ++o) {
      if (o != r) others.insert(o);
    }
    CHECK(owners == others);
  }
  // Each mesh carries an all-reduce: async (large), sync-mode (small), and
  // the subset's.
  threads.clear();
  std::vector<std::vector<float>> big(kWorld), small(kWorld), subset(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      const auto& ctx = results[r]->contexts;
      big[r].assign(300007, float(r + 1));
      ddp::detail::TcpAllreduce(ctx[0], nullptr, 0, big[r].data(), big[r].size(),
                                ddp::DType::kFloat32, ddp::ReduceOp::kSum, 1, 30s);
      small[r].assign(1001, float(r + 1));
      ddp::detail::RunSyncAllreduce(ctx[1], small[r].data(), small[r].size(), ddp::DType::kFloat32,
                                    ddp::ReduceOp::kSum);
      if (ctx[2]) {
        subset[r].assign(17, float(r + 1));
        ddp::detail::TcpAllreduce(ctx[2], nullptr, 0, subset[r].data(), subset[r].size(),
                                  ddp::DType::kFloat32, ddp::ReduceOp::kSum, 2, 30s);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    CHECK(big[r] == std::vector<float>(300007, 10.0f));
    CHECK(small[r] == std::vector<float>(1001, 10.0f));
    if (r % 2 == 0) CHECK(subset[r] == std::vector<float>(17, 4.0f));  // ranks 0 and 2: 1 + 3
  }
}

TEST_CASE("ConnectMeshes: a malformed record or a missing rank is one line", "[integration]") {
  const std::vector<ddp::detail::MeshSpec> specs{{{0, 1}, false}};
  const auto info = ddp::detail::LocalWorkerInfo(0, 2);
  auto store = std::make_shared<ddprun::rendezvous::InMemoryStore>();
  auto device = LoopbackDevice();
  SECTION("malformed") {
    REQUIRE(store->Set("k/1", "not hex").ok());
    auto m = ddp::detail::ConnectMeshes(info, specs, device, *store, "k/", 30s);
    REQUIRE(m.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(m.status().message()),
               Catch::Contains("rank 1's Gloo record is malformed") &&
                   Catch::Contains("same ddprun SDK version"));
  }
  SECTION("a rank that never publishes: the store's deadline") {
    auto m = ddp::detail::ConnectMeshes(info, specs, device, *store, "k/", 200ms);
    REQUIRE(m.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK_THAT(std::string(m.status().message()),
               Catch::Contains("gloo addresses through the store"));
  }
}
