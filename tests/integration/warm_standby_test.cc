// The warm standby (warm_standby.h) over the real launcher and a real
// interpreter, without torch: its imports gated by a FIFO, so that the test
// decides when they end. A rank handed over while the standby still imports
// runs once the imports end, with the rank's environment, argv, output file
// and inherited descriptor (before the fix, the standby's "ready" line to
// the socket the agent had closed killed it, exit 1, silently).
#include "ddprun/agent/warm_standby.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/process_helpers.h"
#include "support/skip.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
const std::string kPython = "/usr/bin/python3";

// Polls until `done` holds, up to 20 s (an interpreter starting on a busy
// machine).
template <typename F>
bool WaitFor(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

struct Dir {
  Dir() {
    char t[] = "/tmp/ddprun_warm_test_XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    path = t;
  }
  ~Dir() { fs::remove_all(path); }
  std::string path;
};

// A standby that imports `modules`, over the real launcher, and the lines it
// said (each the agent would print).
struct SaidStandby {
  explicit SaidStandby(const std::string& modules)
      : launcher(MakeBoostProcessLauncher()),
        standby(*launcher, modules, [this](const std::string& m) { said.push_back(m); }) {}
  std::unique_ptr<ProcessLauncher> launcher;
  std::vector<std::string> said;
  WarmStandby standby;
};

SpawnSpec Like(const std::string& dir) {
  SpawnSpec s;
  s.argv = {kPython, "-u", dir + "/script.py"};
  s.env = {{"PATH", "/usr/bin:/bin"}, {"PYTHONPATH", dir}, {"WARM_GATE", dir + "/gate"}};
  return s;
}

TEST_CASE(
    "warm standby: a rank handed over while it still imports runs once the imports end, as the "
    "rank",
    "[integration]") {
  if (::access(kPython.c_str(), X_OK) != 0)
    return test::SkipCase("integration", kPython + " missing");
  Dir dir;
  std::ofstream(dir.path + "/warm_gate.py")
      << "import os\nopen(os.environ['WARM_GATE']).read()  # blocks until the test writes\n";
  std::ofstream(dir.path + "/script.py")
      << "import os, sys\n"
         "fd = int(os.environ['HELD_FD'])\n"
         "print('rank', os.environ['RANK'], 'argv', sys.argv[1:], 'main', __name__,\n"
         "      'fd', os.pread(fd, 5, 0).decode(), os.get_inheritable(fd),\n"
         "      'gate' + ('' if 'warm_gate' in sys.modules else ' not'), 'imported')\n";
  REQUIRE(::mkfifo((dir.path + "/gate").c_str(), 0600) == 0);
  // A descriptor the worker inherits, under a number the standby reserves.
  const int held = ::memfd_create("warm-test", MFD_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::pwrite(held, "hello", 5, 0) == 5);

  SaidStandby s("warm_gate");
  WarmStandby& standby = s.standby;
  REQUIRE(standby.Start(Like(dir.path), {held}).ok());
  REQUIRE(standby.Alive());
  const pid_t pid = standby.pid();
  CHECK_FALSE(standby.Ready());  // the gate holds its imports

  SpawnSpec rank = Like(dir.path);
  rank.argv.push_back("--lr=0.1");
  rank.env["RANK"] = "3";
  rank.env["HELD_FD"] = std::to_string(held);
  rank.inherit_fds = {held};
  rank.stdout_path = dir.path + "/out.log";
  rank.stderr_path = dir.path + "/out.log";
  auto child = standby.Activate(rank);
  REQUIRE(child.ok());
  CHECK((*child)->pid() == pid);
  CHECK_FALSE(standby.Alive());  // it is the worker now

  // The imports end now.
  {
    std::ofstream gate(dir.path + "/gate");
    gate << "open\n";
  }
  std::optional<ExitStatus> exit;
  REQUIRE(WaitFor([&] { return (exit = (*child)->Poll()).has_value(); }));
  INFO(test::ReadFile(dir.path + "/out.log"));
  CHECK(exit->ok());
  CHECK(test::ReadFile(dir.path + "/out.log") ==
        "rank 3 argv ['--lr=0.1'] main __main__ fd hello True gate imported\n");
  CHECK(s.said.empty());
  ::close(held);
}

TEST_CASE(
    "warm standby: says it is ready once imported, names a module it could not import, "
    "and is gone after Stop",
    "[integration]") {
  if (::access(kPython.c_str(), X_OK) != 0)
    return test::SkipCase("integration", kPython + " missing");
  Dir dir;
  SaidStandby s("json,no_such_module_xyz");
  WarmStandby& standby = s.standby;
  const std::vector<std::string>& said = s.said;
  REQUIRE(standby.Start(Like(dir.path), {}).ok());
  const pid_t pid = standby.pid();
  REQUIRE(WaitFor([&] { return standby.Ready(); }));
  REQUIRE(said.size() == 1);
  CHECK_THAT(said[0], Catch::Contains("could not import no_such_module_xyz (ModuleNotFoundError"));
  CHECK_THAT(said[0], Catch::Contains("check --warm_modules"));
  standby.Stop();
  CHECK_FALSE(standby.Alive());
  CHECK(::kill(pid, 0) != 0);  // killed and reaped
}

}  // namespace
}  // namespace ddprun::agent
