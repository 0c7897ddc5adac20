// Hosts for OpenMPI's mpirun on this host, for the mpi_cluster tier (Debian's
// openmpi-bin; scripts/install-deps.sh), built by support/netns_hosts.h:
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
// in its host's namespaces with the cluster's hosts file as /etc/hosts
// (NetnsHosts::Enter()), and stays there, orphans included, so PidsIn() sees
// them all.
//
// Lifetime: the constructor only checks what is needed (ok(), why(): the test
// skips); Up() builds the namespaces and fails the test when it cannot. The
// destructor always tears down what was made, also after a failed assertion:
// it SIGKILLs every process in the namespaces and deletes them; those of an
// earlier run whose test process died are removed at construction. Declare it
// after the Harness (it writes into the Harness's directory).
#pragma once

#include <unistd.h>

#include <string>
#include <vector>

#include "support/net_pair.h"
#include "support/netns_hosts.h"
#include "support/process_helpers.h"

namespace ddprun::test {

class MpiCluster {
 public:
  // nodes: n1..n<nodes>, at most 8.
  explicit MpiCluster(Harness& h, int nodes = 2)
      : h_(h),
        ip_(FindIp()),
        hosts_(ip_, {"ddpmpb", "ddpmp", "dmp", "10.79", "the MPI hosts"}, nodes) {
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
    hosts_.RemoveStale();
    ok_ = true;
  }

  MpiCluster(const MpiCluster&) = delete;
  MpiCluster& operator=(const MpiCluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  int nodes() const { return hosts_.nodes(); }
  std::string node_name(int i) const { return hosts_.node_name(i); }
  std::string node_addr(int i) const { return hosts_.node_addr(i); }
  // The namespace of node i (1..nodes), or of the bridge (0).
  std::string ns(int i) const { return hosts_.ns(i); }
  // The rsh agent's log: one line per remote start ("<host> <command>").
  std::string agent_log() const { return h_.dir() + "/rsh-agent.log"; }

  // Builds the namespaces, the hosts file and the rsh agent; fails the test
  // when a step fails.
  void Up() {
    REQUIRE(ok_);
    REQUIRE(nodes() >= 1);
    REQUIRE(nodes() <= 8);
    hosts_.Build();
    hosts_file_ = h_.dir() + "/hosts";
    hosts_.WriteHostsFile(hosts_file_);
    // OpenMPI calls the agent as `<agent> <host> <command words...>`, as it
    // would call ssh; like ssh, it runs the words through a shell there.
    std::string cases;
    for (int i = 1; i <= nodes(); ++i) cases += "  " + node_name(i) + ") ns=" + ns(i) + " ;;\n";
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
            hosts_file_ + " \"$host\" \"$*\"\n");
  }

  // argv run in node i's namespaces with its hostname and the cluster's
  // /etc/hosts (the wrappers exec: the process keeps the first pid).
  std::vector<std::string> InNs(int i, const std::vector<std::string>& argv) const {
    std::vector<std::string> out = hosts_.Enter(i, node_name(i), hosts_file_);
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
    return hosts_.PidsIn(name, skip);
  }

  // Live processes on every node but `skip` (a child of the test that it
  // reaps itself: IsAlive would reap it and lose its exit status).
  std::vector<pid_t> AllPids(pid_t skip = -1) const {
    std::vector<pid_t> out;
    for (int i = 1; i <= nodes(); ++i)
      for (pid_t p : PidsIn(ns(i), skip)) out.push_back(p);
    return out;
  }

 private:
  Harness& h_;
  std::string ip_;
  NetnsHosts hosts_;  // torn down by its destructor
  std::string why_, hosts_file_, agent_;
  bool ok_ = false;
};

}  // namespace ddprun::test
