// SDK store failover (docs/ha.md): two ddprund replicas on a real etcd, a
// two-node job of SDK workers (sdk_worker's [failover] case) that bootstrap
// one group after another through the store while the leading replica is
// killed with SIGKILL. Every worker's store calls go on through the other
// replica (DDPRUN_STORE_REPLICAS, set by the agent from --rdzv_endpoint):
// every group forms, every sum is right, no worker fails or restarts.
#include <signal.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "support/etcd_cluster.h"
#include "support/ha_replicas.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

TEST_CASE(
    "ha: SDK workers bootstrap through the store while the leading replica is killed: every "
    "group forms with the right sums",
    "[sdk][ha]") {
  if (!EtcdAvailable()) return SkipCase("sdk", "no /usr/bin/etcd (etcd-server)");
  Harness h;
  EtcdCluster etcd(h, 1);
  std::vector<Replica> replicas{StartReplica(h, "r0", etcd), StartReplica(h, "r1", etcd)};
  const int leader = WaitLeader(replicas, 10);
  REQUIRE(leader >= 0);
  const int other = 1 - leader;
  // The leader first: the agents, and so DDPRUN_STORE_ADDR, start there.
  const std::string endpoints = Endpoints({replicas[leader], replicas[other]});
  const std::string progress = h.MakeDir("progress");
  const int iterations = 40;
  const EnvList env{{"DDP_TIMEOUT_SEC", "30"},
                    {"DDP_SHM", "0"},
                    {"FAILOVER_ITERATIONS", std::to_string(iterations)},
                    {"FAILOVER_PROGRESS_DIR", progress}};
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(&h.StartDdprun(
        "node" + std::to_string(i),
        Concat({"--nnodes=2", "--nproc_per_node=2", "--max_restarts=0",
                "--local_addr=127.0.0." + std::to_string(i + 1), "--rdzv_endpoint=" + endpoints,
                "--rdzv_id=hastore", "--rdzv_conf=join_timeout=30", "--no_python"},
               CatchRun(Bin("sdk_worker"), "[failover]")),
        env));
  }
  // Every rank has formed two groups: kill -9 the leader mid-loop.
  const auto t0 = Clock::now();
  auto count = [&](const std::string& prefix) {
    int n = 0;
    for (const std::string& f : ListDir(progress)) n += f.rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  };
  while (count("started.") < 4 && SecondsSince(t0) < 30) SleepMs(10);
  REQUIRE(count("started.") == 4);
  REQUIRE(count("done.") == 0);  // the kill lands mid-loop
  REQUIRE(::kill(replicas[leader].proc->pid, SIGKILL) == 0);
  h.Wait(*replicas[leader].proc, 5);
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 90);
    INFO(a->name << ":\n"
                 << a->Out() << a->Err() << "\nr" << other << ":\n"
                 << replicas[other].proc->Err());
    CHECK(rc == 0);
    CHECK(a->Err().find("restart 1") == std::string::npos);  // round 0's workers throughout
    CHECK(a->Err().find("restarting") == std::string::npos);
  }
  CHECK(count("done.") == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(ReadFile(progress + "/done." + std::to_string(r)) == std::to_string(iterations) + "\n");
  }
  CHECK(WaitLeader({replicas[other]}, 1) == 0);
  h.StopDaemon(*replicas[other].proc);
}
