// ddprund replicas on a real etcd for the HA tests (tests/multiproc/ha_test.cc,
// ha_partition_test.cc): start one, find the one that leads, the agents'
// endpoint list and a two-node job's flags.
#pragma once

#include <string>
#include <vector>

#include "support/etcd_cluster.h"
#include "support/process_helpers.h"

namespace ddprun::test {

struct Replica {
  Proc* proc = nullptr;
  int port = 0;
};

inline Replica StartReplica(Harness& h, const std::string& name, const EtcdCluster& etcd,
                            const std::vector<std::string>& extra = {},
                            const std::string& lease_ttl = "2") {
  Replica r;
  // TTL 2 (the default): a loaded CI machine must not depose a healthy leader.
  std::vector<std::string> flags{"--etcd_endpoints", etcd.endpoints(), "--etcd_lease_ttl",
                                 lease_ttl};
  flags.insert(flags.end(), extra.begin(), extra.end());
  r.port = h.StartDaemon(name, &r.proc, flags);
  return r;
}

inline bool Leads(const Replica& r) {
  return r.proc->Err().find("leads the control plane") != std::string::npos;
}

// The replica that leads, waiting up to timeout_s.
inline int WaitLeader(const std::vector<Replica>& replicas, double timeout_s) {
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < timeout_s) {
    for (std::size_t i = 0; i < replicas.size(); ++i)
      if (!replicas[i].proc->exit && Leads(replicas[i])) return static_cast<int>(i);
    SleepMs(20);
  }
  return -1;
}

inline std::string Endpoints(const std::vector<Replica>& rs) {
  std::string out;
  for (const Replica& r : rs) {
    if (!out.empty()) out += ",";
    out += "127.0.0.1:" + std::to_string(r.port);
  }
  return out;
}

inline std::vector<std::string> JobFlags(const std::string& endpoints, const std::string& id,
                                         int node, const std::string& restarts = "1") {
  return {"--nnodes=2",
          "--nproc_per_node=2",
          "--max_restarts=" + restarts,
          "--local_addr=127.0.0." + std::to_string(node + 1),
          "--rdzv_endpoint=" + endpoints,
          "--rdzv_id=" + id,
          "--rdzv_conf=join_timeout=30",
          FixtureWorker()};
}

// Starts the two agents of JobFlags' job (node0, node1) with `env` for their
// workers; returns them in node order.
inline std::vector<Proc*> StartTwoNodeJob(Harness& h, const std::vector<std::string>& endpoints,
                                          const std::string& id, const EnvList& env,
                                          const std::string& restarts = "1") {
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(
        &h.StartDdprun("node" + std::to_string(i), JobFlags(endpoints[i], id, i, restarts), env));
  }
  return agents;
}

}  // namespace ddprun::test
