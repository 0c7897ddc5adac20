// Multi-node jobs on loopback: ddprund, the embedded rendezvous and static.
// Each "node" is one ddprun agent with its own --local_addr (127.0.0.N) and
// its own FIXTURE_OUT_DIR, so the test knows which node each worker ran on.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

struct Node {
  Proc* proc = nullptr;
  std::string out, pids, local_addr;
};

// Starts `nnodes` agents of job `id` with the extra rendezvous flags.
std::vector<Node> StartNodes(Harness& h, const std::string& id, int nnodes, int nproc,
                             const std::vector<std::string>& rdzv_flags,
                             const EnvList& extra_env = {},
                             const std::vector<std::vector<std::string>>& per_node = {}) {
  std::vector<Node> nodes;
  for (int i = 0; i < nnodes; ++i) {
    Node n;
    const std::string tag = id + "_node" + std::to_string(i);
    n.out = h.MakeDir(tag + "_out");
    n.pids = h.PidDir(tag + "_pids");
    n.local_addr = "127.0.0." + std::to_string(i + 1);
    std::vector<std::string> args{"--nnodes=" + std::to_string(nnodes),
                                  "--nproc_per_node=" + std::to_string(nproc),
                                  "--local_addr=" + n.local_addr};
    args.insert(args.end(), rdzv_flags.begin(), rdzv_flags.end());
    if (i < static_cast<int>(per_node.size()))
      args.insert(args.end(), per_node[i].begin(), per_node[i].end());
    args.push_back(FixtureWorker());
    EnvList env{{"FIXTURE_OUT_DIR", n.out}, {"FIXTURE_PIDFILE_DIR", n.pids}};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    n.proc = &h.StartDdprun(tag, args, env);
    nodes.push_back(n);
  }
  return nodes;
}

void WaitAll(Harness& h, std::vector<Node>& nodes, int expected_rc, double timeout_s) {
  for (Node& n : nodes) {
    const int rc = h.Wait(*n.proc, timeout_s);
    INFO(n.proc->name << " stderr:\n" << n.proc->Err());
    CHECK(rc == expected_rc);
  }
}

// The assignment the workers saw: every rank 0..nnodes*nproc-1 exactly once,
// ranks contiguous per node (rank = group_rank*nproc + local_rank), group
// ranks 0..nnodes-1 once each, one MASTER_ADDR:MASTER_PORT for the whole job,
// and MASTER_ADDR is the address of the node with group rank 0.
void CheckAssignment(const std::vector<Node>& nodes, int nproc, const std::string& job_id,
                     bool master_is_group0_addr = true) {
  const int nnodes = static_cast<int>(nodes.size());
  const int world = nnodes * nproc;
  std::set<long> ranks, group_ranks;
  std::set<std::string> masters;
  std::string group0_addr;
  for (const Node& n : nodes) {
    const std::vector<Record> recs = ReadRecords(n.out);
    INFO("node " << n.local_addr << " (" << n.out << ")");
    REQUIRE(recs.size() == static_cast<std::size_t>(nproc));
    std::set<long> node_group;
    std::vector<long> node_ranks;
    for (const Record& r : recs) {
      INFO(r.file);
      CHECK(r.Int("world_size") == world);
      CHECK(r.Int("local_world_size") == nproc);
      CHECK(r.Int("group_world_size") == nnodes);
      CHECK(r.Int("restart_count") == 0);
      CHECK(r.Str("run_id") == job_id);
      CHECK(r.Int("master_port") > 0);
      CHECK(r.Int("rank") == r.Int("group_rank") * nproc + r.Int("local_rank"));
      node_group.insert(r.Int("group_rank"));
      node_ranks.push_back(r.Int("rank"));
      CHECK(ranks.insert(r.Int("rank")).second);
      masters.insert(r.Str("master_addr") + ":" + r.Str("master_port"));
    }
    REQUIRE(node_group.size() == 1);
    const long g = *node_group.begin();
    CHECK(group_ranks.insert(g).second);
    if (g == 0) group0_addr = n.local_addr;
    std::sort(node_ranks.begin(), node_ranks.end());
    for (int i = 0; i < nproc; ++i) CHECK(node_ranks[i] == g * nproc + i);
  }
  std::set<long> all_ranks, all_groups;
  for (int r = 0; r < world; ++r) all_ranks.insert(r);
  for (int g = 0; g < nnodes; ++g) all_groups.insert(g);
  CHECK(ranks == all_ranks);
  CHECK(group_ranks == all_groups);
  REQUIRE(masters.size() == 1);
  if (master_is_group0_addr) {
    const std::string m = *masters.begin();
    CHECK(m.substr(0, m.rfind(':')) == group0_addr);
  }
}

void RequireNodesGone(Harness& h, const std::vector<Node>& nodes) {
  for (const Node& n : nodes) h.RequireAllGone(n.pids, 2);
}

std::vector<std::string> DaemonFlags(int port, const std::string& id,
                                     const std::string& conf = "join_timeout=20") {
  return {"--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=" + id,
          "--rdzv_conf=" + conf};
}

}  // namespace

TEST_CASE("ddprund + 2 agents: contiguous ranks per node, rank 0 on group rank 0", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  std::vector<Node> nodes = StartNodes(h, "jobA", 2, 2, DaemonFlags(port, "jobA"));
  WaitAll(h, nodes, 0, 30);
  CheckAssignment(nodes, 2, "jobA");
  // The endpoint is local, so each node says whose rendezvous it joins.
  for (const Node& n : nodes) {
    INFO(n.proc->Err());
    CHECK(n.proc->Err().find("is already served by pid " + std::to_string(daemon->pid) +
                             " (ddprund)") != std::string::npos);
  }
  RequireNodesGone(h, nodes);
  h.StopDaemon(*daemon);
}

TEST_CASE("ddprund + 3 agents with --nnodes=3", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  std::vector<Node> nodes = StartNodes(h, "job3", 3, 2, DaemonFlags(port, "job3"));
  WaitAll(h, nodes, 0, 30);
  CheckAssignment(nodes, 2, "job3");
  RequireNodesGone(h, nodes);
  h.StopDaemon(*daemon);
}

// Issue 33 item 9b: nodes with different --nproc_per_node run as under
// torchrun: LOCAL_WORLD_SIZE is the node's own, global ranks follow node
// order, WORLD_SIZE is the sum (the fixture also checks ROLE_RANK == RANK).
TEST_CASE("nodes with different --nproc_per_node: own LOCAL_WORLD_SIZE, WORLD_SIZE the sum",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::vector<int> nprocs{2, 1, 3};
  std::vector<Node> nodes;
  for (std::size_t i = 0; i < nprocs.size(); ++i) {
    Node n;
    const std::string tag = "mixed_node" + std::to_string(i);
    n.out = h.MakeDir(tag + "_out");
    n.pids = h.PidDir(tag + "_pids");
    n.local_addr = "127.0.0." + std::to_string(i + 1);
    std::vector<std::string> args{"--nnodes=3", "--nproc_per_node=" + std::to_string(nprocs[i]),
                                  "--local_addr=" + n.local_addr};
    for (const std::string& f : DaemonFlags(port, "mixed")) args.push_back(f);
    args.push_back(FixtureWorker());
    n.proc =
        &h.StartDdprun(tag, args, {{"FIXTURE_OUT_DIR", n.out}, {"FIXTURE_PIDFILE_DIR", n.pids}});
    nodes.push_back(n);
  }
  WaitAll(h, nodes, 0, 30);
  // Group ranks follow the addresses here (no --node_rank): 2 + 1 + 3 ranks.
  const std::vector<long> base{0, 2, 3};
  std::set<long> ranks;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::vector<Record> recs = ReadRecords(nodes[i].out);
    INFO("node " << nodes[i].local_addr);
    REQUIRE(recs.size() == static_cast<std::size_t>(nprocs[i]));
    for (const Record& r : recs) {
      INFO(r.file);
      CHECK(r.Int("world_size") == 6);
      CHECK(r.Int("local_world_size") == nprocs[i]);
      CHECK(r.Int("group_world_size") == 3);
      CHECK(r.Int("group_rank") == static_cast<long>(i));
      CHECK(r.Int("rank") == base[i] + r.Int("local_rank"));
      CHECK(ranks.insert(r.Int("rank")).second);
    }
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3, 4, 5});
  RequireNodesGone(h, nodes);
  h.StopDaemon(*daemon);
}

TEST_CASE("one daemon, several jobs: independent successes and an isolated failure",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);

  SECTION("jobA and jobB at once both succeed") {
    std::vector<Node> a = StartNodes(h, "jobA", 2, 2, DaemonFlags(port, "jobA"));
    std::vector<Node> b = StartNodes(h, "jobB", 2, 2, DaemonFlags(port, "jobB"));
    WaitAll(h, a, 0, 30);
    WaitAll(h, b, 0, 30);
    CheckAssignment(a, 2, "jobA");
    CheckAssignment(b, 2, "jobB");
    RequireNodesGone(h, a);
    RequireNodesGone(h, b);
  }

  SECTION("a failing job fails while another job on the same daemon succeeds") {
    // jobC's global rank 3 (node group rank 1, local rank 1) exits 7. jobD's
    // workers sleep a little, so both jobs are live on the daemon together.
    std::vector<Node> c = StartNodes(h, "jobC", 2, 2, DaemonFlags(port, "jobC"),
                                     {{"FIXTURE_FAIL_RANK", "3"}, {"FIXTURE_EXIT_CODE", "7"}});
    std::vector<Node> d =
        StartNodes(h, "jobD", 2, 2, DaemonFlags(port, "jobD"), {{"FIXTURE_SLEEP_MS", "500"}});
    WaitAll(h, c, 1, 30);
    WaitAll(h, d, 0, 30);
    // The failing worker wrote its record before exiting: it tells which node
    // ran global rank 3, and so which host the report must name.
    std::string failed_host;
    for (const Node& n : c)
      for (const Record& r : ReadRecords(n.out))
        if (r.Int("rank") == 3) failed_host = n.local_addr;
    REQUIRE_FALSE(failed_host.empty());
    for (const Node& n : c) {
      const std::string err = n.proc->Err();
      CHECK(err.find("worker rank 3 (local rank 1) on " + failed_host) != std::string::npos);
      INFO(n.proc->name << " stderr:\n" << err);
      CHECK(err.find("worker rank 3 (local rank 1)") != std::string::npos);
      CHECK(err.find("exit code 7") != std::string::npos);
      CHECK(err.find("job jobC failed") != std::string::npos);
    }
    CheckAssignment(d, 2, "jobD");
    RequireNodesGone(h, c);
    RequireNodesGone(h, d);
  }

  // The daemon survived all of that and still serves a new job.
  std::vector<Node> e = StartNodes(h, "jobE", 2, 1, DaemonFlags(port, "jobE"));
  WaitAll(h, e, 0, 30);
  CheckAssignment(e, 1, "jobE");
  RequireNodesGone(h, e);
  h.StopDaemon(*daemon);
}

TEST_CASE("embedded rendezvous: with no daemon at the endpoint, one agent hosts it",
          "[multiproc]") {
  Harness h;
  const int port = FreePort();
  std::vector<Node> nodes = StartNodes(h, "emb", 2, 2,
                                       {"--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                        "--rdzv_id=emb", "--rdzv_conf=join_timeout=20"});
  WaitAll(h, nodes, 0, 30);
  CheckAssignment(nodes, 2, "emb");
  std::size_t hosts = 0;
  for (const Node& n : nodes)
    if (n.proc->Err().find("hosting the rendezvous") != std::string::npos) ++hosts;
  CHECK(hosts == 1);
  RequireNodesGone(h, nodes);
}

TEST_CASE("static backend: node 0 hosts the store at master_addr:master_port", "[multiproc]") {
  Harness h;
  const int port = FreePort();
  std::vector<Node> nodes = StartNodes(
      h, "static", 2, 2,
      {"--rdzv_backend=static", "--master_addr=127.0.0.1", "--master_port=" + std::to_string(port),
       "--rdzv_id=static", "--rdzv_conf=timeout=20"},
      {}, {{"--node_rank=0"}, {"--node_rank=1"}});
  WaitAll(h, nodes, 0, 30);
  // With static, MASTER_ADDR:MASTER_PORT is the given master, not a local_addr.
  CheckAssignment(nodes, 2, "static", /*master_is_group0_addr=*/false);
  for (const Node& n : nodes) {
    for (const Record& r : ReadRecords(n.out)) {
      CHECK(r.Str("master_addr") == "127.0.0.1");
      CHECK(r.Int("master_port") == port);
    }
  }
  // node_rank becomes the group rank.
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (const Record& r : ReadRecords(nodes[i].out)) CHECK(r.Int("group_rank") == long(i));
  RequireNodesGone(h, nodes);
}
