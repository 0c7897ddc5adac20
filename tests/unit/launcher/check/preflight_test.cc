// `ddprun check`: every check passes on good facts and fails (or warns) with
// its fix when its condition is broken on purpose; the workers' exchange over
// an in-process store with a fake machine per node (skewed clocks, a port
// that does not answer, a node that never comes). No sockets, no processes.
#include "ddprun/launcher/check/preflight.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/launcher/check/preflight_exchange.h"
#include "ddprun/launcher/check/preflight_probe.h"
#include "ddprun/rendezvous/common/exit_codes.h"
#include "ddprun/rendezvous/store/store.h"

namespace ddprun::launcher::preflight {
namespace {

NodeFacts GoodNode(int rank) {
  NodeFacts f;
  f.reported = true;
  f.group_rank = rank;
  f.host = "10.0.0." + std::to_string(rank + 1);
  f.hostname = "node" + std::to_string(rank);
  f.interfaces = {
      {"lo", true, true}, {"eth0", true, true}, {"ib0", true, true}, {"docker0", false, false}};
  f.gpu_count = 0;
  f.gpu_source = "none";
  f.cpu_count = 16;
  f.shm_total = f.shm_free = 8 * 1024 * kMiB;
  f.nofile_soft = 65536;
  f.memlock_soft = -1;
  f.ddprun_version = "ddprun 0.1.0";
  f.script_path = "train.py";
  f.script_sha256 = "aaaaaaaaaaaaaaaaaaaa";
  f.python_command = true;
  f.python_version = "3.11.2";
  f.torch_version = "1.13.0";
  f.resolved = {{"node0", true, ""}, {"node1", true, ""}};
  f.reach = {{"rendezvous", "10.0.0.1:29400", true, "", 0.2},
             {"store", "10.0.0.1:29500", true, "", 0.2}};
  if (rank > 0) {
    f.clock_measured = true;
    f.clock_offset_ms = 0.3;
    f.clock_uncertainty_ms = 0.1;
  }
  return f;
}

JobFacts Job(int nproc = 4, int nnodes = 2) { return {"j", nproc, nnodes}; }

// The result of one check for node `rank` after changing that node's facts.
CheckResult Judge(const std::string& check, std::vector<NodeFacts> nodes, const JobFacts& job,
                  int rank) {
  const Report r = RunChecks(nodes, job, DefaultChecks());
  for (const CheckResult& x : r.results) {
    if (x.check == check && x.node == rank) return x;
  }
  FAIL("no check " << check);
  return {};
}

CheckResult JudgeNode1(const std::string& check, const NodeFacts& node1, JobFacts job = Job()) {
  return Judge(check, {GoodNode(0), node1}, job, 1);
}

void ExpectFix(const CheckResult& r, Verdict v, const std::string& detail, const std::string& fix) {
  INFO(r.check << ": " << VerdictName(r.verdict) << " " << r.detail << " / fix: " << r.fix);
  CHECK(r.verdict == v);
  CHECK(r.detail.find(detail) != std::string::npos);
  CHECK(r.fix.find(fix) != std::string::npos);
}

TEST_CASE("check: good facts on two nodes pass, exit 0, one line per node and check", "[unit]") {
  const Report r = RunChecks({GoodNode(0), GoodNode(1)}, Job(), DefaultChecks());
  REQUIRE(r.results.size() == 2 * DefaultChecks().size());
  for (const CheckResult& x : r.results) {
    INFO(x.check << " node " << x.node << ": " << x.detail);
    CHECK((x.verdict == Verdict::kPass || x.verdict == Verdict::kNotApplicable));
    CHECK(x.fix.empty());
  }
  CHECK(ExitCode(r) == kExitSuccess);
  const std::string text = FormatText(r);
  CHECK(text.find("summary: 2 nodes:") != std::string::npos);
  CHECK(text.find("fix:") == std::string::npos);
  CHECK(text.find("offset to node 0 +0.3 ms") != std::string::npos);
  CHECK(FormatJson(r).find("\"exit_code\": 0") != std::string::npos);
}

TEST_CASE("check: NCCL_SOCKET_IFNAME as NCCL reads it", "[unit]") {
  CHECK(NcclListSelects("eth", "eth0"));
  CHECK_FALSE(NcclListSelects("=eth", "eth0"));
  CHECK(NcclListSelects("=eth0", "eth0"));
  CHECK(NcclListSelects("ib,eth", "eth1"));
  CHECK_FALSE(NcclListSelects("^lo,docker", "lo"));
  CHECK(NcclListSelects("^lo,docker", "eth0"));
  CHECK_FALSE(NcclListSelects("^=eth0", "eth0"));
  CHECK(NcclListSelects("^=eth0", "eth01"));
  CHECK(NcclListSelects("mlx5_0:1,mlx5_1:1", "mlx5_1"));

  NodeFacts n = GoodNode(1);
  n.env["NCCL_SOCKET_IFNAME"] = "nonexistent0";
  ExpectFix(JudgeNode1("nccl_socket_ifname", n), Verdict::kFail, "selects no interface",
            "set NCCL_SOCKET_IFNAME to interfaces of this node (lo,eth0,ib0)");
  n.env["NCCL_SOCKET_IFNAME"] = "^lo,eth,ib";  // excludes every interface that is up
  CHECK(JudgeNode1("nccl_socket_ifname", n).verdict == Verdict::kFail);
  n.env["NCCL_SOCKET_IFNAME"] = "=eth";  // exact: no interface is called "eth"
  CHECK(JudgeNode1("nccl_socket_ifname", n).verdict == Verdict::kFail);
  n.env["NCCL_SOCKET_IFNAME"] = "docker";  // exists, but down
  CHECK(JudgeNode1("nccl_socket_ifname", n).verdict == Verdict::kFail);
  n.env["NCCL_SOCKET_IFNAME"] = "eth,enp";  // 'enp' matches nothing: a typo?
  ExpectFix(JudgeNode1("nccl_socket_ifname", n), Verdict::kWarn, "'enp' matches no interface",
            "NCCL_SOCKET_IFNAME");
  n.env["NCCL_SOCKET_IFNAME"] = "^lo,docker";
  const CheckResult ok = JudgeNode1("nccl_socket_ifname", n);
  CHECK(ok.verdict == Verdict::kPass);
  CHECK(ok.detail.find("-> eth0,ib0") != std::string::npos);
}

TEST_CASE("check: GLOO_SOCKET_IFNAME names exact interfaces that are up", "[unit]") {
  NodeFacts n = GoodNode(1);
  n.env["GLOO_SOCKET_IFNAME"] = "eth0";
  CHECK(JudgeNode1("gloo_socket_ifname", n).verdict == Verdict::kPass);
  n.env["GLOO_SOCKET_IFNAME"] = "eth";  // Gloo does not match prefixes
  ExpectFix(JudgeNode1("gloo_socket_ifname", n), Verdict::kFail, "'eth' does not exist",
            "exact interface names of this node (lo,eth0,ib0)");
  n.env["GLOO_SOCKET_IFNAME"] = "eth0,docker0";
  ExpectFix(JudgeNode1("gloo_socket_ifname", n), Verdict::kFail, "'docker0' is down",
            "GLOO_SOCKET_IFNAME");
}

TEST_CASE("check: NCCL_IB_HCA names devices that exist; none is a warning", "[unit]") {
  NodeFacts n = GoodNode(1);
  CHECK(JudgeNode1("nccl_ib_hca", n).verdict == Verdict::kNotApplicable);
  n.env["NCCL_IB_HCA"] = "mlx5_0";
  ExpectFix(JudgeNode1("nccl_ib_hca", n), Verdict::kWarn, "no InfiniBand device",
            "unset NCCL_IB_HCA");
  n.ib_devices = std::vector<std::string>{"mlx5_0", "mlx5_1"};
  n.env["NCCL_IB_HCA"] = "mlx4";
  ExpectFix(JudgeNode1("nccl_ib_hca", n), Verdict::kFail, "selects none of mlx5_0,mlx5_1",
            "devices of this node (mlx5_0,mlx5_1)");
  n.env["NCCL_IB_HCA"] = "=mlx5_1:1";
  CHECK(JudgeNode1("nccl_ib_hca", n).verdict == Verdict::kPass);
}

TEST_CASE("check: workers per node fit the visible GPUs", "[unit]") {
  std::string bad;
  CHECK(VisibleGpus("0,1", 8, &bad) == 2);
  CHECK(bad.empty());
  CHECK(VisibleGpus("0,9,1", 8, &bad) == 1);  // CUDA stops at the first invalid entry
  CHECK(bad == "9");
  bad.clear();
  CHECK(VisibleGpus("", 8, &bad) == 0);
  CHECK(VisibleGpus("-1", 8, &bad) == 0);
  CHECK(bad.empty());
  CHECK(VisibleGpus("GPU-abc,MIG-def", 8, &bad) == 2);

  NodeFacts n = GoodNode(1);
  const CheckResult cpu = JudgeNode1("gpus", n);
  CHECK(cpu.verdict == Verdict::kPass);
  CHECK(cpu.detail.find("no GPU: 4 CPU workers") != std::string::npos);
  ExpectFix(JudgeNode1("gpus", n, Job(32)), Verdict::kWarn, "oversubscribed",
            "--nproc_per_node=16");

  n.gpu_count = 4;
  n.gpu_source = "nvml";
  CHECK(JudgeNode1("gpus", n, Job(4)).verdict == Verdict::kPass);
  ExpectFix(JudgeNode1("gpus", n, Job(8)), Verdict::kFail, "8 workers per node but 4 GPUs",
            "--nproc_per_node=4");
  n.env["CUDA_VISIBLE_DEVICES"] = "0,1";
  ExpectFix(JudgeNode1("gpus", n, Job(4)), Verdict::kFail, "CUDA_VISIBLE_DEVICES=0,1 shows 2",
            "list more GPUs in CUDA_VISIBLE_DEVICES");
  n.env["CUDA_VISIBLE_DEVICES"] = "0,7";
  ExpectFix(JudgeNode1("gpus", n, Job(1)), Verdict::kWarn, "CUDA stops at '7'", "GPUs 0-3");
}

TEST_CASE("check: /dev/shm for the SDK's segments and DataLoader workers", "[unit]") {
  NodeFacts n = GoodNode(1);
  n.shm_total = n.shm_free = 64 * kMiB;  // Docker's default
  ExpectFix(JudgeNode1("dev_shm", n), Verdict::kWarn, "64 MiB free of 64 MiB",
            "--shm-size=2.0 GiB");
  n.shm_free = 8 * kMiB;  // 4 workers need 10 MiB
  ExpectFix(JudgeNode1("dev_shm", n), Verdict::kFail, "4 workers need 10 MiB", "/dev/shm");
  n.shm_total = n.shm_free = -1;
  ExpectFix(JudgeNode1("dev_shm", n), Verdict::kFail, "/dev/shm is missing", "/dev/shm");
}

TEST_CASE("check: ulimit -n fits the store's connections, ulimit -l when IB is used", "[unit]") {
  // 2 nodes x 64 workers: node 0's store takes 2 connections per worker.
  NodeFacts zero = GoodNode(0);
  zero.nofile_soft = 256;
  const CheckResult r = Judge("ulimit_nofile", {zero, GoodNode(1)}, Job(64, 2), 0);
  ExpectFix(r, Verdict::kFail, "the store of 128 workers needs 320",
            "raise the open-file limit to at least 4096");
  NodeFacts n = GoodNode(1);
  n.nofile_soft = 1024;
  ExpectFix(JudgeNode1("ulimit_nofile", n), Verdict::kWarn, "ulimit -n 1024", "ulimit -n");

  n = GoodNode(1);
  n.memlock_soft = 64 * 1024;
  CHECK(JudgeNode1("ulimit_memlock", n).verdict == Verdict::kNotApplicable);  // no IB
  n.ib_devices = std::vector<std::string>{"mlx5_0"};
  ExpectFix(JudgeNode1("ulimit_memlock", n), Verdict::kWarn, "ulimit -l 64 KiB",
            "ulimit -l unlimited");
  n.env["NCCL_IB_DISABLE"] = "1";
  CHECK(JudgeNode1("ulimit_memlock", n).verdict == Verdict::kNotApplicable);
  n.env.clear();
  n.memlock_soft = -1;
  CHECK(JudgeNode1("ulimit_memlock", n).verdict == Verdict::kPass);
}

TEST_CASE("check: names resolve and ports answer", "[unit]") {
  NodeFacts n = GoodNode(1);
  n.resolved.push_back({"node7", false, "Name or service not known"});
  ExpectFix(JudgeNode1("resolve", n), Verdict::kFail, "'node7' does not resolve",
            "add node7 to DNS or /etc/hosts");
  n = GoodNode(1);
  n.reach.push_back({"node 0", "10.0.0.1:41234", false, "connect timed out", 0});
  ExpectFix(JudgeNode1("reach", n), Verdict::kFail,
            "cannot connect to node 0 10.0.0.1:41234: connect timed out", "open these TCP ports");
}

TEST_CASE("check: every node runs the same ddprun, script, Python and torch", "[unit]") {
  NodeFacts n = GoodNode(1);
  n.ddprun_version = "ddprun 0.0.9";
  ExpectFix(JudgeNode1("ddprun_version", n), Verdict::kFail,
            "ddprun 0.0.9, but node 0 (10.0.0.1) runs ddprun 0.1.0",
            "install the same ddprun on every node");
  n = GoodNode(1);
  n.script_sha256 = "bbbbbbbbbbbbbbbbbbbb";
  ExpectFix(JudgeNode1("script", n), Verdict::kFail, "differs from node 0", "copy node 0");
  n.script_error = "no such file";
  ExpectFix(JudgeNode1("script", n), Verdict::kFail, "train.py: no such file", "copy the script");
  n = GoodNode(1);
  n.torch_version = "";
  ExpectFix(JudgeNode1("torch", n), Verdict::kFail,
            "no torch, but node 0 (10.0.0.1) has torch 1.13.0",
            "install the same PyTorch on every node");
  n.torch_version = "2.1.0";
  CHECK(JudgeNode1("torch", n).verdict == Verdict::kFail);
  NodeFacts zero = GoodNode(0);  // no torch anywhere: n/a
  zero.torch_version = "";
  n.torch_version = "";
  CHECK(Judge("torch", {zero, n}, Job(), 1).verdict == Verdict::kNotApplicable);
  // A script that imports torch needs it, even where no node has it.
  n.script_imports_torch = true;
  n.python_exec = "python3";
  ExpectFix(Judge("torch", {zero, n}, Job(), 1), Verdict::kFail,
            "train.py imports torch, but python3 cannot import it", "PYTHON_EXEC=/usr/bin/python3");
  n = GoodNode(1);
  n.python_version = "3.9.2";
  ExpectFix(JudgeNode1("python", n), Verdict::kFail, "Python 3.9.2, but node 0",
            "install the same Python on every node (3.11.2)");
  n.python_error = "cannot run python3: No such file or directory";
  ExpectFix(JudgeNode1("python", n), Verdict::kFail, "cannot run python3", "PYTHON_EXEC");
  CHECK(JudgeNode1("torch", n).verdict == Verdict::kNotApplicable);
  n = GoodNode(1);
  n.python_command = false;
  CHECK(JudgeNode1("python", n).verdict == Verdict::kNotApplicable);
  CHECK(JudgeNode1("torch", n).verdict == Verdict::kNotApplicable);
}

TEST_CASE("check: clock skew against node 0, beyond the measurement's uncertainty", "[unit]") {
  NodeFacts n = GoodNode(1);
  n.clock_offset_ms = -2500;
  n.clock_uncertainty_ms = 1;
  ExpectFix(JudgeNode1("clock", n), Verdict::kFail, "offset to node 0 -2500.0 ms", "NTP");
  n.clock_offset_ms = 300;
  CHECK(JudgeNode1("clock", n).verdict == Verdict::kWarn);
  n.clock_uncertainty_ms = 250;  // 300 +/- 250 ms: not provably skewed beyond 100 ms
  CHECK(JudgeNode1("clock", n).verdict == Verdict::kPass);
}

TEST_CASE("check: a node that sent nothing fails, exit codes and the table", "[unit]") {
  NodeFacts gone;
  gone.group_rank = 1;
  gone.host = "10.0.0.2";
  gone.error = "did not arrive within 30 s";
  const Report r = RunChecks({GoodNode(0), gone}, Job(), DefaultChecks());
  CHECK(ExitCode(r) == kExitCheckFailed);
  const std::string text = FormatText(r);
  CHECK(text.find("reported           fail   sent no results: did not arrive within 30 s") !=
        std::string::npos);
  CHECK(text.find("fix: see that node's stderr") != std::string::npos);

  NodeFacts warn = GoodNode(1);
  warn.nofile_soft = 1024;
  CHECK(ExitCode(RunChecks({GoodNode(0), warn}, Job(), DefaultChecks())) == kExitCheckWarnings);
}

TEST_CASE("check: the facts survive the store's JSON", "[unit]") {
  NodeFacts f = GoodNode(1);
  f.env["NCCL_SOCKET_IFNAME"] = "eth0";
  f.ib_devices = std::vector<std::string>{"mlx5_0"};
  absl::StatusOr<NodeFacts> back = FactsFromJson(FactsToJson(f));
  REQUIRE(back.ok());
  CHECK(FactsToJson(*back) == FactsToJson(f));
  CHECK_FALSE(FactsFromJson("{\"reported\":true}").ok());
  CHECK_FALSE(FactsFromJson("not json").ok());
}

TEST_CASE("check: the file that would run, as BuildWorkerCommand builds the command", "[unit]") {
  const agent::Env env{{"PATH", "/nonexistent:/bin"}};
  CommandFile f = FileOfCommand({"python3", "-u", "train.py", "--lr", "1"}, env);
  CHECK(f.path == "train.py");
  CHECK(f.python == "python3");
  f = FileOfCommand({"/usr/bin/python3.11", "-u", "-m", "pkg.train"}, env);
  CHECK(f.path.empty());  // a module: no file to checksum
  CHECK(f.python == "/usr/bin/python3.11");
  f = FileOfCommand({"./worker", "--size", "4"}, env);
  CHECK(f.path == "./worker");
  CHECK(f.python.empty());
  f = FileOfCommand({"true"}, env);  // found on PATH, as the agent's exec would
  CHECK(f.path == "/bin/true");
}

// ---------------------------------------------------------------------------
// The exchange, with one fake machine per node and threads as nodes.

class FakeListener final : public Listener {
 public:
  explicit FakeListener(int port) : port_(port) {}
  int Port() const override { return port_; }

 private:
  int port_;
};

class FakeProbe final : public SystemProbe {
 public:
  FakeProbe(int rank, std::int64_t skew_us, std::set<int> dead_ports)
      : rank_(rank), skew_us_(skew_us), dead_ports_(std::move(dead_ports)) {}
  std::vector<Interface> Interfaces() override { return {{"lo", true, true}}; }
  std::optional<std::vector<std::string>> InfinibandDevices() override { return std::nullopt; }
  GpuCount Gpus() override { return {0, "none"}; }
  int Cpus() override { return 8; }
  ShmSpace Shm() override { return {4096 * kMiB, 4096 * kMiB}; }
  Limits ResourceLimits() override { return {65536, -1}; }
  std::string Hostname() override { return "h" + std::to_string(rank_); }
  std::string DdprunVersion() override { return "ddprun test"; }
  absl::Status Resolve(const std::string&) override { return absl::OkStatus(); }
  absl::Status Connect(const std::string&, int port, Millis) override {
    if (dead_ports_.count(port)) return absl::DeadlineExceededError("connect timed out");
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Listener>> Listen() override {
    return std::unique_ptr<Listener>(std::make_unique<FakeListener>(40000 + rank_));
  }
  absl::StatusOr<std::string> FileSha256(const std::string&) override { return "ff"; }
  PythonVersions Python(const std::string&, Millis) override { return {"3.11.2", "", ""}; }
  std::int64_t WallMicros() override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
               .count() +
           skew_us_;
  }

 private:
  int rank_;
  std::int64_t skew_us_;
  std::set<int> dead_ports_;
};

ExchangeInput Input(int rank, int world) {
  ExchangeInput in;
  in.group_rank = rank;
  in.group_world_size = world;
  in.host = "127.0.0." + std::to_string(rank + 1);
  in.targets = {{"rendezvous", "127.0.0.1", 29400}, {"store", "127.0.0.1", 29500}};
  in.job = {"j", 2, world};
  in.timeout = std::chrono::milliseconds(2000);
  in.connect_timeout = std::chrono::milliseconds(500);
  return in;
}

TEST_CASE("check exchange: skewed clocks are measured, a dead peer port fails reach", "[unit]") {
  rendezvous::InMemoryStore store;
  constexpr int kWorld = 3;
  // Node 2 runs 3 s ahead; node 1 cannot connect to node 2's listener.
  const std::vector<std::int64_t> skew{0, 0, 3'000'000};
  std::vector<absl::StatusOr<ExchangeOutcome>> outcomes(kWorld, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      FakeProbe probe(r, skew[r], r == 1 ? std::set<int>{40002} : std::set<int>{});
      auto collect = [&] {
        return CollectLocalFacts(probe, {"python3", "-u", "train.py"}, {}, Millis(100));
      };
      outcomes[r] = RunExchange(store, probe, collect, Input(r, kWorld));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    INFO("node " << r << ": " << outcomes[r].status());
    REQUIRE(outcomes[r].ok());
    CHECK(outcomes[r]->exit_code == kExitCheckFailed);
  }
  const std::string& table = outcomes[0]->text;
  INFO(table);
  CHECK(table.find("cannot connect to node 2 127.0.0.3:40002: connect timed out") !=
        std::string::npos);
  CHECK(table.find("fail   offset to node 0 +3000") != std::string::npos);  // node 2
  CHECK(table.find("pass   offset to node 0 ") != std::string::npos);       // node 1
  CHECK(table.find("rendezvous 127.0.0.1:29400, store 127.0.0.1:29500, node 1 127.0.0.2:40001") !=
        std::string::npos);
  CHECK(outcomes[1]->text.find("node 0 prints the table") != std::string::npos);
  CHECK(outcomes[1]->json.find("\"report_on_node\": 0") != std::string::npos);
  CHECK(outcomes[0]->json.find("\"check\": \"clock\"") != std::string::npos);
}

TEST_CASE("check exchange: a node that never comes is reported, within the timeout", "[unit]") {
  rendezvous::InMemoryStore store;
  FakeProbe probe(0, 0, {});
  ExchangeInput in = Input(0, 2);
  in.timeout = std::chrono::milliseconds(200);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ExchangeOutcome> out = RunExchange(
      store, probe, [&] { return CollectLocalFacts(probe, {"/bin/true"}, {}, Millis(100)); }, in);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  REQUIRE(out.ok());
  CHECK(out->exit_code == kExitCheckFailed);
  CHECK(out->text.find("sent no results: did not arrive within 0.2 s") != std::string::npos);
}

}  // namespace
}  // namespace ddprun::launcher::preflight
