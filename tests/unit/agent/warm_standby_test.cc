// WarmStandby's decisions without a process (warm_standby.h): which
// commands it runs, what its own spawn holds (not a rank's descriptors and
// files), and which rank specs it must refuse (they start cold). The
// standby's real hand-over is tested end to end in tests/e2e/inplace_test.cc.
#include "ddprun/agent/warm_standby.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace ddprun::agent {
namespace {

class Child final : public ChildProcess {
 public:
  pid_t pid() const override { return 4242; }
  std::optional<ExitStatus> Poll() override { return exit_; }
  void SignalGroup(int sig) override { exit_ = ExitStatus{0, sig}; }

 private:
  std::optional<ExitStatus> exit_;
};

class Launcher final : public ProcessLauncher {
 public:
  absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnSpec& spec) override {
    spawns.push_back(spec);
    return std::unique_ptr<ChildProcess>(std::make_unique<Child>());
  }
  std::vector<SpawnSpec> spawns;
};

SpawnSpec RankSpec(int rank) {
  SpawnSpec s;
  s.argv = {"/usr/bin/python3", "-u", "/job/train.py", "--lr", "0.1"};
  s.env = {{"PATH", "/usr/bin"},
           {"PYTHONPATH", "/hook:/job"},
           {"OMP_NUM_THREADS", "1"},
           {"RANK", std::to_string(rank)},
           {"LOCAL_RANK", std::to_string(rank)},
           {"TORCHELASTIC_RESTART_COUNT", "1"},
           {"DDPRUN_METRICS_FILE", "/proc/1/fd/16"},
           {"DDPRUN_STACK_FILE", "/proc/1/fd/17"},
           {"DDPRUN_CKPT_FD", "9"},
           {"DDPRUN_CKPT_STEPS", "4"},
           {"DDPRUN_INPLACE_FD", "11"}};
  s.inherit_fds = {9, 11};
  return s;
}

TEST_CASE("WarmStandby runs only Python entrypoints as ddprun builds them", "[unit]") {
  CHECK(WarmStandby::Supports({"/usr/bin/python3", "-u", "train.py"}));
  CHECK(WarmStandby::Supports({"python3", "-u", "-m", "pkg.train", "--x"}));
  CHECK_FALSE(WarmStandby::Supports({"./train.sh"}));                 // --no_python
  CHECK_FALSE(WarmStandby::Supports({"python3", "-u", "job_dir"}));   // a directory
  CHECK_FALSE(WarmStandby::Supports({"python3", "-u", "-m"}));        // no module
  CHECK_FALSE(WarmStandby::Supports({"python3", "train.py", "-u"}));  // not ddprun's form
}

TEST_CASE("WarmStandby's own spawn holds no rank's descriptors, files or output", "[unit]") {
  Launcher launcher;
  std::vector<std::string> said;
  WarmStandby standby(launcher, "torch,numpy",
                      [&said](const std::string& m) { said.push_back(m); });
  REQUIRE(standby.Start(RankSpec(0), {9, 10, 11, 12}).ok());
  REQUIRE(launcher.spawns.size() == 1);
  const SpawnSpec& s = launcher.spawns[0];
  REQUIRE(s.argv.size() == 7);
  CHECK(s.argv[0] == "/usr/bin/python3");
  CHECK(s.argv[1] == "-u");
  CHECK(s.argv[2] == "-c");
  CHECK(s.inherit_fds == std::vector<int>{std::stoi(s.argv[4])});  // its socket, nothing else
  CHECK(s.argv[5] == "9,10,11,12");
  CHECK(s.argv[6] == "torch,numpy");
  // No rank's: a tool reading /proc/<pid>/environ must not take it for a worker.
  for (const char* name : {"DDPRUN_METRICS_FILE", "DDPRUN_STACK_FILE", "DDPRUN_CKPT_FD",
                           "DDPRUN_CKPT_STEPS", "DDPRUN_INPLACE_FD", "RANK", "LOCAL_RANK"}) {
    CHECK(s.env.count(name) == 0);
  }
  CHECK(s.env.at("PYTHONPATH") == "/hook:/job");
  CHECK(s.env.at(kEnvWarmRoom).size() > 1024);  // room for a rank's environment
  CHECK(s.stdout_path == "/dev/null");
  CHECK(s.stderr_path == "/dev/null");
  CHECK(standby.Alive());
  CHECK_FALSE(standby.Ready());  // no line from it yet
  // A second Start while one is alive starts nothing.
  REQUIRE(standby.Start(RankSpec(0), {9}).ok());
  CHECK(launcher.spawns.size() == 1);
  CHECK(said.empty());
}

TEST_CASE("WarmStandby refuses a rank that a cold start would start differently", "[unit]") {
  Launcher launcher;
  WarmStandby standby(launcher, "torch", [](const std::string&) {});
  CHECK(standby.Mismatch(RankSpec(1)) == "no standby");
  REQUIRE(standby.Start(RankSpec(0), {9, 11}).ok());
  // Another rank, round and arguments: the standby can become it.
  SpawnSpec other = RankSpec(3);
  other.argv = {"/usr/bin/python3", "-u", "/job/other.py"};
  CHECK(standby.Mismatch(other) == "");

  SpawnSpec s = RankSpec(1);
  s.env["PYTHONPATH"] = "/elsewhere";  // read when the interpreter starts
  CHECK(standby.Mismatch(s) == "PYTHONPATH differs");
  s = RankSpec(1);
  s.env["OMP_NUM_THREADS"] = "4";  // read when libgomp loads
  CHECK(standby.Mismatch(s) == "OMP_NUM_THREADS differs");
  s = RankSpec(1);
  s.env["LANG"] = "C.UTF-8";  // absent from the standby's
  CHECK(standby.Mismatch(s) == "LANG differs");
  s = RankSpec(1);
  s.argv[0] = "/opt/venv/bin/python3";
  CHECK(standby.Mismatch(s) == "another interpreter");
  s = RankSpec(1);
  s.inherit_fds.push_back(13);
  CHECK(standby.Mismatch(s) == "descriptor 13 was not reserved");
  // Stop kills its group; it is gone.
  standby.Stop();
  CHECK_FALSE(standby.Alive());
}

}  // namespace
}  // namespace ddprun::agent
