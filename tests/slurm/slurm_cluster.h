// A real Slurm cluster on this host for the slurm_cluster tier (Debian's
// slurmctld, slurmd, slurm-client and munge; scripts/install-deps.sh):
//
//   ctl   a network + UTS namespace holding the bridge br0 (10.78.<k>.254)
//         and slurmctld
//   n<i>  a network + UTS namespace per node (hostname n<i>, 10.78.<k>.<i>)
//         joined to br0 by a veth pair, running `slurmd -N n<i>`
//   munged one daemon in the root namespace with a fresh key; its socket is a
//         file in the temporary directory (slurm.conf's AuthInfo), which every
//         namespace reaches
//
// The namespaces are support/netns_hosts.h's; every process of the cluster
// runs in its host's with the cluster's hosts file as /etc/hosts
// (NetnsHosts::Enter()). slurm.conf is generated in the Harness's directory; client commands
// (sbatch, scontrol, ...) run in ctl with SLURM_CONF pointing at it, and the jobs inherit it.
//
// Lifetime: the constructor only checks what is needed (ok(), why(): the test
// skips); Up() builds the cluster and fails the test when it does not come up
// (nodes idle in sinfo) within its deadline. The destructor always tears down
// what was made, also after a failed assertion: it SIGKILLs every process in
// the cluster's namespaces (daemons, slurmstepd, jobs), munged, deletes the
// namespaces; those of an earlier run whose test process died are removed at
// construction. Declare it after the Harness (it uses the Harness's directory).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/net_pair.h"
#include "support/netns_hosts.h"
#include "support/process_helpers.h"

namespace ddprun::test {

struct SlurmOptions {
  int nodes = 2;  // n1..n<nodes>, at most 3
  // slurm.conf's KillWait: SIGTERM to SIGKILL when a job is cancelled or
  // runs out of time (Slurm's default is 30 s).
  int kill_wait_s = 5;
  // slurm.conf's SlurmdTimeout: a silent slurmd is marked DOWN after this.
  int slurmd_timeout_s = 30;
  // Whether the munge key is written (false: munged cannot start).
  bool munge_key = true;
};

// The output of a command run to its end (stdout and stderr together).
struct CommandResult {
  int rc = -1;
  std::string out;
};

class SlurmCluster {
 public:
  SlurmCluster(Harness& h, SlurmOptions o = {})
      : h_(h),
        o_(o),
        ip_(FindIp()),
        hosts_(ip_, {"ddpscc", "ddpsc", "dsc", "10.78", "the Slurm cluster"}, o.nodes) {
    if (::geteuid() != 0) {
      why_ = "needs root (network and UTS namespaces, slurmd)";
      return;
    }
    if (ip_.empty()) {
      why_ = "needs iproute2's ip";
      return;
    }
    for (const char* p : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                          "/usr/bin/sbatch", "/usr/bin/nsenter", "/usr/bin/unshare"}) {
      if (::access(p, X_OK) != 0) {
        why_ = std::string("needs ") + p +
               " (Debian's slurmctld, slurmd, slurm-client, munge, util-linux: "
               "scripts/install-deps.sh)";
        return;
      }
    }
    hosts_.RemoveStale();
    ok_ = true;
  }

  ~SlurmCluster() { TearDown(); }

  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  int nodes() const { return o_.nodes; }
  const std::string& conf() const { return conf_; }
  const std::string& dir() const { return h_.dir(); }
  std::string node_name(int i) const { return hosts_.node_name(i); }
  std::string node_addr(int i) const { return hosts_.node_addr(i); }
  // The namespace of node i (1..nodes), or of the controller (0).
  std::string ns(int i) const { return hosts_.ns(i); }

  // Builds the namespaces, the key, slurm.conf, munged, slurmctld and the
  // slurmds, and waits (timeout_s) until sinfo shows every node idle; fails
  // the test otherwise.
  void Up(double timeout_s = 60) {
    const std::string why = TryUp(timeout_s);
    if (!why.empty()) FAIL(why);
  }

  // Up() that returns munged's refusal to start (its one line, e.g. a missing
  // key) instead of failing the test, with slurmctld started and no slurmd;
  // any other failure still fails the test.
  std::string TryUp(double timeout_s = 60) {
    REQUIRE(ok_);
    REQUIRE(o_.nodes >= 1);
    REQUIRE(o_.nodes <= 3);
    hosts_.Build();
    WriteFiles();
    const std::string munge_error = StartMunge();
    ctld_ = &h_.Start("slurmctld", InNs(0, {"/usr/sbin/slurmctld", "-D", "-i", "-f", conf_}));
    // Without munged, slurmctld runs but nothing authenticates: what a
    // client sees then is the test.
    if (!munge_error.empty()) {
      const auto t0 = Clock::now();
      while (ReadFile(h_.dir() + "/slurmctld.log").find("Running as primary controller") ==
             std::string::npos) {
        if (SecondsSince(t0) > 20) FAIL("slurmctld did not start within 20 s\n" << Logs());
        SleepMs(20);
      }
      return munge_error;
    }
    for (int i = 1; i <= o_.nodes; ++i) {
      slurmds_.push_back(
          &h_.Start("slurmd." + node_name(i),
                    InNs(i, {"/usr/sbin/slurmd", "-D", "-N", node_name(i), "-f", conf_})));
    }
    WaitNodes("idle", timeout_s);
    return "";
  }

  // argv prefix-wrapped to run in namespace i (0 = ctl) with its hostname and
  // the cluster's /etc/hosts, with SLURM_CONF and env set.
  std::vector<std::string> InNs(int i, const std::vector<std::string>& argv,
                                const EnvList& env = {}) const {
    const std::string host = i == 0 ? "ctl" : node_name(i);
    std::vector<std::string> out = hosts_.Enter(i, host, hosts_file_);
    out.insert(out.end(), {"/usr/bin/env", "SLURM_CONF=" + conf_});
    for (const auto& [k, v] : env) out.push_back(k + "=" + v);
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  // Runs a client command (sbatch, scontrol, sinfo, scancel, ...) in ctl,
  // killed after timeout_s.
  CommandResult Run(const std::vector<std::string>& argv, const EnvList& env = {},
                    double timeout_s = 30) const {
    std::string cmd = "/usr/bin/timeout -s KILL " + std::to_string(static_cast<int>(timeout_s));
    for (const std::string& a : InNs(0, argv, env)) cmd += " " + Quote(a);
    cmd += " 2>&1 </dev/null";
    CommandResult r;
    if (FILE* f = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) r.out.append(buf, n);
      const int status = ::pclose(f);
      r.rc = DecodeStatus(status);
    }
    return r;
  }

  // sbatch with args (--parsable added); env is the job's environment on
  // top of this process's (sbatch exports all of it). Returns the job id.
  int Submit(const std::vector<std::string>& args, const EnvList& env = {}) {
    std::vector<std::string> argv{"/usr/bin/sbatch", "--parsable"};
    argv.insert(argv.end(), args.begin(), args.end());
    const CommandResult r = Run(argv, env);
    INFO("sbatch: " << r.out);
    REQUIRE(r.rc == 0);
    return std::stoi(r.out);
  }

  // A field of `scontrol show job` ("JobState", "ExitCode", ...); "" if absent.
  std::string JobField(int job, const std::string& key) const {
    const CommandResult r = Run({"/usr/bin/scontrol", "show", "job", std::to_string(job)});
    const std::string pat = key + "=";
    for (std::size_t at = r.out.find(pat); at != std::string::npos; at = r.out.find(pat, at + 1)) {
      if (at != 0 && r.out[at - 1] != ' ' && r.out[at - 1] != '\n') continue;
      const std::size_t end = r.out.find_first_of(" \n", at);
      return r.out.substr(at + pat.size(), end - at - pat.size());
    }
    return "";
  }

  // Waits until the job is in one of Slurm's final states (COMPLETED,
  // CANCELLED, FAILED, TIMEOUT, NODE_FAIL, ...; not PENDING, RUNNING,
  // SIGNALING, COMPLETING, ...); returns it. Fails the test after timeout_s.
  std::string WaitJobEnd(int job, double timeout_s) {
    static const std::set<std::string> kFinal = {"BOOT_FAIL", "CANCELLED",     "COMPLETED",
                                                 "DEADLINE",  "FAILED",        "NODE_FAIL",
                                                 "PREEMPTED", "OUT_OF_MEMORY", "TIMEOUT"};
    const auto t0 = Clock::now();
    std::string state;
    while (SecondsSince(t0) < timeout_s) {
      state = JobField(job, "JobState");
      if (kFinal.count(state)) return state;
      SleepMs(100);
    }
    FAIL("Slurm job " << job << " did not end within " << timeout_s << " s (JobState=" << state
                      << ")\n"
                      << Logs());
    return state;
  }

  // Waits until sinfo shows every node in `state` (idle, down, ...).
  void WaitNodes(const std::string& state, double timeout_s) const {
    const auto t0 = Clock::now();
    std::string last;
    while (SecondsSince(t0) < timeout_s) {
      const CommandResult r = Run({"/usr/bin/sinfo", "-h", "-N", "-o", "%N %t"}, {}, 10);
      last = r.out;
      int matching = 0;
      for (const std::string& line : Lines(r.out))
        if (line.size() > state.size() && line.substr(line.find(' ') + 1) == state) ++matching;
      if (r.rc == 0 && matching == o_.nodes) return;
      SleepMs(100);
    }
    FAIL("the Slurm nodes are not all " << state << " within " << timeout_s << " s; sinfo:\n"
                                        << last << "\n"
                                        << Logs());
  }

  // The node dies: SIGKILL to every process in its namespace (slurmd, the
  // job's slurmstepd, ddprun and its workers), as a power cut would.
  void KillNode(int i) {
    for (int round = 0; round < 50; ++round) {
      const std::vector<pid_t> pids = PidsIn(ns(i));
      if (pids.empty()) return;
      for (pid_t p : pids) ::kill(p, SIGKILL);
      ReapOrphans(Mine());
      SleepMs(20);
    }
    FAIL("processes in " << ns(i) << " survived SIGKILL for 1 s");
  }

  // The last lines of the daemons' logs, for failure messages.
  std::string Logs() const {
    std::vector<std::string> files{"slurmctld.log", "munged.log"};
    for (int i = 1; i <= o_.nodes; ++i) files.push_back("slurmd." + node_name(i) + ".log");
    std::string out;
    for (const std::string& f : files) {
      const std::vector<std::string> lines = Lines(ReadFile(h_.dir() + "/" + f));
      out += "--- " + f + " (last lines)\n";
      for (std::size_t k = lines.size() > 15 ? lines.size() - 15 : 0; k < lines.size(); ++k)
        out += lines[k] + "\n";
    }
    return out;
  }

  // Live processes in namespace `name` (`ip netns pids`).
  std::vector<pid_t> PidsIn(const std::string& name) const { return hosts_.PidsIn(name); }

 private:
  static std::string Quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  }

  std::set<pid_t> Mine() const {
    std::set<pid_t> out;
    for (const Proc* p : {munged_, ctld_})
      if (p) out.insert(p->pid);
    for (const Proc* p : slurmds_) out.insert(p->pid);
    return out;
  }

  void WriteFiles() {
    const std::string d = h_.dir();
    hosts_file_ = d + "/hosts";
    hosts_.WriteHostsFile(hosts_file_, hosts_.hub_addr() + " ctl\n");
    key_ = d + "/munge.key";
    if (o_.munge_key) {
      std::ifstream rnd("/dev/urandom", std::ios::binary);
      std::string bytes(1024, '\0');
      rnd.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      std::ofstream(key_, std::ios::binary) << bytes;
    }
    if (o_.munge_key) REQUIRE(::chmod(key_.c_str(), 0400) == 0);
    REQUIRE(::mkdir((d + "/state").c_str(), 0700) == 0);
    REQUIRE(::mkdir((d + "/spool").c_str(), 0700) == 0);
    for (int i = 1; i <= o_.nodes; ++i)
      REQUIRE(::mkdir((d + "/spool/" + node_name(i)).c_str(), 0700) == 0);
    socket_ = d + "/munge.socket";
    conf_ = d + "/slurm.conf";
    const std::string last = std::to_string(o_.nodes);
    std::ofstream f(conf_);
    f << "ClusterName=ddprun\n"
      << "SlurmctldHost=ctl(" << hosts_.hub_addr() << ")\n"
      << "AuthType=auth/munge\nCredType=cred/munge\n"
      << "AuthInfo=socket=" << socket_ << "\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "StateSaveLocation=" << d << "/state\n"
      << "SlurmdSpoolDir=" << d << "/spool/%n\n"
      << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
      << "SlurmdPidFile=" << d << "/slurmd.%n.pid\n"
      << "SlurmctldLogFile=" << d << "/slurmctld.log\n"
      << "SlurmdLogFile=" << d << "/slurmd.%n.log\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
      << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
      << "JobCompType=jobcomp/none\nMpiDefault=none\nMailProg=/bin/true\n"
      << "ReturnToService=2\n"
      << "KillWait=" << o_.kill_wait_s << "\n"
      << "SlurmdTimeout=" << o_.slurmd_timeout_s << "\n"
      << "SchedulerType=sched/builtin\n"
      << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
      << "SlurmdParameters=config_overrides\n"
      << "NodeName=n[1-" << last << "] NodeAddr=" << hosts_.addr_prefix() << "[1-" << last
      << "] CPUs=2 State=UNKNOWN\n"
      << "PartitionName=main Nodes=n[1-" << last << "] Default=YES MaxTime=INFINITE State=UP\n";
  }

  // Starts munged; "" once its socket exists, else its error line.
  std::string StartMunge() {
    const std::string d = h_.dir();
    munged_ = &h_.Start("munged",
                        {"/usr/sbin/munged", "--foreground", "--force", "--key-file=" + key_,
                         "--socket=" + socket_, "--pid-file=" + d + "/munged.pid",
                         "--log-file=" + d + "/munged.log", "--seed-file=" + d + "/munged.seed"});
    const auto t0 = Clock::now();
    struct stat st {};
    while (::stat(socket_.c_str(), &st) != 0) {
      int status = 0;
      if (::waitpid(munged_->pid, &status, WNOHANG) == munged_->pid) {
        munged_->ended = Clock::now();
        munged_->exit = DecodeStatus(status);
        std::string error;
        for (const std::string& line : Lines(munged_->Err()))
          if (line.find("Error:") != std::string::npos) error = line;
        return "munged exited with " + std::to_string(*munged_->exit) + ": " + error;
      }
      if (SecondsSince(t0) > 10) FAIL("munged made no socket within 10 s: " << munged_->Err());
      SleepMs(20);
    }
    return "";
  }

  void TearDown() {
    for (Proc* p : std::vector<Proc*>{ctld_}) Stop(p);
    for (Proc* p : slurmds_) Stop(p);
    hosts_.TearDown(Mine());
    Stop(munged_);
    ReapOrphans(Mine());
  }

  // SIGKILL and reap one of the cluster's own daemons.
  static void Stop(Proc* p) {
    if (p == nullptr || p->exit) return;
    ::kill(p->pid, SIGKILL);
    int status = 0;
    ::waitpid(p->pid, &status, 0);
    p->ended = Clock::now();
    p->exit = DecodeStatus(status);
  }

  Harness& h_;
  SlurmOptions o_;
  std::string ip_;
  NetnsHosts hosts_;
  std::string why_;
  std::string hosts_file_, key_, socket_, conf_;
  bool ok_ = false;
  Proc* munged_ = nullptr;
  Proc* ctld_ = nullptr;
  std::vector<Proc*> slurmds_;
};

}  // namespace ddprun::test
