// ddprun's command line: every flag in both spellings, PET_* precedence,
// nproc/nnodes forms, mode selection, worker command construction and the
// one-line messages of bad input. The environment and host facts are
// injected; scripts are real files in a temporary directory.
#include "ddprun/launcher/cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "ddprun/launcher/completion.h"

namespace ddprun::launcher {
namespace {

namespace fs = std::filesystem;
using agent::RendezvousMode;

// A temporary directory holding a Python script, an executable, a
// non-executable non-.py file, and a bin/ directory used as PATH.
class Scratch {
 public:
  Scratch() {
    char tmpl[] = "/tmp/ddprun_cli_test_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    Write("train.py", "print('hi')\n", 0644);
    Write("run.sh", "#!/bin/sh\necho hi\n", 0755);
    Write("data.txt", "not a program\n", 0644);
    Write("exec.py", "#!/usr/bin/env python3\n", 0755);
    fs::create_directories(dir_ / "bin");
    Write("bin/mytool", "#!/bin/sh\n", 0755);
    Write("bin/python3", "#!/bin/sh\n", 0755);
    Write("bin/notexec", "#!/bin/sh\n", 0644);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string BinDir() const { return Path("bin"); }

 private:
  void Write(const std::string& name, const std::string& text, mode_t mode) {
    std::ofstream(dir_ / name) << text;
    ::chmod((dir_ / name).c_str(), mode);
  }
  fs::path dir_;
};

const Scratch& S() {
  static const Scratch scratch;
  return scratch;
}

Env BaseEnv() { return {{"PATH", S().BinDir()}}; }

HostFacts Host(int cpus = 8, int gpus = 0) {
  HostFacts host;
  host.cpu_count = cpus;
  host.gpu_count = [gpus] { return gpus; };
  return host;
}

absl::StatusOr<ParsedCommand> Parse(std::vector<std::string> args, Env env = BaseEnv(),
                                    HostFacts host = Host()) {
  args.insert(args.begin(), "ddprun");
  return ParseCommandLine(args, env, host);
}

// Parses and requires success.
ParsedCommand Ok(std::vector<std::string> args, Env env = BaseEnv(), HostFacts host = Host()) {
  auto r = Parse(std::move(args), std::move(env), host);
  INFO((r.ok() ? std::string("ok") : std::string(r.status().message())));
  REQUIRE(r.ok());
  return *std::move(r);
}

// Parses, requires a usage error, returns its message.
std::string Err(std::vector<std::string> args, Env env = BaseEnv(), HostFacts host = Host()) {
  auto r = Parse(std::move(args), std::move(env), host);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string msg(r.status().message());
  CHECK(msg.rfind("ddprun: ", 0) == 0);
  CHECK(msg.find('\n') == std::string::npos);  // one line
  return msg;
}

using Catch::Matchers::Contains;

}  // namespace

TEST_CASE("defaults: single node, one python worker, embedded rendezvous", "[unit]") {
  ParsedCommand p = Ok({S().Path("train.py")});
  CHECK(p.action == Action::kRun);
  const auto& o = p.options;
  CHECK(o.min_nodes == 1);
  CHECK(o.max_nodes == 1);
  CHECK(o.nproc_per_node == 1);
  CHECK(o.policy.max_restarts == 0);
  CHECK(o.role == "default");
  CHECK(o.mode == RendezvousMode::kEmbedded);
  CHECK(o.rdzv_host == "127.0.0.1");
  CHECK(o.rdzv_port == 0);
  CHECK(o.job_id != "none");  // random for single node
  CHECK(o.job_id.size() == 36);
  CHECK(o.node_rank == -1);
  CHECK(o.grace_period_s == 30.0);
  CHECK(o.policy.join_timeout_s == 600.0);
  CHECK(o.policy.last_call_timeout_s == 30.0);
  // The knob table's defaults of the job-wide knobs are JobPolicy's.
  CHECK(o.policy == rendezvous::JobPolicy{});
  CHECK(o.log_dir.empty());
  CHECK(o.command == std::vector<std::string>{"python3", "-u", S().Path("train.py")});
  CHECK(p.warnings.empty());
  CHECK(p.launcher.redirects.IsDefault());
  CHECK(p.launcher.tee.IsDefault());
  CHECK(p.launcher.local_ranks_filter.empty());
}

TEST_CASE("random job ids differ between runs", "[unit]") {
  CHECK(Ok({S().Path("train.py")}).options.job_id != Ok({S().Path("train.py")}).options.job_id);
}

TEST_CASE("both spellings of every flag", "[unit]") {
  const auto [underscore, dash] = GENERATE(table<std::string, std::string>({
      {"--nproc_per_node=3", "--nproc-per-node=3"},
      {"--max_restarts=3", "--max-restarts=3"},
      {"--rdzv_endpoint=h:3", "--rdzv-endpoint=h:3"},
      {"--rdzv_id=3", "--rdzv-id=3"},
      {"--rdzv_conf=join_timeout=3", "--rdzv-conf=join_timeout=3"},
      {"--grace_period=3", "--grace-period=3"},
      {"--log_dir=/tmp/3", "--log-dir=/tmp/3"},
      {"--local_addr=3", "--local-addr=3"},
      {"--monitor_interval=3", "--monitor-interval=3"},
      {"--start_method=fork", "--start-method=fork"},
      {"--local_ranks_filter=0", "--local-ranks-filter=0"},
  }));
  auto a = Ok({underscore, S().Path("train.py")});
  auto b = Ok({dash, S().Path("train.py")});
  CHECK(a.options.nproc_per_node == b.options.nproc_per_node);
  CHECK(a.options.policy.max_restarts == b.options.policy.max_restarts);
  CHECK(a.options.rdzv_port == b.options.rdzv_port);
  CHECK(a.options.policy.join_timeout_s == b.options.policy.join_timeout_s);
  CHECK(a.options.grace_period_s == b.options.grace_period_s);
  CHECK(a.options.log_dir == b.options.log_dir);
  CHECK(a.options.local_addr == b.options.local_addr);
  CHECK(a.launcher.monitor_interval == b.launcher.monitor_interval);
  CHECK(a.launcher.start_method == b.launcher.start_method);
  CHECK(a.launcher.local_ranks_filter == b.launcher.local_ranks_filter);
}

TEST_CASE("value flags, separate and = forms", "[unit]") {
  auto p =
      Ok({"--nproc_per_node", "4", "--max_restarts", "2", "--role", "trainer", "--grace_period",
          "2.5", "--log_dir", "/tmp/logs", "--local_addr", "10.0.0.7", S().Path("train.py")});
  CHECK(p.options.nproc_per_node == 4);
  CHECK(p.options.policy.max_restarts == 2);
  CHECK(p.options.role == "trainer");
  CHECK(p.options.grace_period_s == 2.5);
  CHECK(p.options.log_dir == "/tmp/logs");
  CHECK(p.options.local_addr == "10.0.0.7");
}

TEST_CASE("a flag given twice: the last one wins, as with argparse", "[unit]") {
  CHECK(Ok({"--nproc_per_node=2", "--nproc-per-node=5", S().Path("train.py")})
            .options.nproc_per_node == 5);
}

TEST_CASE("--nproc_per_node forms", "[unit]") {
  CHECK(Ok({"--nproc_per_node=cpu", S().Path("train.py")}, BaseEnv(), Host(6, 0))
            .options.nproc_per_node == 6);
  CHECK(Ok({"--nproc_per_node=gpu", S().Path("train.py")}, BaseEnv(), Host(6, 2))
            .options.nproc_per_node == 2);
  CHECK(Ok({"--nproc_per_node=auto", S().Path("train.py")}, BaseEnv(), Host(6, 2))
            .options.nproc_per_node == 2);
  CHECK(Ok({"--nproc_per_node=auto", S().Path("train.py")}, BaseEnv(), Host(6, 0))
            .options.nproc_per_node == 6);
  CHECK(Ok({"--nproc_per_node=GPU", S().Path("train.py")}, BaseEnv(), Host(6, 1))
            .options.nproc_per_node == 1);
  CHECK_THAT(Err({"--nproc_per_node=gpu", S().Path("train.py")}, BaseEnv(), Host(6, 0)),
             Contains("no GPU found"));
  CHECK(Err({"--nproc_per_node=", S().Path("train.py")}) ==
        "ddprun: --nproc_per_node= has an empty value; give one (--nproc_per_node=VALUE) or "
        "leave the flag out");
  for (const char* bad : {"0", "-1", "two", "npu", "1.5"}) {
    CAPTURE(bad);
    CHECK_THAT(Err({std::string("--nproc_per_node=") + bad, S().Path("train.py")}),
               Contains("--nproc_per_node must be a positive number of workers, 'cpu', 'gpu', "
                        "'xpu' or 'auto'"));
  }
}

// torch.cuda.device_count() honours CUDA_VISIBLE_DEVICES: a Slurm
// --gres=gpu:4 step on an 8-GPU node runs 4 workers under torchrun, so here too
// (torch 2.11's torchrun with CUDA_VISIBLE_DEVICES=0 on a 1-GPU machine ran 1).
TEST_CASE("--nproc_per_node=gpu|auto count the GPUs the job can see", "[unit]") {
  Env env = BaseEnv();
  env["CUDA_VISIBLE_DEVICES"] = "4,5,6,7";
  CHECK(
      Ok({"--nproc_per_node=gpu", S().Path("train.py")}, env, Host(64, 8)).options.nproc_per_node ==
      4);
  CHECK(Ok({"--nproc_per_node=auto", S().Path("train.py")}, env, Host(64, 8))
            .options.nproc_per_node == 4);
  env["CUDA_VISIBLE_DEVICES"] = "GPU-1f2e,GPU-3a4b";
  CHECK(
      Ok({"--nproc_per_node=gpu", S().Path("train.py")}, env, Host(64, 8)).options.nproc_per_node ==
      2);
  env["CUDA_VISIBLE_DEVICES"] = "";
  CHECK_THAT(Err({"--nproc_per_node=gpu", S().Path("train.py")}, env, Host(64, 8)),
             Contains("=gpu but CUDA_VISIBLE_DEVICES='' hides all 8 GPU(s) of this node"));
  CHECK(Ok({"--nproc_per_node=auto", S().Path("train.py")}, env, Host(64, 8))
            .options.nproc_per_node == 64);  // auto: no usable GPU, the CPUs
  // AMD GPUs (ROCm), narrowed by ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES.
  HostFacts amd = Host(32, 0);
  amd.amd_gpu_count = [] { return 8; };
  CHECK(Ok({"--nproc_per_node=gpu", S().Path("train.py")}, BaseEnv(), amd).options.nproc_per_node ==
        8);
  Env rocr = BaseEnv();
  rocr["ROCR_VISIBLE_DEVICES"] = "0,1";
  CHECK(Ok({"--nproc_per_node=auto", S().Path("train.py")}, rocr, amd).options.nproc_per_node == 2);
  rocr["HIP_VISIBLE_DEVICES"] = "1";
  CHECK(Ok({"--nproc_per_node=gpu", S().Path("train.py")}, rocr, amd).options.nproc_per_node == 1);
}

// torchrun 2.x: torch.xpu.device_count(), which Level Zero narrows by
// ZE_AFFINITY_MASK; `auto` does not count Intel GPUs (see docs/cli.md).
TEST_CASE("--nproc_per_node=xpu counts the Intel GPUs the job can see", "[unit]") {
  HostFacts intel = Host(32, 0);
  intel.intel_gpu_count = [] { return 4; };
  CHECK(
      Ok({"--nproc_per_node=xpu", S().Path("train.py")}, BaseEnv(), intel).options.nproc_per_node ==
      4);
  CHECK(
      Ok({"--nproc-per-node=XPU", S().Path("train.py")}, BaseEnv(), intel).options.nproc_per_node ==
      4);
  Env env = BaseEnv();
  env["ZE_AFFINITY_MASK"] = "0,2";
  CHECK(Ok({"--nproc_per_node=xpu", S().Path("train.py")}, env, intel).options.nproc_per_node == 2);
  env["ZE_AFFINITY_MASK"] = "1.0,1.1,9";  // two tiles of card 1; card 9 does not exist
  CHECK(Ok({"--nproc_per_node=xpu", S().Path("train.py")}, env, intel).options.nproc_per_node == 2);
  env["ZE_AFFINITY_MASK"] = "";  // set and empty: every device, as Level Zero
  CHECK(Ok({"--nproc_per_node=xpu", S().Path("train.py")}, env, intel).options.nproc_per_node == 4);
  env["ZE_AFFINITY_MASK"] = "7";
  CHECK(Err({"--nproc_per_node=xpu", S().Path("train.py")}, env, intel) ==
        "ddprun: --nproc_per_node=xpu but ZE_AFFINITY_MASK='7' hides all 4 Intel GPU(s) of this "
        "node; pass a number of workers, 'cpu' or 'auto'");
  CHECK(Err({"--nproc-per-node=xpu", S().Path("train.py")}, BaseEnv(), Host(32, 2)) ==
        "ddprun: --nproc_per_node=xpu but no Intel GPU found (no /sys/class/drm/card<N> with "
        "vendor 0x8086 and a render node); pass a number of workers, 'cpu' or 'auto'");
  // PET_NPROC_PER_NODE=xpu, as Kubeflow sets it.
  Env pet = BaseEnv();
  pet["PET_NPROC_PER_NODE"] = "xpu";
  CHECK(Ok({S().Path("train.py")}, pet, intel).options.nproc_per_node == 4);
  // auto never counts them: many CPU hosts have an Intel iGPU their torch cannot use.
  CHECK(Ok({"--nproc_per_node=auto", S().Path("train.py")}, BaseEnv(), intel)
            .options.nproc_per_node == 32);
}

TEST_CASE("CountIntelGpus counts Intel DRM cards with a render node", "[unit]") {
  char tmpl[] = "/tmp/ddprun_drm_XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  // card<N>/device/vendor and card<N>/device/drm/{card<N>,renderD<M>}, as sysfs has them.
  auto card = [&](const std::string& name, const std::string& vendor, bool render) {
    const fs::path dev = root / name / "device";
    fs::create_directories(dev / "drm" / name);
    std::ofstream(dev / "vendor") << vendor << "\n";
    if (render)
      fs::create_directories(dev / "drm" / ("renderD" + std::to_string(128 + name.back() - '0')));
  };
  card("card0", "0x8086", true);
  card("card1", "0x8086", true);
  card("card2", "0x10de", true);                // NVIDIA
  card("card3", "0x8086", false);               // display only: no render node
  fs::create_directories(root / "card0-DP-1");  // a connector
  fs::create_directories(root / "renderD128");
  CHECK(CountIntelGpus(root.string()) == 2);
  CHECK(CountIntelGpus((root / "absent").string()) == 0);
  std::error_code ec;
  fs::remove_all(root, ec);
}

TEST_CASE("ZeAffinityDevices reads ZE_AFFINITY_MASK as Level Zero does", "[unit]") {
  CHECK(ZeAffinityDevices(4, "0,1") == 2);
  CHECK(ZeAffinityDevices(4, "0.0,0.1,1") == 3);
  CHECK(ZeAffinityDevices(4, "5,1") == 1);  // an absent card is ignored
  CHECK(ZeAffinityDevices(4, " ") == 4);
  CHECK(ZeAffinityDevices(4, "x") == 0);
  CHECK(ZeAffinityDevices(0, "0") == 0);
}

TEST_CASE("VisibleDevices reads a visibility list as the runtimes do", "[unit]") {
  CHECK(VisibleDevices(8, "0,1,2") == 3);
  CHECK(VisibleDevices(8, "") == 0);
  CHECK(VisibleDevices(8, "-1") == 0);
  CHECK(VisibleDevices(8, "0,9,1") == 1);  // stops at the first invalid index
  CHECK(VisibleDevices(2, "0,1,2,3") == 2);
  CHECK(VisibleDevices(8, " 3 , 4 ") == 2);
  CHECK(VisibleDevices(2, "GPU-a,GPU-b,GPU-c") == 2);
  CHECK(VisibleDevices(4, "MIG-x") == 1);
}

TEST_CASE("CountAmdGpus counts KFD nodes with SIMDs", "[unit]") {
  char tmpl[] = "/tmp/ddprun_kfd_XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  auto node = [&](int i, int simds) {
    fs::create_directories(root / std::to_string(i));
    std::ofstream(root / std::to_string(i) / "properties")
        << "cpu_cores_count 0\nsimd_count " << simds << "\nmem_banks_count 1\n";
  };
  node(0, 0);  // the CPU node
  node(1, 304);
  node(2, 304);
  CHECK(CountAmdGpus(root.string()) == 2);
  CHECK(CountAmdGpus((root / "absent").string()) == 0);
  std::error_code ec;
  fs::remove_all(root, ec);
}

TEST_CASE("the host's probes run only when the command line needs their fact", "[unit]") {
  // ProbeHost() sets probes; a plain `--nproc_per_node=N` job must read none
  // of them (each is a system walk at every start: netlink, /dev, sysfs).
  int gpu_probes = 0, name_probes = 0, topology_probes = 0;
  HostFacts host = Host(6, 0);
  host.gpu_count = [&] {
    ++gpu_probes;
    return 3;
  };
  host.names = [&] {
    ++name_probes;
    return std::vector<std::string>{"n0"};
  };
  host.cpu_topology = [&] {
    ++topology_probes;
    agent::CpuTopology t;
    t.cores = {{0}, {1}, {2}, {3}};
    t.core_numa = {0, 0, 0, 0};
    return t;
  };
  CHECK(Ok({"--nproc_per_node=4", S().Path("train.py")}, BaseEnv(), host).options.nproc_per_node ==
        4);
  CHECK(gpu_probes == 0);
  CHECK(name_probes == 0);
  CHECK(topology_probes == 0);
  // Each fact is the probe's answer when the command line needs it.
  CHECK(
      Ok({"--nproc_per_node=gpu", S().Path("train.py")}, BaseEnv(), host).options.nproc_per_node ==
      3);
  CHECK(gpu_probes == 1);
  CHECK(
      Ok({"--nproc_per_node=auto", S().Path("train.py")}, BaseEnv(), host).options.nproc_per_node ==
      3);
  CHECK(gpu_probes == 2);
  CHECK(Ok({"--nproc_per_node=4", "--cpu_bind=core", S().Path("train.py")}, BaseEnv(), host)
            .options.nproc_per_node == 4);
  CHECK(topology_probes == 1);
  // Five workers on the probe's four cores: refused, so the probe's answer
  // was used (no topology binds nothing and accepts).
  CHECK_THAT(Err({"--nproc_per_node=5", "--cpu_bind=core", S().Path("train.py")}, BaseEnv(), host),
             Contains("only 4 core(s)"));
  CHECK(topology_probes == 2);
  CHECK(name_probes == 0);
}

TEST_CASE("--nnodes forms", "[unit]") {
  auto fixed = Ok({"--nnodes=3", "--rdzv_endpoint=h", S().Path("train.py")});
  CHECK(fixed.options.min_nodes == 3);
  CHECK(fixed.options.max_nodes == 3);
  auto range = Ok({"--nnodes", "2:4", "--rdzv_endpoint=h", S().Path("train.py")});
  CHECK(range.options.min_nodes == 2);
  CHECK(range.options.max_nodes == 4);
  auto one = Ok({"--nnodes=1:1", S().Path("train.py")});
  CHECK(one.options.max_nodes == 1);
  for (const char* bad : {"0", "3:2", "0:2", "a", "1:", ":2", "1:2:3", "-1", "1.5"}) {
    CAPTURE(bad);
    CHECK_THAT(Err({std::string("--nnodes=") + bad, "--rdzv_endpoint=h", S().Path("train.py")}),
               Contains("--nnodes must be N or MIN:MAX with 0 < MIN <= MAX"));
  }
}

TEST_CASE("PET_* variables are defaults: CLI > env > default", "[unit]") {
  Env env = BaseEnv();
  env["PET_NPROC_PER_NODE"] = "3";
  env["PET_MAX_RESTARTS"] = "4";
  env["PET_NNODES"] = "2:3";
  env["PET_RDZV_ENDPOINT"] = "rdzv.example:1234";
  env["PET_RDZV_ID"] = "kube-job";
  env["PET_RDZV_CONF"] = "join_timeout=60,token=t0k";
  env["PET_ROLE"] = "r";
  env["PET_LOG_DIR"] = "/tmp/pet";
  env["PET_LOCAL_ADDR"] = "10.1.1.1";
  env["PET_NODE_RANK"] = "1";

  auto from_env = Ok({S().Path("train.py")}, env);
  const auto& o = from_env.options;
  CHECK(o.nproc_per_node == 3);
  CHECK(o.policy.max_restarts == 4);
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 3);
  CHECK(o.mode == RendezvousMode::kRemote);
  CHECK(o.rdzv_host == "rdzv.example");
  CHECK(o.rdzv_port == 1234);
  CHECK(o.job_id == "kube-job");
  CHECK(o.policy.join_timeout_s == 60);
  CHECK(o.join_token == "t0k");
  CHECK(o.role == "r");
  CHECK(o.log_dir == "/tmp/pet");
  CHECK(o.local_addr == "10.1.1.1");
  CHECK(o.node_rank == 1);

  auto cli_wins = Ok({"--nproc_per_node=5", "--max-restarts=0", "--rdzv_id=cli", "--node_rank=0",
                      S().Path("train.py")},
                     env);
  CHECK(cli_wins.options.nproc_per_node == 5);
  CHECK(cli_wins.options.policy.max_restarts == 0);
  CHECK(cli_wins.options.job_id == "cli");
  CHECK(cli_wins.options.node_rank == 0);

  // An empty variable counts as unset.
  Env empty = BaseEnv();
  empty["PET_NPROC_PER_NODE"] = "";
  CHECK(Ok({S().Path("train.py")}, empty).options.nproc_per_node == 1);
}

TEST_CASE("a bad PET_* value names the variable", "[unit]") {
  Env env = BaseEnv();
  env["PET_NPROC_PER_NODE"] = "zero";
  CHECK_THAT(Err({S().Path("train.py")}, env), Contains("PET_NPROC_PER_NODE (--nproc_per_node)"));
  Env env2 = BaseEnv();
  env2["PET_STANDALONE"] = "yes";
  CHECK_THAT(Err({S().Path("train.py")}, env2), Contains("PET_STANDALONE must be an integer"));
}

TEST_CASE("boolean flags read PET_* as integers", "[unit]") {
  Env env = BaseEnv();
  env["PET_NO_PYTHON"] = "1";
  CHECK(Ok({S().Path("run.sh")}, env).options.command ==
        std::vector<std::string>{S().Path("run.sh")});
  env["PET_NO_PYTHON"] = "0";
  CHECK(Ok({S().Path("train.py")}, env).options.command[0] == "python3");
  Env m = BaseEnv();
  m["PET_MODULE"] = "1";
  CHECK(Ok({"pkg.train"}, m).options.command ==
        std::vector<std::string>{"python3", "-u", "-m", "pkg.train"});
  Env sa = BaseEnv();
  sa["PET_STANDALONE"] = "1";
  sa["PET_RDZV_ENDPOINT"] = "h:1";  // ignored by standalone
  CHECK(Ok({S().Path("train.py")}, sa).options.mode == RendezvousMode::kEmbedded);
}

TEST_CASE("--grace_period: CLI > PET_GRACE_PERIOD > TORCH_ELASTIC_SHUTDOWN_TIMEOUT > 30",
          "[unit]") {
  Env env = BaseEnv();
  env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "7";
  CHECK(Ok({S().Path("train.py")}, env).options.grace_period_s == 7);
  env["PET_GRACE_PERIOD"] = "8";
  CHECK(Ok({S().Path("train.py")}, env).options.grace_period_s == 8);
  CHECK(Ok({"--grace_period=0", S().Path("train.py")}, env).options.grace_period_s == 0);
  CHECK_THAT(Err({"--grace_period=-1", S().Path("train.py")}),
             Contains("--grace_period must be a non-negative number of seconds"));
  Env bad = BaseEnv();
  bad["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "soon";
  CHECK_THAT(Err({S().Path("train.py")}, bad), Contains("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"));
}

TEST_CASE("mode: remote when an endpoint is given", "[unit]") {
  auto p = Ok({"--nnodes=2", "--rdzv_endpoint=node0", "--rdzv_id=j1", S().Path("train.py")});
  CHECK(p.options.mode == RendezvousMode::kRemote);
  CHECK(p.options.rdzv_host == "node0");
  CHECK(p.options.rdzv_port == 29400);
  CHECK(p.options.job_id == "j1");
  CHECK(p.options.node_rank == -1);
  // torchrun's default id when none is given.
  CHECK(Ok({"--rdzv_endpoint=node0:1", S().Path("train.py")}).options.job_id == "none");
  auto v6 = Ok({"--rdzv_endpoint=[::1]:5000", S().Path("train.py")});
  CHECK(v6.options.rdzv_host == "::1");
  CHECK(v6.options.rdzv_port == 5000);
  auto v6_default = Ok({"--rdzv_endpoint=[fe80::1]", S().Path("train.py")});
  CHECK(v6_default.options.rdzv_port == 29400);
  // The alias backend name.
  CHECK(Ok({"--rdzv_backend=ddprun", "--rdzv_endpoint=h", S().Path("train.py")}).options.mode ==
        RendezvousMode::kRemote);
}

TEST_CASE("bad endpoints", "[unit]") {
  for (const char* bad : {":29400", "h:", "h:70000", "h:x", "::1:5", "[::1", "[::1]x"}) {
    CAPTURE(bad);
    CHECK_THAT(Err({std::string("--rdzv_endpoint=") + bad, S().Path("train.py")}),
               Contains("--rdzv_endpoint must be HOST[:PORT]"));
  }
  CHECK_THAT(Err({"--rdzv_endpoint=h:70000", S().Path("train.py")}),
             Contains("the port must be 1..65535"));
}

// torchrun 2.x's "HOST:0" (its docs' several-jobs-on-one-host line, the stock
// LLM launch scripts): this node hosts on a port the OS picks, one node only.
TEST_CASE("torchrun 2.x: --rdzv_endpoint=localhost:0 is a single-node embedded rendezvous",
          "[unit]") {
  auto p = Ok(
      {"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1", S().Path("train.py")});
  CHECK(p.options.mode == RendezvousMode::kEmbedded);
  CHECK(p.options.rdzv_host == "127.0.0.1");
  CHECK(p.options.rdzv_port == 0);
  CHECK(p.options.job_id != "none");  // a random id, as --standalone
  CHECK(
      Ok({"--rdzv_endpoint=127.0.0.1:0", "--rdzv_id=mine", S().Path("train.py")}).options.job_id ==
      "mine");
  CHECK_THAT(Err({"--rdzv_endpoint=localhost:0", "--nnodes=2", S().Path("train.py")}),
             Contains("--rdzv_endpoint=localhost:0: port 0 lets the OS pick the port") &&
                 Contains("e.g. localhost:29400"));
  CHECK_THAT(Err({"--rdzv_endpoint=localhost:0", "--nnodes=1:2", S().Path("train.py")}),
             Contains("single-node job"));
  // Replicas never take port 0.
  CHECK_THAT(Err({"--rdzv_endpoint=a:0,b:1", S().Path("train.py")}),
             Contains("the port must be 1..65535"));
}

TEST_CASE("mode: several nodes need an endpoint", "[unit]") {
  CHECK_THAT(
      Err({"--nnodes=2", S().Path("train.py")}),
      Contains("--nnodes=2 needs a rendezvous shared by the nodes") && Contains("--rdzv_endpoint"));
  CHECK_THAT(Err({"--nnodes=1:2", S().Path("train.py")}), Contains("--nnodes=1:2"));
}

TEST_CASE("mode: embedded keeps an explicit --rdzv_id", "[unit]") {
  CHECK(Ok({"--rdzv_id=mine", S().Path("train.py")}).options.job_id == "mine");
}

TEST_CASE("--standalone", "[unit]") {
  auto p = Ok({"--standalone", "--rdzv_endpoint=h:1", "--rdzv_id=x", "--nproc_per_node=2",
               S().Path("train.py")});
  CHECK(p.options.mode == RendezvousMode::kEmbedded);
  CHECK(p.options.rdzv_port == 0);
  CHECK(p.options.job_id != "x");
  REQUIRE(p.warnings.size() == 1);
  CHECK_THAT(p.warnings[0], Contains("--standalone ignores --rdzv_endpoint, --rdzv_id"));
  CHECK_THAT(Err({"--standalone", "--nnodes=2", S().Path("train.py")}),
             Contains("--standalone runs a single node"));
}

TEST_CASE("mode: static", "[unit]") {
  auto p = Ok({"--rdzv_backend=static", "--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1",
               "--master_port=1234", S().Path("train.py")});
  const auto& o = p.options;
  CHECK(o.mode == RendezvousMode::kStatic);
  CHECK(o.node_rank == 1);
  CHECK(o.master_addr == "10.0.0.1");
  CHECK(o.master_port == 1234);
  CHECK(o.job_id == "none");
  CHECK(p.warnings.empty());

  auto d = Ok({"--rdzv-backend", "static", S().Path("train.py")});
  CHECK(d.options.node_rank == 0);
  CHECK(d.options.master_addr == "127.0.0.1");
  CHECK(d.options.master_port == 29500);

  // torchrun: with static, an endpoint stands for master_addr:master_port.
  auto e = Ok({"--rdzv_backend=static", "--rdzv_endpoint=m:99", S().Path("train.py")});
  CHECK(e.options.master_addr == "m");
  CHECK(e.options.master_port == 99);
  CHECK_THAT(Err({"--rdzv_backend=static", "--rdzv_endpoint=m", S().Path("train.py")}),
             Contains("the port is required"));

  Env kube = BaseEnv();
  kube["PET_RDZV_BACKEND"] = "static";
  kube["PET_NNODES"] = "4";
  kube["PET_NODE_RANK"] = "3";
  kube["PET_MASTER_ADDR"] = "master-0";
  kube["PET_MASTER_PORT"] = "23456";
  auto k = Ok({S().Path("train.py")}, kube);
  CHECK(k.options.mode == RendezvousMode::kStatic);
  CHECK(k.options.node_rank == 3);
  CHECK(k.options.master_addr == "master-0");
  CHECK(k.options.master_port == 23456);

  CHECK_THAT(Err({"--rdzv_backend=static", "--nnodes=1:2", S().Path("train.py")}),
             Contains("static needs a fixed number of nodes"));
  CHECK_THAT(Err({"--rdzv_backend=static", "--nnodes=2", "--node_rank=2", S().Path("train.py")}),
             Contains("--node_rank must be in 0..1"));
  CHECK_THAT(Err({"--rdzv_backend=static", "--master_port=0", S().Path("train.py")}),
             Contains("--master_port must be a port in 1..65535"));
  CHECK_THAT(Err({"--rdzv_backend=static", "--master_port=http", S().Path("train.py")}),
             Contains("--master_port must be a port"));
}

TEST_CASE("--master_addr/--master_port without a backend: torchrun's static default", "[unit]") {
  // torchrun's default backend is static: naming the master selects it, and
  // node rank 0 hosts the store on --master_port (issue 9, item 8).
  auto p = Ok({"--master_addr=127.0.0.1", "--master_port=1234", "--nproc_per_node=2",
               S().Path("train.py")});
  CHECK(p.options.mode == RendezvousMode::kStatic);
  CHECK(p.options.master_addr == "127.0.0.1");
  CHECK(p.options.master_port == 1234);
  CHECK(p.options.node_rank == 0);
  CHECK(p.options.job_id == "none");
  CHECK(p.warnings.empty());
  auto port_only = Ok({"--master_port=2345", S().Path("train.py")});
  CHECK(port_only.options.mode == RendezvousMode::kStatic);
  CHECK(port_only.options.master_addr == "127.0.0.1");
  CHECK(port_only.options.master_port == 2345);
  // --print-config says what chose static.
  CHECK_THAT(Ok({"--print-config", "--master_port=2345", S().Path("train.py")}).text,
             Contains("= static") && Contains("# flag --master_port (torchrun's static default)"));
  // From the environment too (Kubeflow's non-elastic PyTorchJob relies on it).
  Env env = BaseEnv();
  env["PET_MASTER_ADDR"] = "x";
  auto k = Ok({S().Path("train.py")}, env);
  CHECK(k.options.mode == RendezvousMode::kStatic);
  CHECK(k.options.master_addr == "x");
  CHECK(k.options.master_port == 29500);
  CHECK(k.warnings.empty());
  // Several nodes: each must know its rank (torchrun would make every node
  // rank 0, each waiting for the others on its own store).
  CHECK_THAT(Err({"--master_addr=m", "--nnodes=2", S().Path("train.py")}),
             Contains("static rendezvous with --nnodes=2 needs this node's --node_rank"));
  CHECK(Ok({"--master_addr=m", "--nnodes=2", "--node_rank=1", S().Path("train.py")}).options.mode ==
        RendezvousMode::kStatic);
  // An explicit backend or endpoint keeps c10d; the master flags are then ignored, with a warning.
  auto c10d = Ok({"--rdzv_backend=c10d", "--master_addr=x", S().Path("train.py")});
  CHECK(c10d.options.mode == RendezvousMode::kEmbedded);
  REQUIRE(c10d.warnings.size() == 1);
  CHECK_THAT(c10d.warnings[0], Contains("only used with --rdzv_backend=static"));
  auto remote = Ok({"--rdzv_endpoint=h", "--master_port=7", S().Path("train.py")});
  CHECK(remote.options.mode == RendezvousMode::kRemote);
  REQUIRE(remote.warnings.size() == 1);
  Env c10d_env = BaseEnv();
  c10d_env["PET_RDZV_BACKEND"] = "c10d";
  c10d_env["PET_MASTER_ADDR"] = "x";
  auto silent = Ok({S().Path("train.py")}, c10d_env);
  CHECK(silent.options.mode == RendezvousMode::kEmbedded);
  CHECK(silent.warnings.empty());
  CHECK(Ok({"--standalone", "--master_addr=x", S().Path("train.py")}).options.mode ==
        RendezvousMode::kEmbedded);
}

TEST_CASE("no node may wait for a store that will never exist", "[unit]") {
  // Several nodes with neither an endpoint nor the master's address.
  CHECK_THAT(
      Err({"--nnodes=2", S().Path("train.py")}),
      Contains("--nnodes=2 needs a rendezvous shared by the nodes") && Contains("--master_addr"));
  CHECK_THAT(Err({"--rdzv_backend=static", "--nnodes=2", "--node_rank=1", S().Path("train.py")}),
             Contains("static rendezvous with --nnodes=2 needs --master_addr=HOST"));
  CHECK_THAT(Err({"--rdzv_backend=static", "--nnodes=3", S().Path("train.py")}),
             Contains("needs this node's --node_rank"));
  // Given both, or an endpoint standing for the master, it runs.
  CHECK(Ok({"--rdzv_backend=static", "--nnodes=2", "--node_rank=1", "--rdzv_endpoint=m:5",
            S().Path("train.py")})
            .options.master_addr == "m");
}

TEST_CASE("--rdzv_backend values", "[unit]") {
  CHECK_THAT(Err({"--rdzv_backend=etcd", S().Path("train.py")}), Contains("is not supported"));
  CHECK_THAT(Err({"--rdzv_backend=etcd-v2", S().Path("train.py")}), Contains("is not supported"));
  CHECK_THAT(Err({"--rdzv_backend=zk", S().Path("train.py")}),
             Contains("--rdzv_backend must be c10d (alias ddprun) or static, got 'zk'"));
  CHECK(Ok({"--rdzv_backend=c10d", S().Path("train.py")}).options.mode ==
        RendezvousMode::kEmbedded);
}

TEST_CASE("--node_rank with c10d is a requested rank", "[unit]") {
  CHECK(Ok({"--nnodes=3", "--rdzv_endpoint=h", "--node_rank=2", S().Path("train.py")})
            .options.node_rank == 2);
  CHECK_THAT(Err({"--nnodes=3", "--rdzv_endpoint=h", "--node_rank=3", S().Path("train.py")}),
             Contains("--node_rank must be in 0..2"));
  CHECK_THAT(Err({"--node_rank=-1", S().Path("train.py")}), Contains("--node_rank must be"));
}

TEST_CASE("--rdzv_conf", "[unit]") {
  auto p = Ok({"--rdzv_endpoint=h", "--rdzv_conf=join_timeout=900, last_call_timeout=5,token=a=b",
               S().Path("train.py")});
  CHECK(p.options.policy.join_timeout_s == 900);
  CHECK(p.options.policy.last_call_timeout_s == 5);
  CHECK(p.options.join_token == "a=b");
  CHECK(p.warnings.empty());

  auto torchrun_keys =
      Ok({"--rdzv_endpoint=h", "--rdzv_conf=read_timeout=60,is_host=1", S().Path("train.py")});
  CHECK(torchrun_keys.warnings.size() == 1);
  CHECK_THAT(torchrun_keys.warnings[0], Contains("'read_timeout' is a torchrun setting"));
  // torchrun's is_host is honoured: true hosts whatever the name resolves to, false never.
  CHECK(torchrun_keys.options.is_host == std::optional<bool>(true));
  CHECK(Ok({"--rdzv_endpoint=h", "--rdzv_conf=is_host=false", S().Path("train.py")})
            .options.is_host == std::optional<bool>(false));
  CHECK_FALSE(Ok({"--rdzv_endpoint=h", S().Path("train.py")}).options.is_host.has_value());
  CHECK_THAT(Err({"--rdzv_endpoint=h", "--rdzv_conf=is_host=maybe", S().Path("train.py")}),
             Contains("--rdzv_conf is_host must be true or false, got 'maybe'"));

  // static: timeout is how long nodes wait for each other.
  CHECK(Ok({"--rdzv_backend=static", "--rdzv_conf=timeout=42", S().Path("train.py")})
            .options.policy.join_timeout_s == 42);
  CHECK(Ok({"--rdzv_backend=static", "--rdzv_conf=timeout=42,join_timeout=7", S().Path("train.py")})
            .options.policy.join_timeout_s == 7);

  // torchrun passes any key to its backend (Kubeflow adds its own): a
  // warning, never a failure; use_libuv is a known torchrun key.
  auto unknown = Ok({"--rdzv_conf=colour=blue,use_libuv=0", S().Path("train.py")});
  REQUIRE(unknown.warnings.size() == 2);
  CHECK_THAT(unknown.warnings[0], Contains("--rdzv_conf key 'colour' is unknown") &&
                                      Contains("join_timeout, last_call_timeout, token"));
  CHECK_THAT(unknown.warnings[1], Contains("'use_libuv' is a torchrun setting"));
  CHECK_THAT(Err({"--rdzv_conf=join_timeout", S().Path("train.py")}), Contains("has no '='"));
  CHECK_THAT(Err({"--rdzv_conf=join_timeout=0", S().Path("train.py")}),
             Contains("--rdzv_conf join_timeout must be a positive number of seconds"));
  CHECK_THAT(Err({"--rdzv_conf=last_call_timeout=x", S().Path("train.py")}),
             Contains("last_call_timeout"));
}

TEST_CASE("--max_restarts", "[unit]") {
  CHECK_THAT(Err({"--max_restarts=-1", S().Path("train.py")}),
             Contains("--max_restarts must be a non-negative integer, got '-1'"));
  CHECK_THAT(Err({"--max_restarts=x", S().Path("train.py")}), Contains("--max_restarts"));
}

TEST_CASE("compatibility flags are accepted and validated", "[unit]") {
  auto p = Ok({"--monitor_interval=5", "--start_method=forkserver", S().Path("train.py")});
  CHECK(p.launcher.monitor_interval.count() == 5);
  CHECK(p.launcher.start_method == "forkserver");
  CHECK(p.warnings.empty());
  CHECK_THAT(Err({"--monitor_interval=-1", S().Path("train.py")}), Contains("--monitor_interval"));
  CHECK_THAT(Err({"--start_method=thread", S().Path("train.py")}),
             Contains("--start_method must be spawn, fork or forkserver"));
  CHECK_THAT(Err({"--role", "", S().Path("train.py")}), Contains("--role must not be empty"));
  CHECK_THAT(Err({"--role=", S().Path("train.py")}), Contains("--role= has an empty value"));
  // Only options before the script are checked.
  CHECK(Ok({"-r", "1", "--role", "x", S().Path("train.py"), "--role="}).options.command.back() ==
        "--role=");
}

TEST_CASE("-r/--redirects, -t/--tee, --local_ranks_filter", "[unit]") {
  auto p = Ok({"-r", "3", "--tee=0:1,2:2", "--nproc_per_node=4", "--local_ranks_filter=0,3",
               S().Path("train.py")});
  CHECK(p.launcher.redirects.all == 3);
  CHECK(p.launcher.redirects.ForLocalRank(2) == 3);
  CHECK(p.launcher.tee.ForLocalRank(0) == 1);
  CHECK(p.launcher.tee.ForLocalRank(1) == 0);
  CHECK(p.launcher.tee.ForLocalRank(2) == 2);
  CHECK(p.launcher.local_ranks_filter == std::vector<int>{0, 3});
  CHECK(p.warnings.empty());  // applied by the agent, no "not applied yet" warning
  // The agent gets them.
  CHECK(p.options.logs.redirects.all == 3);
  CHECK(p.options.logs.tee.ForLocalRank(2) == 2);
  CHECK(p.options.logs.local_ranks_filter == std::vector<int>{0, 3});
  CHECK_FALSE(p.options.logs.prefix_output);
  CHECK(p.options.logs.stderr_tail_lines == 20);
  auto q = Ok({"--prefix_output", "--stderr_tail_lines=5", S().Path("train.py")});
  CHECK(q.options.logs.prefix_output);
  CHECK(q.options.logs.stderr_tail_lines == 5);
  CHECK(Ok({"--stderr-tail-lines", "0", S().Path("train.py")}).options.logs.stderr_tail_lines == 0);
  CHECK_THAT(Err({"--stderr_tail_lines=-1", S().Path("train.py")}),
             Contains("--stderr_tail_lines must be a number of lines"));

  CHECK(Ok({"--redirects=1", S().Path("train.py")}).launcher.redirects.all == 1);
  CHECK(Ok({"-t2", S().Path("train.py")}).launcher.tee.all == 2);
  for (const char* bad : {"4", "x", "0:4", "a:1", "-1"}) {
    CAPTURE(bad);
    CHECK_THAT(Err({"-r", bad, S().Path("train.py")}),
               Contains("--redirects must be 0 (none), 1 (stdout), 2 (stderr), 3 (both)"));
  }
  CHECK_THAT(Err({"--tee=9", S().Path("train.py")}), Contains("--tee must be"));
  CHECK_THAT(Err({"--local_ranks_filter=0,x", S().Path("train.py")}),
             Contains("--local_ranks_filter must be a comma-separated list"));
  CHECK_THAT(Err({"--nproc_per_node=2", "--local_ranks_filter=2", S().Path("train.py")}),
             Contains("names local rank 2 but --nproc_per_node is 2"));
}

TEST_CASE("worker command: python script, args passed through verbatim", "[unit]") {
  auto p = Ok({"--nproc_per_node=2", S().Path("train.py"), "--epochs", "3", "--nproc_per_node=9",
               "-m", "--", "${local_rank}", "--help"});
  CHECK(p.options.nproc_per_node == 2);
  CHECK(p.options.command == std::vector<std::string>{"python3", "-u", S().Path("train.py"),
                                                      "--epochs", "3", "--nproc_per_node=9", "-m",
                                                      "--", "${local_rank}", "--help"});
}

TEST_CASE("worker command: -- ends the options", "[unit]") {
  CHECK(Ok({"--", S().Path("train.py"), "x"}).options.command ==
        std::vector<std::string>{"python3", "-u", S().Path("train.py"), "x"});
}

TEST_CASE("worker command: PYTHON_EXEC", "[unit]") {
  Env env = BaseEnv();
  env["PYTHON_EXEC"] = S().Path("bin/python3");
  CHECK(Ok({S().Path("train.py")}, env).options.command[0] == S().Path("bin/python3"));
  env["PYTHON_EXEC"] = "/nonexistent/python";
  CHECK_THAT(
      Err({S().Path("train.py")}, env),
      Contains("Python interpreter '/nonexistent/python' not found") && Contains("PYTHON_EXEC"));
  Env no_python = {{"PATH", "/nonexistent"}};
  CHECK_THAT(Err({S().Path("train.py")}, no_python), Contains("'python3' not found"));
}

// torchrun runs workers with its own interpreter (sys.executable), so a
// torchrun inside a venv uses the venv's Python even when it is not activated.
TEST_CASE("worker command: the interpreter a torchrun in the same environment would use",
          "[unit]") {
  char tmpl[] = "/tmp/ddprun_python_choice_XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  auto exe = [&](const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "#!/bin/sh\n";
    ::chmod(p.c_str(), 0755);
  };
  exe(root / "venv/bin/python");
  exe(root / "venv/bin/python3");
  exe(root / "venv/bin/ddprun");
  std::ofstream(root / "venv/pyvenv.cfg") << "home = /usr/bin\n";
  exe(root / "conda/bin/python");
  exe(root / "usr/bin/python3");
  exe(root / "usr/bin/ddprun");  // a system install: not a venv, PATH decides
  const std::string venv = (root / "venv").string(), conda = (root / "conda").string();

  Env env = BaseEnv();
  PythonChoice c = ChoosePython(env, "");
  CHECK(c.path == "python3");
  CHECK_THAT(c.why, Contains("python3 on PATH"));
  env["CONDA_PREFIX"] = conda;
  CHECK(ChoosePython(env, "").path == conda + "/bin/python");
  env["VIRTUAL_ENV"] = venv;  // a venv beats conda's base
  c = ChoosePython(env, "");
  CHECK(c.path == venv + "/bin/python");
  CHECK_THAT(c.why, Contains("VIRTUAL_ENV=" + venv));
  env["PYTHON_EXEC"] = "/opt/py/bin/python3";
  CHECK(ChoosePython(env, "").path == "/opt/py/bin/python3");
  CHECK(ChoosePython(env, "").why == "PYTHON_EXEC");
  // ddprun installed into a venv that is not activated: that venv's Python.
  Env plain = BaseEnv();
  c = ChoosePython(plain, venv + "/bin/ddprun");
  CHECK(c.path == venv + "/bin/python3");
  CHECK_THAT(c.why, Contains("the virtual environment ddprun is installed in"));
  CHECK(ChoosePython(plain, (root / "usr/bin/ddprun").string()).path == "python3");
  // The wheel's binary, run by the venv's console script: the same venv.
  const fs::path wheel_exe = root / "venv/lib/python3.11/site-packages/ddprun/bin/ddprun";
  exe(wheel_exe);
  CHECK(ChoosePython(plain, wheel_exe.string()).path == venv + "/bin/python3");
  // A VIRTUAL_ENV without an interpreter (deleted venv) is passed over.
  plain["VIRTUAL_ENV"] = (root / "gone").string();
  CHECK(ChoosePython(plain, "").path == "python3");
  // Through the command line: the worker command uses it.
  Env active = BaseEnv();
  active["VIRTUAL_ENV"] = venv;
  CHECK(Ok({S().Path("train.py")}, active).options.command ==
        std::vector<std::string>{venv + "/bin/python", "-u", S().Path("train.py")});
  std::error_code ec;
  fs::remove_all(root, ec);
}

TEST_CASE("worker command: -m runs a module", "[unit]") {
  auto p = Ok({"-m", "pkg.train", "--lr", "0.1"});
  CHECK(p.options.command ==
        std::vector<std::string>{"python3", "-u", "-m", "pkg.train", "--lr", "0.1"});
  CHECK(Ok({"--module", "pkg.train"}).options.command[3] == "pkg.train");
  CHECK_THAT(Err({"-m", "--no_python", "x"}),
             Contains("-m/--module and --no_python cannot be used together"));
}

TEST_CASE("worker command: executables run directly", "[unit]") {
  CHECK(Ok({S().Path("run.sh"), "a"}).options.command ==
        std::vector<std::string>{S().Path("run.sh"), "a"});
  // A name found on PATH.
  CHECK(Ok({"mytool", "-v"}).options.command == std::vector<std::string>{"mytool", "-v"});
  // An executable .py still goes through Python, as with torchrun.
  CHECK(Ok({S().Path("exec.py")}).options.command[0] == "python3");
}

TEST_CASE("worker command: a file in the working directory", "[unit]") {
  const fs::path old = fs::current_path();
  fs::current_path(S().Path(""));
  auto exe = Parse({"run.sh"});
  auto py = Parse({"train.py"});
  auto no_python = Parse({"--no_python", "run.sh"});
  fs::current_path(old);
  REQUIRE(exe.ok());
  CHECK(exe->options.command == std::vector<std::string>{"./run.sh"});
  REQUIRE(py.ok());
  CHECK(py->options.command == std::vector<std::string>{"python3", "-u", "train.py"});
  REQUIRE(no_python.ok());
  CHECK(no_python->options.command == std::vector<std::string>{"./run.sh"});
}

TEST_CASE("worker command: --no_python", "[unit]") {
  CHECK(Ok({"--no_python", S().Path("run.sh")}).options.command ==
        std::vector<std::string>{S().Path("run.sh")});
  CHECK(Ok({"--no-python", "mytool"}).options.command == std::vector<std::string>{"mytool"});
  CHECK(Ok({"--no_python", S().Path("exec.py")}).options.command ==
        std::vector<std::string>{S().Path("exec.py")});
  CHECK_THAT(Err({"--no_python", S().Path("data.txt")}),
             Contains("is not an executable file; chmod +x it, or drop --no_python"));
  CHECK_THAT(Err({"--no_python", "notexec"}), Contains("training script 'notexec' not found"));
}

TEST_CASE("worker command: a non-executable non-.py file runs with python and a warning",
          "[unit]") {
  auto p = Ok({S().Path("data.txt")});
  CHECK(p.options.command == std::vector<std::string>{"python3", "-u", S().Path("data.txt")});
  REQUIRE(p.warnings.size() == 1);
  CHECK_THAT(p.warnings[0], Contains("is not executable"));
}

TEST_CASE("worker command: missing script", "[unit]") {
  CHECK(Err({"./train_missing.py"}) ==
        "ddprun: training script './train_missing.py' not found; check the path");
  CHECK_THAT(Err({"no_such_tool"}),
             Contains("'no_such_tool' not found (in the working directory or on PATH)"));
  CHECK_THAT(Err({}), Contains("missing the training script"));
  CHECK_THAT(Err({"--nproc_per_node=2"}), Contains("missing the training script"));
}

TEST_CASE("--run_path is refused", "[unit]") {
  CHECK_THAT(Err({"--run_path", S().Path("train.py")}), Contains("--run_path is not supported"));
}

TEST_CASE("unknown options", "[unit]") {
  CHECK(Err({"--nproc_per_nod=2", S().Path("train.py")}) ==
        "ddprun: unknown option '--nproc_per_nod' (did you mean --nproc_per_node?); options go "
        "before the training script, see ddprun --help");
  CHECK_THAT(Err({"--frobnicate", S().Path("train.py")}),
             Contains("unknown option '--frobnicate';"));
  CHECK_THAT(Err({"--nproc_per_node"}), Contains("--nproc_per_node needs a value"));
}

// torchrun's --print-completion SHELL (torch main, shtab): ddprun's own
// completion script for that shell, before any script or other flag is needed.
TEST_CASE("--print-completion prints the completion script of ddprun completion SHELL", "[unit]") {
  for (const char* shell : {"bash", "zsh"}) {
    CAPTURE(shell);
    auto p = Ok({"--print-completion", shell});
    CHECK(p.action == Action::kHelp);
    CHECK(p.text + "\n" == *CompletionScript(shell));  // main() ends it with a newline
    CHECK(Ok({std::string("--print_completion=") + shell, "--nproc_per_node=2"}).text == p.text);
  }
  CHECK(Err({"--print-completion", "tcsh"}) ==
        "ddprun: --print-completion 'tcsh': ddprun completes bash and zsh; use "
        "--print-completion bash or --print-completion zsh");
  CHECK_THAT(Err({"--print-completion"}), Contains("--print-completion needs a value"));
  CHECK_THAT(*CompletionScript("bash"), Contains("--print-completion"));
}

TEST_CASE("--help and --version", "[unit]") {
  auto help = Ok({"--help"});
  CHECK(help.action == Action::kHelp);
  CHECK_THAT(help.text, Contains("Usage: ddprun [OPTIONS] SCRIPT [SCRIPT_ARGS...]"));
  CHECK_THAT(help.text, Contains("Examples:"));
  CHECK_THAT(help.text, Contains("ddprund --port 29400"));
  CHECK_THAT(help.text, Contains("--rdzv_backend=static"));
  CHECK_THAT(help.text, Contains("Job shape"));
  CHECK_THAT(help.text, Contains("PET_NPROC_PER_NODE"));
  CHECK_THAT(help.text, Contains("source <(ddprun completion bash)"));
  CHECK(Ok({"-h"}).action == Action::kHelp);
  // After the script, --help belongs to the script.
  CHECK(Ok({S().Path("train.py"), "--help"}).action == Action::kRun);
  auto version = Ok({"--version"});
  CHECK(version.action == Action::kVersion);
  CHECK_THAT(version.text, Contains("ddprun "));
  CHECK_THAT(version.text, Contains("\ncompiler: "));
  CHECK_THAT(version.text, Contains("\ngRPC: 1."));
  CHECK_THAT(version.text, Contains("\nNCCL backend: "));
}

TEST_CASE("CountNvidiaGpus", "[unit]") {
  char tmpl[] = "/tmp/ddprun_gpu_test_XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  fs::create_directories(root / "dev");
  fs::create_directories(root / "proc");
  const std::string dev = (root / "dev").string();
  const std::string proc = (root / "proc").string();
  CHECK(CountNvidiaGpus(dev, proc) == 0);
  for (const char* name : {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset"}) {
    std::ofstream(root / "dev" / name) << "";
  }
  CHECK(CountNvidiaGpus(dev, proc) == 2);
  fs::create_directories(root / "proc" / "0000:01:00.0");
  CHECK(CountNvidiaGpus(dev, proc) == 1);  // the driver's list wins
  CHECK(CountNvidiaGpus(dev, (root / "absent").string()) == 2);
  fs::remove_all(root);
}

TEST_CASE("--rdzv_endpoint lists ddprund replicas: every one, in order; bad lists are one line",
          "[unit]") {
  auto p = Ok(
      {"--nnodes=2", "--rdzv_endpoint=d1:29401,d2,[::1]:7", "--rdzv_id=ha", S().Path("train.py")});
  const auto& o = p.options;
  CHECK(o.mode == RendezvousMode::kRemote);
  CHECK(o.rdzv_host == "d1");
  CHECK(o.rdzv_port == 29401);
  CHECK(o.rdzv_replicas ==
        std::vector<ddprun::rendezvous::HostPort>{{"d1", 29401}, {"d2", 29400}, {"::1", 7}});
  CHECK(Ok({"--nnodes=2", "--rdzv_endpoint=d1:1", "--rdzv_id=x", S().Path("train.py")})
            .options.rdzv_replicas.empty());
  const std::string twice =
      Err({"--nnodes=2", "--rdzv_endpoint=d1:1,d1:1", "--rdzv_id=x", S().Path("train.py")});
  CHECK(twice.find("--rdzv_endpoint") != std::string::npos);
  CHECK(twice.find("lists d1:1 twice") != std::string::npos);
  const std::string empty =
      Err({"--nnodes=2", "--rdzv_endpoint=d1:1,,d2:2", "--rdzv_id=x", S().Path("train.py")});
  CHECK(empty.find("an entry is empty") != std::string::npos);
}

}  // namespace ddprun::launcher

namespace ddprun::launcher {
namespace {

// torchrun 2.9+: every listed signal stops the job. ddprun's forwarding
// without a stop is --forward_signals.
TEST_CASE("--signals_to_handle: listed SIGUSR1/2 stop the job; --forward_signals forwards",
          "[unit]") {
  auto d = Ok({S().Path("train.py")});
  CHECK_FALSE(d.options.forward_sigusr1);
  CHECK_FALSE(d.options.stop_on_sigusr1);
  auto u = Ok({"--signals_to_handle=SIGTERM,SIGUSR1", S().Path("train.py")});
  CHECK(u.options.stop_on_sigusr1);
  CHECK_FALSE(u.options.stop_on_sigusr2);
  CHECK_FALSE(u.options.forward_sigusr1);
  auto both = Ok({"--signals-to-handle", "USR1, USR2", S().Path("train.py")});
  CHECK(both.options.stop_on_sigusr1);
  CHECK(both.options.stop_on_sigusr2);
  Env env = BaseEnv();
  env["PET_SIGNALS_TO_HANDLE"] = "SIGUSR2";
  CHECK(Ok({S().Path("train.py")}, env).options.stop_on_sigusr2);
  // A real signal ddprun does not trap: a warning, as torchrun's bad names.
  auto alrm = Ok({"--signals_to_handle=SIGTERM,SIGALRM", S().Path("train.py")});
  REQUIRE(alrm.warnings.size() == 1);
  CHECK_THAT(alrm.warnings[0], Contains("lists SIGALRM, which ddprun does not trap"));
  CHECK_THAT(Err({"--signals_to_handle=SIGNOPE", S().Path("train.py")}),
             Contains("names 'SIGNOPE', which is not a signal"));
  // ddprun's forwarding: the job goes on.
  auto fw = Ok({"--forward_signals=SIGUSR1", S().Path("train.py")});
  CHECK(fw.options.forward_sigusr1);
  CHECK_FALSE(fw.options.forward_sigusr2);
  Env fenv = BaseEnv();
  fenv["PET_FORWARD_SIGNALS"] = "USR1,USR2";
  CHECK(Ok({S().Path("train.py")}, fenv).options.forward_sigusr2);
  CHECK_THAT(Err({"--forward_signals=SIGTERM", S().Path("train.py")}),
             Contains("only SIGUSR1 and SIGUSR2 can be forwarded while the job runs"));
}

}  // namespace
}  // namespace ddprun::launcher

// torchrun 2.x flags (docs/cli.md's compatibility table; the same command
// lines ran under torch 2.11's own torchrun on a GPU machine, docs/gpu.md).
namespace ddprun::launcher {
namespace {

TEST_CASE("torchrun 2.12: --shutdown-timeout and PET_SHUTDOWN_TIMEOUT are --grace_period",
          "[unit]") {
  CHECK(Ok({"--shutdown-timeout=5", S().Path("train.py")}).options.grace_period_s == 5);
  CHECK(Ok({"--shutdown_timeout", "0", S().Path("train.py")}).options.grace_period_s == 0);
  Env env = BaseEnv();
  env["PET_SHUTDOWN_TIMEOUT"] = "6";
  env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "7";
  CHECK(Ok({S().Path("train.py")}, env).options.grace_period_s == 6);
  CHECK(Ok({"--grace_period=4", S().Path("train.py")}, env).options.grace_period_s == 4);
  env["PET_GRACE_PERIOD"] = "8";  // the older name's variable wins a tie of variables
  CHECK(Ok({S().Path("train.py")}, env).options.grace_period_s == 8);
  CHECK(Ok({"--shutdown-timeout=9", S().Path("train.py")}, env).options.grace_period_s == 9);
  CHECK(Ok({"--grace_period=3", "--shutdown-timeout=3", S().Path("train.py")})
            .options.grace_period_s == 3);
  CHECK_THAT(Err({"--grace_period=3", "--shutdown-timeout=4", S().Path("train.py")}),
             Contains("--grace_period=3 and --shutdown_timeout=4 name the same setting"));
  CHECK_THAT(Err({"--shutdown-timeout=soon", S().Path("train.py")}),
             Contains("--shutdown_timeout must be a non-negative number of seconds"));
}

TEST_CASE("--print-config: --shutdown-timeout shows as the grace period's origin", "[unit]") {
  const std::string text =
      Ok({"--print-config", "--shutdown-timeout=7", S().Path("train.py")}).text;
  CHECK_THAT(text, Contains("restart.grace_period"));
  CHECK_THAT(text, Contains("--shutdown-timeout") || Contains("--shutdown_timeout"));
  const std::string venv_line = Ok({"--print-config", S().Path("train.py")}).text;
  CHECK_THAT(venv_line, Contains("python ") && Contains("python3 on PATH"));
}

// Issue 33 item 17: the temporary default of --log_dir is shown as such, not
// as "none", and no line has an empty origin.
TEST_CASE("--print-config: the temporary log_dir default and no empty origin", "[unit]") {
  const std::string text = Ok({"--print-config", S().Path("train.py")}).text;
  CHECK_THAT(text, Contains("(a fresh $TMPDIR/ddprun_XXXXXX)"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    INFO(line);
    CHECK_FALSE(absl::EndsWith(line, "# "));
    CHECK_FALSE(absl::EndsWith(line, "#"));
  }
}

TEST_CASE("torchrun 2.10: --virtual-local-rank", "[unit]") {
  CHECK_FALSE(Ok({S().Path("train.py")}).options.virtual_local_rank);
  CHECK(Ok({"--virtual-local-rank", "--nproc_per_node=2", S().Path("train.py")})
            .options.virtual_local_rank);
  Env env = BaseEnv();
  env["PET_VIRTUAL_LOCAL_RANK"] = "1";
  CHECK(Ok({S().Path("train.py")}, env).options.virtual_local_rank);
  Env two = BaseEnv();
  two["CUDA_VISIBLE_DEVICES"] = "5,7";
  CHECK(Ok({"--virtual_local_rank", "--nproc_per_node=2", S().Path("train.py")}, two)
            .options.virtual_local_rank);
  CHECK_THAT(Err({"--virtual_local_rank", "--nproc_per_node=3", S().Path("train.py")}, two),
             Contains("CUDA_VISIBLE_DEVICES='5,7', which has 2 for 3 workers"));
}

TEST_CASE("torchrun 2.8: --event-log-handler accepted; --logs-specs refused with the reason",
          "[unit]") {
  auto p = Ok({"--event-log-handler=null", S().Path("train.py")});
  CHECK(p.warnings.empty());
  CHECK(Ok({"--event_log_handler", "console", S().Path("train.py")}).warnings.empty());
  CHECK_THAT(Err({"--logs-specs=my_specs", S().Path("train.py")}),
             Contains("--logs_specs=my_specs: torchrun's log layout plugins") &&
                 Contains("drop --logs_specs"));
}

TEST_CASE("torchrun 2.9: TORCHELASTIC_SIGNALS_TO_HANDLE, and --log-dir /dev/null", "[unit]") {
  CHECK(Ok({S().Path("train.py")}).options.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  CHECK(
      Ok({"--signals_to_handle=SIGUSR1,SIGUSR2", S().Path("train.py")}).options.signals_to_handle ==
      "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2");
  CHECK(Ok({"--log-dir", "/dev/null", S().Path("train.py")}).options.log_dir == "/dev/null");
}

}  // namespace
}  // namespace ddprun::launcher

namespace ddprun::launcher {
namespace {

TEST_CASE("torchrun 2.9: --numa-binding", "[unit]") {
  CHECK(Ok({S().Path("train.py")}).options.numa_binding == agent::NumaBinding::kNone);
  CHECK(Ok({"--numa-binding=node", S().Path("train.py")}).options.numa_binding ==
        agent::NumaBinding::kNode);
  CHECK(Ok({"--numa_binding", "exclusive", S().Path("train.py")}).options.numa_binding ==
        agent::NumaBinding::kExclusive);
  CHECK_THAT(Err({"--numa-binding=gpu", S().Path("train.py")}),
             Contains("--numa_binding must be node, socket, exclusive or core-complex, got 'gpu'"));
  CHECK_THAT(Err({"--numa-binding=node", "--cpu_bind=core", S().Path("train.py")}),
             Contains("both choose the workers' CPUs; give one"));
}

}  // namespace
}  // namespace ddprun::launcher

// Issue 33, item 12: a forgotten flag value and a directory, each one line.
namespace ddprun::launcher {
namespace {

TEST_CASE("a flag that took the script as its value; a directory as the script", "[unit]") {
  CHECK_THAT(Err({"--nproc_per_node", S().Path("train.py")}),
             Contains("missing the training script: --nproc_per_node took '" +
                      S().Path("train.py") + "' as its value; give --nproc_per_node a value"));
  CHECK_THAT(Err({"--nproc_per_node", "4"}), Contains("missing the training script; usage:"));
  CHECK_THAT(Err({S().Path("bin")}), Contains("is a directory without a __main__.py"));
  char tmpl[] = "/tmp/ddprun_pkgdir_XXXXXX";
  const fs::path pkg = ::mkdtemp(tmpl);
  std::ofstream(pkg / "__main__.py") << "print('hi')\n";
  CHECK(Ok({pkg.string()}).options.command ==
        std::vector<std::string>{"python3", "-u", pkg.string()});
  std::error_code ec;
  fs::remove_all(pkg, ec);
}

}  // namespace
TEST_CASE("--restart_policy: job by default, inplace needs --max_restarts", "[unit]") {
  CHECK(Ok({S().Path("train.py")}).options.policy.restart_policy ==
        rendezvous::RestartPolicy::kJob);
  CHECK(Ok({"--restart_policy=inplace", "--max_restarts=2", S().Path("train.py")})
            .options.policy.restart_policy == rendezvous::RestartPolicy::kInplace);
  CHECK(Ok({"--restart-policy", "job", S().Path("train.py")}).options.policy.restart_policy ==
        rendezvous::RestartPolicy::kJob);
  Env env = BaseEnv();
  env["PET_RESTART_POLICY"] = "inplace";
  env["PET_MAX_RESTARTS"] = "1";
  CHECK(Ok({S().Path("train.py")}, env).options.policy.restart_policy ==
        rendezvous::RestartPolicy::kInplace);
  // An unknown value names the choices; so does the variable.
  CHECK_THAT(Err({"--restart_policy=in-place", S().Path("train.py")}),
             Contains("must be job or inplace, got 'in-place'"));
  Env bad = BaseEnv();
  bad["PET_RESTART_POLICY"] = "node";
  CHECK_THAT(Err({S().Path("train.py")}, bad), Contains("PET_RESTART_POLICY"));
  // inplace restarts count against --max_restarts: none allowed is refused.
  CHECK_THAT(Err({"--restart_policy=inplace", S().Path("train.py")}),
             Contains("--restart_policy=inplace needs --max_restarts >= 1"));
  CHECK_THAT(Err({"--restart_policy=inplace", "--max_restarts=0", S().Path("train.py")}),
             Contains("pass --max_restarts=N"));
}

TEST_CASE("--ckpt_replicas is a JobPolicy field: 0 by default", "[unit]") {
  CHECK(Ok({S().Path("train.py")}).options.policy.ckpt_replicas == 0);
  CHECK(Ok({"--ckpt_replicas", "1", S().Path("train.py")}).options.policy.ckpt_replicas == 1);
  Env env = BaseEnv();
  env["PET_CKPT_REPLICAS"] = "1";
  CHECK(Ok({S().Path("train.py")}, env).options.policy.ckpt_replicas == 1);
  CHECK_THAT(Err({"--ckpt_replicas", "2", S().Path("train.py")}), Contains("0 or 1"));
}

TEST_CASE("--ckpt_encrypt is a JobPolicy field: 1 by default", "[unit]") {
  CHECK(Ok({S().Path("train.py")}).options.policy.ckpt_encrypt == 1);
  CHECK(Ok({"--ckpt_encrypt", "0", S().Path("train.py")}).options.policy.ckpt_encrypt == 0);
  Env env = BaseEnv();
  env["PET_CKPT_ENCRYPT"] = "0";
  CHECK(Ok({S().Path("train.py")}, env).options.policy.ckpt_encrypt == 0);
  CHECK_THAT(Err({"--ckpt_encrypt", "yes", S().Path("train.py")}), Contains("0 or 1"));
  env["PET_CKPT_ENCRYPT"] = "2";
  CHECK_THAT(Err({S().Path("train.py")}, env), Contains("PET_CKPT_ENCRYPT"));
}

TEST_CASE("--ckpt_bandwidth: bytes per second, 0 (no limit) by default", "[unit]") {
  CHECK(Ok({S().Path("train.py")}).options.ckpt_bandwidth == 0);
  CHECK(Ok({"--ckpt_bandwidth", "256MiB", S().Path("train.py")}).options.ckpt_bandwidth ==
        std::uint64_t{256} << 20);
  Env env = BaseEnv();
  env["PET_CKPT_BANDWIDTH"] = "1GiB";
  CHECK(Ok({S().Path("train.py")}, env).options.ckpt_bandwidth == std::uint64_t{1} << 30);
  CHECK_THAT(Err({"--ckpt_bandwidth", "fast", S().Path("train.py")}),
             Contains("--ckpt_bandwidth"));
}

}  // namespace ddprun::launcher
