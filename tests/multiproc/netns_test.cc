// A cut network (issue 3): two network namespaces joined by a veth pair, the
// daemon and node A in the first, node B in the second. Taking B's end of the
// link down leaves B's connection silent (no FIN, no RST): the daemon must
// notice within --lease_timeout and A must re-form the job alone.
//
// Needs root and iproute2's `ip`; without them the test is skipped with a
// warning. The namespaces and the veth pair are named after the test's pid
// and removed in every case (RAII, after the Harness has killed the processes
// that run in them).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

// Runs a shell command with a deadline; true when it exited 0.
bool Sh(const std::string& cmd) {
  const std::string full = "timeout 10 " + cmd + " >/dev/null 2>&1";
  return std::system(full.c_str()) == 0;
}

std::string FindIp() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

// ns1 <-veth-> ns2, 10.77.<n>.1/24 in ns1 and 10.77.<n>.2/24 in ns2.
class NetPair {
 public:
  NetPair() {
    ip_ = FindIp();
    if (::geteuid() != 0) {
      why_ = "needs root (network namespaces)";
      return;
    }
    if (ip_.empty()) {
      why_ = "needs iproute2's ip";
      return;
    }
    const std::string id = std::to_string(::getpid());
    ns1_ = "ddpft1_" + id;
    ns2_ = "ddpft2_" + id;
    veth1_ = "dft1_" + id;  // interface names: at most 15 characters
    veth2_ = "dft2_" + id;
    const std::string net = "10.77." + std::to_string(::getpid() % 250 + 1) + ".";
    addr1_ = net + "1";
    addr2_ = net + "2";
    RemoveStale();
    const std::vector<std::string> steps{
        ip_ + " netns add " + ns1_,
        ip_ + " netns add " + ns2_,
        ip_ + " link add " + veth1_ + " type veth peer name " + veth2_,
        ip_ + " link set " + veth1_ + " netns " + ns1_,
        ip_ + " link set " + veth2_ + " netns " + ns2_,
        ip_ + " -n " + ns1_ + " addr add " + addr1_ + "/24 dev " + veth1_,
        ip_ + " -n " + ns2_ + " addr add " + addr2_ + "/24 dev " + veth2_,
        ip_ + " -n " + ns1_ + " link set lo up",
        ip_ + " -n " + ns2_ + " link set lo up",
        ip_ + " -n " + ns1_ + " link set " + veth1_ + " up",
        ip_ + " -n " + ns2_ + " link set " + veth2_ + " up",
    };
    for (const std::string& s : steps) {
      if (!Sh(s)) {
        why_ = "cannot set up network namespaces (`" + s + "` failed)";
        return;
      }
    }
    // Both ends report carrier (LOWER_UP) once the pair is up.
    const auto t0 = Clock::now();
    auto up = [&](const std::string& ns, const std::string& dev) {
      return Sh(ip_ + " -n " + ns + " -o link show dev " + dev + " | grep -q LOWER_UP");
    };
    while (!(up(ns1_, veth1_) && up(ns2_, veth2_))) {
      if (SecondsSince(t0) > 5) {
        why_ = "the veth pair did not come up within 5 s";
        return;
      }
      SleepMs(10);
    }
    ok_ = true;
  }

  ~NetPair() {
    if (ns1_.empty()) return;
    Sh(ip_ + " netns del " + ns1_);
    Sh(ip_ + " netns del " + ns2_);
    Sh(ip_ + " link del " + veth1_);  // if it never left the root namespace
  }

  NetPair(const NetPair&) = delete;
  NetPair& operator=(const NetPair&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const std::string& addr1() const { return addr1_; }
  const std::string& addr2() const { return addr2_; }

  // argv prefix that runs a command in namespace 1 or 2.
  std::vector<std::string> In(int which) const {
    return {ip_, "netns", "exec", which == 1 ? ns1_ : ns2_};
  }

  // Takes namespace 2's end of the link down: B's packets go nowhere.
  bool Cut() const { return Sh(ip_ + " -n " + ns2_ + " link set " + veth2_ + " down"); }

 private:
  // Namespaces of earlier runs whose test process died without cleaning up.
  void RemoveStale() const {
    for (const std::string& n : ListDir("/run/netns")) {
      if (n.rfind("ddpft", 0) != 0 || n.size() < 8) continue;
      const std::string pid = n.substr(n.find('_') + 1);
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0) Sh(ip_ + " netns del " + n);
    }
  }

  std::string ip_, why_, ns1_, ns2_, veth1_, veth2_, addr1_, addr2_;
  bool ok_ = false;
};

// Waits for ddprund's ready line; returns its port.
int WaitForReadyLine(Proc& d, double timeout_s) {
  const auto t0 = Clock::now();
  const std::string prefix = "ddprund listening on ";
  while (SecondsSince(t0) < timeout_s) {
    const std::string text = d.Out();
    const std::size_t at = text.find(prefix);
    const std::size_t nl = at == std::string::npos ? at : text.find('\n', at);
    if (nl != std::string::npos) {
      const std::string addr = text.substr(at + prefix.size(), nl - at - prefix.size());
      return std::stoi(addr.substr(addr.rfind(':') + 1));
    }
    if (!IsAlive(d.pid)) FAIL("ddprund exited early: " << d.Err());
    SleepMs(5);
  }
  FAIL("ddprund printed no ready line within " << timeout_s << " s: " << d.Err());
  return -1;
}

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
