// --ckpt_replicas' restore (agent/src/replica_exchange.h) over real loopback
// sockets: a round's real TCPStore, the holder's real replica server and the
// exchange each agent runs before its workers start. The holder keeps the
// lost seat's newest two replicas and offers both; the node taking the seat
// fetches them newest first, each on its own. When the older one cannot be
// fetched (the holder evicted it after the offer, or its bytes fail the
// checksum on the way) the newer one is still restored and offered to
// load(), and the failure is one line naming the holder, the ranks, the step
// and the cause; nothing of the failed one is loadable.
#include "replica_exchange.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/agent/checkpoint_memory.h"
#include "ddprun/agent/checkpoint_replicas.h"
#include "ddprun/rendezvous/common/checkpoint_checksum.h"
#include "ddprun/rendezvous/common/checkpoint_layout.h"
#include "ddprun/rendezvous/store/c10d_store_client.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"

namespace ddprun::agent {
namespace {

using Clock = ReplicaService::Clock;
using replica::Seat;

constexpr const char* kJob = "job1";
constexpr std::int64_t kRound = 2;
constexpr const char* kToken = "tok";
// Two nodes of two local ranks: the holder (group rank 0, ranks 0-1) and
// the node that takes the lost seat (group rank 1, ranks 2-3).
const Seat kLostSeat{2, 2, 4};

// The lines an agent logs.
struct Lines {
  std::mutex mu;
  std::vector<std::string> v;
  std::function<void(const std::string&)> Fn() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      v.push_back(m);
    };
  }
  std::string All() {
    std::lock_guard<std::mutex> lock(mu);
    std::string all;
    for (const std::string& l : v) all += l + "\n";
    return all;
  }
  int Count(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const std::string& l : v) n += l.find(text) != std::string::npos ? 1 : 0;
    return n;
  }
};

// Local rank j's snapshot of the lost seat at `step`.
std::string Snapshot(int j, std::int64_t step) {
  return std::string(100000 + 1000 * j, static_cast<char>('a' + step)) + "rank " +
         std::to_string(2 + j) + " step " + std::to_string(step);
}

// What the lost node's sender put: its replica of `step`.
void PutStep(const std::string& endpoint, std::int64_t step) {
  replica::Header h;
  h.op = replica::Op::kPut;
  h.job_id = kJob;
  h.token = kToken;
  h.round = kRound;
  h.seat = kLostSeat;
  h.step = step;
  std::vector<std::string> data{Snapshot(0, step), Snapshot(1, step)};
  for (const std::string& d : data) {
    h.sizes.push_back(d.size());
    h.crcs.push_back(checkpoint_checksum::SnapshotChecksum(checkpoint_layout::kChecksumCrc32c,
                                                           d.data(), d.size()));
    h.kinds.push_back(checkpoint_layout::kChecksumCrc32c);
  }
  std::vector<std::string_view> views(data.begin(), data.end());
  REQUIRE(ReplicaService::Put(endpoint, h, views, Clock::now() + std::chrono::seconds(10),
                              ReplicaService::Options{}.encrypt)
              .ok());
}

rendezvous::Assignment AssignmentOf(int group_rank, int store_port) {
  rendezvous::Assignment a;
  a.job_id = kJob;
  a.round = kRound;
  a.group_rank = group_rank;
  a.group_world_size = 2;
  a.base_rank = 2 * group_rank;
  a.world_size = 4;
  a.local_world_size = 2;
  a.master_addr = "127.0.0.1";
  a.master_port = store_port;
  a.store_token = kToken;
  return a;
}

// The round's exchange with the holder's replicas of steps 5 and 6 (in
// that order) offered; `after_offer` runs once the holder published its
// offer and before the other node reads it. The restored node's memory is
// `restored`; its lines go to `lines`; the holder's replica server reads
// the test hook `corrupt_older` (the first byte of an older replica it sends
// to a restore flipped).
void Exchange(CheckpointMemory& restored, Lines& lines, bool corrupt_older,
              const std::function<void(const std::string& holder)>& after_offer) {
  auto store = rendezvous::C10dStoreServer::Start({"127.0.0.1", 0});
  REQUIRE(store.ok());
  const int port = (*store)->port();
  if (corrupt_older) ::setenv(checkpoint_layout::kEnvTestReplicaCorruptOlder, "1", 1);
  ReplicaService::Options o;
  o.job_id = kJob;
  o.host = "127.0.0.1";
  o.limit_bytes = 1 << 20;
  Lines holder_lines;
  ReplicaService holder(o, nullptr, holder_lines.Fn());
  ::unsetenv(checkpoint_layout::kEnvTestReplicaCorruptOlder);
  REQUIRE(holder.Start().ok());
  holder.SetRound(kRound, kToken, "");
  PutStep(holder.endpoint(), 5);
  PutStep(holder.endpoint(), 6);
  // The holder's agent: its own seat (ranks 0-1) has nothing to restore.
  CheckpointMemory holder_memory(1 << 20);
  holder_memory.set_slots(static_cast<int>(checkpoint_layout::kSlotsWithReplicas));
  REQUIRE(holder_memory.Ensure(2).ok());
  std::thread holder_agent([&] {
    ExchangeReplicas(holder, holder_memory, AssignmentOf(0, port), kJob, holder_lines.Fn());
  });
  {
    auto client = rendezvous::C10dStoreClient::Connect("127.0.0.1", port, 10.0);
    REQUIRE(client.ok());
    const std::string key = std::string(kReplicaKeyPrefix) + kJob + "/" + std::to_string(kRound);
    auto offer = (*client)->Get(key + "/0", 10.0);
    REQUIRE(offer.ok());
    CHECK(offer->find(",5;") != std::string::npos);  // both steps offered
    after_offer(holder.endpoint());
  }
  ReplicaService::Options mine = o;
  ReplicaService service(mine, &restored, lines.Fn());
  REQUIRE(service.Start().ok());
  ExchangeReplicas(service, restored, AssignmentOf(1, port), kJob, lines.Fn());
  holder_agent.join();
  INFO("holder's lines:\n" << holder_lines.All());
  CHECK(holder_lines.Count("cannot") == 0);
  service.Stop();
  holder.Stop();
}

// Every local rank of `memory` holds exactly `steps` (newest first), each
// with the bytes the lost node saved.
void CheckHolds(const CheckpointMemory& memory, const std::vector<std::int64_t>& steps) {
  for (int j = 0; j < 2; ++j) {
    const std::vector<CommittedSnapshot> held = memory.Committed(j);
    REQUIRE(held.size() == steps.size());
    for (std::size_t i = 0; i < steps.size(); ++i) {
      INFO("local rank " << j << ", step " << steps[i]);
      CHECK(held[i].step == steps[i]);
      CHECK(held[i].rank == 2 + j);
      auto bytes = memory.ReadCommitted(j, held[i]);
      REQUIRE(bytes.ok());
      CHECK(*bytes == Snapshot(j, steps[i]));
    }
  }
}

}  // namespace

TEST_CASE(
    "replica exchange: both replicas restored, the newer with the higher generation; when the "
    "older cannot be fetched (evicted after the offer, or corrupt on the way) the newer is "
    "still restored and offered alone, with one line naming holder, ranks, step and cause",
    "[integration][replica]") {
  CheckpointMemory restored(1 << 20);
  restored.set_slots(static_cast<int>(checkpoint_layout::kSlotsWithReplicas));
  REQUIRE(restored.Ensure(2).ok());
  Lines lines;

  SECTION("both fetched") {
    Exchange(restored, lines, false, [](const std::string&) {});
    INFO(lines.All());
    CHECK(restored.CommonSteps(2, 2, 4) == std::vector<std::int64_t>{5, 6});
    CheckHolds(restored, {6, 5});
    CHECK(lines.Count("restored step 6 of ranks 2-3 from the replica held by 127.0.0.1:") == 1);
    CHECK(lines.Count("(with step 5 before it; nothing read from storage)") == 1);
    CHECK(lines.Count("cannot") == 0);
  }

  SECTION("the older evicted after the offer") {
    std::string holder;
    // The lost node's sender, still running, begins step 7: the holder
    // evicts step 5, which it had offered.
    Exchange(restored, lines, false, [&](const std::string& h) {
      holder = h;
      PutStep(h, 7);
    });
    INFO(lines.All());
    CHECK(restored.CommonSteps(2, 2, 4) == std::vector<std::int64_t>{6});
    CheckHolds(restored, {6});
    CHECK(lines.Count("--ckpt_replicas: cannot restore step 5 of ranks 2-3 from the replica held "
                      "by " +
                      holder +
                      ": no replica of ranks 2-3 at step 5 here; that step is not "
                      "offered to load()") == 1);
    CHECK(lines.Count("--ckpt_replicas: restored step 6 of ranks 2-3 from the replica held by " +
                      holder + " (nothing read from storage)") == 1);
    CHECK(lines.Count("[job ") == 0);  // the agent's line adds the fence once
  }

  SECTION("the older corrupt on the way") {
    std::string holder;
    Exchange(restored, lines, true, [&](const std::string& h) { holder = h; });
    INFO(lines.All());
    CHECK(restored.CommonSteps(2, 2, 4) == std::vector<std::int64_t>{6});
    CheckHolds(restored, {6});  // nothing of step 5 is loadable
    CHECK(lines.Count("--ckpt_replicas: cannot restore step 5 of ranks 2-3 from the replica held "
                      "by " +
                      holder + ": the replica of step 5 of rank 2 from " + holder +
                      " does not match its checksum; that step is not offered to load()") == 1);
    CHECK(lines.Count("restored step 6 of ranks 2-3 from the replica held by " + holder +
                      " (nothing read from storage)") == 1);
  }
}

}  // namespace ddprun::agent
