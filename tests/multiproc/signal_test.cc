// Signals to ddprun: forwarded to every worker's process group, the grace
// period before SIGKILL, and PDEATHSIG when ddprun itself is SIGKILLed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

constexpr int kNproc = 3;

// Sends sig to a ddprun whose workers hang; ddprun must exit 128+sig quickly
// and take every worker with it.
void ForwardsSignal(int sig) {
  Harness h;
  const std::string pids = h.PidDir("pids");
  Proc& p = h.StartDdprun(
      "ddprun",
      {"--nproc_per_node=" + std::to_string(kNproc), "--grace_period=10", FixtureWorker()},
      {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_HANG", "1"}});
  const std::vector<pid_t> workers = h.WaitForPids(pids, kNproc, 10);
  REQUIRE(::kill(p.pid, sig) == 0);
  const auto t0 = Clock::now();
  const int rc = h.Wait(p, 10);
  const double took = SecondsSince(t0);
  INFO("stderr:\n" << p.Err());
  CHECK(rc == 128 + sig);
  // The workers die of the signal itself, well before --grace_period.
  CHECK(took < 3.0);
  h.RequireAllGone(pids, 1);
}

}  // namespace

TEST_CASE("SIGTERM to ddprun reaches every worker; ddprun exits 143", "[multiproc]") {
  ForwardsSignal(SIGTERM);
}

TEST_CASE("SIGINT to ddprun reaches every worker; ddprun exits 130", "[multiproc]") {
  ForwardsSignal(SIGINT);
}

TEST_CASE("workers that ignore SIGTERM are SIGKILLed after --grace_period", "[multiproc]") {
  Harness h;
  const std::string pids = h.PidDir("pids");
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=2", "--grace_period=1", FixtureWorker()},
      {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_HANG", "1"}, {"FIXTURE_IGNORE_TERM", "1"}});
  const std::vector<pid_t> workers = h.WaitForPids(pids, 2, 10);
  // The fixture writes its pid file before it ignores SIGTERM: wait for that.
  const auto w0 = Clock::now();
  for (pid_t w : workers) {
    while (!IgnoresSigterm(w) && SecondsSince(w0) < 5) SleepMs(5);
    REQUIRE(IgnoresSigterm(w));
  }
  REQUIRE(::kill(p.pid, SIGTERM) == 0);
  const auto t0 = Clock::now();
  const int rc = h.Wait(p, 10);
  const double took = SecondsSince(t0);
  INFO("stderr:\n" << p.Err() << "took " << took << " s");
  CHECK(rc == 143);
  CHECK(took >= 0.9);  // the workers survived SIGTERM for the grace period
  CHECK(took < 3.0);   // and were then killed
  h.RequireAllGone(pids, 1);
}

TEST_CASE("kill -9 of ddprun leaves no worker alive (PDEATHSIG)", "[multiproc]") {
  Harness h;
  const std::string pids = h.PidDir("pids");
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=3", FixtureWorker()},
                          {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_HANG", "1"}});
  h.WaitForPids(pids, 3, 10);
  // Everything ddprun started (workers, helpers) must go with it.
  const std::vector<pid_t> descendants = Descendants(p.pid);
  CHECK(descendants.size() >= 3);
  REQUIRE(::kill(p.pid, SIGKILL) == 0);
  CHECK(h.Wait(p, 5) == 128 + SIGKILL);
  h.RequireAllGone(pids, 2);
  h.RequireAllGone(descendants, 2);
}

TEST_CASE("kill -9 of ddprun also kills the workers' own children", "[multiproc]") {
  Harness h;
  const std::string pids = h.PidDir("pids");
  // PDEATHSIG reaches only the direct workers (the shells); the background
  // fixture_workers need the agent's orphan guard to kill their process group.
  const std::string script =
      "echo $$ > \"$FIXTURE_PIDFILE_DIR/sh$LOCAL_RANK.pid\"; '" + FixtureWorker() + "' & wait";
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", "--no_python", "/bin/sh", "-c", script},
                          {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_HANG", "1"}});
  h.WaitForPids(pids, 4, 10);
  const std::vector<pid_t> descendants = Descendants(p.pid);
  REQUIRE(::kill(p.pid, SIGKILL) == 0);
  CHECK(h.Wait(p, 5) == 128 + SIGKILL);
  h.RequireAllGone(pids, 2);
  h.RequireAllGone(descendants, 2);
}

TEST_CASE("kill -9 of ddprun: its guard removes the temporary error-file directory",
          "[multiproc]") {
  Harness h;
  const std::string pids = h.PidDir("pids");
  const std::string tmp = h.MakeDir("tmp");
  // Each worker writes its error file (as torch's @record would) and hangs.
  const std::string script =
      "echo '{}' > \"$TORCHELASTIC_ERROR_FILE\"; exec '" + FixtureWorker() + "'";
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", "--no_python", "/bin/sh", "-c", script},
                          {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_HANG", "1"}, {"TMPDIR", tmp}});
  h.WaitForPids(pids, 2, 10);
  auto entries = [](const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      names.push_back(e.path().filename().string());
    }
    return names;
  };
  const std::vector<std::string> made = entries(tmp);
  REQUIRE(made.size() == 1);  // ddprun_XXXXXX
  CHECK(made[0].rfind("ddprun_", 0) == 0);
  CHECK(entries(tmp + "/" + made[0]).size() == 2);  // the two error files, flat
  REQUIRE(::kill(p.pid, SIGKILL) == 0);
  CHECK(h.Wait(p, 5) == 128 + SIGKILL);
  h.RequireAllGone(pids, 2);
  const auto t0 = Clock::now();
  while (!entries(tmp).empty() && SecondsSince(t0) < 2) SleepMs(5);
  INFO("left in TMPDIR: " << (entries(tmp).empty() ? "" : entries(tmp)[0]));
  CHECK(entries(tmp).empty());
}

TEST_CASE("SIGTERM also kills a worker's own children (its process group)", "[multiproc]") {
  Harness h;
  const std::string pids = h.PidDir("pids");
  // Each worker is a shell that records its pid and waits on a background
  // fixture_worker, whose pid file records the grandchild's pid. PDEATHSIG
  // does not cover the grandchild; only the process-group kill does.
  const std::string script =
      "echo $$ > \"$FIXTURE_PIDFILE_DIR/sh$LOCAL_RANK.pid\"; '" + FixtureWorker() + "' & wait";
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=2", "--grace_period=10", "--no_python", "/bin/sh", "-c", script},
      {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_HANG", "1"}});
  const std::vector<pid_t> all = h.WaitForPids(pids, 4, 10);  // 2 shells + 2 fixtures
  REQUIRE(all.size() == 4);
  REQUIRE(::kill(p.pid, SIGTERM) == 0);
  const auto t0 = Clock::now();
  const int rc = h.Wait(p, 10);
  INFO("stderr:\n" << p.Err());
  CHECK(rc == 143);
  CHECK(SecondsSince(t0) < 3.0);
  h.RequireAllGone(pids, 2);
}

// Issue 33 item 19: what an agent killed before it could clean up left
// behind (ddprun_<pid>_XXXXXX of a pid that no longer runs, empty or with
// error files only) is removed by the next ddprun using that TMPDIR; a live
// agent's directory, and one holding anything else, are kept.
TEST_CASE("the next ddprun removes a dead agent's empty temporary directory", "[multiproc]") {
  Harness h;
  const std::string tmp = h.MakeDir("tmp");
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  REQUIRE(dead > 0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const std::string d = std::to_string(dead);
  const std::string empty = tmp + "/ddprun_" + d + "_aaaaaa";
  const std::string errors = tmp + "/ddprun_" + d + "_bbbbbb";
  const std::string logs = tmp + "/ddprun_" + d + "_cccccc";
  const std::string live = tmp + "/ddprun_" + std::to_string(::getpid()) + "_dddddd";
  for (const std::string& dir : {empty, errors, logs, live}) {
    REQUIRE(std::filesystem::create_directory(dir));
  }
  std::ofstream(errors + "/attempt_0_rank_1_error.json") << "{}";
  std::ofstream(logs + "/stdout.log") << "kept\n";
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=1", "--no_python", "/bin/true"},
                          {{"TMPDIR", tmp}});
  CHECK(h.Wait(p, 20) == 0);
  INFO("stderr:\n" << p.Err());
  CHECK_FALSE(std::filesystem::exists(empty));
  CHECK_FALSE(std::filesystem::exists(errors));
  CHECK(std::filesystem::exists(logs + "/stdout.log"));
  CHECK(std::filesystem::exists(live));
  // Its own directory is gone too (a normal exit), so exactly these two remain.
  std::size_t left = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp)) {
    (void)e;
    ++left;
  }
  CHECK(left == 2);
}
