// Hosts on this host for the cluster tiers (tests/slurm/slurm_cluster.h,
// tests/mpi/mpi_cluster.h): network namespaces joined by a bridge.
//
//   hub   a network namespace holding the bridge br0 (<subnet>.<k>.254),
//         where a tier may run its own daemons (slurmctld)
//   n<i>  a network namespace per node (<subnet>.<k>.<i>) joined to br0 by a
//         veth pair
//
// <k> follows the test process's pid, as every name does, so that tests of
// two checkouts (or two tiers) can build their hosts at the same time. A
// process enters a host through Enter(): `nsenter --net=<ns> unshare --mount
// --uts`, which binds a hosts file over /etc/hosts and sets the hostname, so
// the host names resolve in every namespace and nothing in /etc changes.
// (`ip netns exec` is not used: it remounts /sys, which hides the cgroup
// hierarchy slurmd insists on finding.) Every process a host runs, orphans
// included, stays in its network namespace, so PidsIn() sees them all.
//
// Lifetime: the tier's cluster owns one and calls Build() in its Up() and
// TearDown() in its destructor (also after a failed assertion);
// RemoveStale() removes the namespaces of an earlier run whose test process
// died without cleaning up.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/net_pair.h"
#include "support/process_helpers.h"

namespace ddprun::test {

// The names of one tier's namespaces and interfaces.
struct NetnsNames {
  std::string hub;     // the hub's namespace prefix ("ddpscc": "ddpscc_<pid>")
  std::string node;    // a node's ("ddpsc": "ddpsc<i>_<pid>"); also what RemoveStale() matches
  std::string veth;    // a veth pair's ("dsc": "dsc<i>a_<pid>", "dsc<i>b_<pid>"; 15 characters)
  std::string subnet;  // the first two octets ("10.78")
  std::string what;    // for failure messages ("the Slurm cluster")
};

class NetnsHosts {
 public:
  // ip: iproute2's ip (FindIp()); nodes n1..n<nodes>.
  NetnsHosts(std::string ip, NetnsNames names, int nodes)
      : ip_(std::move(ip)),
        names_(std::move(names)),
        nodes_(nodes),
        id_(std::to_string(::getpid())),
        net_(names_.subnet + "." + std::to_string(::getpid() % 250 + 1) + ".") {}

  ~NetnsHosts() { TearDown({}); }

  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int nodes() const { return nodes_; }
  std::string node_name(int i) const { return "n" + std::to_string(i); }
  std::string node_addr(int i) const { return net_ + std::to_string(i); }
  std::string hub_addr() const { return net_ + "254"; }
  // What every address here starts with ("10.78.<k>.").
  const std::string& addr_prefix() const { return net_; }
  // The namespace of node i (1..nodes), or of the hub (0).
  std::string ns(int i) const {
    return i == 0 ? names_.hub + "_" + id_ : names_.node + std::to_string(i) + "_" + id_;
  }

  // Builds the hub's namespace and bridge, and each node's namespace and
  // veth pair; fails the test naming the step that failed.
  void Build() {
    built_ = true;
    const std::string b = ns(0);
    Step(ip_ + " netns add " + b);
    Step(ip_ + " -n " + b + " link set lo up");
    Step(ip_ + " -n " + b + " link add br0 type bridge");
    Step(ip_ + " -n " + b + " addr add " + hub_addr() + "/24 dev br0");
    Step(ip_ + " -n " + b + " link set br0 up");
    for (int i = 1; i <= nodes_; ++i) {
      const std::string n = ns(i);
      // Both ends leave the root namespace at once.
      const std::string x = Veth(i, 'a');
      const std::string y = Veth(i, 'b');
      Step(ip_ + " netns add " + n);
      Step(ip_ + " link add " + x + " type veth peer name " + y);
      Step(ip_ + " link set " + x + " netns " + n);
      Step(ip_ + " link set " + y + " netns " + b);
      Step(ip_ + " -n " + b + " link set " + y + " master br0 up");
      Step(ip_ + " -n " + n + " addr add " + node_addr(i) + "/24 dev " + x);
      Step(ip_ + " -n " + n + " link set " + x + " up");
      Step(ip_ + " -n " + n + " link set lo up");
    }
  }

  // Writes the hosts file the hosts see as /etc/hosts: localhost, `extra`
  // lines ("<addr> <name>\n"), then every node.
  void WriteHostsFile(const std::string& path, const std::string& extra = "") const {
    std::ofstream f(path);
    f << "127.0.0.1 localhost\n" << extra;
    for (int i = 1; i <= nodes_; ++i) f << node_addr(i) << " " << node_name(i) << "\n";
  }

  // The argv prefix that runs the words after it in namespace i (0: the
  // hub) with `hostname` and `hosts_file` as /etc/hosts; the wrappers exec,
  // so the process keeps the first pid.
  std::vector<std::string> Enter(int i, const std::string& hostname,
                                 const std::string& hosts_file) const {
    return {"/usr/bin/nsenter",
            "--net=/run/netns/" + ns(i),
            "/usr/bin/unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            "mount --bind \"$0\" /etc/hosts && hostname \"$1\" && shift && exec \"$@\"",
            hosts_file,
            hostname};
  }

  // Live processes in namespace `name` (`ip netns pids`) but `skip` (a child
  // of the test that it reaps itself: IsAlive would reap it and lose its
  // exit status).
  std::vector<pid_t> PidsIn(const std::string& name, pid_t skip = -1) const {
    std::vector<pid_t> out;
    const std::string cmd = "/usr/bin/timeout 10 " + ip_ + " netns pids " + name + " 2>/dev/null";
    if (FILE* f = ::popen(cmd.c_str(), "r")) {
      long p = 0;
      while (std::fscanf(f, "%ld", &p) == 1)
        if (p != skip && IsAlive(static_cast<pid_t>(p))) out.push_back(static_cast<pid_t>(p));
      ::pclose(f);
    }
    return out;
  }

  // SIGKILLs every process in the namespaces (for at most 5 s each,
  // reaping orphans but `mine`, the test's own children that the caller
  // reaps), deletes the namespaces and the nodes' veth pairs. Idempotent.
  void TearDown(const std::set<pid_t>& mine) {
    if (!built_) return;
    built_ = false;
    for (int i = 0; i <= nodes_; ++i) {
      const auto t0 = Clock::now();
      for (std::vector<pid_t> pids = PidsIn(ns(i)); !pids.empty() && SecondsSince(t0) < 5;
           pids = PidsIn(ns(i))) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ReapOrphans(mine);
        SleepMs(10);
      }
      Sh(ip_ + " netns del " + ns(i));
    }
    for (int i = 1; i <= nodes_; ++i) Sh(ip_ + " link del " + Veth(i, 'a'));
    ReapOrphans(mine);
  }

  // Namespaces of this tier left by earlier runs whose test process died
  // without cleaning up: their processes are killed first.
  void RemoveStale() const {
    for (const std::string& n : ListDir("/run/netns")) {
      if (n.rfind(names_.node, 0) != 0) continue;  // the hub's prefix starts with it too
      const std::size_t us = n.find('_');
      if (us == std::string::npos) continue;
      const std::string pid = n.substr(us + 1);
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0) continue;
      for (pid_t p : PidsIn(n)) ::kill(p, SIGKILL);
      Sh(ip_ + " netns del " + n);
    }
  }

 private:
  std::string Veth(int i, char end) const {
    return names_.veth + std::to_string(i) + end + "_" + id_;
  }

  void Step(const std::string& cmd) {
    if (!Sh(cmd)) FAIL("setting up " << names_.what << "'s network: `" << cmd << "` failed");
  }

  std::string ip_;
  NetnsNames names_;
  int nodes_;
  std::string id_, net_;
  bool built_ = false;
};

}  // namespace ddprun::test
