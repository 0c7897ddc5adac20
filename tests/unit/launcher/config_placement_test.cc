// Placement and precedence: Slurm host lists, scheduler variables, matching
// this host against nodes.hosts, flag > env > file > default through the real
// command-line parser, the exported NCCL/environment variables and
// --print-config. The environment and the host's names are injected.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "ddprun/launcher/cli.h"
#include "ddprun/launcher/client/status_command.h"
#include "ddprun/launcher/job_config.h"
#include "ddprun/launcher/placement.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;
using agent::RendezvousMode;
using V = std::vector<std::string>;

TEST_CASE("Slurm host lists expand", "[unit]") {
  auto x = [](const std::string& s) {
    auto r = ExpandSlurmHostlist(s);
    INFO(s << ": " << r.status().message());
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(x("node1") == V{"node1"});
  CHECK(x("node[01-04,07]") == V{"node01", "node02", "node03", "node04", "node07"});
  CHECK(x("a[1-2]-ib,b3") == V{"a1-ib", "a2-ib", "b3"});
  CHECK(x("n[8-11]") == V{"n8", "n9", "n10", "n11"});
  CHECK(x("n[008-010]") == V{"n008", "n009", "n010"});
  CHECK(x("rack[1-2]-n[1-2]") == V{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(x("a,b[1,3],c") == V{"a", "b1", "b3", "c"});
  CHECK(x("10.0.0.[1-2]") == V{"10.0.0.1", "10.0.0.2"});
  for (const char* bad :
       {"n[1-2", "n1-2]", "n[2-1]", "n[a-b]", "n[]", "n[1-2-3]", "", ",", "n[0-9999999]"}) {
    INFO(bad);
    CHECK_FALSE(ExpandSlurmHostlist(bad).ok());
  }
  CHECK(std::string(ExpandSlurmHostlist("n[3-1]").status().message()) ==
        "ddprun: host list 'n[3-1]' has a reversed range '3-1'");
}

Env SlurmEnv(const std::string& nodelist, int nnodes, int nodeid) {
  return {{"SLURM_JOB_ID", "77"},
          {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_NNODES", std::to_string(nnodes)},
          {"SLURM_NODEID", std::to_string(nodeid)},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NUM_TASKS", std::to_string(nnodes)},
          {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)}};
}

TEST_CASE("Slurm and MPI detection", "[unit]") {
  auto s = DetectScheduler(SlurmEnv("gpu[1-3]", 3, 2), SchedulerMode::kAuto);
  REQUIRE(s.ok());
  REQUIRE(s->has_value());
  CHECK((*s)->name == "slurm");
  CHECK((*s)->node_rank == 2);
  CHECK((*s)->nnodes == 3);
  CHECK((*s)->hosts == V{"gpu1", "gpu2", "gpu3"});

  // The node list and the node count disagree.
  Env bad = SlurmEnv("gpu[1-3]", 3, 0);
  bad["SLURM_STEP_NUM_NODES"] = "4";
  auto e = DetectScheduler(bad, SchedulerMode::kAuto);
  REQUIRE_FALSE(e.ok());
  CHECK(std::string(e.status().message()) ==
        "ddprun: Slurm's counts disagree: SLURM_STEP_NUM_NODES=4 but SLURM_JOB_NODELIST lists 3 "
        "hosts; check the allocation (srun --nodes) or unset the stale variable");

  // srun with several tasks per node would start several ddprun per node.
  Env many = SlurmEnv("gpu[1-2]", 2, 0);
  many["SLURM_STEP_NUM_TASKS"] = "16";
  e = DetectScheduler(many, SchedulerMode::kAuto);
  REQUIRE_FALSE(e.ok());
  CHECK(std::string(e.status().message()).find("run one per node: srun --ntasks-per-node=1") !=
        std::string::npos);

  // scheduler: none ignores it; slurm outside Slurm is an error.
  s = DetectScheduler(SlurmEnv("gpu[1-3]", 3, 2), SchedulerMode::kNone);
  REQUIRE(s.ok());
  CHECK_FALSE(s->has_value());
  CHECK_FALSE(DetectScheduler({}, SchedulerMode::kSlurm).ok());

  // OpenMPI, one process per node.
  s = DetectScheduler({{"OMPI_COMM_WORLD_RANK", "1"},
                       {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}},
                      SchedulerMode::kAuto);
  REQUIRE(s.ok());
  REQUIRE(s->has_value());
  CHECK((*s)->name == "mpi");
  CHECK((*s)->node_rank == 1);
  CHECK((*s)->nnodes == 2);
  e = DetectScheduler({{"OMPI_COMM_WORLD_RANK", "1"},
                       {"OMPI_COMM_WORLD_SIZE", "8"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}},
                      SchedulerMode::kAuto);
  REQUIRE_FALSE(e.ok());
  CHECK(std::string(e.status().message()).find("--map-by ppr:1:node") != std::string::npos);
  s = DetectScheduler({{"PMIX_RANK", "3"}}, SchedulerMode::kAuto);
  REQUIRE(s.ok());
  CHECK((*s)->node_rank == 3);
  CHECK((*s)->nnodes == -1);
}

// A scratch directory with a job file; the worker command is /bin/true.
class Job {
 public:
  explicit Job(const std::string& yaml) {
    char tmpl[] = "/tmp/ddprun_placement_test_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = (dir_ / "job.yaml").string();
    std::ofstream(path_) << yaml;
  }
  ~Job() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  fs::path dir_;
  std::string path_;
};

absl::StatusOr<ParsedCommand> Parse(const Job& job, V flags, Env env = {},
                                    V names = {"vm", "10.1.0.5", "127.0.0.1"}) {
  V args{"ddprun", "--config", job.path()};
  args.insert(args.end(), flags.begin(), flags.end());
  env.emplace("PATH", "/usr/bin:/bin");
  HostFacts host;
  host.cpu_count = 8;
  host.names = [names] { return names; };
  return ParseCommandLine(args, env, host);
}

const char* kTwoNodes =
    "job: {id: pair}\n"
    "rendezvous: {endpoint: first_node:29555, join_timeout: 90}\n"
    "nodes:\n"
    "  hosts: [127.0.0.1 slots=2, 127.0.0.2 slots=2]\n"
    "command: [/bin/true, --x]\n"
    "restart: {max_restarts: 3}\n"
    "nccl: {socket_ifname: lo, debug: WARN, NCCL_ALGO: Ring}\n"
    "environment: {set: {FOO: bar}}\n";

TEST_CASE("placement: node rank from --local_addr in nodes.hosts, first_node endpoint", "[unit]") {
  Job job(kTwoNodes);
  auto p = Parse(job, {"--local_addr=127.0.0.2"});
  INFO(p.status().message());
  REQUIRE(p.ok());
  const agent::AgentOptions& o = p->options;
  CHECK(o.node_rank == 1);
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 2);
  CHECK(o.nproc_per_node == 2);
  CHECK(o.mode == RendezvousMode::kRemote);
  CHECK(o.rdzv_host == "127.0.0.1");
  CHECK(o.rdzv_port == 29555);
  CHECK(o.job_id == "pair");
  CHECK(o.policy.join_timeout_s == 90);
  CHECK(o.policy.max_restarts == 3);
  CHECK(o.local_addr == "127.0.0.2");
  CHECK(o.command == V{"/bin/true", "--x"});
  CHECK(o.extra_env == std::map<std::string, std::string>{{"NCCL_SOCKET_IFNAME", "lo"},
                                                          {"NCCL_DEBUG", "WARN"},
                                                          {"NCCL_ALGO", "Ring"},
                                                          {"FOO", "bar"}});
}

TEST_CASE("placement: node rank from the host's own names; local_addr becomes the entry",
          "[unit]") {
  Job job(
      "nodes: {hosts: [gpu1.cluster, gpu2.cluster]}\nrendezvous: {endpoint: first_node}\n"
      "command: /bin/true\n");
  auto p = Parse(job, {}, {}, {"gpu2", "10.0.0.2", "127.0.0.1"});
  INFO(p.status().message());
  REQUIRE(p.ok());
  CHECK(p->options.node_rank == 1);
  CHECK(p->options.local_addr == "gpu2.cluster");
  CHECK(p->options.rdzv_host == "gpu1.cluster");
  CHECK(p->options.rdzv_port == 29400);

  // A host that matches no entry says which names it looked for.
  auto none = Parse(job, {}, {}, {"cpu9", "10.9.9.9"});
  REQUIRE_FALSE(none.ok());
  CHECK(std::string(none.status().message()) ==
        "ddprun: " + job.path() +
            ":1:16: nodes.hosts: this node is not in the list (gpu1.cluster, gpu2.cluster); "
            "looked for this host's names and addresses (cpu9, 10.9.9.9); pass "
            "--local_addr=ADDR or --node_rank=N, or add this host to nodes.hosts");
  auto wrong_addr = Parse(job, {"--local_addr=10.0.0.3"});
  REQUIRE_FALSE(wrong_addr.ok());
  CHECK(std::string(wrong_addr.status().message()).find("looked for --local_addr 10.0.0.3") !=
        std::string::npos);
  // --node_rank needs no match.
  auto given = Parse(job, {"--node_rank=0"}, {}, {"cpu9"});
  REQUIRE(given.ok());
  CHECK(given->options.node_rank == 0);
}

TEST_CASE("placement: a spare beyond MAX requests no rank", "[unit]") {
  Job job(
      "nodes: {count: 2:3, hosts: [a, b, c, d]}\nrendezvous: {endpoint: d:29400}\n"
      "command: /bin/true\n");
  auto p = Parse(job, {"--local_addr=d"});
  INFO(p.status().message());
  REQUIRE(p.ok());
  CHECK(p->options.node_rank == -1);
  CHECK(p->options.min_nodes == 2);
  CHECK(p->options.max_nodes == 3);
}

TEST_CASE("precedence: flag > PET_* > file > default, for every kind of knob", "[unit]") {
  Job job(kTwoNodes);
  // File only.
  auto f = Parse(job, {"--local_addr=127.0.0.1"});
  REQUIRE(f.ok());
  CHECK(f->options.policy.max_restarts == 3);
  CHECK(f->options.policy.join_timeout_s == 90);
  CHECK(f->options.grace_period_s == 30);  // default
  // Env over file.
  auto e = Parse(job, {"--local_addr=127.0.0.1"},
                 {{"PET_MAX_RESTARTS", "5"}, {"PET_RDZV_CONF", "join_timeout=7"}});
  REQUIRE(e.ok());
  CHECK(e->options.policy.max_restarts == 5);
  CHECK(e->options.policy.join_timeout_s == 7);
  // Flag over env over file.
  auto fl = Parse(job, {"--local_addr=127.0.0.1", "--max_restarts=1", "--rdzv_conf=token=t"},
                  {{"PET_MAX_RESTARTS", "5"}});
  REQUIRE(fl.ok());
  CHECK(fl->options.policy.max_restarts == 1);
  CHECK(fl->options.policy.join_timeout_s == 90);  // --rdzv_conf overrides only the keys it names
  CHECK(fl->options.join_token == "t");
  // Endpoint and node count: flags win over the file and first_node.
  auto ep = Parse(job, {"--local_addr=127.0.0.1", "--rdzv_endpoint=10.0.0.9:1234"});
  REQUIRE(ep.ok());
  CHECK(ep->options.rdzv_host == "10.0.0.9");
  CHECK(ep->options.rdzv_port == 1234);
  // The worker command on the command line replaces the file's.
  auto cmd = Parse(job, {"--local_addr=127.0.0.1", "/bin/echo", "hi"});
  REQUIRE(cmd.ok());
  CHECK(cmd->options.command == V{"/bin/echo", "hi"});
  // NCCL: the node's own variable wins over the file.
  auto nccl = Parse(job, {"--local_addr=127.0.0.1"}, {{"NCCL_DEBUG", "INFO"}});
  REQUIRE(nccl.ok());
  CHECK(nccl->options.extra_env.count("NCCL_DEBUG") == 0);
  CHECK(nccl->options.extra_env.at("NCCL_SOCKET_IFNAME") == "lo");
  // TORCH_ELASTIC_SHUTDOWN_TIMEOUT is an env source for grace_period: over the file.
  Job grace("restart: {grace_period: 3}\ncommand: /bin/true\n");
  auto g = Parse(grace, {}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}});
  REQUIRE(g.ok());
  CHECK(g->options.grace_period_s == 9);
  auto g2 = Parse(grace, {});
  REQUIRE(g2.ok());
  CHECK(g2->options.grace_period_s == 3);
  // Booleans: the file turns no_python on; PET_NO_PYTHON=0 turns it off again.
  Job np("no_python: true\ncommand: true\n");
  auto n1 = Parse(np, {});
  REQUIRE(n1.ok());
  CHECK(n1->options.command == V{"true"});
  // A bad value in the file is named with its position and flag.
  Job gpu("nproc_per_node: gpu\ncommand: /bin/true\n");
  auto bad = Parse(gpu, {});
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find(gpu.path() + ":1:17: nproc_per_node") !=
        std::string::npos);
}

TEST_CASE("placement: simulated Slurm gives node rank, count and the rendezvous host", "[unit]") {
  Job job("job: {id: s}\nnproc_per_node: 2\ncommand: /bin/true\n");
  auto p = Parse(job, {}, SlurmEnv("node[01-04]", 4, 2));
  INFO(p.status().message());
  REQUIRE(p.ok());
  CHECK(p->options.node_rank == 2);
  CHECK(p->options.min_nodes == 4);
  CHECK(p->options.max_nodes == 4);
  CHECK(p->options.mode == RendezvousMode::kRemote);
  CHECK(p->options.rdzv_host == "node01");
  CHECK(p->options.rdzv_port == 29400);
  // Flags still win.
  auto f = Parse(job, {"--node_rank=0", "--rdzv_endpoint=ctl:1"}, SlurmEnv("node[01-04]", 4, 2));
  REQUIRE(f.ok());
  CHECK(f->options.node_rank == 0);
  CHECK(f->options.rdzv_host == "ctl");

  // The file's count disagrees with the allocation: a clear error, no hang.
  Job three("nodes: {count: 3}\ncommand: /bin/true\n");
  auto e = Parse(three, {}, SlurmEnv("node[01-04]", 4, 2));
  REQUIRE_FALSE(e.ok());
  CHECK(std::string(e.status().message()) ==
        "ddprun: " + three.path() +
            ":1:16: nodes.count (--nnodes) asks for 3 nodes but slurm runs this job on 4 "
            "(SLURM_STEP_NUM_NODES=4); make them agree: allocate 3 nodes, or change the count (--scheduler=none "
            "ignores slurm)");
  // An elastic range that includes the allocation is fine.
  Job range("nodes: {count: 2:4}\ncommand: /bin/true\n");
  CHECK(Parse(range, {}, SlurmEnv("node[01-04]", 4, 2)).ok());
  // --nnodes on the command line is checked too.
  auto flag = Parse(job, {"--nnodes=2"}, SlurmEnv("node[01-04]", 4, 2));
  REQUIRE_FALSE(flag.ok());
  CHECK(std::string(flag.status().message()).find("--nnodes asks for 2 nodes but slurm") !=
        std::string::npos);
}

TEST_CASE("--print-config shows every value with its origin and starts nothing", "[unit]") {
  Job job(kTwoNodes);
  auto p = Parse(job, {"--local_addr=127.0.0.2", "--print-config", "--max_restarts=2"},
                 {{"PET_ROLE", "trainer"}, {"NCCL_IB_DISABLE", "1"}});
  INFO(p.status().message());
  REQUIRE(p.ok());
  CHECK(p->action == Action::kPrintConfig);
  const std::string& t = p->text;
  INFO(t);
  auto has = [&](const std::string& key, const std::string& value, const std::string& from) {
    for (const std::string& line : std::vector<std::string>(absl::StrSplit(t, '\n'))) {
      if (line.rfind(key + " ", 0) == 0 && line.find("= " + value) != std::string::npos &&
          line.find("# " + from) != std::string::npos)
        return true;
    }
    return false;
  };
  CHECK(has("restart.max_restarts", "2", "flag --max_restarts"));
  CHECK(has("role", "trainer", "env PET_ROLE"));
  CHECK(has("rendezvous.join_timeout", "90",
            "file " + job.path() + ":2:56: rendezvous.join_timeout"));
  CHECK(has("restart.grace_period", "30", "default"));
  CHECK(has("--node_rank", "1", "host " + job.path() + ":4:30: nodes.hosts[1] 127.0.0.2"));
  CHECK(has("rendezvous.endpoint", "127.0.0.1:29555", "file "));
  CHECK(has("nccl.NCCL_SOCKET_IFNAME", "lo", "file " + job.path() + ":7:23: nccl.socket_ifname"));
  CHECK(has("nccl.NCCL_ALGO", "Ring", "file"));
  CHECK(has("nccl.NCCL_IB_DISABLE", "1", "env NCCL_IB_DISABLE"));
  CHECK(has("environment.FOO", "bar", "file"));
  CHECK(has("command", "/bin/true --x", "file"));
}

TEST_CASE("ddprun status renders jobs as a table and as JSON", "[unit]") {
  rendezvous::JobStatus a;
  a.job_id = "jobA";
  a.round = 2;
  a.state = "running";
  a.restart_count = 1;
  a.world_size = 4;
  a.nodes = {{0, "127.0.0.1", 100, 2, 0}, {1, "127.0.0.2", 101, 2, 2}};
  rendezvous::JobStatus b;
  b.job_id = "job\"B";
  b.state = "gathering";
  b.waiting = 1;
  b.nodes = {{-1, "h", 7, 1, -1}};
  const std::string text = FormatStatusText({a, b});
  CHECK(text.find("jobA") != std::string::npos);
  CHECK(text.find("ranks 2-3") != std::string::npos);
  CHECK(FormatStatusText({}) == "no jobs\n");
  const std::string json = FormatStatusJson("h:1", {a, b});
  CHECK(json ==
        "{\"endpoint\":\"h:1\",\"jobs\":[{\"job_id\":\"jobA\",\"round\":2,\"state\":\"running\","
        "\"world_size\":4,\"restarts\":1,\"waiting\":0,\"quarantined\":[],"
        "\"nodes\":[{\"group_rank\":0,\"host\":"
        "\"127.0.0.1\",\"pid\":100,\"nproc\":2,\"base_rank\":0,\"ranks\":\"0-1\"},{\"group_rank\":"
        "1,\"host\":\"127.0.0.2\",\"pid\":101,\"nproc\":2,\"base_rank\":2,\"ranks\":\"2-3\"}],"
        "\"min_nodes\":0,\"max_nodes\":0,\"join_deadline_in_s\":0.0},"
        "{\"job_id\":\"job\\\"B\",\"round\":0,\"state\":\"gathering\",\"world_size\":0,"
        "\"restarts\":0,\"waiting\":1,\"quarantined\":[],"
        "\"nodes\":[{\"group_rank\":-1,\"host\":\"h\",\"pid\":7,"
        "\"nproc\":1,\"base_rank\":-1,\"ranks\":\"-\"}],"
        "\"min_nodes\":0,\"max_nodes\":0,\"join_deadline_in_s\":0.0}]}\n");
}

}  // namespace
}  // namespace ddprun::launcher
