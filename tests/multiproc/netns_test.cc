// A cut network (issue 3): two network namespaces joined by a veth pair, the
// daemon and node A in the first, node B in the second. Taking B's end of the
// link down leaves B's connection silent (no FIN, no RST): the daemon must
// notice within --lease_timeout and A must re-form the job alone.
//
// Needs root and iproute2's `ip` (support/net_pair.h); without them the test
// is skipped with a warning.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "support/net_pair.h"
#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

bool WaitForRecords(const std::string& dir, long round, std::size_t n, double timeout_s) {
  const auto t0 = Clock::now();
  do {
    if (RecordsOfRound(ReadRecords(dir), round).size() >= n) return true;
    SleepMs(5);
  } while (SecondsSince(t0) < timeout_s);
  return false;
}

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
  FAIL("processes of the test still alive: " << Harness::Join(alive));
}

}  // namespace

TEST_CASE(
    "cut link (network namespaces): the daemon notices within --lease_timeout and the "
    "survivor re-forms alone",
    "[multiproc][netns]") {
  NetPair net;  // declared first: removed after the Harness killed everything
  if (!net.ok()) {
    return SkipCase("multiproc", "cut-link test: " + net.why());
  }
  Harness h;
  std::vector<std::string> dargv = net.In(1);
  for (const std::string& a : {Ddprund(), std::string("--dashboard_port"), std::string("0"),
                               std::string("--host"), net.addr1(), std::string("--port"),
                               std::string("0"), std::string("--lease_timeout"), std::string("1")})
    dargv.push_back(a);
  Proc& daemon = h.Start("ddprund", dargv);
  const int port = WaitForReadyLine(daemon, 10);

  struct Node {
    Proc* proc = nullptr;
    std::string out, pids, addr;
  };
  auto start = [&](int which, const std::string& addr) {
    Node n;
    n.addr = addr;
    n.out = h.MakeDir("out" + std::to_string(which));
    n.pids = h.PidDir("pids" + std::to_string(which));
    std::vector<std::string> argv = net.In(which);
    for (const std::string& a :
         {Ddprun(), std::string("--nnodes=1:2"), std::string("--nproc_per_node=2"),
          "--local_addr=" + addr, "--rdzv_endpoint=" + net.addr1() + ":" + std::to_string(port),
          std::string("--rdzv_id=cut"),
          std::string("--rdzv_conf=join_timeout=10,last_call_timeout=5"), FixtureWorker()})
      argv.push_back(a);
    n.proc = &h.Start("node" + std::to_string(which), argv,
                      {{"FIXTURE_OUT_DIR", n.out},
                       {"FIXTURE_PIDFILE_DIR", n.pids},
                       {"FIXTURE_SLEEP_MS", "3000"}});
    return n;
  };
  Node a = start(1, net.addr1());
  Node b = start(2, net.addr2());
  const std::vector<pid_t> a_workers = h.WaitForPids(a.pids, 2, 10);
  const std::vector<pid_t> b_workers = h.WaitForPids(b.pids, 2, 10);

  REQUIRE(net.Cut());
  const auto t0 = Clock::now();
  const bool reformed = WaitForRecords(a.out, 1, 2, 6);
  const double took = SecondsSince(t0);
  INFO("A stderr:\n"
       << a.proc->Err() << "\nB stderr:\n"
       << b.proc->Err() << "\nddprund stderr:\n"
       << daemon.Err());
  INFO("link down to A's workers running alone: " << took << " s");
  REQUIRE(reformed);
  // Noticed within the 1 s lease (keepalive ping + timeout), plus the
  // re-rendezvous and the spawn.
  CHECK(took < 2.0);
  CHECK(a.proc->Err().find("agent " + net.addr2() + ":") != std::string::npos);
  CHECK(a.proc->Err().find("was lost") != std::string::npos);
  h.RequireAllGone(a_workers, 2);  // A's round-0 workers were stopped at once

  const int rc = h.Wait(*a.proc, 10);
  CHECK(rc == 0);

  // Round 0: A (group rank 0, the master) and B, world size 4.
  std::set<long> ranks;
  for (const Node* n : {&a, &b}) {
    const std::vector<Record> recs = RecordsOfRound(ReadRecords(n->out), 0);
    REQUIRE(recs.size() == 2);
    const long group = n == &a ? 0 : 1;
    for (const Record& r : recs) {
      INFO(r.file);
      CHECK(r.Int("world_size") == 4);
      CHECK(r.Int("group_world_size") == 2);
      CHECK(r.Int("group_rank") == group);
      CHECK(r.Int("rank") == group * 2 + r.Int("local_rank"));
      CHECK(r.Str("master_addr") == net.addr1());
      CHECK(r.Int("restart_count") == 0);
      ranks.insert(r.Int("rank"));
    }
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  // Round 1, the last: A alone, world size 2, no restart spent.
  std::set<long> rounds;
  for (const Record& r : ReadRecords(a.out)) rounds.insert(r.round);
  CHECK(rounds == std::set<long>{0, 1});
  const std::vector<Record> alone = RecordsOfRound(ReadRecords(a.out), 1);
  REQUIRE(alone.size() == 2);
  for (const Record& r : alone) {
    INFO(r.file);
    CHECK(r.Int("world_size") == 2);
    CHECK(r.Int("group_world_size") == 1);
    CHECK(r.Int("group_rank") == 0);
    CHECK(r.Int("rank") == r.Int("local_rank"));
    CHECK(r.Int("restart_count") == 0);
    CHECK(r.Str("master_addr") == net.addr1());
  }
  for (const Record& r : ReadRecords(b.out)) CHECK(r.round == 0);
  h.RequireAllGone(a.pids, 2);

  // B, cut off, never learns that the job went on without it: kill it.
  REQUIRE(::kill(b.proc->pid, SIGKILL) == 0);
  CHECK(h.Wait(*b.proc, 5) == 128 + SIGKILL);
  h.RequireAllGone(b_workers, 2);
  REQUIRE(::kill(daemon.pid, SIGTERM) == 0);
  CHECK(h.Wait(daemon, 10) == 0);
  RequireNoDescendants(2);
}
