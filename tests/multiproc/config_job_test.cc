// Jobs from a YAML file with real processes on loopback: two agents place
// themselves from --local_addr in nodes.hosts; a simulated Slurm allocation
// places them from SLURM_*; a count that disagrees fails fast; `ddprun
// status` lists two live jobs on one ddprund. Every wait is bounded and the
// Harness kills whatever is left.
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

std::string WriteFile(Harness& h, const std::string& name, const std::string& text,
                      mode_t mode = 0644) {
  const std::string path = h.dir() + "/" + name;
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

// A worker that records its environment, then runs the fixture worker.
std::string EnvWorker(Harness& h) {
  return WriteFile(
      h, "env_worker.sh",
      "#!/bin/sh\nenv > \"$FIXTURE_OUT_DIR/env.$RANK\"\nexec " + FixtureWorker() + "\n", 0755);
}

std::map<std::string, std::string> ReadEnv(const std::string& path) {
  std::map<std::string, std::string> env;
  for (const std::string& line : Lines(ReadFile(path))) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

struct Node {
  Proc* proc = nullptr;
  std::string out, pids, addr;
};

Node StartNode(Harness& h, const std::string& tag, const std::vector<std::string>& args,
               EnvList env = {}) {
  Node n;
  n.out = h.MakeDir(tag + "_out");
  n.pids = h.PidDir(tag + "_pids");
  env.push_back({"FIXTURE_OUT_DIR", n.out});
  env.push_back({"FIXTURE_PIDFILE_DIR", n.pids});
  n.proc = &h.StartDdprun(tag, args, env);
  return n;
}

// Every worker of `n` ran with group rank `group` of a 2x2 job.
void CheckNode(const Node& n, long group, const std::string& job_id) {
  const std::vector<Record> recs = ReadRecords(n.out);
  INFO(n.proc->name << " stderr:\n" << n.proc->Err());
  REQUIRE(recs.size() == 2);
  std::set<long> ranks;
  for (const Record& r : recs) {
    CHECK(r.Int("group_rank") == group);
    CHECK(r.Int("world_size") == 4);
    CHECK(r.Int("group_world_size") == 2);
    CHECK(r.Str("run_id") == job_id);
    CHECK(r.Str("master_addr") == "127.0.0.1");
    ranks.insert(r.Int("rank"));
  }
  CHECK(ranks == std::set<long>{group * 2, group * 2 + 1});
}

}  // namespace

TEST_CASE("config: a two-node job from one YAML file, node rank from the address", "[multiproc]") {
  Harness h;
  const int port = FreePort();
  const std::string worker = EnvWorker(h);
  const std::string yaml =
      WriteFile(h, "two_nodes.yaml",
                "job: {id: yaml-pair}\n"
                "rendezvous:\n"
                "  endpoint: first_node:" +
                    std::to_string(port) +
                    "\n"
                    "  join_timeout: 20\n"
                    "nodes:\n"
                    "  hosts:\n"
                    "    - 127.0.0.1 slots=2\n"
                    "    - 127.0.0.2 slots=2\n"
                    "command: " +
                    worker +
                    "\n"
                    "environment: {set: {FROM_FILE: yes-it-is}}\n"
                    "nccl: {socket_ifname: lo, debug: WARN, p2p_disable: true, NCCL_ALGO: Ring}\n");
  // Node 1 first: its rank comes from its address, not from the order of joining.
  Node n1 = StartNode(h, "node1", {"--config", yaml, "--local_addr=127.0.0.2"});
  SleepMs(200);
  Node n0 = StartNode(h, "node0", {"--config", yaml, "--local_addr=127.0.0.1"});
  for (Node* n : {&n0, &n1}) {
    const int rc = h.Wait(*n->proc, 40);
    INFO(n->proc->name << " stderr:\n" << n->proc->Err());
    CHECK(rc == 0);
  }
  CheckNode(n0, 0, "yaml-pair");
  CheckNode(n1, 1, "yaml-pair");
  // NCCL settings and environment values reached every worker.
  for (const Node* n : {&n0, &n1}) {
    for (const std::string& f : ListDir(n->out)) {
      if (f.rfind("env.", 0) != 0) continue;
      auto env = ReadEnv(n->out + "/" + f);
      INFO(n->out << "/" << f);
      CHECK(env["NCCL_SOCKET_IFNAME"] == "lo");
      CHECK(env["NCCL_DEBUG"] == "WARN");
      CHECK(env["NCCL_P2P_DISABLE"] == "1");
      CHECK(env["NCCL_ALGO"] == "Ring");
      CHECK(env["FROM_FILE"] == "yes-it-is");
    }
  }
  h.RequireAllGone(n0.pids, 2);
  h.RequireAllGone(n1.pids, 2);

  // --print-config starts nothing and shows the NCCL settings.
  Proc& pc = h.StartDdprun("print", {"--config", yaml, "--local_addr=127.0.0.2", "--print-config"});
  REQUIRE(h.Wait(pc, 10) == 0);
  const std::string text = pc.Out();
  INFO(text);
  CHECK(text.find("nccl.NCCL_SOCKET_IFNAME") != std::string::npos);
  CHECK(text.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK(text.find("nodes.hosts[1] 127.0.0.2") != std::string::npos);

  // A node whose address is not listed fails at once and names what it looked for.
  Proc& stray = h.StartDdprun("stray", {"--config", yaml, "--local_addr=127.0.0.9"});
  CHECK(h.Wait(stray, 10) == 2);
  CHECK(stray.Err().find("this node is not in the list (127.0.0.1, 127.0.0.2); looked for "
                         "--local_addr 127.0.0.9") != std::string::npos);
}

TEST_CASE("config: a simulated Slurm allocation places the nodes; a count mismatch fails fast",
          "[multiproc]") {
  Harness h;
  const int port = FreePort();
  const std::string yaml = WriteFile(h, "slurm.yaml",
                                     "job: {id: slurm-sim}\n"
                                     "scheduler: slurm\n"
                                     "nproc_per_node: 2\n"
                                     "rendezvous: {endpoint: first_node:" +
                                         std::to_string(port) +
                                         ", join_timeout: 20}\n"
                                         "command: " +
                                         FixtureWorker() + "\n");
  auto slurm = [](int nodeid, int nnodes) {
    return EnvList{{"SLURM_JOB_ID", "4242"},
                   {"SLURM_JOB_NODELIST", "127.0.0.[1-2]"},
                   {"SLURM_NNODES", std::to_string(nnodes)},
                   {"SLURM_NODEID", std::to_string(nodeid)},
                   {"SLURM_STEP_ID", "0"},
                   {"SLURM_STEP_NUM_TASKS", std::to_string(nnodes)}};
  };
  Node n1 = StartNode(h, "slurm1", {"--config", yaml, "--local_addr=127.0.0.2"}, slurm(1, 2));
  Node n0 = StartNode(h, "slurm0", {"--config", yaml, "--local_addr=127.0.0.1"}, slurm(0, 2));
  for (Node* n : {&n0, &n1}) {
    const int rc = h.Wait(*n->proc, 40);
    INFO(n->proc->name << " stderr:\n" << n->proc->Err());
    CHECK(rc == 0);
  }
  CheckNode(n0, 0, "slurm-sim");
  CheckNode(n1, 1, "slurm-sim");
  h.RequireAllGone(n0.pids, 2);
  h.RequireAllGone(n1.pids, 2);

  // The file wants 3 nodes, Slurm allocated 2: exit 2 within seconds, no waiting.
  const std::string three =
      WriteFile(h, "three.yaml", "nodes: {count: 3}\ncommand: " + FixtureWorker() + "\n");
  Proc& bad = h.StartDdprun("mismatch", {"--config", three}, slurm(0, 2));
  CHECK(h.Wait(bad, 10) == 2);
  CHECK(bad.Seconds() < 5);
  CHECK(bad.Err().find("nodes.count (--nnodes) asks for 3 nodes but slurm runs this job on 2 "
                       "(SLURM_NNODES=2)") != std::string::npos);
}

TEST_CASE("ddprun status lists two live jobs on one ddprund (text and JSON)", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string ep = "127.0.0.1:" + std::to_string(port);
  std::vector<Node> nodes;
  for (const std::string id : {"jobA", "jobB"}) {
    for (int i = 0; i < 2; ++i) {
      nodes.push_back(
          StartNode(h, id + std::to_string(i),
                    {"--nnodes=2", "--nproc_per_node=2",
                     "--local_addr=127.0.0." + std::to_string(i + 1), "--rdzv_endpoint=" + ep,
                     "--rdzv_id=" + id, "--rdzv_conf=join_timeout=20", FixtureWorker()},
                    {{"FIXTURE_SLEEP_MS", "4000"}}));
    }
  }
  // Poll until both jobs run (bounded).
  std::string json;
  const auto t0 = Clock::now();
  for (int attempt = 0; SecondsSince(t0) < 20; ++attempt) {
    Proc& s = h.StartDdprun("status_json" + std::to_string(attempt),
                            {"status", "--rdzv_endpoint", ep, "--json"});
    REQUIRE(h.Wait(s, 10) == 0);
    json = s.Out();
    std::size_t running = 0;
    for (std::size_t p = json.find("\"state\":\"running\""); p != std::string::npos;
         p = json.find("\"state\":\"running\"", p + 1))
      ++running;
    if (running == 2) break;
    SleepMs(100);
  }
  INFO(json);
  CHECK(json.find("{\"endpoint\":\"" + ep + "\",\"jobs\":[") == 0);
  for (const char* id : {"jobA", "jobB"}) {
    const std::size_t at = json.find(std::string("\"job_id\":\"") + id + "\"");
    REQUIRE(at != std::string::npos);
    const std::string job = json.substr(at, json.find("]}", at) - at);
    CHECK(job.find("\"state\":\"running\"") != std::string::npos);
    CHECK(job.find("\"world_size\":4") != std::string::npos);
    CHECK(job.find("\"restarts\":0") != std::string::npos);
    CHECK(job.find("\"ranks\":\"0-1\"") != std::string::npos);
    CHECK(job.find("\"ranks\":\"2-3\"") != std::string::npos);
    CHECK(job.find("\"host\":\"127.0.0.2\"") != std::string::npos);
  }
  Proc& text = h.StartDdprun("status_text", {"status", "--rdzv_endpoint=" + ep});
  REQUIRE(h.Wait(text, 10) == 0);
  const std::string table = text.Out();
  INFO(table);
  CHECK(table.rfind("JOB ", 0) == 0);
  CHECK(table.find("jobA") != std::string::npos);
  CHECK(table.find("jobB") != std::string::npos);
  CHECK(table.find("ranks 2-3") != std::string::npos);

  for (Node& n : nodes) {
    const int rc = h.Wait(*n.proc, 40);
    INFO(n.proc->name << " stderr:\n" << n.proc->Err());
    CHECK(rc == 0);
  }
  for (Node& n : nodes) h.RequireAllGone(n.pids, 2);
  h.StopDaemon(*daemon);

  // A daemon that is gone: exit 3 with one line, within the timeout.
  Proc& gone = h.StartDdprun("status_gone", {"status", "--rdzv_endpoint=" + ep, "--timeout=1"});
  CHECK(h.Wait(gone, 10) == 3);
  CHECK(gone.Err().find("cannot reach the rendezvous at " + ep) != std::string::npos);
  Proc& usage = h.StartDdprun("status_usage", {"status"}, {{"PET_RDZV_ENDPOINT", ""}});
  CHECK(h.Wait(usage, 10) == 2);
}
