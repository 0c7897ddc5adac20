// Worker failures: restarts within --max_restarts, the failure report, and
// workers killed by a signal.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

TEST_CASE("a worker failure restarts the job once with --max_restarts=1", "[multiproc]") {
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string pids = h.PidDir("pids");
  // Global rank 1 exits 7, but only in the first attempt (restart count 0).
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=3", "--max_restarts=1", FixtureWorker()},
                          {{"FIXTURE_OUT_DIR", out},
                           {"FIXTURE_PIDFILE_DIR", pids},
                           {"FIXTURE_FAIL_RANK", "1"},
                           {"FIXTURE_FAIL_ONLY_RESTART", "0"},
                           {"FIXTURE_EXIT_CODE", "7"}});
  const int rc = h.Wait(p, 20);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  REQUIRE(rc == 0);

  const std::vector<Record> all = ReadRecords(out);
  std::set<long> rounds;
  for (const Record& r : all) rounds.insert(r.round);
  REQUIRE(rounds.size() == 2);  // two attempts, each in its own rendezvous round
  const long first = *rounds.begin();
  const long second = *rounds.rbegin();

  // The first attempt: rank 1 ran (and failed) with restart count 0.
  bool saw_failing = false;
  for (const Record& r : RecordsOfRound(all, first)) {
    CHECK(r.Int("restart_count") == 0);
    if (r.Int("rank") == 1) saw_failing = true;
  }
  CHECK(saw_failing);

  // The second attempt: every worker, restart count 1.
  const std::vector<Record> again = RecordsOfRound(all, second);
  REQUIRE(again.size() == 3);
  std::set<long> ranks;
  for (const Record& r : again) {
    INFO(r.file);
    ranks.insert(r.Int("rank"));
    CHECK(r.Int("restart_count") == 1);
    CHECK(r.Int("world_size") == 3);
  }
  CHECK(ranks == std::set<long>{0, 1, 2});
  CHECK(err.find("exit code 7") != std::string::npos);
  CHECK(err.find("failed:") == std::string::npos);  // no failure report: the job succeeded
  h.RequireAllGone(pids, 2);
}

TEST_CASE("with --max_restarts=0 a worker failure ends the job with a report", "[multiproc]") {
  Harness h;
  const std::string out = h.MakeDir("out");
  const std::string pids = h.PidDir("pids");
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=3", "--max_restarts=0", FixtureWorker()},
                          {{"FIXTURE_OUT_DIR", out},
                           {"FIXTURE_PIDFILE_DIR", pids},
                           {"FIXTURE_FAIL_RANK", "2"},
                           {"FIXTURE_EXIT_CODE", "7"}});
  const int rc = h.Wait(p, 20);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  CHECK(rc == 1);
  // The report names the host, the global and local rank, and the exit code.
  CHECK(err.find("failed: worker rank 2 (local rank 2) on 127.0.0.1 exited with exit code 7") !=
        std::string::npos);
  CHECK(err.find("first failure") != std::string::npos);
  // Only one attempt ran.
  std::set<long> rounds;
  for (const Record& r : ReadRecords(out)) rounds.insert(r.round);
  CHECK(rounds.size() == 1);
  h.RequireAllGone(pids, 2);
}

TEST_CASE("a worker killed by SIGSEGV is reported with the signal name", "[multiproc]") {
  Harness h;
  const std::string pids = h.PidDir("pids");
  Proc& p = h.StartDdprun(
      "ddprun", {"--nproc_per_node=2", FixtureWorker()},
      {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_FAIL_RANK", "1"}, {"FIXTURE_CRASH_SIGNAL", "11"}});
  const int rc = h.Wait(p, 20);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  CHECK(rc == 1);
  CHECK(err.find("worker rank 1 (local rank 1) on 127.0.0.1 exited with signal SIGSEGV") !=
        std::string::npos);
  h.RequireAllGone(pids, 2);
}

TEST_CASE("a multi-node job restarts every node once, and the restart count agrees",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  std::vector<Proc*> agents;
  std::vector<std::string> outs, pid_dirs;
  // Node 0 (group rank 0 via --node_rank) runs global rank 0, which fails in
  // the first attempt; node 1's workers sleep, so they are still running when
  // the restart comes and both nodes take part in the second attempt.
  for (int i = 0; i < 2; ++i) {
    outs.push_back(h.MakeDir("out" + std::to_string(i)));
    pid_dirs.push_back(h.PidDir("pids" + std::to_string(i)));
    agents.push_back(&h.StartDdprun(
        "node" + std::to_string(i),
        {"--nnodes=2", "--nproc_per_node=2", "--max_restarts=1",
         "--local_addr=127.0.0." + std::to_string(i + 1),
         "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=restartjob",
         "--node_rank=" + std::to_string(i), "--rdzv_conf=join_timeout=20", FixtureWorker()},
        {{"FIXTURE_OUT_DIR", outs.back()},
         {"FIXTURE_PIDFILE_DIR", pid_dirs.back()},
         {"FIXTURE_FAIL_RANK", "0"},
         {"FIXTURE_FAIL_ONLY_RESTART", "0"},
         {"FIXTURE_EXIT_CODE", "5"},
         {"FIXTURE_SLEEP_MS", i == 0 ? "0" : "1000"}}));
  }
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 30);
    INFO(a->name << " stderr:\n" << a->Err());
    CHECK(rc == 0);
  }
  std::set<long> ranks;
  for (const std::string& out : outs) {
    const std::vector<Record> all = ReadRecords(out);
    long last = -1;
    for (const Record& r : all) last = std::max(last, r.round);
    for (const Record& r : RecordsOfRound(all, last)) {
      INFO(r.file);
      CHECK(r.Int("restart_count") == 1);
      CHECK(r.Int("world_size") == 4);
      ranks.insert(r.Int("rank"));
    }
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  for (const std::string& d : pid_dirs) h.RequireAllGone(d, 2);
  h.StopDaemon(*daemon);
}

// Issue 33 item 7: two ranks that each fail at once are both in the report,
// not only the first (the agent waits kFailureSettle for the node's other
// workers before it stops them). Run as in the reproduction, several times:
// the race it guards against lost the second rank in 3 of 4 runs.
TEST_CASE("two workers that fail on their own are both in the failure report", "[multiproc]") {
  Harness h;
  const std::string script = h.Script("fail.sh", "#!/bin/sh\nexit $((5+LOCAL_RANK))\n");
  for (int attempt = 0; attempt < 3; ++attempt) {
    Proc& p = h.StartDdprun("ddprun" + std::to_string(attempt), {"--nproc_per_node=2", script});
    const int rc = h.Wait(p, 20);
    const std::string err = p.Err();
    INFO("attempt " << attempt << ", stderr:\n" << err);
    CHECK(rc == 1);
    CHECK(err.find("worker rank 0 (local rank 0) on 127.0.0.1 exited with exit code 5") !=
          std::string::npos);
    CHECK(err.find("worker rank 1 (local rank 1) on 127.0.0.1 exited with exit code 6") !=
          std::string::npos);
    CHECK(err.find("SIGTERM") == std::string::npos);  // neither was stopped by the agent
  }
}

// Issue 33 item 4: workers that die with ModuleNotFoundError get a report
// that points at their interpreter and the fix.
TEST_CASE("a worker's ModuleNotFoundError points the report at the interpreter", "[multiproc]") {
  Harness h;
  const std::string script = h.Script("train.py", "import torch\n");
  const std::string python =
      h.Script("python3-notorch", "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n");
  Proc& p = h.StartDdprun("ddprun", {"--nproc_per_node=2", script}, {{"PYTHON_EXEC", python}});
  const int rc = h.Wait(p, 30);
  const std::string err = p.Err();
  INFO("stderr:\n" << err);
  CHECK(rc == 1);
  CHECK(err.find("ModuleNotFoundError") != std::string::npos);
  CHECK(err.find("the workers' Python (" + python + ") cannot import 'torch'; set PYTHON_EXEC") !=
        std::string::npos);
}
