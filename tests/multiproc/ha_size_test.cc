// Jobs and store values against etcd's request limit (docs/ha.md, "Large jobs
// and etcd's request limit"): a real 3-member etcd on loopback started with a
// small --max-request-bytes, so that a job of a few hundred simulated agents
// (real Join streams over gRPC, tests/support/simulated_job.h) needs a
// snapshot of several chunks; ddprund replicas as real processes.
#include <signal.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rendezvous/client.h"
#include "ddprun/rendezvous/common/errors.h"
#include "ddprun/rendezvous/ha/etcd_journal.h"
#include "ddprun/rendezvous/ha/etcd_snapshot_chunks.h"
#include "ddprun/rendezvous/job_table.h"
#include "support/etcd_cluster.h"
#include "support/formed_snapshot.h"
#include "support/ha_replicas.h"
#include "support/process_helpers.h"
#include "support/simulated_job.h"
#include "support/skip.h"

using namespace ddprun::test;
namespace rdzv = ddprun::rendezvous;
using ddprun::testing::SimulatedJob;
using ddprun::testing::SimulatedJobOptions;

namespace {

constexpr const char* kLimit = "16384";  // etcd's and ddprund's, bytes
constexpr int kAgents = 1000;  // a snapshot of about 30 KiB compressed: 2-3 chunks of 16 KiB

EtcdPlace SmallRequests() {
  EtcdPlace p;
  p.max_request_bytes = kLimit;
  return p;
}

SimulatedJobOptions Job(const std::string& id, int nodes) {
  SimulatedJobOptions o;
  o.job_id = id;
  o.nodes = nodes;
  o.nproc = 8;
  o.channels = 8;
  o.timeout = std::chrono::seconds(30);
  return o;
}

// The snapshot of a formed round of n members (8 workers each).
rdzv::JobSnapshot FormedJob(const std::string& id, int n) {
  SimulatedJob shape("127.0.0.1", 0, Job(id, n));
  std::vector<rdzv::JoinSpec> specs;
  for (int i = 0; i < n; ++i) {
    specs.push_back(shape.Spec(i));
    specs.back().command = "python3 train.py --config configs/llama.yaml";
  }
  absl::StatusOr<rdzv::JobSnapshot> snap = ddprun::testing::FormedSnapshot(specs);
  REQUIRE(snap.ok());
  return *snap;
}

// The number in "chunks=N" of a snapshot head (0 when there is none).
long HeadChunks(const std::string& head) {
  const std::size_t at = head.find(" chunks=");
  return at == std::string::npos ? 0 : std::stol(head.substr(at + 8));
}

}  // namespace

TEST_CASE(
    "ha size: a job whose snapshot spans several etcd requests fails over; the standby "
    "recovers every member",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 3, "etcd", "", false, SmallRequests());
  const std::vector<std::string> flags{"--etcd_max_request_bytes", kLimit};
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd, flags),
                                StartReplica(h, "r1", etcd, flags)};
  const int leader = WaitLeader(replicas, 10);
  REQUIRE(leader >= 0);
  SimulatedJob job("127.0.0.1", replicas[leader].port, Job("big", kAgents));
  REQUIRE(job.Connect().ok());
  auto formed = job.FormRound();
  INFO(replicas[leader].proc->Err());
  INFO(formed.status().ToString());
  REQUIRE(formed.ok());
  REQUIRE(SimulatedJob::CheckRanks(*formed, kAgents, 8).ok());
  // Durable before delivered: the head names a version of several chunks.
  const std::string head = etcd.Get("/ddprun/jobs/626967/head");  // hex("big")
  INFO("head: " << head);
  CHECK(HeadChunks(head) >= 2);
  // A failure, so that a second version replaces the first (the head moves,
  // the old chunks go).
  auto reformed = job.FailAndReform(0);
  INFO(reformed.status().ToString());
  REQUIRE(reformed.ok());
  // The job's first join wrote version 1, the formed round 2; the restart
  // and the new round wrote versions 3 and 4; only the head's is kept.
  const std::string head2 = etcd.Get("/ddprun/jobs/626967/head");
  INFO("head after the restart: " << head2);
  CHECK(head2.find(" version=4 ") != std::string::npos);
  {
    const std::string dir = "/ddprun/jobs/626967/snapshot/";
    auto chunks = etcd.Client()->Range(dir, rdzv::EtcdClient::PrefixEnd(dir));
    REQUIRE(chunks.ok());
    CHECK(static_cast<long>(chunks->kvs.size()) == HeadChunks(head2));
    for (const auto& kv : chunks->kvs) CHECK(kv.key.rfind(dir + "00000000000000000004/", 0) == 0);
  }
  std::set<std::string> hosts;
  for (int i = 0; i < kAgents; ++i) hosts.insert(job.Spec(i).host);
  // kill -9 the leader: the standby reads the head and its chunks.
  REQUIRE(::kill(replicas[leader].proc->pid, SIGKILL) == 0);
  h.Wait(*replicas[leader].proc, 5);
  const int next = WaitLeader(replicas, 10);
  REQUIRE(next == 1 - leader);
  auto client = rdzv::RendezvousClient::Create("127.0.0.1", replicas[next].port);
  auto status = client->Status("big", std::chrono::seconds(5));
  INFO(replicas[next].proc->Err());
  REQUIRE(status.ok());
  REQUIRE(status->size() == 1);
  const rdzv::JobStatus& s = status->front();
  CHECK(s.state == "running");
  CHECK(s.round == 1);
  CHECK(s.restart_count == 1);
  CHECK(s.world_size == kAgents * 8);
  REQUIRE(s.nodes.size() == static_cast<std::size_t>(kAgents));
  std::set<std::string> recovered;
  for (const rdzv::NodeInfo& n : s.nodes) recovered.insert(n.host);
  CHECK(recovered == hosts);
  job.Close();
  h.StopDaemon(*replicas[next].proc);
}

TEST_CASE(
    "ha size: a store value over etcd's request limit is refused to the worker naming the "
    "limit; no reader ever sees it",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 3, "etcd", "", false, SmallRequests());
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd, {"--etcd_max_request_bytes", kLimit})};
  REQUIRE(WaitLeader(replicas, 10) == 0);
  SimulatedJob job("127.0.0.1", replicas[0].port, Job("kv", 2));
  REQUIRE(job.Connect().ok());
  auto formed = job.FormRound();
  REQUIRE(formed.ok());
  const rdzv::StoreScope scope{"kv", (*formed)[0].store_token, (*formed)[0].round};
  rdzv::GrpcStore writer("127.0.0.1", replicas[0].port, scope);
  rdzv::GrpcStore reader("127.0.0.1", replicas[0].port, scope);
  // A reader already waiting for the key when the big value comes.
  absl::StatusOr<std::string> waited;
  std::thread wait([&] { waited = reader.Get("big", std::chrono::seconds(2)); });
  SleepMs(200);
  const absl::Status big = writer.Set("big", std::string(20000, 'x'));
  REQUIRE_FALSE(big.ok());
  CHECK(rdzv::KindOf(big) == rdzv::ErrorKind::kBadInput);
  const std::string msg(big.message());
  INFO(msg);
  CHECK(msg.find("20000 bytes") != std::string::npos);
  CHECK(msg.find("--etcd_max_request_bytes=16384") != std::string::npos);
  CHECK(msg.find("--max-request-bytes") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  wait.join();
  CHECK(rdzv::KindOf(waited.status()) == rdzv::ErrorKind::kTimeout);
  CHECK(etcd.Get("/ddprun/jobs/6b76/store/00000000000000000000/big").empty());
  // A value that fits is written to etcd before the worker hears OK.
  REQUIRE(writer.Set("small", std::string(10000, 'y')).ok());
  CHECK(etcd.Get("/ddprun/jobs/6b76/store/00000000000000000000/small") == std::string(10000, 'y'));
  job.Close();
  h.StopDaemon(*replicas[0].proc);
}

TEST_CASE(
    "ha size: ddprund told a larger limit than etcd's: the round is not delivered, its agents "
    "get one line naming both settings",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 3, "etcd", "", false, SmallRequests());
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd)};  // the default 1.5 MiB
  REQUIRE(WaitLeader(replicas, 10) == 0);
  SimulatedJob job("127.0.0.1", replicas[0].port, Job("mis", kAgents));
  REQUIRE(job.Connect().ok());
  auto formed = job.FormRound();
  REQUIRE_FALSE(formed.ok());
  const std::string msg(formed.status().message());
  INFO(msg);
  CHECK(rdzv::KindOf(formed.status()) == rdzv::ErrorKind::kBadInput);
  CHECK(msg.find("[job mis round 0] not delivered") != std::string::npos);
  CHECK(msg.find("--etcd_max_request_bytes=1572864") != std::string::npos);
  CHECK(msg.find("etcd's --max-request-bytes") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  // hex("mis"): the round is not durable; the head is still the job's first
  // join (one member, written once when the job was created).
  CHECK(etcd.Get("/ddprun/jobs/6d6973/head").find(" version=1 ") != std::string::npos);
  // The replica drops the job from memory: a later run of the id starts afresh.
  auto client = rdzv::RendezvousClient::Create("127.0.0.1", replicas[0].port);
  const auto t0 = Clock::now();
  absl::StatusOr<std::vector<rdzv::JobStatus>> status;
  while (SecondsSince(t0) < 5) {
    status = client->Status("mis", std::chrono::seconds(2));
    REQUIRE(status.ok());
    if (status->empty()) break;
    SleepMs(50);
  }
  CHECK(status->empty());
  job.Close();
  h.StopDaemon(*replicas[0].proc);
}

TEST_CASE(
    "ha size: a job kept in the layout before chunks (one snapshot value) beside a torn write is "
    "recovered, and rewritten in chunks on its next change",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 1);
  const std::vector<std::string> flags{"--reattach_timeout", "1"};
  std::vector<Replica> first{StartReplica(h, "r0", etcd, flags)};
  REQUIRE(WaitLeader(first, 10) == 0);
  SimulatedJob job("127.0.0.1", first[0].port, Job("old", 4));
  REQUIRE(job.Connect().ok());
  REQUIRE(job.FormRound().ok());
  REQUIRE(::kill(first[0].proc->pid, SIGKILL) == 0);
  h.Wait(*first[0].proc, 5);
  job.Close();
  // Rewrite the job as an older ddprund kept it: P/jobs/<hex>/snapshot, the
  // serialized JobSnapshot in one value, no head, no chunks.
  const std::string base = "/ddprun/jobs/6f6c64/";  // hex("old")
  auto c = etcd.Client();
  auto head = c->Range(base + "head");
  REQUIRE(head.ok());
  REQUIRE(head->kvs.size() == 1);
  auto parsed = rdzv::ParseSnapshotHead(head->kvs[0].value);
  REQUIRE(parsed.ok());
  auto chunks = c->Range(base + "snapshot/", rdzv::EtcdClient::PrefixEnd(base + "snapshot/"));
  REQUIRE(chunks.ok());
  std::vector<std::string> values;
  for (const auto& kv : chunks->kvs) values.push_back(kv.value);
  auto raw = rdzv::JoinAndDecompress(*parsed, values);
  REQUIRE(raw.ok());
  REQUIRE(c->DeleteRange(base + "head").ok());
  REQUIRE(c->DeleteRange(base + "snapshot/", rdzv::EtcdClient::PrefixEnd(base + "snapshot/")).ok());
  REQUIRE(c->Put(base + "snapshot", *raw).ok());
  // And an unfinished write (a leader killed between chunks): a version no head names.
  REQUIRE(c->Put(base + "snapshot/00000000000000000007/00000000", "torn").ok());
  // A new replica recovers it; its members do not re-attach, so after
  // --reattach_timeout the round is over; new agents form the next one, and
  // that change is written in chunks.
  std::vector<Replica> second{StartReplica(h, "r1", etcd, flags)};
  REQUIRE(WaitLeader(second, 10) == 0);
  auto client = rdzv::RendezvousClient::Create("127.0.0.1", second[0].port);
  auto status = client->Status("old", std::chrono::seconds(5));
  INFO(second[0].proc->Err());
  REQUIRE(status.ok());
  REQUIRE(status->size() == 1);
  CHECK(status->front().nodes.size() == 4);
  CHECK(status->front().state == "running");
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < 10) {
    status = client->Status("old", std::chrono::seconds(5));
    REQUIRE(status.ok());
    if (status->front().state != "running") break;
    SleepMs(50);
  }
  REQUIRE(status->front().state == "gathering");
  {
    auto legacy = c->Range(base + "snapshot");  // nothing written while nobody heard
    REQUIRE(legacy.ok());
    REQUIRE(legacy->kvs.size() == 1);
    CHECK(legacy->kvs[0].value == *raw);
  }
  SimulatedJob again("127.0.0.1", second[0].port, Job("old", 4));
  REQUIRE(again.Connect().ok());
  auto formed = again.FormRound();
  INFO(formed.status().ToString());
  REQUIRE(formed.ok());
  CHECK((*formed)[0].round == 1);
  CHECK(HeadChunks(etcd.Get(base + "head")) == 1);
  auto legacy = c->Range(base + "snapshot");
  REQUIRE(legacy.ok());
  CHECK(legacy->kvs.empty());
  // The new head's chunk is all that is left under snapshot/: the torn version went with it.
  auto left = c->Range(base + "snapshot/", rdzv::EtcdClient::PrefixEnd(base + "snapshot/"));
  REQUIRE(left.ok());
  REQUIRE(left->kvs.size() == 1);
  CHECK(left->kvs[0].key == base + "snapshot/00000000000000000001/00000000");
  again.Close();
  h.StopDaemon(*second[0].proc);
}

TEST_CASE(
    "ha size: a job of 16384 members is one etcd transaction at etcd's default limit, several at "
    "a small one, and reads back whole",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  constexpr int kMembers = 16384;
  const rdzv::JobSnapshot snap = FormedJob("huge", kMembers);
  for (const char* limit : {"1572864", "262144"}) {
    INFO("etcd --max-request-bytes " << limit);
    Harness h;
    EtcdPlace place;
    place.max_request_bytes = limit;
    EtcdCluster etcd(h, 1, "etcd", "", false, place);
    auto client = etcd.Client();
    rdzv::EtcdJournalOptions o;
    o.client = client.get();
    o.prefix = "/ddprun";
    o.may_lead = [] { return true; };
    o.on_deposed = [](absl::Status st) { FAIL("deposed: " << st.message()); };
    o.max_request_bytes = std::stoul(limit);
    rdzv::EtcdJournal journal(o);  // leader revision 0: P/leader absent, as the compare expects
    const absl::Status written = journal.WriteSnapshot(snap, snap.round, rdzv::KvEngine());
    INFO(written.ToString());
    REQUIRE(written.ok());
    const long chunks = HeadChunks(etcd.Get("/ddprun/jobs/68756765/head"));  // hex("huge")
    CHECK(journal.writes() == chunks);  // one transaction per chunk, the head in the last
    if (std::string(limit) == "1572864") CHECK(chunks == 1);
    if (std::string(limit) == "262144") CHECK(chunks >= 2);
    rdzv::EtcdJournal reader(o);
    auto recovered = reader.Recover();
    INFO(recovered.status().ToString());
    REQUIRE(recovered.ok());
    REQUIRE(recovered->size() == 1);
    const rdzv::JobSnapshot& back = recovered->front().snapshot;
    CHECK(back.job_id == "huge");
    CHECK(back.state == snap.state);
    CHECK(back.store_token == snap.store_token);
    REQUIRE(back.members.size() == static_cast<std::size_t>(kMembers));
    REQUIRE(back.assigned.size() == snap.assigned.size());
    bool same = true;
    for (std::size_t i = 0; i < snap.members.size(); ++i) {
      same = same && back.members[i].node_id == snap.members[i].node_id &&
             back.members[i].spec.host == snap.members[i].spec.host &&
             back.members[i].spec.pid == snap.members[i].spec.pid &&
             back.members[i].spec.command == snap.members[i].spec.command;
    }
    for (std::size_t i = 0; i < snap.assigned.size(); ++i) {
      same = same && back.assigned[i].host == snap.assigned[i].host &&
             back.assigned[i].base_rank == snap.assigned[i].base_rank;
    }
    CHECK(same);
  }
}
