// Bad input: each one gets one clear line on stderr and a non-zero exit, fast,
// and no worker is started.
#include <fstream>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

// Runs ddprun with args; it must exit `code` within max_s with exactly one
// stderr line that starts with "ddprun:" and contains `needle`. Returns the
// seconds it took.
double ExpectOneLineError(const std::vector<std::string>& args, int code, const std::string& needle,
                          double max_s = 2.0) {
  Harness h;
  const std::string pids = h.PidDir("pids");
  Proc& p = h.StartDdprun("ddprun", args, {{"FIXTURE_PIDFILE_DIR", pids}});
  const int rc = h.Wait(p, max_s + 5);
  const std::string err = p.Err();
  std::string cmd;
  for (const std::string& a : args) cmd += " " + a;
  INFO("ddprun" << cmd);
  INFO("stderr:\n" << err << "stdout:\n" << p.Out());
  CHECK(rc == code);
  CHECK(p.Seconds() < max_s);
  const std::vector<std::string> lines = Lines(err);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].rfind("ddprun: ", 0) == 0);
  CHECK(lines[0].find(needle) != std::string::npos);
  CHECK(ReadPids(pids).empty());  // no worker ran
  return p.Seconds();
}

}  // namespace

TEST_CASE("bad command lines: one line on stderr, exit 2, fast", "[multiproc]") {
  const std::string fw = FixtureWorker();
  SECTION("unknown flag") {
    ExpectOneLineError({"--bogus_flag=1", fw}, 2, "unknown option '--bogus_flag");
  }
  SECTION("misspelt flag gets a suggestion") {
    ExpectOneLineError({"--nproc_per_nod=2", fw}, 2, "did you mean");
  }
  SECTION("--nnodes MIN > MAX") { ExpectOneLineError({"--nnodes=3:2", fw}, 2, "--nnodes"); }
  SECTION("--nproc_per_node=0") {
    ExpectOneLineError({"--nproc_per_node=0", fw}, 2, "--nproc_per_node");
  }
  // No node may wait for a store that will never exist (issue 9, item 8).
  SECTION("several nodes, no endpoint and no master") {
    ExpectOneLineError({"--nnodes=2", fw}, 2, "--master_addr");
  }
  SECTION("static, several nodes, no master address") {
    ExpectOneLineError({"--rdzv_backend=static", "--nnodes=2", "--node_rank=1", fw}, 2,
                       "needs --master_addr=HOST");
  }
  SECTION("torchrun's static by --master_addr, several nodes, no node rank") {
    ExpectOneLineError({"--master_addr=127.0.0.1", "--nnodes=2", fw}, 2, "--node_rank");
  }
  SECTION("a job id with a space") {
    ExpectOneLineError({"--rdzv_id=a b", fw}, 2, "is not a valid job id");
  }
  SECTION("--cpu_bind with an unknown policy") {
    ExpectOneLineError({"--cpu_bind=socket", fw}, 2, "must be auto, none, core or numa");
  }
  SECTION("--cpu_bind=core with more workers than cores") {
    ExpectOneLineError({"--cpu_bind=core", "--nproc_per_node=4096", fw}, 2, "use --cpu_bind=none");
  }
  SECTION("missing script") { ExpectOneLineError({"/nonexistent/dir/train.py"}, 2, "not found"); }
  SECTION("--no_python on a file that is not executable") {
    Harness h;
    const std::string file = h.dir() + "/plain.txt";
    { std::ofstream(file) << "not a program\n"; }
    ::chmod(file.c_str(), 0644);
    ExpectOneLineError({"--no_python", file}, 2, "not an executable file");
  }
}

// Issue 33 item 3: this node should host the local endpoint, but another
// program holds the port: one line naming the port and the holder (this
// test process), exit 3 at once, as the static master port.
TEST_CASE("a local rendezvous port held by another program: one line naming it, exit 3",
          "[multiproc]") {
  SilentListener holder;
  const std::string port = std::to_string(holder.port);
  const double took =
      ExpectOneLineError({"--nnodes=2", "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_id=x1",
                          "--rdzv_conf=join_timeout=20", FixtureWorker()},
                         3,
                         "cannot host the rendezvous at 127.0.0.1:" + port + ": port " + port +
                             " is in use by pid " + std::to_string(::getpid()) + " (",
                         5.0);
  CHECK(took < 5.0);
}

TEST_CASE("an endpoint that does not speak gRPC: exit 3 within join_timeout", "[multiproc]") {
  // Every 127.x address counts as local, and a local endpoint makes the agent
  // host the rendezvous itself (or refuse a port another program holds):
  // is_host=false makes it a client of the "wrong endpoint", a listening
  // socket that never answers.
  SilentListener silent;
  const double took = ExpectOneLineError(
      {"--nnodes=2", "--rdzv_endpoint=127.0.0.1:" + std::to_string(silent.port), "--rdzv_id=wrong",
       "--rdzv_conf=join_timeout=2,is_host=false", FixtureWorker()},
      3, "cannot reach the rendezvous at 127.0.0.1:" + std::to_string(silent.port), 5.0);
  CHECK(took >= 1.5);
}

TEST_CASE("a connect that waits longer than 5 s says once what it waits for, then exits 3",
          "[multiproc]") {
  SilentListener silent;
  const std::string ep = "127.0.0.1:" + std::to_string(silent.port);
  Harness h;
  Proc& p = h.StartDdprun("ddprun", {"--nnodes=2", "--rdzv_endpoint=" + ep, "--rdzv_id=waits",
                                     "--rdzv_conf=join_timeout=7,is_host=false", FixtureWorker()});
  const int rc = h.Wait(p, 15);
  const std::vector<std::string> lines = Lines(p.Err());
  INFO("stderr:\n" << p.Err());
  CHECK(rc == 3);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("nothing answers as the rendezvous at " + ep + " yet; waiting until ") !=
        std::string::npos);
  CHECK(lines[0].find("fix --rdzv_endpoint") != std::string::npos);
  CHECK(lines[1].find("cannot reach the rendezvous at " + ep) != std::string::npos);
  CHECK(p.Seconds() >= 6.5);
}

TEST_CASE("a lone agent of a 2-node job times out naming the node count", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  Proc& p =
      h.StartDdprun("ddprun", {"--nnodes=2", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                               "--rdzv_id=lone", "--rdzv_conf=join_timeout=2", FixtureWorker()});
  const int rc = h.Wait(p, 10);
  const std::vector<std::string> lines = Lines(p.Err());
  INFO("stderr:\n" << p.Err());
  CHECK(rc == 3);
  REQUIRE(lines.size() == 2);
  // The endpoint is local and served: the node says whose rendezvous it
  // joins (issue 33 item 3), then the timeout.
  CHECK(lines[0].find("is already served by pid " + std::to_string(daemon->pid) + " (ddprund)") !=
        std::string::npos);
  CHECK(lines[1].find("1 of 2 required nodes") != std::string::npos);
  CHECK(p.Seconds() >= 1.5);
  CHECK(p.Seconds() < 5.0);
  h.StopDaemon(*daemon);
}

TEST_CASE("ddprund on a port in use: one line, exit 1", "[multiproc]") {
  Harness h;
  Proc* first = nullptr;
  const int port = h.StartDaemon("first", &first);
  Proc& second = h.Start("second", {Ddprund(), "--dashboard_port", "0", "--host", "127.0.0.1",
                                    "--port", std::to_string(port)});
  const int rc = h.Wait(second, 10);
  const std::string err = second.Err();
  INFO("stderr:\n" << err);
  CHECK(rc == 1);
  const std::vector<std::string> lines = Lines(err);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("address already in use") != std::string::npos);
  CHECK(lines[0].find(std::to_string(port)) != std::string::npos);
  CHECK(second.Out().find("listening") == std::string::npos);
  h.StopDaemon(*first);
}

// Issue 33 items 10 and 11: a typo in a subcommand's flag, a subcommand's
// name or a ddprund flag gets the closest word from one helper (suggest.h),
// and bench names the user's word, not the interpreter.
TEST_CASE("typos everywhere get a suggestion; bench names the user's word", "[multiproc]") {
  Harness h;
  const std::string script = h.Script("train.py", "print('hi')\n");
  struct Case {
    std::vector<std::string> argv;
    std::string line;
  };
  const std::vector<Case> cases = {
      {{Ddprun(), "bench", "--opp", "allreduce"},
       "ddprun bench: unknown option '--opp' (did you mean --op?); see ddprun bench --help"},
      {{Ddprun(), "check", "--chek_timeout=5", script},
       "ddprun check: unknown option '--chek_timeout' (did you mean --check_timeout?)"},
      {{Ddprun(), "status", "--jsn"},
       "ddprun status: unknown option '--jsn' (did you mean --json?); see ddprun status --help"},
      {{Ddprun(), "statsu", "--rdzv_endpoint=127.0.0.1:1"},
       "ddprun: 'statsu' is neither a command nor a file (did you mean ddprun status?)"},
      {{Ddprund(), "--prot", "5"},
       "ddprund: unknown option '--prot' (did you mean --port?); see ddprund --help"},
      {{Ddprun(), "bench", "--nproc_per_node=2", script},
       "ddprun bench: '" + script + "' is not a flag"},
      {{Ddprun(), "bench", "--nproc_per_node", "2", "extra"},
       "ddprun bench: 'extra' is not a flag"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Proc& p = h.Start("typo" + std::to_string(i), cases[i].argv);
    const int rc = h.Wait(p, 10);
    INFO(cases[i].argv[1] << " " << cases[i].argv[2] << "\nstderr:\n" << p.Err());
    CHECK(rc == 2);
    CHECK(Lines(p.Err()).size() == 1);
    CHECK(p.Err().find(cases[i].line) != std::string::npos);
  }
}

// Issue 33 item 14: ddprund names an etcd name that does not resolve at
// once, and the OS's reason for a --config file it cannot read.
TEST_CASE("ddprund: an unresolvable etcd name and a missing --config, one line each",
          "[multiproc]") {
  Harness h;
  Proc& etcd = h.Start("etcd", {Ddprund(), "--host", "127.0.0.1", "--port", "0", "--etcd_endpoints",
                                "nosuch.invalid:2379"});
  const int rc = h.Wait(etcd, 10);
  INFO("stderr:\n" << etcd.Err());
  CHECK(rc == 1);
  CHECK(etcd.Seconds() < 3);  // not the etcd client's "no answer in time" after 6 s
  CHECK(Lines(etcd.Err()).size() == 1);
  CHECK(etcd.Err().find("cannot resolve the etcd endpoint name 'nosuch.invalid'") !=
        std::string::npos);
  CHECK(etcd.Err().find("--etcd_endpoints") != std::string::npos);

  Proc& config = h.Start("config", {Ddprund(), "--config", h.dir() + "/nosuch.yaml"});
  CHECK(h.Wait(config, 10) == 2);
  INFO("stderr:\n" << config.Err());
  CHECK(config.Err().find("nosuch.yaml: cannot read the config file: No such file or directory; "
                          "check the --config path") != std::string::npos);
}

// Issue 33 item 13: settings that exclude each other are a usage mistake
// (exit 2, as the exit-code table says), found before anything listens.
TEST_CASE("ddprund with --state_dir and --etcd_endpoints: one line, exit 2", "[multiproc]") {
  Harness h;
  Proc& d = h.Start("ddprund", {Ddprund(), "--host", "127.0.0.1", "--port", "0", "--state_dir",
                                h.MakeDir("state"), "--etcd_endpoints",
                                "127.0.0.1:" + std::to_string(FreePort())});
  const int rc = h.Wait(d, 10);
  const std::string err = d.Err();
  INFO("stderr:\n" << err);
  CHECK(rc == 2);
  REQUIRE(Lines(err).size() == 1);
  CHECK(err.find("--state_dir and --etcd_endpoints exclude each other") != std::string::npos);
  CHECK(d.Out().find("listening") == std::string::npos);
}

// torchrun ignores --node_rank under c10d, so launch scripts that pass one
// constant on every node run there; here it is a preference: the second node
// asking for a taken rank gets the next one and says so in one line.
TEST_CASE("two agents asking for the same --node_rank: both run, the second warns", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(port);
  const std::string pids = h.PidDir("pids");
  const EnvList env{{"FIXTURE_PIDFILE_DIR", pids}};
  Proc& a =
      h.StartDdprun("a",
                    {"--nnodes=2", "--node_rank=0", endpoint, "--rdzv_id=dup",
                     "--local_addr=127.0.0.1", "--rdzv_conf=join_timeout=20", FixtureWorker()},
                    env);
  // Let the first agent claim rank 0 before the second asks for it.
  SleepMs(500);
  Proc& b =
      h.StartDdprun("b",
                    {"--nnodes=2", "--node_rank=0", endpoint, "--rdzv_id=dup",
                     "--local_addr=127.0.0.2", "--rdzv_conf=join_timeout=20", FixtureWorker()},
                    env);
  const int rc = h.Wait(b, 20);
  INFO("a stderr:\n" << a.Err() << "b stderr:\n" << b.Err());
  CHECK(rc == 0);
  CHECK(h.Wait(a, 20) == 0);
  CHECK(b.Err().find("--node_rank=0 was not this node's to take") != std::string::npos);
  CHECK(b.Err().find("it is node 1") != std::string::npos);
  CHECK(a.Err().find("was not this node's") == std::string::npos);

  // The daemon still serves jobs, including one with the same node ranks.
  const std::string out = h.MakeDir("out");
  std::vector<Proc*> next;
  for (int i = 0; i < 2; ++i)
    next.push_back(
        &h.StartDdprun("next" + std::to_string(i),
                       {"--nnodes=2", "--node_rank=" + std::to_string(i), endpoint,
                        "--rdzv_id=after_dup", "--local_addr=127.0.0." + std::to_string(i + 1),
                        "--rdzv_conf=join_timeout=20", FixtureWorker()},
                       {{"FIXTURE_OUT_DIR", out}, {"FIXTURE_PIDFILE_DIR", pids}}));
  for (Proc* n : next) {
    const int nrc = h.Wait(*n, 20);
    INFO(n->name << " stderr:\n" << n->Err());
    CHECK(nrc == 0);
  }
  CHECK(ReadRecords(out).size() == 2);
  h.RequireAllGone(pids, 2);
  h.StopDaemon(*daemon);
}
