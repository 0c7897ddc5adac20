// Hosts for OpenMPI's mpirun on this host, for the mpi_cluster tier (Debian's
// openmpi-bin; scripts/install-deps.sh). The namespace approach of
// tests/slurm/slurm_cluster.h:
//
//   bridge a network namespace holding the bridge br0 (10.79.<k>.254)
//   n<i>   a network + UTS namespace per node (hostname n<i>, 10.79.<k>.<i>)
//          joined to br0 by a veth pair
//
// mpirun runs on n1, as a batch system runs it on the first node of an
// allocation. It starts its remote daemons (orted) the way it would over ssh:
// through its rsh agent (`--mca plm_rsh_agent`), here a generated script that
// enters the target host's namespaces with a login-like environment (PATH and
// HOME only, as ssh gives; `mpirun -x` forwards the rest). So the placement
// variables (OMPI_COMM_WORLD_*, PMIX_*) are OpenMPI's own. Every process runs
// through `nsenter --net=<ns> unshare --mount --uts`, which binds the
// cluster's hosts file over /etc/hosts and sets the hostname: the host names
// resolve in every namespace and nothing in /etc changes. Every process a
// node runs, orphans included, stays in its network namespace, so PidsIn()
// sees them all.
//
// Lifetime: the constructor only checks what is needed (ok(), why(): the test
// skips); Up() builds the namespaces and fails the test when it cannot. The
// destructor always tears down what was made, also after a failed assertion:
// it SIGKILLs every process in the namespaces and deletes them; those of an
// earlier run whose test process died are removed at construction. Declare it
// after the Harness (it writes into the Harness's directory).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "support/net_pair.h"
#include "support/process_helpers.h"

namespace ddprun::test {

class MpiCluster {
 public:
  // nodes: n1..n<nodes>, at most 8.
  explicit MpiCluster(Harness& h, int nodes = 2) : h_(h), nodes_(nodes) {
    ip_ = FindIp();
    if (::geteuid() != 0) {
      why_ = "needs root (network and UTS namespaces)";
      return;
    }
    if (ip_.empty()) {
      why_ = "needs iproute2's ip";
      return;
    }
    for (const char* p :
         {"/usr/bin/mpirun", "/usr/bin/orted", "/usr/bin/nsenter", "/usr/bin/unshare"}) {
      if (::access(p, X_OK) != 0) {
        why_ = std::string("needs ") + p +
               " (Debian's openmpi-bin, util-linux: scripts/install-deps.sh)";
        return;
      }
    }
    id_ = std::to_string(::getpid());
    net_ = "10.79." + std::to_string(::getpid() % 250 + 1) + ".";
    RemoveStale();
    ok_ = true;
  }

  ~MpiCluster() { TearDown(); }

  MpiCluster(const MpiCluster&) = delete;
  MpiCluster& operator=(const MpiCluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  int nodes() const { return nodes_; }
  std::string node_name(int i) const { return "n" + std::to_string(i); }
  std::string node_addr(int i) const { return net_ + std::to_string(i); }
  // The namespace of node i (1..nodes), or of the bridge (0).
  std::string ns(int i) const {
    return i == 0 ? "ddpmpb_" + id_ : "ddpmp" + std::to_string(i) + "_" + id_;
  }
  // The rsh agent's log: one line per remote start ("<host> <command>").
  std::string agent_log() const { return h_.dir() + "/rsh-agent.log"; }

  // Builds the namespaces, the hosts file and the rsh agent; fails the test
  // when a step fails.
  void Up() {
    REQUIRE(ok_);
    REQUIRE(nodes_ >= 1);
    REQUIRE(nodes_ <= 8);
    BuildNetwork();
    hosts_ = h_.dir() + "/hosts";
    {
      std::ofstream f(hosts_);
      f << "127.0.0.1 localhost\n";
      for (int i = 1; i <= nodes_; ++i) f << node_addr(i) << " " << node_name(i) << "\n";
    }
    // OpenMPI calls the agent as `<agent> <host> <command words...>`, as it
    // would call ssh; like ssh, it runs the words through a shell there.
    std::string cases;
    for (int i = 1; i <= nodes_; ++i) cases += "  " + node_name(i) + ") ns=" + ns(i) + " ;;\n";
    agent_ = h_.Script(
        "rsh-agent",
        "#!/bin/sh\n"
        "host=$1\nshift\n"
        "case \"$host\" in\n" +
            cases +
            "  *) echo \"rsh-agent: no host $host\" >&2; exit 255 ;;\n"
            "esac\n"
            "echo \"$host $*\" >> " +
            agent_log() +
            "\n"
            "exec /usr/bin/nsenter --net=/run/netns/$ns /usr/bin/unshare --mount --uts "
            "--propagation private /bin/sh -c 'mount --bind \"$0\" /etc/hosts && hostname "
            "\"$1\" && exec /usr/bin/env -i "
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "
            "/bin/sh -c \"$2\"' " +
            hosts_ + " \"$host\" \"$*\"\n");
  }

  // argv run in node i's namespaces with its hostname and the cluster's
  // /etc/hosts (the wrappers exec: the process keeps the first pid).
  std::vector<std::string> InNs(int i, const std::vector<std::string>& argv) const {
    std::vector<std::string> out{"/usr/bin/nsenter",
                                 "--net=/run/netns/" + ns(i),
                                 "/usr/bin/unshare",
                                 "--mount",
                                 "--uts",
                                 "--propagation",
                                 "private",
                                 "/bin/sh",
                                 "-c",
                                 "mount --bind \"$0\" /etc/hosts && hostname \"$1\" && shift && "
                                 "exec \"$@\"",
                                 hosts_,
                                 node_name(i)};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  // `mpirun --allow-run-as-root --mca plm_rsh_agent <agent> <args>` on n1,
  // its session directories (and orted's: mpirun passes the parameter on)
  // in the Harness's directory rather than /tmp/ompi.<host>.<uid>, where a
  // killed mpirun leaves them.
  std::vector<std::string> Mpirun(const std::vector<std::string>& args) const {
    std::vector<std::string> argv{
        "/usr/bin/mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent", agent_,
        "--mca",           "orte_tmpdir_base",    h_.dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return InNs(1, argv);
  }

  // Live processes in namespace `name` (`ip netns pids`) but `skip`.
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

  // Live processes on every node but `skip` (a child of the test that it
  // reaps itself: IsAlive would reap it and lose its exit status).
  std::vector<pid_t> AllPids(pid_t skip = -1) const {
    std::vector<pid_t> out;
    for (int i = 1; i <= nodes_; ++i)
      for (pid_t p : PidsIn(ns(i), skip)) out.push_back(p);
    return out;
  }

 private:
  void Step(const std::string& cmd) {
    if (!Sh(cmd)) FAIL("setting up the MPI hosts' network: `" << cmd << "` failed");
  }

  void BuildNetwork() {
    made_ns_ = true;
    const std::string b = ns(0);
    Step(ip_ + " netns add " + b);
    Step(ip_ + " -n " + b + " link set lo up");
    Step(ip_ + " -n " + b + " link add br0 type bridge");
    Step(ip_ + " -n " + b + " addr add " + net_ + "254/24 dev br0");
    Step(ip_ + " -n " + b + " link set br0 up");
    for (int i = 1; i <= nodes_; ++i) {
      const std::string n = ns(i);
      // Interface names: at most 15 characters; both ends leave the root
      // namespace at once.
      const std::string x = "dmp" + std::to_string(i) + "a_" + id_;
      const std::string y = "dmp" + std::to_string(i) + "b_" + id_;
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

  void TearDown() {
    if (!made_ns_) return;
    for (int i = 0; i <= nodes_; ++i) {
      const auto t0 = Clock::now();
      for (std::vector<pid_t> pids = PidsIn(ns(i)); !pids.empty() && SecondsSince(t0) < 5;
           pids = PidsIn(ns(i))) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ReapOrphans({});
        SleepMs(10);
      }
      Sh(ip_ + " netns del " + ns(i));
    }
    for (int i = 1; i <= nodes_; ++i) Sh(ip_ + " link del dmp" + std::to_string(i) + "a_" + id_);
    ReapOrphans({});
  }

  // Namespaces of earlier runs whose test process died without cleaning up:
  // their processes are killed first.
  void RemoveStale() const {
    for (const std::string& n : ListDir("/run/netns")) {
      if (n.rfind("ddpmp", 0) != 0) continue;
      const std::size_t us = n.find('_');
      if (us == std::string::npos) continue;
      const std::string pid = n.substr(us + 1);
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0) continue;
      for (pid_t p : PidsIn(n)) ::kill(p, SIGKILL);
      Sh(ip_ + " netns del " + n);
    }
  }

  Harness& h_;
  int nodes_;
  std::string ip_, why_, id_, net_, hosts_, agent_;
  bool ok_ = false;
  bool made_ns_ = false;
};

}  // namespace ddprun::test
