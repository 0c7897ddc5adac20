// ddprund's probe routes for Kubernetes (docs/monitoring.md, "Health";
// configs/k8s/ddprund.yaml): /healthz answers while the process runs,
// /readyz maps the daemon's state. Real ddprund processes, a real etcd.
#include <regex>
#include <string>
#include <vector>

#include "support/etcd_cluster.h"
#include "support/ha_replicas.h"
#include "support/http_get.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

// Polls /readyz until its status is `want` and its state `state`; the last
// answer.
std::pair<int, std::string> WaitReady(int port, int want, const std::string& state,
                                      double timeout_s) {
  const auto t0 = Clock::now();
  std::pair<int, std::string> got;
  do {
    got = Http(port, "/readyz");
    if (got.first == want && got.second.find("\"state\":\"" + state + "\"") != std::string::npos) {
      return got;
    }
    SleepMs(50);
  } while (SecondsSince(t0) < timeout_s);
  return got;
}

}  // namespace

TEST_CASE("ddprund without etcd: /healthz and /readyz answer 200 while it serves",
          "[multiproc][k8s]") {
  Harness h;
  Proc* d = nullptr;
  h.StartDaemon("ddprund", &d);
  const int port = DashboardPort(*d);
  const auto live = Http(port, "/healthz");
  CHECK(live.first == 200);
  CHECK(live.second == "ok\n");
  const auto ready = Http(port, "/readyz");
  CHECK(ready.first == 200);
  CHECK(ready.second.find("\"ready\":true") != std::string::npos);
  CHECK(ready.second.find("\"state\":\"serving\"") != std::string::npos);
  h.StopDaemon(*d);
}

TEST_CASE(
    "ddprund on etcd: /readyz is 200 for the leader and a standby, 503 once etcd stops "
    "answering (while /healthz stays 200), and 200 again when etcd is back",
    "[multiproc][ha][k8s]") {
  if (!EtcdAvailable()) return SkipCase("multiproc", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 1);
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd), StartReplica(h, "r1", etcd)};
  const int leader = WaitLeader(replicas, 10);
  REQUIRE(leader >= 0);
  const Replica& lead = replicas[leader];
  const Replica& standby = replicas[1 - leader];
  const int lead_port = DashboardPort(*lead.proc);
  const int standby_port = DashboardPort(*standby.proc);

  const auto l = WaitReady(lead_port, 200, "leader", 10);
  INFO("leader /readyz: " << l.second);
  CHECK(l.first == 200);
  CHECK(l.second.find("\"state\":\"leader\"") != std::string::npos);
  // The standby knows the leader once its campaign has read P/leader.
  const auto s = WaitReady(standby_port, 200, "standby", 10);
  INFO("standby /readyz: " << s.second);
  CHECK(s.first == 200);
  CHECK(s.second.find("\"state\":\"standby\"") != std::string::npos);
  CHECK(s.second.find("127.0.0.1:" + std::to_string(lead.port)) != std::string::npos);

  // etcd gone: the leader steps down (fail-stop, docs/ha.md); the standby's
  // lease runs out within its 2 s TTL and it is no longer ready, but alive.
  etcd.Kill(0);
  const auto gone = WaitReady(standby_port, 503, "etcd unreachable", 10);
  INFO("standby /readyz without etcd: " << gone.second << "\nstderr:\n" << standby.proc->Err());
  CHECK(gone.first == 503);
  CHECK(gone.second.find("\"state\":\"etcd unreachable\"") != std::string::npos);
  CHECK(gone.second.find("--etcd_endpoints " + etcd.endpoints()) != std::string::npos);
  CHECK(Http(standby_port, "/healthz").first == 200);
  CHECK(h.Wait(*lead.proc, 10) == 1);

  // etcd back: the standby is ready again (first as a standby of the old
  // leader, whose key etcd keeps until its lease runs out), then wins the
  // election and is ready as the leader.
  etcd.Restart(0);
  const auto back = WaitReady(standby_port, 200, "leader", 30);
  INFO("standby /readyz with etcd back: " << back.second << "\nstderr:\n" << standby.proc->Err());
  CHECK(back.first == 200);
  CHECK(back.second.find("\"state\":\"leader\"") != std::string::npos);
  h.StopDaemon(*standby.proc);
}
