// The rest of an agent's life: the daemon going away mid-job, signals while
// joining, elastic ranges and join tokens; and how ddprund sets up its heap
// (it re-executes itself with glibc tunables, server_heap.h).
#include <link.h>
#include <signal.h>
#include <sys/auxv.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ddprun/rendezvous/daemon/server_heap.h"
#include "support/process_helpers.h"

using namespace ddprun::test;

namespace {

std::vector<std::string> JobFlags(int port, const std::string& id, const std::string& nnodes,
                                  const std::string& conf, int node) {
  return {"--nnodes=" + nnodes,
          "--nproc_per_node=2",
          "--local_addr=127.0.0." + std::to_string(node + 1),
          "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
          "--rdzv_id=" + id,
          "--rdzv_conf=" + conf,
          FixtureWorker()};
}

// A 2-node job on a ddprund with --state_dir; the daemon is stopped with sig
// while the workers run, and restarted on the same port with the same state:
// the agents keep their workers, re-attach, and the round completes.
void DaemonRestartMidJob(int sig) {
  INFO("the daemon is stopped with signal " << sig);
  Harness h;
  const std::string state = h.MakeDir("state");
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon, {"--state_dir", state});
  const std::string pids = h.PidDir("pids");
  std::vector<std::string> outs;
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    outs.push_back(h.MakeDir("out" + std::to_string(i)));
    agents.push_back(&h.StartDdprun("node" + std::to_string(i),
                                    JobFlags(port, "survive", "2", "join_timeout=20", i),
                                    {{"FIXTURE_PIDFILE_DIR", pids},
                                     {"FIXTURE_OUT_DIR", outs.back()},
                                     {"FIXTURE_SLEEP_MS", "2500"}}));
  }
  const std::vector<pid_t> workers = h.WaitForPids(pids, 4, 20);
  REQUIRE(::kill(daemon->pid, sig) == 0);
  CHECK(h.Wait(*daemon, 10) == (sig == SIGTERM ? 0 : 128 + SIGKILL));
  SleepMs(200);
  for (pid_t w : workers) CHECK(IsAlive(w));  // the agents keep their workers
  Proc& again = h.Start("ddprund2", {Ddprund(), "--dashboard_port", "0", "--host", "127.0.0.1",
                                     "--port", std::to_string(port), "--state_dir", state});
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 10);
    INFO(a->name << " stderr:\n" << a->Err() << "\nddprund2 stderr:\n" << again.Err());
    CHECK(rc == 0);
    CHECK(a->Err().find("re-attached") != std::string::npos);
  }
  // One round, each worker started once.
  CHECK(ReadPids(pids).size() == 4);
  std::set<long> ranks;
  for (const std::string& out : outs)
    for (const Record& r : ReadRecords(out)) {
      CHECK(r.Int("restart_count") == 0);
      CHECK(ranks.insert(r.Int("rank")).second);
    }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  h.RequireAllGone(pids, 2);
  REQUIRE(::kill(again.pid, SIGTERM) == 0);
  CHECK(h.Wait(again, 10) == 0);
}

// Thread arenas of glibc's malloc in process `pid`: its anonymous mappings
// of 32 MiB or more that are reserved, not accessible (each arena reserves
// 64 MiB and makes it accessible as it grows).
int ThreadArenas(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) {
    std::istringstream f(line);
    std::string range, perms, offset, dev, inode, path;
    f >> range >> perms >> offset >> dev >> inode >> path;
    const std::size_t dash = range.find('-');
    const std::uint64_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const std::uint64_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (perms == "---p" && path.empty() && end - begin >= (32u << 20)) ++n;
  }
  return n;
}

// The path of this process's dynamic loader (the object loaded at AT_BASE).
std::string DynamicLoader() {
  struct Found {
    ElfW(Addr) base;
    std::string path;
  } found{static_cast<ElfW(Addr)>(getauxval(AT_BASE)), ""};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* f = static_cast<Found*>(data);
        if (info->dlpi_addr == f->base && info->dlpi_name) f->path = info->dlpi_name;
        return 0;
      },
      &found);
  return found.path;
}

}  // namespace

TEST_CASE("ddprund started through the dynamic loader serves, without re-executing",
          "[multiproc]") {
  const std::string loader = DynamicLoader();
  REQUIRE_FALSE(loader.empty());
  Harness h;
  Proc& d = h.Start("ddprund", {loader, Ddprund(), "--host", "127.0.0.1", "--port", "0",
                                "--dashboard_port", "0"});
  const auto t0 = Clock::now();
  while (d.Out().find("ddprund listening on ") == std::string::npos && SecondsSince(t0) < 10 &&
         IsAlive(d.pid)) {
    SleepMs(5);
  }
  INFO("ddprund's stderr: " << d.Err());
  REQUIRE(d.Out().find("ddprund listening on ") != std::string::npos);
  const std::string env = ReadFile("/proc/" + std::to_string(d.pid) + "/environ");
  CHECK(env.find(ddprun::rendezvous::kServerHeapReexecMark) == std::string::npos);
  h.StopDaemon(d);
}

TEST_CASE("ddprund serves from one heap with huge-page advice; the user's GLIBC_TUNABLES wins",
          "[multiproc]") {
  Harness h;
  SECTION("by default: re-executed once with glibc's tunables, no thread arenas") {
    Proc* d = nullptr;
    h.StartDaemon("ddprund", &d);
    // The re-executed process's environment as it started (the pid is the same).
    const std::string env = ReadFile("/proc/" + std::to_string(d->pid) + "/environ");
    CHECK(env.find("glibc.malloc.hugetlb=1") != std::string::npos);
    // gRPC's threads have allocated by the time it listens: all from one arena.
    CHECK(ThreadArenas(d->pid) == 0);
    h.StopDaemon(*d);
  }
  SECTION("GLIBC_TUNABLES naming glibc.malloc.hugetlb: not re-executed, glibc's arenas") {
    Proc* d = nullptr;
    h.StartDaemon("ddprund", &d, {}, {{"GLIBC_TUNABLES", "glibc.malloc.hugetlb=0"}});
    const std::string env = ReadFile("/proc/" + std::to_string(d->pid) + "/environ");
    CHECK(env.find(ddprun::rendezvous::kServerHeapReexecMark) == std::string::npos);
    CHECK(ThreadArenas(d->pid) >= 1);
    h.StopDaemon(*d);
  }
}

TEST_CASE("ddprund SIGKILLed and restarted mid-job with --state_dir: the round goes on",
          "[multiproc]") {
  DaemonRestartMidJob(SIGKILL);
}

TEST_CASE("ddprund SIGTERMed and restarted mid-job with --state_dir: the round goes on",
          "[multiproc]") {
  DaemonRestartMidJob(SIGTERM);
}

// A ddprund that is alive but does not answer for 3 s (SIGSTOP: its kernel
// still acknowledges every segment, as when 10,000 strangers connect to it on
// a loaded machine, docs/security.md) delays the agent's keepalive answer
// past 1 s. The agent must not take that for a lost link: had it dropped its
// stream, ddprund would count the node as lost when it runs again, and this
// job, with no restart allowed, would end (`cannot re-attach: ... the job is
// closed`).
TEST_CASE(
    "ddprund stopped for 3 s (alive, answering nothing): the agent keeps its stream, the "
    "round goes on",
    "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string pids = h.PidDir("pids");
  const std::string out = h.MakeDir("out");
  Proc& agent = h.StartDdprun(
      "node", JobFlags(port, "stopped", "1", "join_timeout=20", 0),
      {{"FIXTURE_PIDFILE_DIR", pids}, {"FIXTURE_OUT_DIR", out}, {"FIXTURE_SLEEP_MS", "4500"}});
  const std::vector<pid_t> workers = h.WaitForPids(pids, 2, 20);
  REQUIRE(::kill(daemon->pid, SIGSTOP) == 0);
  SleepMs(3000);  // the length of the stop is the test, not a synchronisation
  REQUIRE(::kill(daemon->pid, SIGCONT) == 0);
  const int rc = h.Wait(agent, 15);
  INFO("agent stderr:\n" << agent.Err() << "\nddprund stderr:\n" << daemon->Err());
  CHECK(rc == 0);
  CHECK(agent.Err().find("lost the rendezvous") == std::string::npos);
  CHECK(ReadPids(pids).size() == 2);  // one round, each worker started once
  for (const Record& r : ReadRecords(out)) CHECK(r.Int("restart_count") == 0);
  h.RequireAllGone(workers, 2);
  h.StopDaemon(*daemon);
}

// Issue 33 item 00: ddprund SIGKILLed while a job gathers (one of its two
// nodes joined) and restarted on its --state_dir: the joined agent joins the
// same endpoint again, the second node joins, and the job runs.
TEST_CASE("ddprund SIGKILLed and restarted while a job gathers: the agent re-joins and the job runs",
          "[multiproc]") {
  Harness h;
  const std::string state = h.MakeDir("state");
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon, {"--state_dir", state});
  const std::string pids = h.PidDir("pids");
  std::vector<std::string> outs;
  std::vector<Proc*> agents;
  auto start_node = [&](int i) {
    outs.push_back(h.MakeDir("out" + std::to_string(i)));
    agents.push_back(&h.StartDdprun("node" + std::to_string(i),
                                    JobFlags(port, "gather", "2", "join_timeout=20", i),
                                    {{"FIXTURE_PIDFILE_DIR", pids},
                                     {"FIXTURE_OUT_DIR", outs.back()},
                                     {"FIXTURE_SLEEP_MS", "300"}}));
  };
  start_node(0);
  // The daemon knows the job (its first join) before it is killed.
  const auto t0 = Clock::now();
  std::string st;
  do {
    Proc& p =
        h.StartDdprun("status", {"status", "--rdzv_endpoint", "127.0.0.1:" + std::to_string(port),
                                 "--rdzv_id", "gather", "--json", "--timeout", "2"});
    st = h.Wait(p, 5) == 0 ? p.Out() : "";
    if (st.find("gathering") == std::string::npos) SleepMs(20);
  } while (st.find("gathering") == std::string::npos && SecondsSince(t0) < 10);
  REQUIRE(st.find("gathering") != std::string::npos);
  REQUIRE(::kill(daemon->pid, SIGKILL) == 0);
  CHECK(h.Wait(*daemon, 10) == 128 + SIGKILL);
  Proc& again = h.Start("ddprund2", {Ddprund(), "--dashboard_port", "0", "--host", "127.0.0.1",
                                     "--port", std::to_string(port), "--state_dir", state});
  start_node(1);
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 20);
    INFO(a->name << " stderr:\n" << a->Err() << "\nddprund2 stderr:\n" << again.Err());
    CHECK(rc == 0);
  }
  INFO("node0 stderr:\n" << agents[0]->Err());
  CHECK(agents[0]->Err().find("joining it again") != std::string::npos);
  std::set<long> ranks;
  for (const std::string& out : outs)
    for (const Record& r : ReadRecords(out)) {
      CHECK(r.Int("world_size") == 4);
      CHECK(ranks.insert(r.Int("rank")).second);
    }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  h.RequireAllGone(pids, 2);
  REQUIRE(::kill(again.pid, SIGTERM) == 0);
  CHECK(h.Wait(again, 10) == 0);
}

TEST_CASE("SIGTERM while waiting for the other nodes: exit 143 at once", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string pids = h.PidDir("pids");
  Proc& a = h.StartDdprun("lone", JobFlags(port, "lonely", "2", "join_timeout=20", 0),
                          {{"FIXTURE_PIDFILE_DIR", pids}});
  SleepMs(500);
  REQUIRE_FALSE(a.exit.has_value());
  REQUIRE(::kill(a.pid, SIGTERM) == 0);
  const auto t0 = Clock::now();
  const int rc = h.Wait(a, 10);
  INFO("stderr:\n" << a.Err());
  CHECK(rc == 143);
  CHECK(SecondsSince(t0) < 2.0);
  CHECK(ReadPids(pids).empty());
  h.StopDaemon(*daemon);
}

TEST_CASE("elastic --nnodes=1:2: one node starts alone after last_call_timeout", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string out = h.MakeDir("out");
  const std::string pids = h.PidDir("pids");
  Proc& a =
      h.StartDdprun("alone", JobFlags(port, "el1", "1:2", "join_timeout=10,last_call_timeout=1", 0),
                    {{"FIXTURE_OUT_DIR", out}, {"FIXTURE_PIDFILE_DIR", pids}});
  const int rc = h.Wait(a, 15);
  INFO("stderr:\n" << a.Err());
  CHECK(rc == 0);
  CHECK(a.Seconds() >= 0.9);  // it waited for the last call
  const std::vector<Record> recs = ReadRecords(out);
  REQUIRE(recs.size() == 2);
  for (const Record& r : recs) {
    CHECK(r.Int("world_size") == 2);
    CHECK(r.Int("group_world_size") == 1);
  }
  h.RequireAllGone(pids, 2);
  h.StopDaemon(*daemon);
}

TEST_CASE("elastic --nnodes=1:2: two nodes joining together form one round", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string pids = h.PidDir("pids");
  std::vector<std::string> outs;
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    outs.push_back(h.MakeDir("out" + std::to_string(i)));
    // A last call long enough that both nodes are in the first round, which
    // then starts as soon as MAX nodes have joined.
    agents.push_back(
        &h.StartDdprun("node" + std::to_string(i),
                       JobFlags(port, "el2", "1:2", "join_timeout=20,last_call_timeout=10", i),
                       {{"FIXTURE_OUT_DIR", outs.back()}, {"FIXTURE_PIDFILE_DIR", pids}}));
  }
  for (Proc* a : agents) {
    const int rc = h.Wait(*a, 20);
    INFO(a->name << " stderr:\n" << a->Err());
    CHECK(rc == 0);
    CHECK(a->Seconds() < 8.0);  // MAX reached: no need to wait out the last call
  }
  std::set<long> ranks;
  for (const std::string& out : outs) {
    const std::vector<Record> recs = ReadRecords(out);
    REQUIRE(recs.size() == 2);
    for (const Record& r : recs) {
      CHECK(r.Int("world_size") == 4);
      CHECK(r.Int("group_world_size") == 2);
      CHECK(ranks.insert(r.Int("rank")).second);
    }
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
  h.RequireAllGone(pids, 2);
  h.StopDaemon(*daemon);
}

TEST_CASE("a node with the wrong join token is refused", "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  const std::string pids = h.PidDir("pids");
  Proc& a = h.StartDdprun("a", JobFlags(port, "tok", "2", "join_timeout=20,token=secret", 0),
                          {{"FIXTURE_PIDFILE_DIR", pids}});
  SleepMs(500);
  Proc& b = h.StartDdprun("b", JobFlags(port, "tok", "2", "join_timeout=20,token=guess", 1),
                          {{"FIXTURE_PIDFILE_DIR", pids}});
  const int rc = h.Wait(b, 10);
  INFO("b stderr:\n" << b.Err());
  CHECK(rc == 3);
  CHECK(b.Err().find("wrong join token") != std::string::npos);
  CHECK(b.Seconds() < 3.0);
  REQUIRE(::kill(a.pid, SIGTERM) == 0);
  CHECK(h.Wait(a, 10) == 143);
  CHECK(ReadPids(pids).empty());
  h.StopDaemon(*daemon);
}

TEST_CASE("a node SIGKILLed mid-job: its workers die, the other node gives up after join_timeout",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  std::vector<std::string> pids;
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    pids.push_back(h.PidDir("pids" + std::to_string(i)));
    agents.push_back(&h.StartDdprun("node" + std::to_string(i),
                                    JobFlags(port, "lost", "2", "join_timeout=2", i),
                                    {{"FIXTURE_PIDFILE_DIR", pids.back()}, {"FIXTURE_HANG", "1"}}));
  }
  for (const std::string& d : pids) h.WaitForPids(d, 2, 20);
  REQUIRE(::kill(agents[1]->pid, SIGKILL) == 0);
  CHECK(h.Wait(*agents[1], 5) == 128 + SIGKILL);
  h.RequireAllGone(pids[1], 2);  // PDEATHSIG
  // The survivor stops its workers for the next round, which cannot form.
  const int rc = h.Wait(*agents[0], 15);
  const std::string err = agents[0]->Err();
  INFO("survivor stderr:\n" << err);
  CHECK(rc == 3);
  CHECK(err.find("was lost") != std::string::npos);
  CHECK(err.find("1 of 2 required nodes") != std::string::npos);
  h.RequireAllGone(pids[0], 2);
  h.StopDaemon(*daemon);
}

TEST_CASE("elastic --nnodes=1:2: losing a node re-forms the job without using a restart",
          "[multiproc]") {
  Harness h;
  Proc* daemon = nullptr;
  const int port = h.StartDaemon("ddprund", &daemon);
  std::vector<std::string> pids, outs;
  std::vector<Proc*> agents;
  for (int i = 0; i < 2; ++i) {
    pids.push_back(h.PidDir("pids" + std::to_string(i)));
    outs.push_back(h.MakeDir("out" + std::to_string(i)));
    agents.push_back(
        &h.StartDdprun("node" + std::to_string(i),
                       JobFlags(port, "shrink", "1:2", "join_timeout=20,last_call_timeout=1", i),
                       {{"FIXTURE_PIDFILE_DIR", pids.back()},
                        {"FIXTURE_OUT_DIR", outs.back()},
                        {"FIXTURE_SLEEP_MS", "2500"}}));
  }
  for (const std::string& d : pids) h.WaitForPids(d, 2, 20);
  REQUIRE(::kill(agents[1]->pid, SIGKILL) == 0);
  CHECK(h.Wait(*agents[1], 5) == 128 + SIGKILL);
  const int rc = h.Wait(*agents[0], 20);
  INFO("survivor stderr:\n" << agents[0]->Err());
  CHECK(rc == 0);
  const std::vector<Record> all = ReadRecords(outs[0]);
  long first = -1, last = -1;
  for (const Record& r : all) {
    if (first < 0 || r.round < first) first = r.round;
    last = std::max(last, r.round);
  }
  REQUIRE(last > first);  // a second round ran
  for (const Record& r : RecordsOfRound(all, first)) CHECK(r.Int("world_size") == 4);
  const std::vector<Record> alone = RecordsOfRound(all, last);
  REQUIRE(alone.size() == 2);
  for (const Record& r : alone) {
    INFO(r.file);
    CHECK(r.Int("world_size") == 2);
    CHECK(r.Int("group_world_size") == 1);
    CHECK(r.Int("restart_count") == 0);  // membership changes do not spend restarts
  }
  for (const std::string& d : pids) h.RequireAllGone(d, 2);
  h.StopDaemon(*daemon);
}
