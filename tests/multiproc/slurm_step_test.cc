// Zero-flag Slurm (docs/schedulers.md) with real processes on loopback: two
// ddprun processes are the two nodes of a fake `srun -N2 ddprun` step, each
// given the variables srun sets in its task and no rendezvous flag at all;
// they find each other through the first host of SLURM_STEP_NODELIST
// (localhost, port 29400, in a network namespace of the test's own where it
// can make one) and run one 2x2 job. What Slurm contradicts exits 2
// at once with one line. Every wait is bounded and the Harness kills whatever
// is left.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "support/net_pair.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

constexpr int kSlurmRdzvPort = 29400;  // the default a step's first node serves

// What srun sets in task `nodeid` of a `srun -N2 --ntasks-per-node=1` step.
EnvList SrunTask(int nodeid, const std::string& nodelist = "localhost,127.0.0.2", int nnodes = 2) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_JOB_NUM_NODES", std::to_string(nnodes)},
          {"SLURM_NNODES", std::to_string(nnodes)},
          {"SLURM_NODEID", std::to_string(nodeid)},
          {"SLURM_PROCID", std::to_string(nodeid)},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NODELIST", nodelist},
          {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(nnodes)}};
}

// Whether nothing listens on (or holds) 127.0.0.1:port.
bool PortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

struct Node {
  Proc* proc = nullptr;
  std::string out, pids;
};

// A node: ddprun with args, run through `prefix` (a network namespace's
// `ip netns exec`, or nothing).
Node StartNode(Harness& h, const std::string& tag, const std::vector<std::string>& args,
               EnvList env, const std::vector<std::string>& prefix = {}) {
  Node n;
  n.out = h.MakeDir(tag + "_out");
  n.pids = h.PidDir(tag + "_pids");
  env.push_back({"FIXTURE_OUT_DIR", n.out});
  env.push_back({"FIXTURE_PIDFILE_DIR", n.pids});
  std::vector<std::string> argv = prefix;
  argv.push_back(Ddprun());
  argv.insert(argv.end(), args.begin(), args.end());
  n.proc = &h.Start(tag, argv, env);
  return n;
}

}  // namespace

TEST_CASE("slurm: srun ddprun with zero rendezvous flags runs a two-node job", "[multiproc]") {
  // Port 29400 is fixed (the zero-flag default). Where network namespaces
  // can be made (root), both nodes run in one of the test's own, whose
  // loopback nothing else on the machine shares (parallel tests, other
  // jobs); elsewhere on the host's, and the case skips while another
  // process holds the port. Declared before the Harness: its processes are
  // killed before the namespace goes.
  NetPair net;
  std::vector<std::string> in_ns;
  if (net.ok()) {
    in_ns = net.In(1);
  } else if (!PortFree(kSlurmRdzvPort)) {
    return SkipCase("multiproc", "port 29400, the zero-flag Slurm default, is in use here");
  }
  Harness h;
  const std::vector<std::string> args = {"--nproc_per_node=2", FixtureWorker()};
  Node n0 = StartNode(h, "slurm0", args, SrunTask(0), in_ns);
  Node n1 = StartNode(h, "slurm1", args, SrunTask(1), in_ns);
  for (Node* n : {&n0, &n1}) {
    const int rc = h.Wait(*n->proc, 60);
    INFO(n->proc->name << " stderr:\n" << n->proc->Err());
    CHECK(rc == 0);
    // The one line that says where the placement came from.
    CHECK(n->proc->Err().find("ddprun: placed by slurm: node rank ") != std::string::npos);
    CHECK(n->proc->Err().find("rendezvous at localhost:29400 (first_node: SLURM_STEP_NODELIST "
                              "(first host)), job id slurm-4242-0") != std::string::npos);
  }
  long group = 0;
  for (Node* n : {&n0, &n1}) {
    const std::vector<Record> recs = ReadRecords(n->out);
    INFO(n->proc->name << " stderr:\n" << n->proc->Err());
    REQUIRE(recs.size() == 2);
    std::set<long> ranks;
    for (const Record& r : recs) {
      CHECK(r.Int("group_rank") == group);
      CHECK(r.Int("world_size") == 4);
      CHECK(r.Int("group_world_size") == 2);
      CHECK(r.Str("run_id") == "slurm-4242-0");
      ranks.insert(r.Int("rank"));
    }
    CHECK(ranks == std::set<long>{group * 2, group * 2 + 1});
    ++group;
  }
  h.RequireAllGone(n0.pids, 2);
  h.RequireAllGone(n1.pids, 2);
}

TEST_CASE("slurm: a placement Slurm contradicts exits 2 at once with one line", "[multiproc]") {
  Harness h;
  struct Case {
    std::string name;
    std::vector<std::string> args;
    EnvList env;
    std::string error;
  };
  EnvList tasks = SrunTask(0);
  for (auto& [name, value] : tasks) {
    if (name == "SLURM_STEP_NUM_TASKS") value = "4";  // srun -n4 -N2
  }
  const std::vector<Case> cases = {
      {"nnodes",
       {"--nnodes=3", FixtureWorker()},
       SrunTask(0),
       "ddprun: --nnodes asks for 3 nodes but slurm runs this job on 2 (SLURM_STEP_NUM_NODES=2)"},
      {"tasks",
       {FixtureWorker()},
       tasks,
       "ddprun: srun started 4 tasks (SLURM_STEP_NUM_TASKS) on 2 nodes"},
      {"nodelist",
       {FixtureWorker()},
       SrunTask(0, "node[1-2"),
       "ddprun: SLURM_STEP_NODELIST: host list 'node[1-2' has a '[' without ']'"},
      {"longer",
       {FixtureWorker()},
       SrunTask(0, "node[1-3]"),
       "ddprun: Slurm's counts disagree: SLURM_STEP_NUM_NODES=2 but SLURM_STEP_NODELIST lists 3 "
       "hosts"},
      {"pet_node_rank",
       {FixtureWorker()},
       {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "2"}, {"PET_MASTER_ADDR", "127.0.0.1"}},
       "PET_NODE_RANK"},
  };
  for (const Case& c : cases) {
    Proc& p = h.StartDdprun(c.name, c.args, c.env);
    const int rc = h.Wait(p, 10);
    INFO(c.name << " stderr:\n" << p.Err());
    CHECK(rc == 2);
    CHECK(p.Seconds() < 5);
    CHECK(p.Err().find(c.error) != std::string::npos);
    CHECK(p.Err().find("placed by") == std::string::npos);
  }
}
