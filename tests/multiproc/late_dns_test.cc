// A rendezvous host name that resolves only after a while, as a pod's DNS
// name does on Kubernetes (docs/schedulers.md, "Kubernetes"): ddprun looks
// it up again until join_timeout, with one line while it waits, and one line
// and exit 3 at the deadline (agent/src/name_wait.h).
//
// The name lives in a private /etc/hosts: a holder process makes a mount and
// network namespace (only loopback), bind-mounts the test's hosts file over
// /etc/hosts and sleeps; the ddprun processes enter it with nsenter. The test
// appends the name to the file after a delay; the system's DNS is never
// touched. Needs root, unshare, nsenter and ip; skipped without them.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/process_helpers.h"
#include "support/skip.h"

using namespace ddprun::test;

namespace {

constexpr const char* kLateName = "late-node.test";

// A mount + network namespace whose /etc/hosts is hosts_path.
class PrivateHosts {
 public:
  explicit PrivateHosts(Harness& h) : h_(h) {
    path_ = h.dir() + "/hosts";
    std::ofstream(path_) << "127.0.0.1 localhost\n::1 localhost ip6-localhost\n";
    if (::geteuid() != 0 || std::system("unshare -m -n true >/dev/null 2>&1") != 0 ||
        std::system("command -v nsenter >/dev/null && command -v ip >/dev/null") != 0) {
      return;  // why() says so
    }
    const std::string ready = h.dir() + "/ns.ready";
    holder_ = &h.Start("ns-holder",
                       {"unshare", "-m", "-n", "--", "sh", "-c",
                        "ip link set lo up && mount --bind \"$0\" /etc/hosts && touch \"$1\" && "
                        "exec sleep 600",
                        path_, ready});
    const auto t0 = Clock::now();
    while (SecondsSince(t0) < 10 && ::access(ready.c_str(), F_OK) != 0) SleepMs(5);
    INFO("namespace holder stderr: " << holder_->Err());
    REQUIRE(::access(ready.c_str(), F_OK) == 0);
  }

  bool ok() const { return holder_ != nullptr; }
  std::string why() const {
    return "needs root, unshare -m -n, nsenter and ip (a private /etc/hosts in a namespace)";
  }

  // argv run inside the namespace.
  std::vector<std::string> In(const std::vector<std::string>& argv) const {
    std::vector<std::string> out{"nsenter", "-t", std::to_string(holder_->pid), "-m", "-n", "--"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  // Makes `name` resolve to 127.0.0.1 from now on: appended to the same file
  // (the bind mount keeps its inode).
  void Add(const std::string& name) const {
    std::ofstream(path_, std::ios::app) << "127.0.0.1 " << name << "\n";
  }

 private:
  Harness& h_;
  std::string path_;
  Proc* holder_ = nullptr;
};

// Runs Add(name) after delay_ms on its own thread; joined on destruction.
class AddLater {
 public:
  AddLater(const PrivateHosts& hosts, std::string name, int delay_ms)
      : thread_([&hosts, name = std::move(name), delay_ms] {
          SleepMs(delay_ms);
          hosts.Add(name);
        }) {}
  ~AddLater() { thread_.join(); }

 private:
  std::thread thread_;
};

std::vector<std::string> DdprunArgs(const std::vector<std::string>& flags) {
  std::vector<std::string> argv{Ddprun()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(FixtureWorker());
  return argv;
}

long CountLines(const std::string& text, const std::string& needle) {
  long n = 0;
  for (const std::string& line : Lines(text))
    if (line.find(needle) != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST_CASE(
    "an --rdzv_endpoint name that resolves 6 s late: both nodes wait with one line, then the "
    "one it names hosts and the job runs",
    "[multiproc][netns][dns]") {
  Harness h;
  PrivateHosts hosts(h);
  if (!hosts.ok()) return SkipCase("multiproc", "late-DNS test: " + hosts.why());
  const std::string endpoint = std::string(kLateName) + ":29400";  // the namespace's own port
  const std::string out = h.MakeDir("out");
  std::vector<Proc*> nodes;
  {
    AddLater later(hosts, kLateName, 6000);
    for (int i = 0; i < 2; ++i) {
      nodes.push_back(
          &h.Start("node" + std::to_string(i),
                   hosts.In(DdprunArgs({"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                                        "--rdzv_endpoint=" + endpoint, "--rdzv_id=late-dns",
                                        "--rdzv_conf=join_timeout=60"})),
                   {{"FIXTURE_OUT_DIR", out}}));
    }
  }
  for (Proc* n : nodes) {
    const int rc = h.Wait(*n, 60);
    INFO(n->name << " stderr:\n" << n->Err());
    CHECK(rc == 0);
    // Resolution came 6 s in: the wait said so once (5 s in), naming the
    // name and the flag.
    CHECK(CountLines(n->Err(),
                     "waiting for the host name 'late-node.test' (--rdzv_endpoint) "
                     "to resolve") == 1);
    CHECK(n->Seconds() >= 6.0);
  }
  const std::vector<Record> recs = ReadRecords(out);
  REQUIRE(recs.size() == 2);
  std::set<long> ranks;
  for (const Record& r : recs) {
    CHECK(r.Int("world_size") == 2);
    ranks.insert(r.Int("rank"));
  }
  CHECK(ranks == std::set<long>{0, 1});
}

TEST_CASE("a static --master_addr that resolves 2 s late: node rank 0 and 1 wait for it and run",
          "[multiproc][netns][dns]") {
  Harness h;
  PrivateHosts hosts(h);
  if (!hosts.ok()) return SkipCase("multiproc", "late-DNS test: " + hosts.why());
  const std::string out = h.MakeDir("out");
  std::vector<Proc*> nodes;
  {
    AddLater later(hosts, kLateName, 2000);
    for (int i = 0; i < 2; ++i) {
      nodes.push_back(&h.Start(
          "node" + std::to_string(i),
          hosts.In(
              DdprunArgs({"--nnodes=2", "--nproc_per_node=2", "--node_rank=" + std::to_string(i),
                          std::string("--master_addr=") + kLateName, "--master_port=29500",
                          "--rdzv_conf=join_timeout=60"})),
          {{"FIXTURE_OUT_DIR", out}}));
    }
  }
  for (Proc* n : nodes) {
    const int rc = h.Wait(*n, 60);
    INFO(n->name << " stderr:\n" << n->Err());
    CHECK(rc == 0);
    CHECK(n->Seconds() >= 2.0);
    CHECK(n->Err().find("did not resolve") == std::string::npos);
  }
  const std::vector<Record> recs = ReadRecords(out);
  REQUIRE(recs.size() == 4);
  std::set<long> ranks;
  for (const Record& r : recs) {
    CHECK(r.Int("world_size") == 4);
    ranks.insert(r.Int("rank"));
  }
  CHECK(ranks == std::set<long>{0, 1, 2, 3});
}

TEST_CASE("an --rdzv_endpoint name that never resolves: one line at join_timeout and exit 3",
          "[multiproc][netns][dns]") {
  Harness h;
  PrivateHosts hosts(h);
  if (!hosts.ok()) return SkipCase("multiproc", "late-DNS test: " + hosts.why());
  Proc& node =
      h.Start("node", hosts.In(DdprunArgs({"--nnodes=2", "--rdzv_backend=c10d",
                                           "--rdzv_endpoint=never-node.test:29400",
                                           "--rdzv_id=no-dns", "--rdzv_conf=join_timeout=3"})));
  const int rc = h.Wait(node, 30);
  const std::string err = node.Err();
  INFO("stderr:\n" << err);
  CHECK(rc == 3);
  CHECK(node.Seconds() >= 3.0);
  CHECK(node.Seconds() < 10.0);
  CHECK(CountLines(err,
                   "the host name 'never-node.test' (--rdzv_endpoint) did not resolve "
                   "within 3 s") == 1);
  // One line: nothing else is said about a rendezvous it never reached.
  CHECK(Lines(err).size() == 1);
}

TEST_CASE("SIGTERM during the wait for a host name: ddprun exits 143 at once",
          "[multiproc][netns][dns]") {
  Harness h;
  PrivateHosts hosts(h);
  if (!hosts.ok()) return SkipCase("multiproc", "late-DNS test: " + hosts.why());
  Proc& node = h.Start(
      "node", hosts.In(DdprunArgs({"--nnodes=2", "--node_rank=1", "--master_addr=never-node.test",
                                   "--master_port=29500", "--rdzv_conf=join_timeout=60"})));
  // The wait's line, 5 s in: it is waiting for the name, not for anything else.
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < 15 && node.Err().find("waiting for the host name") == std::string::npos)
    SleepMs(20);
  REQUIRE(node.Err().find("waiting for the host name 'never-node.test' (--master_addr)") !=
          std::string::npos);
  REQUIRE(::kill(node.pid, SIGTERM) == 0);
  const auto sent = Clock::now();
  const int rc = h.Wait(node, 10);
  INFO("stderr:\n" << node.Err());
  CHECK(rc == 143);
  CHECK(SecondsSince(sent) < 2.0);  // the wait wakes every 250 ms
}
