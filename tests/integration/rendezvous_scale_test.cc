// The rendezvous at CI scale: 1000 agents of one job over real gRPC on
// loopback (tests/support/simulated_job.h). Asserts correctness, not time:
// bench/rendezvous_bench.cc measures the same rounds at up to 16k agents.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <tuple>

#include "ddprun/rendezvous/daemon/server.h"
#include "support/simulated_job.h"

namespace ddprun::rendezvous {
namespace {

using testing::SimulatedJob;
using testing::SimulatedJobOptions;

constexpr int kAgents = 1000;
constexpr int kNproc = 4;

std::unique_ptr<RendezvousServer> StartServer() {
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  auto s = RendezvousServer::Start(opts);
  REQUIRE(s.ok());
  return std::move(*s);
}

// The protocol's order (docs/architecture.md): no node rank requested, so
// group ranks follow (host, pid).
std::vector<int> ExpectedGroupRanks(const SimulatedJob& job) {
  std::vector<int> order(kAgents);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const JoinSpec sa = job.Spec(a), sb = job.Spec(b);
    return std::tie(sa.host, sa.pid) < std::tie(sb.host, sb.pid);
  });
  std::vector<int> rank(kAgents);
  for (int r = 0; r < kAgents; ++r) rank[order[r]] = r;
  return rank;
}

void RequireRanks(const SimulatedJob& job, const std::vector<Assignment>& a) {
  const absl::Status st = SimulatedJob::CheckRanks(a, kAgents, kNproc);
  INFO(st.ToString());
  REQUIRE(st.ok());
  const std::vector<int> expected = ExpectedGroupRanks(job);
  for (int i = 0; i < kAgents; ++i) {
    const JoinSpec s = job.Spec(i);
    INFO("agent " << i);
    REQUIRE(a[i].group_rank == expected[i]);
    REQUIRE(a[i].node_id == s.host + ":" + std::to_string(s.pid));
    REQUIRE(a[i].local_world_size == kNproc);
  }
}

SimulatedJobOptions Options() {
  SimulatedJobOptions o;
  o.job_id = "scale";
  o.nodes = kAgents;
  o.nproc = kNproc;
  o.channels = 16;
  o.timeout = std::chrono::seconds(30);
  return o;
}

TEST_CASE("1000 agents over gRPC each get their own rank, contiguous and in protocol order",
          "[integration][scale]") {
  auto server = StartServer();
  SimulatedJob job("127.0.0.1", server->port(), Options());
  REQUIRE(job.Connect().ok());
  auto a = job.FormRound();
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  RequireRanks(job, *a);
  REQUIRE((*a)[0].round == 0);
  for (const auto& x : *a) REQUIRE(x.store_token == (*a)[0].store_token);
}

TEST_CASE("a worker failure among 1000 agents re-forms the next round with every agent",
          "[integration][scale]") {
  auto server = StartServer();
  SimulatedJob job("127.0.0.1", server->port(), Options());
  REQUIRE(job.Connect().ok());
  auto first = job.FormRound();
  REQUIRE(first.ok());
  auto next = job.FailAndReform(kAgents / 3);
  INFO(next.status().ToString());
  REQUIRE(next.ok());
  RequireRanks(job, *next);
  for (const auto& x : *next) {
    REQUIRE(x.round == 1);
    REQUIRE(x.restart_count == 1);
  }
  const auto status = server->Status();
  REQUIRE(status.size() == 1);
  REQUIRE(status[0].nodes.size() == static_cast<std::size_t>(kAgents));
}

}  // namespace
}  // namespace ddprun::rendezvous
