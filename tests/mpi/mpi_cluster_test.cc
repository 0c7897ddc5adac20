// The mpi_cluster tier: ddprun started by OpenMPI's real mpirun on two hosts
// (network and UTS namespaces, the remote one reached through mpirun's rsh
// agent; tests/mpi/mpi_cluster.h), running a real PyTorch DDP script on Gloo.
// ddprun places itself from OpenMPI's own variables (OMPI_COMM_WORLD_*).
// Each case builds its own hosts and tears them down, also when it fails;
// without root, namespaces, OpenMPI or torch it skips (support/skip.h).
#include "mpi/mpi_cluster.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's torch lives here (this-machine.md)

// Why the tier cannot run here, or "" when it can.
std::string WhyNot(const MpiCluster& c) {
  if (!c.ok()) return c.why();
  if (std::system((kPython + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) != 0)
    return kPython + " cannot import torch";
  return "";
}

std::string Fixture() {
  return std::string(DDPRUN_SOURCE_DIR) + "/tests/fixtures/ddp_until_usr1.py";
}

// What mpirun printed: its stdout and stderr (the ranks' output and its own).
std::string Output(const Proc& p) { return p.Out() + p.Err(); }

// Reaps p if it has ended (without waiting); whether it has.
bool Ended(Proc& p) {
  if (p.exit) return true;
  int status = 0;
  if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
    p.ended = Clock::now();
    p.exit = DecodeStatus(status);
  }
  return p.exit.has_value();
}

// The live processes of every node, mpirun among them while it runs (it is
// reaped here, keeping its exit status).
std::vector<pid_t> Left(const MpiCluster& c, Proc& mpirun) {
  std::vector<pid_t> out;
  if (!Ended(mpirun)) out.push_back(mpirun.pid);
  for (pid_t p : c.AllPids(mpirun.pid)) out.push_back(p);
  return out;
}

std::string Describe(const std::vector<pid_t>& pids) {
  std::string out;
  for (pid_t p : pids) {
    const std::string cmd = ReadFile("/proc/" + std::to_string(p) + "/cmdline");
    out += std::to_string(p) + " " + cmd.substr(0, cmd.find('\0')) + "\n";
  }
  return out;
}

// Waits until every process on every node (mpirun included) is gone; returns
// the seconds it took, or fails the test naming what is left after within_s.
double WaitAllGone(const MpiCluster& c, Proc& mpirun, Clock::time_point t0, double within_s) {
  std::vector<pid_t> left = Left(c, mpirun);
  while (!left.empty() && SecondsSince(t0) < within_s) {
    SleepMs(5);
    left = Left(c, mpirun);
  }
  const double s = SecondsSince(t0);
  INFO("still running " << within_s << " s later:\n"
                        << Describe(left) << "mpirun's output:\n"
                        << Output(mpirun));
  CHECK(left.empty());
  return s;
}

// Waits until dir holds n files named <prefix>.rank<R>.
void WaitRankFiles(Proc& mpirun, const std::string& dir, const std::string& prefix, int n,
                   double timeout_s) {
  const auto t0 = Clock::now();
  for (;;) {
    int found = 0;
    for (const std::string& f : ListDir(dir))
      if (f.rfind(prefix + ".rank", 0) == 0) ++found;
    if (found >= n) return;
    if (SecondsSince(t0) > timeout_s || Ended(mpirun)) {
      FAIL(found << " of " << n << " ranks wrote " << prefix << " within " << timeout_s
                 << " s; mpirun's output:\n"
                 << Output(mpirun));
    }
    SleepMs(50);
  }
}

std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A figure for docs/schedulers.md, on stdout.
void Figure(const std::string& what, double s) {
  std::printf("mpi_cluster figure: %s: %.0f ms\n", what.c_str(), s * 1000);
}

// The tested command of docs/schedulers.md: one ddprun per host, two
// workers each, the rendezvous on n1.
std::vector<std::string> TwoNodes(const std::vector<std::string>& ddprun_args) {
  std::vector<std::string> args{"-x",
                                "PYTHON_EXEC=" + kPython,
                                "--map-by",
                                "ppr:1:node",
                                "-np",
                                "2",
                                "--host",
                                "n1,n2",
                                Ddprun(),
                                "--rdzv_endpoint=n1:29400",
                                "--nproc_per_node=2"};
  args.insert(args.end(), ddprun_args.begin(), ddprun_args.end());
  return args;
}

// Starts the two-node job on ddp_until_usr1.py with mpirun's extra args,
// SIGTERMs mpirun alone once every rank trains (as a batch system ends a
// job), and checks that every process on both hosts is gone within 5 s and
// mpirun's exit status; returns mpirun's output.
std::string TerminateWhileTraining(Harness& h, const MpiCluster& c,
                                   const std::vector<std::string>& mpirun_args,
                                   const std::string& label) {
  const std::string out = h.MakeDir("ranks");
  std::vector<std::string> args = mpirun_args;
  for (const std::string& a : TwoNodes({Fixture(), out})) args.push_back(a);
  Proc& mpirun = h.Start("mpirun", c.Mpirun(args));
  WaitRankFiles(mpirun, out, "started", 4, 120);
  // The processes of the job: mpirun (the pid the test started: the
  // namespace wrappers exec), 2 ddprun, 4 workers and more.
  REQUIRE(ReadFile("/proc/" + std::to_string(mpirun.pid) + "/comm") == "mpirun\n");
  const std::vector<pid_t> before = Left(c, mpirun);
  INFO("processes before SIGTERM:\n" << Describe(before));
  int workers = 0, launchers = 0;
  for (pid_t p : before) {
    const std::string comm = ReadFile("/proc/" + std::to_string(p) + "/comm");
    workers += comm == "python3\n";
    launchers += comm == "ddprun\n";
  }
  CHECK(workers == 4);
  CHECK(launchers == 2);

  const auto t0 = Clock::now();
  REQUIRE(::kill(mpirun.pid, SIGTERM) == 0);
  const double gone_s = WaitAllGone(c, mpirun, t0, 5);
  Figure("SIGTERM to mpirun to the last process on both hosts gone" + label, gone_s);
  REQUIRE(Ended(mpirun));
  Figure("SIGTERM to mpirun's exit" + label,
         std::chrono::duration<double>(mpirun.ended - t0).count());
  const std::string text = Output(mpirun);
  INFO("mpirun's output:\n" << text << "\nexit " << *mpirun.exit);
  // mpirun exits 1 (OpenMPI's ORTE_ERROR_DEFAULT_EXIT_CODE), not 128+15:
  // its status alone does not tell a cancelled job from a failed one.
  CHECK(*mpirun.exit == 1);
  return text;
}

}  // namespace

TEST_CASE(
    "mpi cluster: mpirun --map-by ppr:1:node -np 2 --host n1,n2 ddprun places each ddprun from "
    "OMPI_COMM_WORLD_RANK/SIZE and 2 nodes x 2 workers train in one world",
    "[mpi_cluster]") {
  Harness h;
  MpiCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("mpi_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  Proc& mpirun = h.Start(
      "mpirun", c.Mpirun(TwoNodes({std::string(DDPRUN_SOURCE_DIR) + "/examples/ddp_train.py",
                                   "--steps", "5", "--out", out})));
  const int rc = h.Wait(mpirun, 180);
  Figure("mpirun start to exit (2 nodes x 2 workers, 5 steps)", mpirun.Seconds());
  const std::string text = Output(mpirun);
  INFO("mpirun's output:\n" << text << "\nrsh agent log:\n" << ReadFile(c.agent_log()));
  CHECK(rc == 0);
  // Each ddprun placed itself from OpenMPI's variables, in one line.
  for (const char* rank :
       {"node rank 0 (OMPI_COMM_WORLD_RANK=0)", "node rank 1 (OMPI_COMM_WORLD_RANK=1)"}) {
    CHECK(Count(text,
                std::string("ddprun: placed by mpi: ") + rank +
                    ", 2 nodes (OMPI_COMM_WORLD_SIZE=2); --scheduler=none turns this off\n") == 1);
  }
  CHECK(Count(text, "hosting the rendezvous at n1:29400") == 1);
  CHECK(Count(text, "ranks 0-1 of 4, node 0 of 2") == 1);
  CHECK(Count(text, "ranks 2-3 of 4, node 1 of 2") == 1);
  // mpirun started the second ddprun on n2 through its rsh agent (orted),
  // the first one itself on n1.
  const std::vector<std::string> starts = Lines(ReadFile(c.agent_log()));
  REQUIRE(starts.size() == 1);
  CHECK(starts[0].rfind("n2 ", 0) == 0);
  CHECK(starts[0].find("orted") != std::string::npos);
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
  CHECK(Count(text, "identical across ranks: True") == 4);
  WaitAllGone(c, mpirun, Clock::now(), 5);
}

TEST_CASE(
    "mpi cluster: SIGTERM to mpirun during training: every ddprun and worker on both hosts is "
    "gone within 5 s",
    "[mpi_cluster]") {
  Harness h;
  MpiCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("mpi_cluster", why);
  c.Up();
  const std::string text = TerminateWhileTraining(h, c, {}, "");
  // mpirun passed SIGTERM on to ddprun (odls_base_sigkill_timeout, 1 s by
  // default, before its SIGKILL), which forwarded it to its workers.
  CHECK(Count(text, "received SIGTERM") >= 1);
}

TEST_CASE(
    "mpi cluster: SIGTERM to mpirun with odls_base_sigkill_timeout 0 (its SIGKILL right after "
    "its SIGTERM): every ddprun and worker on both hosts is still gone within 5 s",
    "[mpi_cluster]") {
  Harness h;
  MpiCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("mpi_cluster", why);
  c.Up();
  TerminateWhileTraining(h, c, {"--mca", "odls_base_sigkill_timeout", "0"}, " (sigkill_timeout 0)");
}

TEST_CASE(
    "mpi cluster: a worker fails: ddprun's exit code 1 is mpirun's exit status and nothing is "
    "left on either host",
    "[mpi_cluster]") {
  Harness h;
  MpiCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("mpi_cluster", why);
  c.Up();
  const std::string out = h.MakeDir("ranks");
  // Rank 3 (on n2) fails at once; the others start training.
  const std::string worker =
      h.Script("fail_rank3.sh",
               "#!/bin/sh\nif [ \"$RANK\" = 3 ]; then echo \"rank 3 fails\" >&2; "
               "exit 7; fi\nexec " +
                   kPython + " " + Fixture() + " " + out + "\n");
  Proc& mpirun = h.Start("mpirun", c.Mpirun(TwoNodes({"--max_restarts=0", worker})));
  const int rc = h.Wait(mpirun, 120);
  Figure("mpirun start to exit with a failing worker", mpirun.Seconds());
  const std::string text = Output(mpirun);
  INFO("mpirun's output:\n" << text);
  CHECK(rc == 1);  // kExitWorkerFailed (docs/cli.md's exit codes)
  CHECK(Count(text,
              "worker rank 3 (local rank 1) on n2 exited with exit code 7; stopping the node's "
              "other workers") == 1);
  CHECK(Count(text, "a worker failed and the restart budget (0) is spent") >= 1);
  WaitAllGone(c, mpirun, Clock::now(), 5);
}

TEST_CASE(
    "mpi cluster: mpirun -np 2 on one host: each ddprun refuses with the one-line usage error "
    "and mpirun exits 2",
    "[mpi_cluster]") {
  Harness h;
  MpiCluster c(h);
  if (const std::string why = WhyNot(c); !why.empty()) return SkipCase("mpi_cluster", why);
  c.Up();
  Proc& mpirun = h.Start("mpirun", c.Mpirun({"-np", "2", "--host", "n1:2", Ddprun(),
                                             "--rdzv_endpoint=n1:29400", Fixture(), "/nowhere"}));
  const int rc = h.Wait(mpirun, 60);
  Figure("mpirun start to exit with 2 ddprun on one host", mpirun.Seconds());
  const std::string text = Output(mpirun);
  INFO("mpirun's output:\n" << text);
  CHECK(rc == 2);  // kExitUsage, passed on by mpirun
  const std::string line =
      "ddprun: mpirun started 2 ddprun processes on this node (OMPI_COMM_WORLD_LOCAL_SIZE); "
      "ddprun starts the workers itself, so run one per node: mpirun --map-by ppr:1:node "
      "ddprun ...";
  // mpirun may abort the second ddprun before it prints; every line of
  // ddprun's is whole (one write each, never torn by the other's).
  int whole = 0;
  for (const std::string& l : Lines(text)) {
    if (l.find("ddprun") == std::string::npos || l.find("ddprun:") == std::string::npos) continue;
    CHECK(l == line);
    whole += l == line;
  }
  CHECK(whole >= 1);
  CHECK(whole <= 2);
  WaitAllGone(c, mpirun, Clock::now(), 5);
}

TEST_CASE("mpi cluster: the hosts tear down every process and namespace they made",
          "[mpi_cluster]") {
  Harness h;
  std::vector<pid_t> pids;
  std::vector<std::string> namespaces;
  {
    MpiCluster c(h);
    if (const std::string why = c.why(); !c.ok()) return SkipCase("mpi_cluster", why);
    c.Up();
    h.Start("mpirun", c.Mpirun({"--map-by", "ppr:1:node", "-np", "2", "--host", "n1,n2",
                                "/bin/sleep", "300"}));
    // Both hosts run: mpirun and sleep on n1, orted and sleep on n2.
    const auto t0 = Clock::now();
    while (c.PidsIn(c.ns(1)).size() < 2 || c.PidsIn(c.ns(2)).size() < 2) {
      if (SecondsSince(t0) > 30) FAIL("mpirun's sleep did not start on both hosts within 30 s");
      SleepMs(50);
    }
    for (int i = 0; i <= c.nodes(); ++i) {
      namespaces.push_back(c.ns(i));
      for (pid_t p : c.PidsIn(c.ns(i))) pids.push_back(p);
    }
  }
  CHECK(pids.size() >= 4);
  for (pid_t p : pids) CHECK_FALSE(IsAlive(p));
  // OpenMPI's session directories, left by the killed mpirun and orted, lie
  // in the Harness's directory (removed with it), not in /tmp.
  struct stat session {};
  CHECK(::stat((h.dir() + "/ompi.n1.0").c_str(), &session) == 0);
  CHECK(::stat((h.dir() + "/ompi.n2.0").c_str(), &session) == 0);
  struct stat st {};
  for (const std::string& n : namespaces) CHECK(::stat(("/run/netns/" + n).c_str(), &st) != 0);
}
