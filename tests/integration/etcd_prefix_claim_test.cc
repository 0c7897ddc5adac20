// ClaimEtcdPrefix (rendezvous/ha/src/etcd_journal.cc) against a real etcd:
// replicas that claim a fresh prefix at the same moment all succeed, whatever
// the interleaving; a prefix that another program uses is still refused.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rendezvous/ha/etcd_journal.h"
#include "support/etcd_cluster.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;
namespace rdzv = ddprun::rendezvous;

namespace {

// One client per claimer, as one per ddprund replica.
std::vector<std::unique_ptr<rdzv::EtcdClient>> Clients(EtcdCluster& etcd, int n) {
  std::vector<std::unique_ptr<rdzv::EtcdClient>> out;
  for (int i = 0; i < n; ++i) out.push_back(etcd.Client());
  return out;
}

}  // namespace

TEST_CASE("etcd prefix claim: claimers racing on a fresh prefix all succeed, 40 rounds",
          "[integration][ha]") {
  if (!EtcdAvailable()) return SkipCase("integration", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 1);
  constexpr int kClaimers = 4;
  constexpr int kRounds = 40;
  auto clients = Clients(etcd, kClaimers);
  for (int round = 0; round < kRounds; ++round) {
    const std::string prefix = "/race" + std::to_string(round);
    std::atomic<int> ready{0};
    std::vector<absl::Status> results(kClaimers);
    std::vector<std::thread> threads;
    for (int i = 0; i < kClaimers; ++i) {
      threads.emplace_back([&, i] {
        // Start together: every thread spins until all are ready.
        ready.fetch_add(1);
        while (ready.load() < kClaimers) std::this_thread::yield();
        results[i] = rdzv::ClaimEtcdPrefix(*clients[i], prefix);
        // A replica that won writes its leader key at once (etcd_election.cc):
        // a claimer behind it must still accept the prefix as ddprun's.
        if (results[i].ok()) (void)clients[i]->Put(prefix + "/leader", "127.0.0.1:1");
      });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kClaimers; ++i) {
      INFO("round " << round << ", claimer " << i << ": " << results[i].message());
      CHECK(results[i].ok());
    }
    auto format = clients[0]->Range(prefix + "/format");
    REQUIRE(format.ok());
    REQUIRE(format->kvs.size() == 1);
    CHECK(format->kvs[0].value == rdzv::kEtcdFormat);
    // Created once: later claims found it and wrote nothing.
    CHECK(format->kvs[0].version == 1);
  }
}

TEST_CASE("etcd prefix claim: ddprun's own prefix again; another program's prefix refused",
          "[integration][ha]") {
  if (!EtcdAvailable()) return SkipCase("integration", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 1);
  auto client = etcd.Client();

  // A prefix ddprun claimed before (a restarted replica) is accepted as is.
  REQUIRE(rdzv::ClaimEtcdPrefix(*client, "/mine").ok());
  REQUIRE(client->Put("/mine/jobs/6a/head", "x").ok());
  CHECK(rdzv::ClaimEtcdPrefix(*client, "/mine").ok());

  // Keys without the marker: another program's; nothing is written there.
  REQUIRE(client->Put("/other/config", "not ddprun's").ok());
  absl::Status other = rdzv::ClaimEtcdPrefix(*client, "/other");
  CHECK(other.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(other.message())
            .find("etcd key '/other/config' under --etcd_prefix=/other "
                  "is not ddprun's (no /other/format marker)") != std::string::npos);
  auto marker = client->Range("/other/format");
  REQUIRE(marker.ok());
  CHECK(marker->kvs.empty());

  // A marker of another format (or program): refused, left as it is.
  REQUIRE(client->Put("/newer/format", "ddprun-ha-9").ok());
  absl::Status newer = rdzv::ClaimEtcdPrefix(*client, "/newer");
  CHECK(newer.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(newer.message())
            .find("etcd key '/newer/format' under --etcd_prefix=/newer "
                  "is not ddprun's (format 'ddprun-ha-9', this ddprund "
                  "writes 'ddprun-ha-1')") != std::string::npos);
  auto kept = client->Range("/newer/format");
  REQUIRE(kept.ok());
  REQUIRE(kept->kvs.size() == 1);
  CHECK(kept->kvs[0].value == "ddprun-ha-9");

  // A prefix whose name merely starts like another's is its own (/other2 is
  // not under /other/).
  CHECK(rdzv::ClaimEtcdPrefix(*client, "/other2").ok());
}
