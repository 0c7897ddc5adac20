// The slurm_cluster tier: ddprun on a real multi-node Slurm (slurmctld and a
// slurmd per node, each node its own network and UTS namespace,
// tests/slurm/slurm_cluster.h), running a real PyTorch DDP script on Gloo.
// Each case builds its own cluster and tears it down, also when it fails;
// without root, namespaces or the packages it skips (support/skip.h).
#include "slurm/slurm_cluster.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here (this-machine.md)

// Why the tier cannot run here, or "" when it can.
std::string WhyNot(const SlurmCluster& c) {
  if (!c.ok()) return c.why();
  if (std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) != 0)
    return kPython + " cannot import torch";
  return "";
}

// The job's environment: the workers' interpreter (Debian's torch).
const EnvList kJobEnv = {{"PYTHON_EXEC", kPython}};

std::string JobOutput(const SlurmCluster& c, int job) {
  return ReadFile(c.dir() + "/job-" + std::to_string(job) + ".out");
}

std::string Fixture() {
  return std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/ddp_until_usr1.py";
}

// A process of a job: pid, argv[0] and the node it runs on (SLURMD_NODENAME
// in its environment).
struct MarkedProc {
  pid_t pid = -1;
  std::string argv0, node;
};

// The live processes whose environment holds DDPRUN_SLURM_TEST=<mark>: the
// batch script, srun, ddprun and the workers of one job (srun and
// slurmstepd pass the job's environment on; /proc is this host's for every
// namespace).
std::vector<MarkedProc> Marked(const std::string& mark) {
  std::vector<MarkedProc> out;
  const std::string want = "DDPRUN_SLURM_TEST=" + mark;
  for (const std::string& n : ListDir("/proc")) {
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = ReadFile("/proc/" + n + "/environ");
    MarkedProc p;
    bool hit = false;
    for (std::size_t at = 0; at < env.size();) {
      const std::size_t end = std::min(env.find('\0', at), env.size());
      const std::string kv = env.substr(at, end - at);
      if (kv == want) hit = true;
      if (kv.rfind("SLURMD_NODENAME=", 0) == 0) p.node = kv.substr(16);
      at = end + 1;
    }
    if (!hit) continue;
    p.pid = static_cast<pid_t>(std::stol(n));
    if (!IsAlive(p.pid)) continue;
    const std::string cmd = ReadFile("/proc/" + n + "/cmdline");
    p.argv0 = cmd.substr(0, cmd.find('\0'));
    out.push_back(p);
  }
  return out;
}

// The workers among them: the Python processes.
std::vector<MarkedProc> Workers(const std::vector<MarkedProc>& procs) {
  std::vector<MarkedProc> out;
  for (const MarkedProc& p : procs)
    if (p.argv0.find("python") != std::string::npos) out.push_back(p);
  return out;
}

std::string Describe(const std::vector<MarkedProc>& procs) {
  std::string out;
  for (const MarkedProc& p : procs)
    out += std::to_string(p.pid) + " " + p.argv0 + " on " + p.node + "\n";
  return out;
}

// Waits until dir holds n files named <prefix>.rank<R>.
void WaitRankFiles(const SlurmCluster& c, int job, const std::string& dir,
                   const std::string& prefix, int n, double timeout_s) {
  const auto t0 = Clock::now();
  for (;;) {
    int found = 0;
    for (const std::string& f : ListDir(dir))
      if (f.rfind(prefix + ".rank", 0) == 0) ++found;
    if (found >= n) return;
    if (SecondsSince(t0) > timeout_s) {
      FAIL(found << " of " << n << " ranks wrote " << prefix << " within " << timeout_s
                 << " s; JobState=" << c.JobField(job, "JobState") << "; job output:\n"
                 << JobOutput(c, job));
    }
    SleepMs(100);
  }
}

// The batch script: srun ddprun <flags> with the fixture, srun's exit code
// printed and returned.
std::string BatchScript(Harness& h, const std::string& srun_flags, const std::string& ddprun_flags,
                        const std::string& out, const std::string& max_steps = "") {
  return h.Script("train.sbatch", "#!/bin/bash\nsrun " + srun_flags + Ddprun() + " " +
                                      ddprun_flags + " " + Fixture() + " " + out + " " + max_steps +
                                      "\nrc=$?\necho srun-exit=$rc\nexit $rc\n");
}

// A figure for docs/schedulers.md, on stdout.
void Figure(const std::string& what, double ms) {
  std::printf("slurm_cluster figure: %s: %.0f ms\n", what.c_str(), ms);
}

}  // namespace

TEST_CASE("slurm cluster: sbatch -N2 with srun ddprun and no rendezvous flag trains on both nodes",
          "[slurm_cluster]") {
  Harness h;
  SlurmCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  // The batch script of docs/schedulers.md, with the test's paths.
  const std::string script =
      h.Script("train.sbatch", "#!/bin/bash\n#SBATCH -N2\n#SBATCH --ntasks-per-node=1\nsrun " +
                                   Ddprun() + " --nproc_per_node=2 " + DDPRUN_SOURCE_DIR +
                                   "/examples/ddp_train.py --steps 5 --out " + out + "\n");
  const int job =
      c.Submit({"--output=" + c.dir() + "/job-%j.out", "--chdir=" + c.dir(), script}, kJobEnv);
  const std::string state = c.WaitJobEnd(job, 180);
  const std::string text = JobOutput(c, job);
  INFO("job output:\n" << text);
  CHECK(state == "COMPLETED");
  CHECK(c.JobField(job, "ExitCode") == "0:0");
  CHECK(c.JobField(job, "NodeList") == "n[1-2]");
  // Each ddprun placed itself from the step's variables, node 0 (n1) hosting.
  const std::string id = "job id slurm-" + std::to_string(job) + "-0";
  for (const char* rank : {"node rank 0 (SLURM_NODEID=0)", "node rank 1 (SLURM_NODEID=1)"}) {
    CHECK(text.find(std::string("ddprun: placed by slurm: ") + rank +
                    ", 2 nodes (SLURM_STEP_NUM_NODES=2), rendezvous at n1:29400") !=
          std::string::npos);
  }
  CHECK(text.find(id) != std::string::npos);
  CHECK(text.find("ranks 0-1 of 4, node 0 of 2") != std::string::npos);
  CHECK(text.find("ranks 2-3 of 4, node 1 of 2") != std::string::npos);
  // Every rank trained in one world of 4 and ends with the same parameters.
  std::string digest;
  for (int r = 0; r < 4; ++r) {
    const std::string line = ReadFile(out + "/rank" + std::to_string(r) + ".txt");
    INFO("rank " << r << ": " << line);
    REQUIRE_FALSE(line.empty());
    const std::string d = line.substr(0, line.find(' '));
    CHECK(line.substr(d.size() + 1, 2) == "4 ");
    if (digest.empty()) digest = d;
    CHECK(d == digest);
  }
  CHECK(text.find("identical across ranks: True") != std::string::npos);
}

TEST_CASE("slurm cluster: scancel during training leaves no process of the job on any node",
          "[slurm_cluster]") {
  Harness h;
  SlurmCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  const std::string mark = "scancel-" + std::to_string(::getpid());
  EnvList env = kJobEnv;
  env.push_back({"DDPRUN_SLURM_TEST", mark});
  const int job = c.Submit({"-N2", "--output=" + c.dir() + "/job-%j.out", "--chdir=" + c.dir(),
                            BatchScript(h, "", "--nproc_per_node=2", out)},
                           env);
  WaitRankFiles(c, job, out, "started", 4, 120);
  const std::vector<MarkedProc> workers = Workers(Marked(mark));
  INFO("workers:\n" << Describe(workers));
  REQUIRE(workers.size() == 4);
  std::map<std::string, int> per_node;
  for (const MarkedProc& w : workers) ++per_node[w.node];
  CHECK(per_node == std::map<std::string, int>{{"n1", 2}, {"n2", 2}});

  const auto t0 = Clock::now();
  const CommandResult r = c.Run({"/usr/bin/scancel", std::to_string(job)});
  INFO("scancel: " << r.out);
  REQUIRE(r.rc == 0);
  // The bound: every worker on every node, and every other process
  // of the job (ddprun, srun, the batch script), gone within 5 s.
  double workers_gone_ms = -1;
  std::vector<MarkedProc> left = Marked(mark);
  while (!left.empty() && SecondsSince(t0) < 5) {
    if (workers_gone_ms < 0 && Workers(left).empty()) workers_gone_ms = SecondsSince(t0) * 1000;
    SleepMs(5);
    left = Marked(mark);
  }
  const double all_gone_ms = SecondsSince(t0) * 1000;
  if (workers_gone_ms < 0) workers_gone_ms = all_gone_ms;
  INFO("still running 5 s after scancel:\n"
       << Describe(left) << "job output:\n"
       << JobOutput(c, job));
  CHECK(left.empty());
  Figure("scancel to the last worker gone", workers_gone_ms);
  Figure("scancel to the last process of the job gone", all_gone_ms);
  CHECK(c.WaitJobEnd(job, 30) == "CANCELLED");
  // ddprun forwarded Slurm's SIGTERM to its workers on both nodes.
  const std::string text = JobOutput(c, job);
  std::size_t forwarded = 0;
  for (std::size_t at = text.find("received SIGTERM; forwarding it to the workers");
       at != std::string::npos;
       at = text.find("received SIGTERM; forwarding it to the workers", at + 1))
    ++forwarded;
  CHECK(forwarded == 2);
}

TEST_CASE(
    "slurm cluster: --signal=USR1@60 reaches every worker through --forward_signals and the "
    "job ends before its time limit",
    "[slurm_cluster]") {
  Harness h;
  SlurmCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  // The warning is due 60 s before the time limit (10 min): not yet. Once
  // every rank trains, the limit drops to 1 min, so the warning is due at
  // once and slurmctld sends it at its next time-limit check.
  const int job =
      c.Submit({"-N2", "-t", "10", "--signal=USR1@60", "--output=" + c.dir() + "/job-%j.out",
                "--chdir=" + c.dir(),
                BatchScript(h, "", "--forward_signals=SIGUSR1 --nproc_per_node=2", out)},
               kJobEnv);
  WaitRankFiles(c, job, out, "started", 4, 120);
  const auto t0 = Clock::now();
  const CommandResult r =
      c.Run({"/usr/bin/scontrol", "update", "JobId=" + std::to_string(job), "TimeLimit=1"});
  INFO("scontrol update: " << r.out);
  REQUIRE(r.rc == 0);
  const std::string state = c.WaitJobEnd(job, 90);
  Figure("time limit shortened to the job's end (the warning's delay included)",
         SecondsSince(t0) * 1000);
  const std::string text = JobOutput(c, job);
  INFO("job output:\n" << text);
  // Ended by itself before the limit (TIMEOUT otherwise), every rank at the
  // same step because of the warning.
  CHECK(state == "COMPLETED");
  CHECK(c.JobField(job, "ExitCode") == "0:0");
  CHECK(text.find("srun-exit=0") != std::string::npos);
  std::size_t forwarded = 0;
  for (std::size_t at = text.find("forwarding SIGUSR1 to the workers"); at != std::string::npos;
       at = text.find("forwarding SIGUSR1 to the workers", at + 1))
    ++forwarded;
  CHECK(forwarded == 2);
  std::string steps;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string line = ReadFile(out + "/done.rank" + std::to_string(rank));
    INFO("rank " << rank << ": " << line);
    CHECK(line.find(" world=4 host=n" + std::to_string(rank / 2 + 1) + " reason=usr1\n") !=
          std::string::npos);
    const std::string s = line.substr(0, line.find(' '));
    if (steps.empty()) steps = s;
    CHECK(s == steps);
  }
}

TEST_CASE(
    "slurm cluster: a node dies mid-job: the fixed-size job exits 3 and Slurm reports "
    "NODE_FAIL with exit code 3",
    "[slurm_cluster]") {
  Harness h;
  SlurmOptions o;
  o.slurmd_timeout_s = 10;  // Slurm notices the dead node sooner
  SlurmCluster c(h, o);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  const std::string mark = "nodefail-" + std::to_string(::getpid());
  EnvList env = kJobEnv;
  env.push_back({"DDPRUN_SLURM_TEST", mark});
  // srun -K: a task's non-zero exit ends the step, so srun returns ddprun's
  // code; --no-requeue: Slurm would requeue a job that lost a node.
  const int job =
      c.Submit({"-N2", "--no-requeue", "--output=" + c.dir() + "/job-%j.out", "--chdir=" + c.dir(),
                BatchScript(h, "-K ", "--rdzv_conf=join_timeout=10 --nproc_per_node=2", out)},
               env);
  WaitRankFiles(c, job, out, "started", 4, 120);
  const auto t0 = Clock::now();
  c.KillNode(2);
  const std::string state = c.WaitJobEnd(job, 120);
  Figure("node killed to the job's end (fixed size, join_timeout 10 s, SlurmdTimeout 10 s)",
         SecondsSince(t0) * 1000);
  const std::string text = JobOutput(c, job);
  INFO("job output:\n" << text);
  CHECK(state == "NODE_FAIL");
  CHECK(text.find("rendezvous timed out after 10 s with 1 of 2 required nodes") !=
        std::string::npos);
  // ddprun's exit code 3 reaches Slurm: srun reports it for the task.
  CHECK(text.find("srun: error: n1: task 0: Exited with exit code 3") != std::string::npos);
  // srun itself returns only once slurmctld declares the dead node failed,
  // and that same moment cancels the job (NODE_FAIL), batch script included:
  // the script that prints srun's status and ends with it races the cancel.
  // When the script wins, the job's ExitCode is 3:0; when the cancel wins,
  // 0:15 (SIGTERM) and the 3 is in the task's line above (docs/schedulers.md).
  const std::string exit_code = c.JobField(job, "ExitCode");
  INFO("ExitCode=" << exit_code);
  CHECK((exit_code == "3:0" || exit_code == "0:15"));
  if (exit_code == "3:0") CHECK(text.find("srun-exit=3") != std::string::npos);
  const std::vector<MarkedProc> left = Marked(mark);
  INFO("left after the job ended:\n" << Describe(left));
  CHECK(left.empty());
}

TEST_CASE(
    "slurm cluster: a node dies mid-job: an elastic job (--nnodes=1:2, sbatch and srun --no-kill) "
    "re-forms on the remaining node and completes",
    "[slurm_cluster]") {
  Harness h;
  SlurmOptions o;
  o.slurmd_timeout_s = 10;
  SlurmCluster c(h, o);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  // 400 steps of ~50 ms: the node dies long before the end, and Slurm
  // declares it failed (SlurmdTimeout) while the job trains on. sbatch
  // --no-kill keeps the job then, srun --no-kill the step.
  const int job =
      c.Submit({"-N2", "--no-kill", "--no-requeue", "--output=" + c.dir() + "/job-%j.out",
                "--chdir=" + c.dir(),
                BatchScript(h, "--no-kill ", "--nnodes=1:2 --nproc_per_node=2", out, "400")},
               kJobEnv);
  WaitRankFiles(c, job, out, "started", 4, 120);
  const auto t0 = Clock::now();
  c.KillNode(2);
  const std::string state = c.WaitJobEnd(job, 180);
  Figure("node killed to the elastic job's end (400 steps again on one node)",
         SecondsSince(t0) * 1000);
  const std::string text = JobOutput(c, job);
  INFO("job output:\n" << text);
  CHECK(state == "COMPLETED");
  CHECK(c.JobField(job, "ExitCode") == "0:0");
  CHECK(text.find("round 1] starting 2 worker(s): ranks 0-1 of 2, node 0 of 1") !=
        std::string::npos);
  CHECK(text.find("srun: error: Node failure on n2") != std::string::npos);
  CHECK(text.find("srun-exit=0") != std::string::npos);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line = ReadFile(out + "/done.rank" + std::to_string(rank));
    INFO("rank " << rank << ": " << line);
    CHECK(line == "steps=400 world=2 host=n1 reason=max_steps\n");
  }
}

TEST_CASE("slurm cluster: the cluster tears down every daemon, job process and namespace it made",
          "[slurm_cluster]") {
  Harness h;
  std::vector<pid_t> pids;
  std::vector<std::string> namespaces;
  {
    SlurmCluster c(h);
    if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
    c.Up();
    const int job = c.Submit({"-N2", "--output=" + c.dir() + "/job-%j.out", "--chdir=" + c.dir(),
                              "--wrap", "srun sleep 300"});
    // Both nodes run the step: slurmd, slurmstepd and sleep in each.
    const auto t0 = Clock::now();
    while (c.JobField(job, "JobState") != "RUNNING" || c.PidsIn(c.ns(2)).size() < 3) {
      if (SecondsSince(t0) > 30) FAIL("the job's step did not start on n2 within 30 s");
      SleepMs(100);
    }
    for (int i = 0; i <= c.nodes(); ++i) {
      namespaces.push_back(c.ns(i));
      for (pid_t p : c.PidsIn(c.ns(i))) pids.push_back(p);
    }
  }
  CHECK(pids.size() >= 7);  // slurmctld; slurmd, slurmstepd, sleep on each node
  for (pid_t p : pids) CHECK_FALSE(IsAlive(p));
  struct stat st {};
  for (const std::string& n : namespaces) CHECK(::stat(("/run/netns/" + n).c_str(), &st) != 0);
}

TEST_CASE("slurm cluster: a missing munge key is one line from munged, and sbatch fails at once",
          "[slurm_cluster]") {
  Harness h;
  SlurmOptions o;
  o.munge_key = false;
  SlurmCluster c(h, o);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  const std::string why = c.TryUp();
  INFO("munged's stderr:\n" << ReadFile(c.dir() + "/munged.err"));
  CHECK(why == "munged exited with 1: munged: Error: Failed to find keyfile \"" + c.dir() +
                   "/munge.key\": No such file or directory (Did you run mungekey?)");
  // A user's sbatch against it: refused within seconds, naming munged; ddprun never starts.
  const auto t0 = Clock::now();
  const CommandResult r = c.Run({"/usr/bin/sbatch", "-N2", "--wrap", Ddprun() + " true"}, {}, 30);
  INFO("sbatch: " << r.out);
  CHECK(r.rc == 1);
  CHECK(SecondsSince(t0) < 10);
  CHECK(r.out.find("Munge encode failed: Failed to access \"" + c.dir() +
                   "/munge.socket\": No such file or directory (Did you start munged?)") !=
        std::string::npos);
  CHECK(r.out.find("Batch job submission failed: Protocol authentication error") !=
        std::string::npos);
}

TEST_CASE(
    "slurm cluster: --signal=USR1@60 without --forward_signals: ddprun ignores it with one "
    "line per node, and Slurm signals the workers itself",
    "[slurm_cluster]") {
  Harness h;
  SlurmCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("slurm_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  const int job =
      c.Submit({"-N2", "-t", "10", "--signal=USR1@60", "--output=" + c.dir() + "/job-%j.out",
                "--chdir=" + c.dir(), BatchScript(h, "", "--nproc_per_node=2", out)},
               kJobEnv);
  WaitRankFiles(c, job, out, "started", 4, 120);
  const CommandResult r =
      c.Run({"/usr/bin/scontrol", "update", "JobId=" + std::to_string(job), "TimeLimit=1"});
  INFO("scontrol update: " << r.out);
  REQUIRE(r.rc == 0);
  const std::string state = c.WaitJobEnd(job, 90);
  const std::string text = JobOutput(c, job);
  INFO("job output:\n" << text);
  // Each ddprun logs that it ignores the signal ...
  const std::string line =
      "ignoring SIGUSR1; add it to --forward_signals to forward it to the workers while the job "
      "runs, or to --signals_to_handle to stop the job on it";
  std::size_t ignored = 0;
  for (std::size_t at = text.find(line); at != std::string::npos; at = text.find(line, at + 1))
    ++ignored;
  CHECK(ignored == 2);
  CHECK(text.find("forwarding SIGUSR1") == std::string::npos);
  // ... yet every worker got it: slurmstepd signals every process of the
  // step (proctrack), not only the task srun started.
  CHECK(state == "COMPLETED");
  for (int rank = 0; rank < 4; ++rank) {
    const std::string done = ReadFile(out + "/done.rank" + std::to_string(rank));
    INFO("rank " << rank << ": " << done);
    CHECK(done.find(" reason=usr1\n") != std::string::npos);
  }
}
