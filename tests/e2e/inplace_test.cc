// --restart_policy=inplace end to end (docs/recovery.md): a real 4-rank
// PyTorch DDP job (gloo) under ddprun.inprocess.run, checkpointed with
// ddprun.checkpoint every step (tests/fixtures/inplace_ddp.py). A SIGKILLed
// rank is restarted alone: the survivors keep their processes (pids checked
// per attempt), every rank resumes at the same step, and the final
// parameters are bit-identical to a run without the failure. An unchanged
// script is restarted as processes, with one line per worker; a second
// failure during the recovery converges. The replacement starts warm
// (--warm_modules, warm_standby.h) and sees what a cold start sees.
#include <signal.h>

#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here
const std::string kPythonDir = std::string(DDPRUN_BIN_DIR) + "/../python";
const std::string kScript = std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/inplace_ddp.py";
constexpr int kRanks = 4;

bool TorchAvailable() {
  return std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) == 0;
}

// One call of train(): "<restart count> <pid> <first step>".
struct Attempt {
  int restart = 0;
  long pid = 0;
  int start = 0;
};

std::vector<Attempt> Attempts(const std::string& out, int rank) {
  std::vector<Attempt> v;
  std::istringstream in(ReadFile(out + "/rank" + std::to_string(rank) + ".attempts"));
  Attempt a;
  while (in >> a.restart >> a.pid >> a.start) v.push_back(a);
  return v;
}

// Whether every rank logged a step >= `step` in attempt `restart`
// (EVENTS=1: "<t> <rank> step <restart> <step>" lines in OUT_DIR/events).
bool AllRanksPast(const std::string& out, int restart, int step) {
  std::set<std::string> ranks;
  std::istringstream in(ReadFile(out + "/events"));
  std::string t, rank, name, r, st;
  while (in >> t >> rank >> name >> r >> st) {
    if (name == "step" && std::stoi(r) == restart && std::stoi(st) >= step) ranks.insert(rank);
  }
  return ranks.size() == kRanks;
}

// The environment of a run of the script writing into `out`, plus `extra`.
EnvList ScriptEnv(const std::string& out, const EnvList& extra = {}) {
  EnvList env{{"PYTHON_EXEC", kPython}, {"PYTHONPATH", kPythonDir}, {"OUT_DIR", out}};
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Each rank called train() twice, the second time from step `resumed_at`:
// rank `replaced` in a new process, every other rank in the one it had.
void CheckReplacedAlone(const std::vector<std::vector<Attempt>>& by_rank, int replaced,
                        int resumed_at) {
  REQUIRE(by_rank.size() == kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::vector<Attempt>& a = by_rank[rank];
    INFO("rank " << rank);
    REQUIRE(a.size() == 2);
    CHECK(a[1].start == resumed_at);
    if (rank == replaced) {
      CHECK(a[1].pid != a[0].pid);  // the failed rank: a new process
    } else {
      CHECK(a[1].pid == a[0].pid);  // a survivor: the same process
    }
  }
}

std::vector<std::vector<Attempt>> AttemptsByRank(const std::string& out) {
  std::vector<std::vector<Attempt>> v;
  for (int rank = 0; rank < kRanks; ++rank) v.push_back(Attempts(out, rank));
  return v;
}

struct Run {
  std::string out;
  std::string console;
};

Run Train(Harness& h, const std::string& name, const std::vector<std::string>& flags,
          const EnvList& extra) {
  Run r;
  r.out = h.MakeDir(name);
  const EnvList env = ScriptEnv(r.out, extra);
  std::vector<std::string> args{"--nproc_per_node=" + std::to_string(kRanks), "--rdzv_id=" + name};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back(kScript);
  Proc& p = h.StartDdprun(name, args, env);
  const int rc = h.Wait(p, 240);
  r.console = p.Out() + p.Err();
  INFO(name << ":\n" << r.console);
  REQUIRE(rc == 0);
  return r;
}

// The final parameters of a run without faults (once per test program).
std::string CleanParams(Harness& h) {
  static std::string params;
  if (!params.empty()) return params;
  const Run clean = Train(h, "clean", {"--restart_policy=inplace", "--max_restarts=1"}, {});
  params = ReadFile(clean.out + "/params.bin");
  REQUIRE(params.size() == (16 * 4 + 4) * 4);
  return params;
}

// What train() started with (tests/fixtures/inplace_ddp.py, ENV_DUMP), with
// what differs between any two runs masked: the run's directory and job,
// the agent's pid in paths, the ports and the store token drawn per run.
std::string StartDump(const Run& run, const std::string& job, const std::string& file) {
  std::string text = ReadFile(run.out + "/" + file);
  auto replace_all = [&text](const std::string& from, const std::string& to) {
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
      text.replace(at, from.size(), to);
      at += to.size();
    }
  };
  replace_all(run.out, "OUT");
  replace_all(job, "JOB");
  text = std::regex_replace(text, std::regex("/proc/[0-9]+/"), "/proc/AGENT/");
  text = std::regex_replace(text, std::regex("ddprun_[0-9]+_[A-Za-z0-9]+"), "ddprun_AGENT_TMP");
  text = std::regex_replace(
      text, std::regex("env (MASTER_PORT|DDPRUN_STORE_ADDR|DDPRUN_TCPSTORE_ADDR|DDPRUN_TOKEN)=.*"),
      "env $1=(per run)");
  return text;
}

// The kill of rank 1 before step 5, every call of train() dumping what it
// starts with (ENV_DUMP), kept by value (a Harness removes its directories
// at the end of its test case).
struct KillRun {
  std::string console;
  std::vector<std::vector<Attempt>> attempts;  // by rank
  std::string attempts_text;
  std::string params;
  std::string start_dump;  // rank 1's second call of train(), StartDump
};

KillRun RunKill(Harness& h, const std::string& name, const std::vector<std::string>& extra_flags) {
  std::vector<std::string> flags{"--restart_policy=inplace", "--max_restarts=2"};
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  const Run run = Train(h, name, flags, {{"KILL_RANK", "1"}, {"KILL_AT", "5"}, {"ENV_DUMP", "1"}});
  KillRun k;
  k.console = run.console;
  k.attempts = AttemptsByRank(run.out);
  for (int rank = 0; rank < kRanks; ++rank) {
    k.attempts_text += ReadFile(run.out + "/rank" + std::to_string(rank) + ".attempts");
  }
  k.params = ReadFile(run.out + "/params.bin");
  k.start_dump = StartDump(run, name, "rank1.env1");
  return k;
}

// The run with the replacement started warm (the default --warm_modules),
// once per test program.
const KillRun& WarmKill(Harness& h) {
  static const KillRun run = RunKill(h, "inplace1", {});
  return run;
}

}  // namespace

TEST_CASE(
    "inplace: a SIGKILLed rank is restarted alone; the survivors keep their pids, every rank "
    "resumes at the same step, and the parameters equal a run without the failure",
    "[e2e][inplace]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string clean = CleanParams(h);
  const KillRun& run = WarmKill(h);
  INFO(run.console);
  INFO(run.attempts_text);
  // Every rank resumes after step 4, the newest step all four committed.
  CheckReplacedAlone(run.attempts, 1, 5);
  for (const std::vector<Attempt>& a : run.attempts) {
    CHECK(a[0].restart == 0);
    CHECK(a[0].start == 0);
    CHECK(a[1].restart == 1);
  }
  CHECK(run.params == clean);
  // The survivors' lines, and the budget's "in place".
  CHECK_THAT(run.console, Catch::Contains("in place: rank(s) 0,2,3 keep their processes"));
  CHECK_THAT(run.console, Catch::Contains("re-formed in place into round 1"));
  CHECK(std::regex_search(run.console,
                          std::regex("\\[job inplace1 round 1\\] recovered in [0-9]+ ms: .*"
                                     "\\(in place: worker rank 1 exited with signal SIGKILL")));
  CHECK(run.console.find("never registered") == std::string::npos);
  // The replacement ran in the warm standby: its pid is the standby's.
  std::smatch warm;
  REQUIRE(std::regex_search(
      run.console, warm,
      std::regex("\\[job inplace1 round 1\\] in place: worker rank 1 starts warm, in the standby "
                 "\\(pid ([0-9]+), (modules imported|still importing)\\)")));
  CHECK(run.attempts[1][1].pid == std::stol(warm[1].str()));
}

TEST_CASE(
    "inplace: a warm replacement starts with what a cold one does: environment, argv, sys.path, "
    "__main__, its own process group, /proc/<pid>/environ, the inherited descriptors, the start-up "
    "hook",
    "[e2e][inplace]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const KillRun& warm = WarmKill(h);
  const KillRun cold = RunKill(h, "inplace_cold", {"--warm_modules=none"});
  INFO("warm:\n" << warm.console << "\ncold:\n" << cold.console);
  REQUIRE_THAT(warm.console, Catch::Contains("worker rank 1 starts warm"));
  CHECK(cold.console.find("starts warm") == std::string::npos);
  CHECK_THAT(warm.start_dump, Catch::Contains("env TORCHELASTIC_RESTART_COUNT=1\n"));
  CHECK_THAT(warm.start_dump, Catch::Contains("hook_counts_steps True\n"));
  CHECK_THAT(warm.start_dump, Catch::Contains("inherited DDPRUN_INPLACE_FD True\n"));
  CHECK_THAT(warm.start_dump, Catch::Contains("proc_environ_is_os_environ True\n"));
  CHECK(warm.start_dump == cold.start_dump);
  CHECK(warm.params == cold.params);
}

TEST_CASE(
    "inplace: an unchanged script (no ddprun.inprocess.run) is restarted as processes, one line "
    "per survivor, and still ends with the same parameters",
    "[e2e][inplace]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string clean = CleanParams(h);
  const Run run = Train(h, "plain1", {"--restart_policy=inplace", "--max_restarts=2"},
                        {{"KILL_RANK", "1"}, {"KILL_AT", "5"}, {"INPROCESS", "0"}});
  INFO(run.console);
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::vector<Attempt> a = Attempts(run.out, rank);
    REQUIRE(a.size() == 2);
    CHECK(a[1].pid != a[0].pid);
    CHECK(a[1].start == 5);
    if (rank != 1) {
      CHECK_THAT(run.console,
                 Catch::Contains("[job plain1 round 1] in place: worker rank " +
                                 std::to_string(rank) + " (pid " + std::to_string(a[0].pid) +
                                 ") never registered to re-form in its process"));
    }
  }
  CHECK(ReadFile(run.out + "/params.bin") == clean);
}

TEST_CASE(
    "inplace: a second worker that dies while the job re-forms converges: no deadlock, no rank "
    "twice, the same parameters",
    "[e2e][inplace]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string clean = CleanParams(h);
  const Run run = Train(h, "second1", {"--restart_policy=inplace", "--max_restarts=3"},
                        {{"KILL_RANK", "1"}, {"KILL_AT", "4"}, {"KILL2_RANK", "2"}});
  INFO(run.console);
  std::map<int, long> last_pid;
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::vector<Attempt> a = Attempts(run.out, rank);
    REQUIRE(a.size() >= 2);
    // One process per rank and attempt: restart counts never repeat.
    for (std::size_t i = 1; i < a.size(); ++i) CHECK(a[i].restart > a[i - 1].restart);
    last_pid[rank] = a.back().pid;
    CHECK(a.back().start <= 4);
  }
  // Rank 0 and 3 never failed: one process throughout.
  for (int rank : {0, 3}) {
    const std::vector<Attempt> a = Attempts(run.out, rank);
    CHECK(a.front().pid == a.back().pid);
  }
  CHECK(ReadFile(run.out + "/params.bin") == clean);
}

TEST_CASE(
    "inplace across nodes: ddprund and two agents; a worker killed on one node is restarted "
    "alone, the other node's workers keep their processes; then a lost node of this fixed-size "
    "job is replaced by a new agent at its address and the surviving node keeps its workers",
    "[e2e][inplace]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string clean = CleanParams(h);
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string out = h.MakeDir("nodes");
  // Slower steps (the parameters do not depend on them): room for the
  // second fault before the job ends.
  const EnvList env =
      ScriptEnv(out, {{"KILL_RANK", "1"}, {"KILL_AT", "5"}, {"STEP_S", "0.3"}, {"EVENTS", "1"}});
  auto node_args = [&](int i) {
    return std::vector<std::string>{"--nnodes=2",
                                    "--nproc_per_node=2",
                                    "--node_rank=" + std::to_string(i),
                                    "--local_addr=127.0.0." + std::to_string(i + 1),
                                    "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                    "--rdzv_id=nodes1",
                                    "--rdzv_conf=join_timeout=60",
                                    "--restart_policy=inplace",
                                    "--max_restarts=2",
                                    "--ckpt_replicas=1",
                                    kScript};
  };
  std::vector<Proc*> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(&h.StartDdprun("node" + std::to_string(i), node_args(i), env));
  // Recovered from the worker kill: every rank stepped past step 6 in attempt 1.
  const auto t0 = Clock::now();
  while (!AllRanksPast(out, 1, 6) && SecondsSince(t0) < 120) SleepMs(50);
  REQUIRE(AllRanksPast(out, 1, 6));
  // The second fault: node 1's agent is killed (its workers die with it),
  // and a new agent takes its seat at the same address.
  REQUIRE(::kill(nodes[1]->pid, SIGKILL) == 0);
  (void)h.Wait(*nodes[1], 10);
  Proc& replacement = h.StartDdprun("node1b", node_args(1), env);
  for (Proc* p : {nodes[0], &replacement}) {
    const int rc = h.Wait(*p, 240);
    INFO(p->name << ":\n" << p->Out() << p->Err());
    CHECK(rc == 0);
  }
  std::set<int> resumed;
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::vector<Attempt> a = Attempts(out, rank);
    INFO("rank " << rank << ":\n" << ReadFile(out + "/rank" + std::to_string(rank) + ".attempts"));
    REQUIRE(a.size() == 3);
    CHECK(a[1].start == 5);
    resumed.insert(a[2].start);
    if (rank == 1) {
      CHECK(a[1].pid != a[0].pid);
    } else {
      CHECK(a[1].pid == a[0].pid);  // ranks 2 and 3 run on the other node
    }
    if (rank < 2) {
      CHECK(a[2].pid == a[1].pid);  // node 0 survived the loss of node 1 in its processes
    } else {
      CHECK(a[2].pid != a[1].pid);  // node 1's ranks: the replacement's new processes
    }
  }
  // Every rank resumed from the same step, past the first recovery (node
  // 1's seat restored from its replica on node 0).
  REQUIRE(resumed.size() == 1);
  CHECK(*resumed.begin() > 5);
  // The node without the failure heard of it from the rendezvous and kept its workers.
  CHECK_THAT(nodes[1]->Err(), Catch::Contains("re-forming in place (--restart_policy=inplace)"));
  CHECK_THAT(nodes[1]->Err(), Catch::Contains("in place: rank(s) 2,3 keep their processes"));
  CHECK_THAT(nodes[0]->Err(), Catch::Contains("was lost"));
  CHECK(std::regex_search(nodes[0]->Err(),
                          std::regex("\\[job nodes1 round 2\\] in place: rank\\(s\\) 0,1 keep "
                                     "their processes")));
  CHECK(ReadFile(out + "/params.bin") == clean);
  h.StopDaemon(*daemon);
}

TEST_CASE(
    "inplace: a hung rank under --on_hang=restart is the only worker replaced; the ranks "
    "waiting for it re-form in their processes",
    "[e2e][inplace][hang]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  const std::string clean = CleanParams(h);
  // Rank 1 blocks in C (os.read) before step 5; the others wait for it in
  // the step's all-reduce.
  const Run run = Train(
      h, "hang1",
      {"--restart_policy=inplace", "--max_restarts=2", "--on_hang=restart", "--hang_timeout=25"},
      {{"HANG_RANK", "1"}, {"HANG_AT", "5"}});
  INFO(run.console);
  CheckReplacedAlone(AttemptsByRank(run.out), 1, 5);
  CHECK_THAT(run.console, Catch::Contains("hung: no progress for --hang_timeout"));
  CHECK_THAT(run.console, Catch::Contains("in place: worker rank 1 (pid"));
  CHECK_THAT(run.console, Catch::Contains("wait inside a PyTorch collective"));
  CHECK(ReadFile(run.out + "/params.bin") == clean);
}

TEST_CASE(
    "inplace, a lost node: an elastic job re-forms at the smaller size with the other node's "
    "workers in their processes, and their steps count for the recovery budget",
    "[e2e][inplace]") {
  if (!TorchAvailable()) return SkipCase("e2e", kPython + " cannot import torch");
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string out = h.MakeDir("lost");
  std::vector<Proc*> nodes;
  const EnvList env = ScriptEnv(out, {{"STEPS", "300"}, {"EVENTS", "1"}});
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(
        &h.StartDdprun("node" + std::to_string(i),
                       {"--nnodes=1:2", "--nproc_per_node=2", "--node_rank=" + std::to_string(i),
                        "--local_addr=127.0.0." + std::to_string(i + 1),
                        "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=lost1",
                        "--rdzv_conf=join_timeout=60,last_call_timeout=5",
                        "--restart_policy=inplace", "--max_restarts=1", kScript},
                       env));
  }
  // Once every rank completed step 3, the second node's agent is killed.
  const auto t0 = Clock::now();
  while (!AllRanksPast(out, 0, 3) && SecondsSince(t0) < 120) SleepMs(50);
  REQUIRE(AllRanksPast(out, 0, 3));
  REQUIRE(::kill(nodes[1]->pid, SIGKILL) == 0);
  const int rc = h.Wait(*nodes[0], 240);
  const std::string console = nodes[0]->Out() + nodes[0]->Err();
  INFO(console);
  CHECK(rc == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<Attempt> a = Attempts(out, rank);
    REQUIRE(a.size() == 2);
    CHECK(a[1].pid == a[0].pid);  // the surviving node's workers kept their processes
  }
  CHECK_THAT(console, Catch::Contains("in place: rank(s) 0,1 keep their processes"));
  // Only survivors ran the new round: their steps closed the budget.
  CHECK(std::regex_search(console, std::regex("\\[job lost1 round [0-9]+\\] recovered in [0-9]+ "
                                              "ms: .*\\(in place: ")));
  (void)h.Wait(*nodes[1], 10);
  h.StopDaemon(*daemon);
}

TEST_CASE(
    "inplace: fn returning normally while its group is broken is run again after the re-form; "
    "an intact return ends run() with fn's result",
    "[e2e][inplace]") {
  // The wrapper alone (no torch): tests/fixtures/inprocess_return.py plays
  // the agent's side of the control block on a real memfd.
  Harness h;
  const std::string fixture =
      std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/inprocess_return.py";
  for (const std::string mode : {"broken", "intact"}) {
    Proc& p = h.Start("return_" + mode, {"python3", fixture},
                      {{"MODE", mode}, {"PYTHONPATH", kPythonDir}});
    const int rc = h.Wait(p, 60);
    INFO(mode << ":\n" << p.Out() << p.Err());
    CHECK(rc == 0);
    if (mode == "broken") {
      CHECK_THAT(p.Out(), Catch::Contains("calls=2 result=call2 rank=5"));
      CHECK_THAT(p.Err(), Catch::Contains("rank 0: fn returned while a peer had failed; re-forming "
                                          "in place to run it again with the job"));
      CHECK_THAT(p.Err(), Catch::Contains("rank 5 re-formed in place into round 1"));
    } else {
      CHECK_THAT(p.Out(), Catch::Contains("calls=1 result=call1 rank=0"));
      CHECK(p.Err().find("re-forming") == std::string::npos);
    }
  }
}
