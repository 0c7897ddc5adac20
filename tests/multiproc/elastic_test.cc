// Elastic and fault-tolerant behaviour with real processes (issue 3): a node
// joining a running job (scale-up), a hot spare promoted on a failure, an
// agent killed with -9 above and below MIN, the daemon killed with -9 and
// restarted on its --state_dir, a repeatedly failing host quarantined, and
// every signal ddprun forwards.
//
// Each test asserts the final round, the ranks and world sizes the workers
// saw (from the fixture's rank<R>.round<N>.txt records, one out directory per
// node) and that no process it started is left.
#include <signal.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

struct Node {
  Proc* proc = nullptr;
  std::string out, pids, addr;
};

// One agent of job `id` on 127.0.0.<idx+1>, with its own out and pid dirs.
Node StartNode(Harness& h, const std::string& id, int idx, const std::string& nnodes, int nproc,
               int port, const std::string& conf, const EnvList& env = {},
               const std::vector<std::string>& extra = {}) {
  Node n;
  const std::string tag = id + "_node" + std::to_string(idx);
  n.out = h.MakeDir(tag + "_out");
  n.pids = h.PidDir(tag + "_pids");
  n.addr = "127.0.0." + std::to_string(idx + 1);
  std::vector<std::string> args{
      "--nnodes=" + nnodes,     "--nproc_per_node=" + std::to_string(nproc),
      "--local_addr=" + n.addr, "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
      "--rdzv_id=" + id,        "--rdzv_conf=" + conf};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(FixtureWorker());
  EnvList all{{"FIXTURE_OUT_DIR", n.out}, {"FIXTURE_PIDFILE_DIR", n.pids}};
  all.insert(all.end(), env.begin(), env.end());
  n.proc = &h.StartDdprun(tag, args, all);
  return n;
}

long LastRound(const std::vector<Record>& recs) {
  long last = -1;
  for (const Record& r : recs) last = std::max(last, r.round);
  return last;
}

std::set<long> RoundsOf(const std::vector<Record>& recs) {
  std::set<long> rounds;
  for (const Record& r : recs) rounds.insert(r.round);
  return rounds;
}

// Waits until dir holds at least n complete records of `round`.
bool WaitForRecords(const std::string& dir, long round, std::size_t n, double timeout_s) {
  const auto t0 = Clock::now();
  do {
    if (RecordsOfRound(ReadRecords(dir), round).size() >= n) return true;
    SleepMs(5);
  } while (SecondsSince(t0) < timeout_s);
  return false;
}

// The round `round` as the workers of `nodes` saw it: node i ran global
// ranks [base_i, base_i + nproc) with group rank group_ranks[i]; one world
// size, one restart count, one master for everybody.
void CheckRound(const std::vector<const Node*>& nodes, long round, int nproc,
                const std::vector<long>& group_ranks, long restart_count,
                const std::string& master_addr) {
  INFO("round " << round);
  const long world = static_cast<long>(nodes.size()) * nproc;
  std::set<long> ranks;
  std::set<std::string> masters;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::vector<Record> recs = RecordsOfRound(ReadRecords(nodes[i]->out), round);
    INFO("node " << nodes[i]->addr << " (" << nodes[i]->out << ")");
    REQUIRE(recs.size() == static_cast<std::size_t>(nproc));
    for (const Record& r : recs) {
      INFO(r.file);
      CHECK(r.Int("world_size") == world);
      CHECK(r.Int("group_world_size") == static_cast<long>(nodes.size()));
      CHECK(r.Int("local_world_size") == nproc);
      CHECK(r.Int("group_rank") == group_ranks[i]);
      CHECK(r.Int("rank") == group_ranks[i] * nproc + r.Int("local_rank"));
      CHECK(r.Int("restart_count") == restart_count);
      CHECK(ranks.insert(r.Int("rank")).second);
      masters.insert(r.Str("master_addr") + ":" + r.Str("master_port"));
    }
  }
  std::set<long> want;
  for (long r = 0; r < world; ++r) want.insert(r);
  CHECK(ranks == want);
  REQUIRE(masters.size() == 1);
  const std::string m = *masters.begin();
  CHECK(m.substr(0, m.rfind(':')) == master_addr);
}

// `ddprun status --json` for one job; "" when the daemon did not answer.
std::string StatusJson(Harness& h, int port, const std::string& id) {
  static int n = 0;
  Proc& p = h.StartDdprun("status" + std::to_string(++n),
                          {"status", "--rdzv_endpoint", "127.0.0.1:" + std::to_string(port),
                           "--rdzv_id", id, "--json", "--timeout", "2"});
  return h.Wait(p, 5) == 0 ? p.Out() : std::string();
}

std::string StatusText(Harness& h, int port, const std::string& id) {
  static int n = 0;
  Proc& p = h.StartDdprun("status_text" + std::to_string(++n),
                          {"status", "--rdzv_endpoint", "127.0.0.1:" + std::to_string(port),
                           "--rdzv_id", id, "--timeout", "2"});
  return h.Wait(p, 5) == 0 ? p.Out() : std::string();
}

// Polls `ddprun status --json` until its output contains `needle`.
std::string WaitForStatus(Harness& h, int port, const std::string& id, const std::string& needle,
                          double timeout_s) {
  const auto t0 = Clock::now();
  std::string last;
  do {
    last = StatusJson(h, port, id);
    if (last.find(needle) != std::string::npos) return last;
    SleepMs(20);
  } while (SecondsSince(t0) < timeout_s);
  FAIL("ddprun status never showed " << needle << " within " << timeout_s << " s; last:\n" << last);
  return last;
}

// Every process this test process started (directly, or adopted as the
// subreaper) is gone.
void RequireNoDescendants(double within_s) {
  const auto t0 = Clock::now();
  std::vector<pid_t> alive;
  do {
    ReapOrphans({});
    alive.clear();
    for (pid_t p : Descendants(::getpid()))
      if (IsAlive(p)) alive.push_back(p);
    if (alive.empty()) return;
    SleepMs(10);
  } while (SecondsSince(t0) < within_s);
  std::string ps;
  for (pid_t p : alive)
    ps += std::to_string(p) + ":" + ReadFile("/proc/" + std::to_string(p) + "/comm");
  FAIL("processes of the test still alive: " << ps);
}

bool DdprunHasFlag(const std::string& flag) {
  Harness h;
  Proc& p = h.StartDdprun("help", {"--help"});
  h.Wait(p, 10);
  return p.Out().find(flag) != std::string::npos;
}

}  // namespace

TEST_CASE(
    "scale-up: a node joining a running --nnodes=1:2 job starts a new round at world size "
    "4, not a restart",
    "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string conf = "join_timeout=10,last_call_timeout=0.3";
  const EnvList env{{"FIXTURE_SLEEP_MS", "2500"}};
  Node a = StartNode(h, "grow", 0, "1:2", 2, port, conf, env);
  // A runs alone first (after the last call).
  REQUIRE(WaitForRecords(a.out, 0, 2, 10));
  const std::vector<pid_t> alone = h.WaitForPids(a.pids, 2, 5);
  Node b = StartNode(h, "grow", 1, "1:2", 2, port, conf, env);
  REQUIRE(WaitForRecords(b.out, 1, 2, 10));
  h.RequireAllGone(alone, 2);  // A's round-0 workers were stopped for the new round
  for (Node* n : {&a, &b}) {
    const int rc = h.Wait(*n->proc, 15);
    INFO(n->proc->name << " stderr:\n" << n->proc->Err());
    CHECK(rc == 0);
  }
  INFO("A stderr:\n" << a.proc->Err() << "\nB stderr:\n" << b.proc->Err());
  CHECK(a.proc->Err().find("joined") != std::string::npos);  // the restart's reason
  // Round 0: A alone, world size 2.
  CheckRound({&a}, 0, 2, {0}, 0, a.addr);
  // Round 1 (the last): A and B, world size 4, rank 0 on A, restart count unchanged.
  CHECK(LastRound(ReadRecords(a.out)) == 1);
  CHECK(RoundsOf(ReadRecords(b.out)) == std::set<long>{1});
  CheckRound({&a, &b}, 1, 2, {0, 1}, 0, a.addr);
  h.RequireAllGone(a.pids, 2);
  h.RequireAllGone(b.pids, 2);
  h.StopDaemon(*daemon);
  RequireNoDescendants(2);
}

// Membership after the failure, from job_rendezvous.cc: the round is full
// (2:2), so C joins as a spare. B's failure opens round 1 and promotes C at
// once (spares first); the first previous member to re-join then completes
// the round (MAX reached) and the other becomes a spare. B has no worker left
// to stop and re-joins at once; A's workers ignore SIGTERM and A spends its
// --grace_period stopping them, so round 1 is exactly {B, C} and A waits as
// a spare until the job closes.
TEST_CASE("hot spare: a third node waits beyond MAX and takes the seat of a failed member",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string conf = "join_timeout=10,last_call_timeout=5";
  const std::vector<std::string> restarts{"--max_restarts=1"};
  // Global rank 2 (B's local rank 0 in round 0) exits 3 once, at restart 0.
  const EnvList fail_once{{"FIXTURE_SLEEP_MS", "2000"},
                          {"FIXTURE_FAIL_RANK", "2"},
                          {"FIXTURE_FAIL_ONLY_RESTART", "0"},
                          {"FIXTURE_EXIT_CODE", "3"}};
  const EnvList healthy{{"FIXTURE_SLEEP_MS", "2000"}};
  Node a = StartNode(h, "spare", 0, "2:2", 2, port, conf, healthy, restarts);
  Node b = StartNode(h, "spare", 1, "2:2", 2, port, conf, fail_once, restarts);
  const std::vector<pid_t> b_workers = h.WaitForPids(b.pids, 2, 10);
  const std::vector<pid_t> a_workers = h.WaitForPids(a.pids, 2, 10);
  Node c = StartNode(h, "spare", 2, "2:2", 2, port, conf, healthy, restarts);
  // C is a hot spare of the full running round: no workers.
  const std::string st = WaitForStatus(h, port, "spare", "\"waiting\":1", 1.5);
  INFO("status: " << st);
  CHECK(st.find("\"round\":0,\"state\":\"running\"") != std::string::npos);
  REQUIRE(IsAlive(b_workers[0]));  // B's failure is still to come
  CHECK(ReadPids(c.pids).empty());

  // Round 1 runs on A and the promoted C; B, whose worker failed, waits as a
  // spare and exits 0 when the job succeeds.
  for (Node* n : {&a, &b, &c}) {
    const int rc = h.Wait(*n->proc, 20);
    INFO(n->proc->name << " stderr:\n" << n->proc->Err());
    CHECK(rc == 0);
  }
  INFO("A stderr:\n"
       << a.proc->Err() << "\nB stderr:\n"
       << b.proc->Err() << "\nC stderr:\n"
       << c.proc->Err());
  CHECK(b.proc->Err().find("worker rank 2 (local rank 0) on 127.0.0.2 exited with exit code 3") !=
        std::string::npos);
  CHECK(b.proc->Err().find("the job finished before this node was needed (every worker "
                           "succeeded)") != std::string::npos);
  CHECK(a.proc->Err().find("worker failure on 127.0.0.2") != std::string::npos);

  CheckRound({&a, &b}, 0, 2, {0, 1}, 0, a.addr);
  CHECK(RoundsOf(ReadRecords(a.out)) == std::set<long>{0, 1});
  CHECK(RoundsOf(ReadRecords(b.out)) == std::set<long>{0});
  CHECK(RoundsOf(ReadRecords(c.out)) == std::set<long>{1});
  CheckRound({&a, &c}, 1, 2, {0, 1}, 1, a.addr);
  const std::string done = StatusJson(h, port, "spare");
  INFO("final status: " << done);
  CHECK(done.find("\"round\":1,\"state\":\"succeeded\"") != std::string::npos);
  CHECK(done.find("\"restarts\":1") != std::string::npos);
  for (Node* n : {&a, &b, &c}) h.RequireAllGone(n->pids, 2);
  h.StopDaemon(*daemon);
  RequireNoDescendants(2);
}

// Issue 33 item 1: the lost node was the only running one (--nnodes=1), so
// no member re-joins; the spare must take the seat by itself, and status must
// stop showing the dead node.
TEST_CASE("hot spare: kill -9 of the only running node; the spare takes the seat at once",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string conf = "join_timeout=20";
  const EnvList env{{"FIXTURE_SLEEP_MS", "3000"}};
  Node a = StartNode(h, "lastseat", 0, "1", 1, port, conf, env);
  const std::vector<pid_t> a_workers = h.WaitForPids(a.pids, 1, 10);
  Node b = StartNode(h, "lastseat", 1, "1", 1, port, conf, env);
  WaitForStatus(h, port, "lastseat", "\"waiting\":1", 5);
  CHECK(ReadPids(b.pids).empty());  // a spare: no workers yet
  REQUIRE(::kill(a.proc->pid, SIGKILL) == 0);
  const auto t0 = Clock::now();
  CHECK(h.Wait(*a.proc, 5) == 128 + SIGKILL);
  h.RequireAllGone(a_workers, 2);  // PDEATHSIG
  REQUIRE(WaitForRecords(b.out, 1, 1, 5));
  const double took = SecondsSince(t0);
  INFO("kill -9 to the spare's worker running: " << took << " s");
  CHECK(took < 4.0);
  const std::string st = StatusJson(h, port, "lastseat");
  INFO("status: " << st);
  CHECK(st.find("\"round\":1,\"state\":\"running\"") != std::string::npos);
  CHECK(st.find("\"pid\":" + std::to_string(a.proc->pid)) == std::string::npos);
  CHECK(st.find("\"pid\":" + std::to_string(b.proc->pid)) != std::string::npos);
  const int rc = h.Wait(*b.proc, 15);
  INFO("B stderr:\n" << b.proc->Err());
  CHECK(rc == 0);
  CheckRound({&b}, 1, 1, {0}, 0, b.addr);
  h.RequireAllGone(b.pids, 2);
  h.StopDaemon(*daemon);
  RequireNoDescendants(2);
}

TEST_CASE(
    "agent kill -9 in a --nnodes=2:3 job: the survivors re-form at size 2 within 2 s, "
    "no restart spent",
    "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string conf = "join_timeout=10,last_call_timeout=5";
  const EnvList env{{"FIXTURE_SLEEP_MS", "2000"}};
  std::vector<Node> nodes;
  for (int i = 0; i < 3; ++i)
    nodes.push_back(StartNode(h, "shrink3", i, "2:3", 2, port, conf, env, {"--max_restarts=2"}));
  std::vector<pid_t> killed_workers;
  for (const Node& n : nodes) {
    std::vector<pid_t> w = h.WaitForPids(n.pids, 2, 10);
    if (&n == &nodes[0]) killed_workers = w;
  }
  // Kill the master's agent (group rank 0): the next round needs a new master.
  REQUIRE(::kill(nodes[0].proc->pid, SIGKILL) == 0);
  const auto t0 = Clock::now();
  CHECK(h.Wait(*nodes[0].proc, 5) == 128 + SIGKILL);
  h.RequireAllGone(killed_workers, 2);  // PDEATHSIG
  REQUIRE(WaitForRecords(nodes[1].out, 1, 2, 5));
  REQUIRE(WaitForRecords(nodes[2].out, 1, 2, 5));
  const double took = SecondsSince(t0);
  INFO("kill -9 to every survivor worker running at size 2: " << took << " s");
  CHECK(took < 2.0);
  for (int i = 1; i < 3; ++i) {
    const int rc = h.Wait(*nodes[i].proc, 15);
    INFO(nodes[i].proc->name << " stderr:\n" << nodes[i].proc->Err());
    CHECK(rc == 0);
    CHECK(nodes[i].proc->Err().find("was lost") != std::string::npos);
  }
  CheckRound({&nodes[0], &nodes[1], &nodes[2]}, 0, 2, {0, 1, 2}, 0, nodes[0].addr);
  for (int i = 1; i < 3; ++i) CHECK(LastRound(ReadRecords(nodes[i].out)) == 1);
  CHECK(LastRound(ReadRecords(nodes[0].out)) == 0);
  CheckRound({&nodes[1], &nodes[2]}, 1, 2, {0, 1}, 0, nodes[1].addr);
  for (const Node& n : nodes) h.RequireAllGone(n.pids, 2);
  h.StopDaemon(*daemon);
  RequireNoDescendants(2);
}

TEST_CASE(
    "agent kill -9 below MIN (--nnodes=2:2): the survivor waits join_timeout, then fails "
    "clearly",
    "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string conf = "join_timeout=2";
  const EnvList env{{"FIXTURE_HANG", "1"}};
  Node a = StartNode(h, "below", 0, "2:2", 2, port, conf, env);
  Node b = StartNode(h, "below", 1, "2:2", 2, port, conf, env);
  h.WaitForPids(a.pids, 2, 10);
  const std::vector<pid_t> b_workers = h.WaitForPids(b.pids, 2, 10);
  REQUIRE(::kill(b.proc->pid, SIGKILL) == 0);
  const auto t0 = Clock::now();
  CHECK(h.Wait(*b.proc, 5) == 128 + SIGKILL);
  h.RequireAllGone(b_workers, 2);
  const int rc = h.Wait(*a.proc, 10);
  const double took = SecondsSince(t0);
  const std::string err = a.proc->Err();
  INFO("survivor stderr:\n" << err << "\nexited " << took << " s after the kill");
  CHECK(rc == 3);
  CHECK(took >= 1.9);  // it waited for the join timeout
  CHECK(took < 4.0);   // and not much longer
  CHECK(err.find("agent 127.0.0.2:" + std::to_string(b.proc->pid) + " was lost") !=
        std::string::npos);
  CHECK(err.find("rendezvous timed out after 2 s with 1 of 2 required nodes") != std::string::npos);
  CheckRound({&a, &b}, 0, 2, {0, 1}, 0, a.addr);
  CHECK(RoundsOf(ReadRecords(a.out)) == std::set<long>{0});
  h.RequireAllGone(a.pids, 2);
  h.StopDaemon(*daemon);
  RequireNoDescendants(2);
}

// Two agents on loopback, the first hosting the rendezvous (torchrun's c10d
// is_host), a fixed --nnodes=2. The second is killed: the survivor says once
// what it waits for and until when, `ddprun status` shows the same wait, and
// at the join timeout the survivor exits 3 (docs/cli.md, "Exit codes").
TEST_CASE(
    "fixed-size job loses a node: the survivor announces the wait for a replacement, status "
    "shows it, exit 3 at the join timeout",
    "[multiproc]") {
  Harness h;
  const int port = FreePort();
  const std::string conf = "join_timeout=4";
  const EnvList env{{"FIXTURE_HANG", "1"}};
  Node a = StartNode(h, "fixed", 0, "2", 1, port, conf, env);
  const auto hosting = Clock::now();
  while (a.proc->Err().find("hosting the rendezvous at") == std::string::npos &&
         SecondsSince(hosting) < 10) {
    SleepMs(10);
  }
  REQUIRE(a.proc->Err().find("hosting the rendezvous at 127.0.0.1:" + std::to_string(port)) !=
          std::string::npos);
  Node b = StartNode(h, "fixed", 1, "2", 1, port, conf, env);
  h.WaitForPids(a.pids, 1, 10);
  const std::vector<pid_t> b_workers = h.WaitForPids(b.pids, 1, 10);
  REQUIRE(::kill(b.proc->pid, SIGKILL) == 0);
  const auto t0 = Clock::now();
  CHECK(h.Wait(*b.proc, 5) == 128 + SIGKILL);
  h.RequireAllGone(b_workers, 2);

  // The announcement: one line, fenced with the round it waits for.
  const std::string needle =
      "ddprun: [job fixed round 1] a node left this fixed-size job "
      "(--nnodes=2): waiting for a replacement, 1 of 2 nodes have joined; "
      "the job fails with exit code 3 unless 2 nodes join by ";
  while (a.proc->Err().find(needle) == std::string::npos && SecondsSince(t0) < 3) SleepMs(10);
  const std::string announced = a.proc->Err();
  const std::size_t at = announced.find(needle);
  INFO("survivor stderr:\n" << announced);
  REQUIRE(at != std::string::npos);
  const std::string line = announced.substr(at, announced.find('\n', at) - at);
  // "... join by HH:MM:SS (in N s, --rdzv_conf join_timeout)", N within the 4 s timeout.
  const std::string rest = line.substr(needle.size());
  REQUIRE(rest.size() > 9);
  CHECK(rest[2] == ':');
  CHECK(rest[5] == ':');
  const std::size_t in = rest.find(" (in ");
  REQUIRE(in == 8);
  const int left = std::stoi(rest.substr(in + 5));
  CHECK(left >= 1);
  CHECK(left <= 4);
  CHECK(rest.substr(rest.find(" s, ")) == " s, --rdzv_conf join_timeout)");

  // `ddprun status` shows the same wait (asked of the survivor's server).
  const std::string text = StatusText(h, port, "fixed");
  INFO("status:\n" << text);
  CHECK(text.find("gathering") != std::string::npos);
  CHECK(text.find("  waiting for 2 nodes (1 of 2 have joined); the round fails at ") !=
        std::string::npos);
  CHECK(text.find(" s) unless they join") != std::string::npos);
  const std::string json = StatusJson(h, port, "fixed");
  CHECK(json.find("\"min_nodes\":2,\"max_nodes\":2,\"join_deadline_in_s\":") != std::string::npos);

  const int rc = h.Wait(*a.proc, 10);
  const double took = SecondsSince(t0);
  const std::string err = a.proc->Err();
  INFO("survivor stderr:\n" << err << "\nexited " << took << " s after the kill");
  CHECK(rc == 3);
  CHECK(took >= 3.9);  // it waited for the join timeout
  CHECK(took < 7.0);   // and not much longer
  CHECK(err.find("ddprun: [job fixed round 1] rendezvous timed out after 4 s with 1 of 2 "
                 "required nodes") != std::string::npos);
  // Announced once.
  CHECK(err.find("waiting for a replacement", at + line.size()) == std::string::npos);
  h.RequireAllGone(a.pids, 2);
  RequireNoDescendants(2);
}

namespace {

// A 2-node job on a ddprund with --state_dir and a tight --reattach_timeout;
// the daemon is stopped with sig while the workers run and restarted on the
// same port and state: the agents keep their workers and re-attach within the
// timeout, and the job finishes in round 0 with each worker started once.
void DaemonRestart(int sig) {
  INFO("ddprund stopped with signal " << sig);
  Harness h;
  const std::string state = h.MakeDir("state");
  const std::vector<std::string> flags{"--state_dir", state, "--reattach_timeout", "1.5"};
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon, flags);
  const std::string conf = "join_timeout=10";
  const EnvList env{{"FIXTURE_SLEEP_MS", "2500"}};
  Node a = StartNode(h, "reattach", 0, "2", 2, port, conf, env);
  Node b = StartNode(h, "reattach", 1, "2", 2, port, conf, env);
  std::vector<pid_t> workers = h.WaitForPids(a.pids, 2, 10);
  for (pid_t p : h.WaitForPids(b.pids, 2, 10)) workers.push_back(p);
  REQUIRE(::kill(daemon->pid, sig) == 0);
  CHECK(h.Wait(*daemon, 5) == (sig == SIGKILL ? 128 + SIGKILL : 0));
  SleepMs(200);
  for (pid_t w : workers) CHECK(IsAlive(w));  // the agents keep their workers
  std::vector<std::string> argv{Ddprund(), "--dashboard_port",  "0", "--host", "127.0.0.1",
                                "--port",  std::to_string(port)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  Proc& again = h.Start("ddprund2", argv);
  for (Node* n : {&a, &b}) {
    const int rc = h.Wait(*n->proc, 15);
    INFO(n->proc->name << " stderr:\n" << n->proc->Err() << "\nddprund2 stderr:\n" << again.Err());
    CHECK(rc == 0);
    CHECK(n->proc->Err().find("re-attached to the rendezvous; the round goes on") !=
          std::string::npos);
  }
  // Exactly one round: every worker started once, round 0 only.
  for (Node* n : {&a, &b}) CHECK(RoundsOf(ReadRecords(n->out)) == std::set<long>{0});
  CheckRound({&a, &b}, 0, 2, {0, 1}, 0, a.addr);
  std::vector<pid_t> after = ReadPids(a.pids);
  for (pid_t p : ReadPids(b.pids)) after.push_back(p);
  std::sort(after.begin(), after.end());
  std::sort(workers.begin(), workers.end());
  CHECK(after == workers);
  const std::string st = StatusJson(h, port, "reattach");
  INFO("status after the job: " << st);
  CHECK(st.find("\"round\":0,\"state\":\"succeeded\"") != std::string::npos);
  CHECK(st.find("\"restarts\":0") != std::string::npos);
  h.RequireAllGone(workers, 2);
  REQUIRE(::kill(again.pid, SIGTERM) == 0);
  CHECK(h.Wait(again, 10) == 0);
  RequireNoDescendants(2);
}

}  // namespace

TEST_CASE(
    "ddprund kill -9, restarted on its --state_dir with a tight --reattach_timeout: the "
    "job finishes in round 0",
    "[multiproc]") {
  DaemonRestart(SIGKILL);
}

TEST_CASE(
    "ddprund SIGTERM, restarted on its --state_dir with a tight --reattach_timeout: the "
    "job finishes in round 0",
    "[multiproc]") {
  DaemonRestart(SIGTERM);
}

TEST_CASE("quarantine: a host whose workers fail twice is refused, the job finishes without it",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon,
                                 {"--quarantine_failures", "2", "--quarantine_cooldown", "60"});
  // A long last call: both nodes are in round 0, which starts once MAX joined.
  const std::string conf = "join_timeout=10,last_call_timeout=5";
  const std::vector<std::string> restarts{"--max_restarts=5"};
  Node a = StartNode(h, "quar", 0, "1:2", 2, port, conf, {{"FIXTURE_SLEEP_MS", "1500"}}, restarts);
  // B's workers fail 300 ms in, after A's workers of the round wrote their records.
  Node b = StartNode(h, "quar", 1, "1:2", 2, port, conf,
                     {{"FIXTURE_SLEEP_MS", "300"}, {"FIXTURE_EXIT_CODE", "1"}}, restarts);
  const int rc_b = h.Wait(*b.proc, 20);
  INFO("B stderr:\n" << b.proc->Err());
  CHECK(rc_b == 3);
  CHECK(b.proc->Err().find("host 127.0.0.2 is quarantined for") != std::string::npos);
  CHECK(b.proc->Err().find("after 2 worker failures in this job") != std::string::npos);
  // A runs round 2 alone; the daemon's status says who is refused and why.
  INFO("A stderr:\n" << a.proc->Err() << "\nstatus: " << StatusJson(h, port, "quar"));
  REQUIRE(WaitForRecords(a.out, 2, 2, 10));
  const std::string st =
      WaitForStatus(h, port, "quar", "\"quarantined\":[\"127.0.0.2: 2 worker failures, ", 2);
  INFO("status: " << st);
  CHECK(st.find("\"round\":2,\"state\":\"running\"") != std::string::npos);
  CHECK(st.find("\"restarts\":2") != std::string::npos);
  const std::string text = StatusText(h, port, "quar");
  INFO("status text: " << text);
  CHECK(text.find("  quarantined 127.0.0.2: 2 worker failures, ") != std::string::npos);
  const int rc_a = h.Wait(*a.proc, 15);
  INFO("A stderr:\n" << a.proc->Err());
  CHECK(rc_a == 0);
  CheckRound({&a, &b}, 0, 2, {0, 1}, 0, a.addr);
  CheckRound({&a, &b}, 1, 2, {0, 1}, 1, a.addr);
  CHECK(RoundsOf(ReadRecords(a.out)) == std::set<long>{0, 1, 2});
  CHECK(RoundsOf(ReadRecords(b.out)) == std::set<long>{0, 1});
  CheckRound({&a}, 2, 2, {0}, 2, a.addr);  // the last round: A alone, restart 2
  for (Node* n : {&a, &b}) h.RequireAllGone(n->pids, 2);
  h.StopDaemon(*daemon);
  RequireNoDescendants(2);
}

namespace {

// The signal file's lines, "rank=<R> signal=<NAME>".
std::multiset<std::string> SignalLines(const std::string& path) {
  std::vector<std::string> lines = Lines(ReadFile(path));
  return {lines.begin(), lines.end()};
}

std::multiset<std::string> Expected(int nproc, const std::vector<std::string>& names) {
  std::multiset<std::string> out;
  for (int r = 0; r < nproc; ++r)
    for (const std::string& n : names) out.insert("rank=" + std::to_string(r) + " signal=" + n);
  return out;
}

// sig to a ddprun whose workers hang: every worker gets it (and records it),
// ddprun exits 128+sig well before --grace_period, nothing is left.
void SignalReachesEveryWorker(int sig, const std::string& name) {
  INFO("signal " << name);
  Harness h;
  const std::string pids = h.PidDir("pids");
  const std::string out = h.MakeDir("out");
  const std::string file = h.dir() + "/signals.txt";
  constexpr int kNproc = 3;
  Proc& p = h.StartDdprun(
      "ddprun",
      {"--nproc_per_node=" + std::to_string(kNproc), "--grace_period=10", FixtureWorker()},
      {{"FIXTURE_PIDFILE_DIR", pids},
       {"FIXTURE_OUT_DIR", out},
       {"FIXTURE_HANG", "1"},
       {"FIXTURE_SIGNAL_FILE", file}});
  const std::vector<pid_t> workers = h.WaitForPids(pids, kNproc, 10);
  REQUIRE(::kill(p.pid, sig) == 0);
  const auto t0 = Clock::now();
  const int rc = h.Wait(p, 10);
  INFO("stderr:\n" << p.Err());
  CHECK(rc == 128 + sig);
  CHECK(SecondsSince(t0) < 3.0);
  CHECK(p.Err().find("received " + name + "; forwarding it to the workers") != std::string::npos);
  CHECK(SignalLines(file) == Expected(kNproc, {name}));
  const std::vector<Record> recs = ReadRecords(out);
  CHECK(recs.size() == static_cast<std::size_t>(kNproc));
  for (const Record& r : recs) {
    CHECK(r.round == 0);
    CHECK(r.Int("world_size") == kNproc);
  }
  h.RequireAllGone(workers, 2);
  RequireNoDescendants(2);
}

}  // namespace

TEST_CASE("SIGHUP, SIGQUIT, SIGINT and SIGTERM to ddprun reach every worker", "[multiproc]") {
  SECTION("SIGHUP") { SignalReachesEveryWorker(SIGHUP, "SIGHUP"); }
  SECTION("SIGQUIT") { SignalReachesEveryWorker(SIGQUIT, "SIGQUIT"); }
  SECTION("SIGINT") { SignalReachesEveryWorker(SIGINT, "SIGINT"); }
  SECTION("SIGTERM") { SignalReachesEveryWorker(SIGTERM, "SIGTERM"); }
}

TEST_CASE("SIGUSR1 and SIGUSR2 are forwarded to every worker and the job goes on", "[multiproc]") {
  // Forwarding SIGUSR1/2 while the job runs is asked for with --forward_signals
  // (--signals_to_handle, as in torchrun, stops the job on them); without it
  // they are ignored.
  const bool has_flag = DdprunHasFlag("forward_signals");
  Harness h;
  const std::string pids = h.PidDir("pids");
  const std::string out = h.MakeDir("out");
  const std::string file = h.dir() + "/signals.txt";
  constexpr int kNproc = 2;
  std::vector<std::string> args{"--nproc_per_node=" + std::to_string(kNproc)};
  if (has_flag) args.push_back("--forward_signals=SIGUSR1,SIGUSR2");
  args.push_back(FixtureWorker());
  Proc& p = h.StartDdprun("ddprun", args,
                          {{"FIXTURE_PIDFILE_DIR", pids},
                           {"FIXTURE_OUT_DIR", out},
                           {"FIXTURE_SLEEP_MS", "1500"},
                           {"FIXTURE_SIGNAL_FILE", file}});
  const std::vector<pid_t> workers = h.WaitForPids(pids, kNproc, 10);
  auto wait_lines = [&](const std::multiset<std::string>& want) {
    const auto t0 = Clock::now();
    while (SignalLines(file) != want && SecondsSince(t0) < 2) SleepMs(5);
    return SignalLines(file);
  };
  REQUIRE(::kill(p.pid, SIGUSR1) == 0);
  CHECK(wait_lines(Expected(kNproc, {"SIGUSR1"})) == Expected(kNproc, {"SIGUSR1"}));
  REQUIRE(::kill(p.pid, SIGUSR2) == 0);
  CHECK(wait_lines(Expected(kNproc, {"SIGUSR1", "SIGUSR2"})) ==
        Expected(kNproc, {"SIGUSR1", "SIGUSR2"}));
  for (pid_t w : workers) CHECK(IsAlive(w));  // the same workers go on
  const int rc = h.Wait(p, 10);
  INFO("stderr:\n" << p.Err());
  CHECK(rc == 0);
  const std::vector<Record> recs = ReadRecords(out);
  CHECK(recs.size() == static_cast<std::size_t>(kNproc));
  for (const Record& r : recs) {
    CHECK(r.round == 0);
    CHECK(r.Int("restart_count") == 0);
  }
  h.RequireAllGone(workers, 2);

  if (has_flag) {
    INFO("without --forward_signals listing them, SIGUSR1/2 are not forwarded");
    {
      Harness h2;
      const std::string pids2 = h2.PidDir("pids");
      const std::string file2 = h2.dir() + "/signals.txt";
      Proc& q = h2.StartDdprun("ddprun", {"--nproc_per_node=2", FixtureWorker()},
                               {{"FIXTURE_PIDFILE_DIR", pids2},
                                {"FIXTURE_SLEEP_MS", "800"},
                                {"FIXTURE_SIGNAL_FILE", file2}});
      h2.WaitForPids(pids2, 2, 10);
      REQUIRE(::kill(q.pid, SIGUSR1) == 0);
      REQUIRE(::kill(q.pid, SIGUSR2) == 0);
      const int rc2 = h2.Wait(q, 10);
      INFO("stderr:\n" << q.Err());
      CHECK(rc2 == 0);
      CHECK(ReadFile(file2).empty());
      CHECK(q.Err().find("ignoring SIGUSR1") != std::string::npos);
      h2.RequireAllGone(pids2, 2);
    }
  }
  RequireNoDescendants(2);
}
