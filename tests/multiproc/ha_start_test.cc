// A cluster booting: three ddprund replicas started at the same moment on a
// fresh etcd prefix (docs/ha.md, "Replicas started together") must all come
// up, whatever order their claims of the prefix reach etcd in, and exactly one
// of them must lead.
#include <string>
#include <vector>

#include "support/etcd_cluster.h"
#include "support/ha_replicas.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

// The port of d's ready line ("ddprund listening on H:P"), waiting up to
// timeout_s; -1 when d exits first or prints none in time.
int WaitReadyPort(Harness& h, Proc& d, double timeout_s) {
  const std::string prefix = "ddprund listening on ";
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < timeout_s) {
    const std::string text = d.Out();
    const std::size_t at = text.find(prefix);
    const std::size_t nl = at == std::string::npos ? std::string::npos : text.find('\n', at);
    if (nl != std::string::npos) {
      const std::string addr = text.substr(at + prefix.size(), nl - at - prefix.size());
      return std::stoi(addr.substr(addr.rfind(':') + 1));
    }
    int status = 0;
    if (::waitpid(d.pid, &status, WNOHANG) == d.pid) {
      d.exit = DecodeStatus(status);
      return -1;
    }
    SleepMs(5);
  }
  return -1;
}

}  // namespace

TEST_CASE(
    "ha: three replicas started at once on a fresh prefix, 10 times: every one comes up and "
    "exactly one leads",
    "[multiproc][ha]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 3);
  auto client = etcd.Client();
  constexpr int kRounds = 10;
  constexpr int kReplicas = 3;
  for (int round = 0; round < kRounds; ++round) {
    const std::string prefix = "/boot" + std::to_string(round);
    // All three spawned before any is waited for: their claims of the prefix
    // race in etcd.
    std::vector<Replica> replicas(kReplicas);
    for (int i = 0; i < kReplicas; ++i) {
      replicas[i].proc = &h.Start(
          "b" + std::to_string(round) + "r" + std::to_string(i),
          {Ddprund(), "--host", "127.0.0.1", "--port", "0", "--dashboard_port", "0",
           "--etcd_endpoints", etcd.endpoints(), "--etcd_lease_ttl", "2", "--etcd_prefix", prefix});
    }
    for (Replica& r : replicas) {
      r.port = WaitReadyPort(h, *r.proc, 10);
      INFO("round " << round << ", " << r.proc->name << " stderr:\n" << r.proc->Err());
      REQUIRE(r.port > 0);
    }
    const int leader = WaitLeader(replicas, 10);
    INFO("round " << round);
    REQUIRE(leader >= 0);
    // The others stand by: none says it leads, and etcd names the leader.
    SleepMs(200);
    int leading = 0;
    for (const Replica& r : replicas) {
      CHECK_FALSE(r.proc->exit.has_value());
      if (Leads(r)) ++leading;
    }
    CHECK(leading == 1);
    // Each standby says so, naming the leader (issue 33 item 14).
    const std::string leader_line =
        "is a standby replica; the leader is 127.0.0.1:" + std::to_string(replicas[leader].port);
    for (int i = 0; i < kReplicas; ++i) {
      if (i == leader) continue;
      const auto t0 = Clock::now();
      while (replicas[i].proc->Err().find(leader_line) == std::string::npos &&
             SecondsSince(t0) < 5) {
        SleepMs(20);
      }
      INFO(replicas[i].proc->name << " stderr:\n" << replicas[i].proc->Err());
      CHECK(replicas[i].proc->Err().find(leader_line) != std::string::npos);
    }
    auto leader_key = client->Range(prefix + "/leader");
    REQUIRE(leader_key.ok());
    REQUIRE(leader_key->kvs.size() == 1);
    CHECK(leader_key->kvs[0].value == "127.0.0.1:" + std::to_string(replicas[leader].port));
    auto format = client->Range(prefix + "/format");
    REQUIRE(format.ok());
    REQUIRE(format->kvs.size() == 1);
    CHECK(format->kvs[0].value == "ddprun-ha-1");
    // Standbys first, so that none takes over while the round ends.
    for (int i = 0; i < kReplicas; ++i)
      if (i != leader) h.StopDaemon(*replicas[i].proc);
    h.StopDaemon(*replicas[leader].proc);
  }
}
