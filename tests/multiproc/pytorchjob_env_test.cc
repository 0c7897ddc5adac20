// Kubeflow's PyTorchJob starts each pod's launcher with node-level variables
// (training-operator's pytorch/envvar.go and master.go): RANK (the pod's
// index), WORLD_SIZE (pods x nprocPerNode), MASTER_ADDR/MASTER_PORT, and
// torchrun's own PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT.
// As torchrun, ddprun places itself from the PET_* variables alone, and every
// worker gets its own RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: the
// pod's values never reach it (docs/schedulers.md, "PyTorchJob").
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

TEST_CASE(
    "PyTorchJob's node-level RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT never reach the "
    "workers; ddprun places itself from PET_*",
    "[multiproc][k8s]") {
  Harness h;
  const std::string port = std::to_string(FreePort());
  const std::string out = h.MakeDir("out");
  // A probe worker: the environment it sees, and the fixture's checks.
  const std::string probe =
      h.Script("probe.sh",
               "#!/bin/sh\n"
               "env | grep -E '^(RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|GROUP_RANK|PET_NODE_RANK)="
               "' | sort > \"$PROBE_DIR/env.$RANK\"\n"
               "exec \"$FIXTURE\"\n");
  std::vector<Proc*> pods;
  for (int pod = 0; pod < 2; ++pod) {
    // What the operator sets on pod `pod` of a 2-replica job (no nprocPerNode:
    // WORLD_SIZE is the pod count), ddprun running 2 workers per pod. The
    // node-level values are chosen so that a leak shows: the workers' world
    // is 4, and the master service name does not resolve.
    pods.push_back(&h.StartDdprun("pod" + std::to_string(pod), {"--nproc_per_node=2", probe},
                                  {{"RANK", std::to_string(pod)},
                                   {"WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "pytorchjob-master-0.invalid"},
                                   {"MASTER_PORT", "23456"},
                                   {"PET_NNODES", "2"},
                                   {"PET_NODE_RANK", std::to_string(pod)},
                                   {"PET_MASTER_ADDR", "127.0.0.1"},
                                   {"PET_MASTER_PORT", port},
                                   {"PYTHONUNBUFFERED", "1"},
                                   {"PROBE_DIR", out},
                                   {"FIXTURE", FixtureWorker()},
                                   {"FIXTURE_OUT_DIR", out}}));
  }
  for (Proc* p : pods) {
    const int rc = h.Wait(*p, 60);
    INFO(p->name << " stderr:\n" << p->Err());
    REQUIRE(rc == 0);
  }
  const std::vector<Record> recs = ReadRecords(out);
  REQUIRE(recs.size() == 4);
  std::set<long> ranks;
  for (const Record& r : recs) {
    INFO(r.file);
    CHECK(r.Int("world_size") == 4);
    CHECK(r.Int("group_world_size") == 2);
    CHECK(r.Str("master_addr") == "127.0.0.1");
    CHECK(r.Str("master_port") == port);
    ranks.insert(r.Int("rank"));
    // The probe's own view: every variable is the worker's.
    const std::string rank = std::to_string(r.Int("rank"));
    const std::string env = ReadFile(out + "/env." + rank);
    CHECK(env.find("RANK=" + rank + "\n") != std::string::npos);
    CHECK(env.find("WORLD_SIZE=4\n") != std::string::npos);
    CHECK(env.find("MASTER_ADDR=127.0.0.1\n") != std::string::npos);
    CHECK(env.find("MASTER_PORT=" + port + "\n") != std::string::npos);
    CHECK(env.find("GROUP_RANK=" + std::to_string(r.Int("group_rank")) + "\n") !=
          std::string::npos);
    CHECK(env.find("pytorchjob-master-0") == std::string::npos);
    CHECK(env.find("23456") == std::string::npos);
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  // Node rank from PET_NODE_RANK: pod 1's workers are ranks 2 and 3.
  for (const Record& r : recs) CHECK(r.Int("group_rank") == r.Int("rank") / 2);
}
