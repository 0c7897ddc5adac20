// The rendezvous at scale: N simulated agents (tests/support/simulated_job.h)
// over real gRPC streams on loopback to a real RendezvousServer.
//
//   rendezvous_bench [max_n [min_n]]
//                                   the time from the first Join until every
//                                   agent holds its Assignment, N = min_n (8)
//                                   ..max_n, doubling (and the state machine
//                                   alone, no transport)
//   rendezvous_bench --split N [P]  the same round with the server in a
//                                   process of its own (as ddprund runs):
//                                   the wall time and each side's CPU; the
//                                   agents in P processes (default 1: in
//                                   this one), as nodes are on hosts
//   rendezvous_bench --table N      the job table and metrics hub alone
//   rendezvous_bench --restart N [P]
//                                   in a job of N nodes that has formed, one
//                                   agent reports a failed worker: the time
//                                   until every agent has read RestartRound,
//                                   re-joined, and holds the next Assignment
//                                   (P > 1: the server in a process of its
//                                   own, the agents in P processes)
//   rendezvous_bench --memory N     the server's resident memory for one job
//                                   of N nodes, and for 1000 jobs of one node
//
// Prints Markdown tables. The timings run the server in this process; the
// memory figures run it as `rendezvous_bench --serve` (it prints its port and
// exits when stdin closes) and read its /proc/<pid>/status.
//
// Like ddprund, the bench keeps freed heap for reuse (server_heap.h);
// DDPRUN_BENCH_GLIBC_HEAP=1 in the environment leaves glibc's defaults.
// DDPRUN_BENCH_CHANNELS=C: the simulated agents share C connections (default
// 64; C = N gives each agent a connection of its own, as N hosts have: raise
// the open-file limit, each side holds N sockets).
// DDPRUN_BENCH_SERVER_TUNABLES=T: the server's process of --split and
// --memory runs with GLIBC_TUNABLES=T; by default it uses ddprund's heap
// (server_heap.h: huge pages, one arena), and T = glibc.malloc.hugetlb=0
// leaves glibc's defaults.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddprun/rendezvous/common/host_port.h"
#include "ddprun/rendezvous/daemon/server.h"
#include "ddprun/rendezvous/daemon/server_heap.h"
#include "ddprun/rendezvous/job_rendezvous.h"
#include "ddprun/rendezvous/job_table.h"
#include "ddprun/rendezvous/monitoring/metrics_hub.h"
#include "support/simulated_job.h"

using namespace ddprun::rendezvous;
using ddprun::testing::SimulatedJob;
using ddprun::testing::SimulatedJobOptions;
using Clock_ = std::chrono::steady_clock;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "rendezvous_bench: %s\n", what.c_str());
  std::exit(1);
}

double MsSince(Clock_::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock_::now() - t0).count();
}

int Serve() {
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  auto server = RendezvousServer::Start(opts);
  if (!server.ok()) Die(server.status().ToString());
  std::printf("%d\n", (*server)->port());
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  _exit(0);  // the measurement is over; no orderly shutdown of 16k streams
}

// Starts this program again with `args` (argv[1]...), GLIBC_TUNABLES set to
// `tunables` unless null or empty: its stdin from *to, its stdout to *from.
pid_t StartSelf(const std::vector<std::string>& args, const char* tunables, int* to, int* from) {
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) Die("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    if (tunables && *tunables) setenv("GLIBC_TUNABLES", tunables, 1);
    std::vector<char*> argv{const_cast<char*>("rendezvous_bench")};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  *to = to_child[1];
  *from = from_child[0];
  return pid;
}

// The server under test: in this process (the timings: one process on loopback
// measured faster on this 2-core machine than two), or in a process of its
// own, this program with --serve (the memory figures).
class ServerProcess {
 public:
  explicit ServerProcess(bool separate) {
    if (!separate) {
      ServerOptions opts;
      opts.host = "127.0.0.1";
      opts.port = 0;
      // DDPRUN_BENCH_ETCD=H:P,...: the server is a replica on that etcd
      // (docs/ha.md), alone, so it leads; every round change goes to etcd.
      if (const char* etcd = std::getenv("DDPRUN_BENCH_ETCD"); etcd && *etcd) {
        auto list = ParseHostPortList(etcd, {.default_port = 2379});
        if (!list.ok()) Die(std::string(list.status().message()));
        opts.etcd_endpoints = *list;
        opts.etcd_prefix = "/ddprun-bench-" + std::to_string(getpid());
        opts.etcd_lease_ttl_s = 5;
        // DDPRUN_BENCH_ETCD_MAX_REQUEST_BYTES: etcd's --max-request-bytes when not its default.
        if (const char* m = std::getenv("DDPRUN_BENCH_ETCD_MAX_REQUEST_BYTES"); m && *m) {
          opts.etcd_max_request_bytes = std::atoll(m);
        }
      }
      auto server = RendezvousServer::Start(opts);
      if (!server.ok()) Die(std::string(server.status().message()));
      if (!opts.etcd_endpoints.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // elected alone
      }
      inproc_ = std::move(*server);
      port_ = inproc_->port();
      return;
    }
    // DDPRUN_BENCH_SERVER_TUNABLES=T: the server process (alone) runs with
    // GLIBC_TUNABLES=T instead of ddprund's heap (ExecWithServerHeap).
    int from = -1;
    pid_ = StartSelf({"--serve"}, std::getenv("DDPRUN_BENCH_SERVER_TUNABLES"), &stdin_, &from);
    char buf[32] = {};
    std::size_t got = 0;
    while (got < sizeof(buf) - 1) {
      ssize_t r = read(from, buf + got, 1);
      if (r <= 0 || buf[got] == '\n') break;
      ++got;
    }
    close(from);
    port_ = std::atoi(buf);
    if (port_ <= 0) Die("the server process did not start");
  }
  ~ServerProcess() {
    if (inproc_) return;
    close(stdin_);
    waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }
  // The server process's CPU time (user + system), in ms.
  double CpuMs() const {
    const std::vector<double> f = Stat(15);
    return (f[14] + f[15]) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  // The server process's minor page faults so far.
  double MinorFaults() const { return Stat(10)[10]; }
  // The server's resident memory (VmRSS), in KiB.
  long RssKiB() const {
    if (inproc_) Die("RssKiB needs a separate server process");
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
    }
    return -1;
  }

 private:
  // Fields 1..last of the server's /proc/<pid>/stat as numbers (index = field
  // number; the pid and the command, fields 1 and 2, are left 0).
  std::vector<double> Stat(int last) const {
    if (inproc_) Die("the server's /proc figures need a separate server process");
    std::ifstream f("/proc/" + std::to_string(pid_) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // The fields after the command's closing parenthesis start at field 3.
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) Die("cannot read the server's /proc/<pid>/stat");
    std::istringstream rest(stat.substr(close + 2));
    std::vector<double> out(last + 1, 0);
    std::string field;
    for (int i = 3; i <= last && rest >> field; ++i) out[i] = std::atof(field.c_str());
    return out;
  }

  std::unique_ptr<RendezvousServer> inproc_;
  pid_t pid_ = -1;
  int stdin_ = -1;
  int port_ = 0;
};

JoinSpec Spec(const std::string& job, int i, int n) {
  JoinSpec s;
  s.job_id = job;
  s.host = "10." + std::to_string(i / 65536) + "." + std::to_string((i / 256) % 256) + "." +
           std::to_string(i % 256);
  s.pid = 1000 + i;
  s.nproc = 8;
  s.min_nodes = n;
  s.max_nodes = n;
  s.policy.join_timeout_s = 120;
  s.command = "train";
  return s;
}

double StateMachineMs(int n) {
  const SystemClock& clock = static_cast<const SystemClock&>(SystemClock::Get());
  JobRendezvous job("bench", clock);
  std::vector<Delivery> out;
  out.reserve(n);
  auto t0 = Clock_::now();
  for (int i = 0; i < n; ++i) (void)job.Join(Spec("bench", i, n), &out);
  const double dt = MsSince(t0);
  if (static_cast<int>(out.size()) != n) Die("the state machine delivered too few assignments");
  return dt;
}

// A sink that only counts what it is given.
class CountingSink final : public EventSink {
 public:
  explicit CountingSink(std::atomic<int>* delivered) : delivered_(delivered) {}
  void Bind(const std::string&, const std::string&) override {}
  void Deliver(RoundEvent) override { delivered_->fetch_add(1); }

 private:
  std::atomic<int>* delivered_;
};

// The server's in-memory side without transport: a JobTable (and the metrics
// hub it tells about rounds, as in ddprund) takes N joins and delivers N
// Assignments to sinks.
double TableMs(int n) {
  MetricsHub hub(MetricsHubOptions{});
  JobTableOptions o;
  o.observer = &hub;
  JobTable table(std::move(o));
  std::atomic<int> delivered{0};
  std::vector<std::shared_ptr<EventSink>> sinks;
  for (int i = 0; i < n; ++i) sinks.push_back(std::make_shared<CountingSink>(&delivered));
  auto t0 = Clock_::now();
  for (int i = 0; i < n; ++i) {
    if (auto id = table.Join(Spec("table", i, n), sinks[i]); !id.ok()) Die(id.status().ToString());
  }
  const double dt = MsSince(t0);
  if (delivered.load() != n) Die("the job table delivered too few assignments");
  table.Shutdown();
  return dt;
}

SimulatedJobOptions Job(int n, const std::string& id) {
  SimulatedJobOptions o;
  o.job_id = id;
  o.nodes = n;
  // DDPRUN_BENCH_CHANNELS=C: the agents share C connections instead of 64
  // (C = N: each agent on a connection of its own, as N hosts are).
  if (const char* c = std::getenv("DDPRUN_BENCH_CHANNELS"); c && *c) o.channels = std::atoi(c);
  return o;
}

void Check(const absl::StatusOr<std::vector<Assignment>>& a, int n) {
  if (!a.ok()) Die(a.status().ToString());
  if (auto st = SimulatedJob::CheckRanks(*a, n, 8); !st.ok()) Die(st.ToString());
}

// This process's CPU time (user + system, every thread), in ms: on a loaded
// machine a steadier figure than the wall time.
double CpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

// This process's context switches (voluntary and not).
long CtxSwitches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw + u.ru_nivcsw;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Rendezvous(int max_n, int min_n) {
  ServerProcess server(/*separate=*/false);
  std::printf(
      "| agents | state machine only (ms) | job table + metrics hub (ms) | gRPC, N streams on "
      "loopback (ms) | CPU of the "
      "process (ms) | context switches |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int n = std::max(1, min_n); n <= max_n; n *= 2) {
    std::vector<double> sm, tab, rpc, cpu, cs;
    const int reps = n >= 1024 ? 3 : 5;
    for (int r = 0; r < reps; ++r) {
      sm.push_back(StateMachineMs(n));
      tab.push_back(TableMs(n));
      SimulatedJob job("127.0.0.1", server.port(),
                       Job(n, "bench-" + std::to_string(n) + "-" + std::to_string(r)));
      if (auto st = job.Connect(); !st.ok()) Die(st.ToString());
      const double c0 = CpuMs();
      const long x0 = CtxSwitches();
      auto t0 = Clock_::now();
      auto a = job.FormRound();
      rpc.push_back(MsSince(t0));
      cpu.push_back(CpuMs() - c0);
      cs.push_back(static_cast<double>(CtxSwitches() - x0));
      Check(a, n);
    }
    std::printf("| %d | %.2f | %.2f | %.1f | %.1f | %.0f |\n", n, Median(sm), Median(tab),
                Median(rpc), Median(cpu), Median(cs));
    std::fflush(stdout);
  }
}

// Waits (at most 5 s) until the server process is idle: its CPU time grows by
// under 10 ms in 100 ms. The previous round's streams end (16k cancellations)
// before the next round is timed, not during it.
void WaitServerIdle(const ServerProcess& server) {
  const auto end = Clock_::now() + std::chrono::seconds(5);
  double last = server.CpuMs();
  while (Clock_::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double now = server.CpuMs();
    if (now - last < 10) return;
    last = now;
  }
}

// One process of a load generator spread over processes (`--split N P`,
// `--restart N P`): plays agents [first, first + count) of each job of N
// agents, on `channels` connections. Commands on stdin, one byte each:
//   'c' connects the next job (ending the previous one's streams), answers
//       "ready";
//   'g' forms the round;
//   'f' has the slice's first agent report a failed worker, then does 'r';
//   'r' re-joins every agent of the slice on its RestartRound.
// 'g', 'f' and 'r' answer "<CPU ms> <round>" once every agent of the slice
// holds its Assignment, then a line of the slice's group ranks. End of input:
// exits.
int PlayAgents(int port, int n, int first, int count, int channels) {
  std::unique_ptr<SimulatedJob> job;
  int round = 0;
  char c;
  while (read(0, &c, 1) == 1) {
    if (c == 'c') {
      job.reset();
      SimulatedJobOptions o = Job(n, "split-" + std::to_string(round++));
      o.first_agent = first;
      o.agents = count;
      o.channels = channels;
      job = std::make_unique<SimulatedJob>("127.0.0.1", port, o);
      if (auto st = job->Connect(); !st.ok()) Die(st.ToString());
      std::printf("ready\n");
    } else if ((c == 'g' || c == 'f' || c == 'r') && job) {
      const double c0 = CpuMs();
      if (c == 'f') {
        if (auto st = job->ReportFailure(0); !st.ok()) Die(st.ToString());
      }
      auto a = c == 'g' ? job->FormRound() : job->RejoinOnRestart();
      const double cpu = CpuMs() - c0;
      if (!a.ok()) Die(a.status().ToString());
      for (const auto& x : *a) {
        if (auto st = SimulatedJob::CheckAssignment(x, n, job->options().nproc, (*a)[0].round);
            !st.ok()) {
          Die(st.ToString());
        }
      }
      std::printf("%.1f %lld\n", cpu, static_cast<long long>((*a)[0].round));
      for (const auto& x : *a) std::printf("%d ", x.group_rank);
      std::printf("\n");
    } else {
      Die("unexpected command on stdin");
    }
    std::fflush(stdout);
  }
  _exit(0);  // as Serve: no orderly shutdown of the streams
}

// A process of the load generator (PlayAgents), started by this program.
class AgentProcess {
 public:
  AgentProcess(int port, int n, int first, int count, int channels) {
    // The load generator's processes use the daemon's heap too (or
    // GLIBC_TUNABLES=DDPRUN_BENCH_AGENT_TUNABLES): 16k agents' first-round
    // page faults in 4 processes are the generator's cost, not what an agent
    // alone on its host pays.
    const char* t = std::getenv("DDPRUN_BENCH_AGENT_TUNABLES");
    int from = -1;
    pid_ = StartSelf({"--agents", std::to_string(port), std::to_string(n), std::to_string(first),
                      std::to_string(count), std::to_string(channels)},
                     t && *t ? t : kServerHeapTunables, &to_, &from);
    from_ = fdopen(from, "r");
  }
  ~AgentProcess() {
    close(to_);
    std::fclose(from_);
    waitpid(pid_, nullptr, 0);
  }
  void Send(char c) {
    if (write(to_, &c, 1) != 1) Die("an agent process went away");
  }
  std::string Line() {
    std::string line;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    if (c == EOF) Die("an agent process ended early (its error is above)");
    return line;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

// The load generator: one job of n agents over `procs` processes
// (PlayAgents), the 64 connections split among them.
class AgentFleet {
 public:
  AgentFleet(int port, int n, int procs) : n_(n) {
    const int channels = std::max(1, Job(n, "").channels / procs);
    for (int p = 0; p < procs; ++p) {
      const int first = static_cast<int>(static_cast<long>(n) * p / procs);
      const int end = static_cast<int>(static_cast<long>(n) * (p + 1) / procs);
      procs_.push_back(std::make_unique<AgentProcess>(port, n, first, end - first, channels));
    }
  }
  int size() const { return static_cast<int>(procs_.size()); }

  // A new job, every process connected.
  void Connect() {
    for (auto& a : procs_) a->Send('c');
    for (auto& a : procs_) {
      if (a->Line() != "ready") Die("an agent process did not connect");
    }
  }

  struct Result {
    double wall_ms = 0;   // from the first command sent to the last report read
    double cpu_ms = 0;    // the agents' processes, summed
    long long round = 0;  // the round every agent holds
  };
  // Sends cmds[p] to process p ('g', 'f' or 'r'), waits for every report,
  // and checks that each group rank 0..n-1 came once, all in one round.
  Result Run(const std::vector<char>& cmds) {
    Result r;
    const auto t0 = Clock_::now();
    for (int p = 0; p < size(); ++p) procs_[p]->Send(cmds[p]);
    std::vector<long long> rounds;
    for (auto& a : procs_) {
      const std::string done = a->Line();
      double c = 0;
      long long round = 0;
      if (std::sscanf(done.c_str(), "%lf %lld", &c, &round) != 2) Die("bad report: " + done);
      r.cpu_ms += c;
      rounds.push_back(round);
    }
    r.wall_ms = MsSince(t0);
    std::vector<int> seen(n_, 0);
    for (auto& a : procs_) {
      std::istringstream ranks(a->Line());
      int g;
      while (ranks >> g) {
        if (g < 0 || g >= n_ || seen[g]++) Die("group rank " + std::to_string(g) + " given twice");
      }
    }
    if (std::count(seen.begin(), seen.end(), 1) != n_) Die("some agent got no group rank");
    if (std::count(rounds.begin(), rounds.end(), rounds[0]) != size()) Die("rounds differ");
    r.round = rounds[0];
    return r;
  }

 private:
  const int n_;
  std::vector<std::unique_ptr<AgentProcess>> procs_;
};

// The round with the server in a process of its own, as ddprund runs: the
// wall time and each side's CPU (which share is the load generator's). With
// procs > 1 the agents are spread over that many processes of their own (as
// nodes over hosts; the 64 connections split among them), started together:
// the time from the go to the last process holding its slice's Assignments.
void Split(int n, int procs) {
  ServerProcess server(/*separate=*/true);
  const char* q = std::getenv("DDPRUN_BENCH_QUIET");
  const bool quiet = q && std::string(q) == "1";
  std::printf(
      "| agents | agent processes | gRPC, server in its own process (ms) | CPU of the agents' "
      "processes (ms) | CPU of the server's process (ms) | server's page faults |\n");
  std::printf("|---|---|---|---|---|---|\n");
  if (procs <= 1) {
    for (int r = 0; r < 3; ++r) {
      SimulatedJob job("127.0.0.1", server.port(), Job(n, "split-" + std::to_string(r)));
      if (auto st = job.Connect(); !st.ok()) Die(st.ToString());
      if (quiet) WaitServerIdle(server);
      const double c0 = CpuMs(), s0 = server.CpuMs(), f0 = server.MinorFaults();
      auto t0 = Clock_::now();
      auto a = job.FormRound();
      const double wall = MsSince(t0);
      const double c1 = CpuMs(), s1 = server.CpuMs(), f1 = server.MinorFaults();
      Check(a, n);
      std::printf("| %d | 1 | %.1f | %.1f | %.1f | %.0f |\n", n, wall, c1 - c0, s1 - s0, f1 - f0);
      std::fflush(stdout);
    }
    return;
  }
  AgentFleet fleet(server.port(), n, procs);
  for (int r = 0; r < 3; ++r) {
    fleet.Connect();
    if (quiet) WaitServerIdle(server);
    const double s0 = server.CpuMs(), f0 = server.MinorFaults();
    const AgentFleet::Result res = fleet.Run(std::vector<char>(procs, 'g'));
    const double s1 = server.CpuMs(), f1 = server.MinorFaults();
    std::printf("| %d | %d | %.1f | %.1f | %.1f | %.0f |\n", n, procs, res.wall_ms, res.cpu_ms,
                s1 - s0, f1 - f0);
    std::fflush(stdout);
  }
}

// With procs > 1, the server in a process of its own (ddprund's heap) and the
// agents over `procs` processes: process procs/2's first agent (agent n/2)
// reports the failure, and the time runs from that command until every
// process holds its slice's next Assignment.
void Restart(int n, int procs) {
  std::printf(
      "| nodes | agent processes | first round (ms) | failure -> every node re-joined, next round "
      "held (ms) |\n");
  std::printf("|---|---|---|---|\n");
  for (int r = 0; r < 3; ++r) {
    // A fresh server: each run is the job's first restart.
    ServerProcess server(/*separate=*/procs > 1);
    double form = 0, restart = 0;
    if (procs > 1) {
      AgentFleet fleet(server.port(), n, procs);
      fleet.Connect();
      const AgentFleet::Result first = fleet.Run(std::vector<char>(procs, 'g'));
      std::vector<char> cmds(procs, 'r');
      cmds[procs / 2] = 'f';
      const AgentFleet::Result next = fleet.Run(cmds);
      if (next.round != first.round + 1) Die("the restart did not open the next round");
      form = first.wall_ms;
      restart = next.wall_ms;
    } else {
      SimulatedJob job("127.0.0.1", server.port(), Job(n, "restart-" + std::to_string(r)));
      if (auto st = job.Connect(); !st.ok()) Die(st.ToString());
      auto t0 = Clock_::now();
      auto first = job.FormRound();
      form = MsSince(t0);
      Check(first, n);
      t0 = Clock_::now();
      auto next = job.FailAndReform(n / 2);
      restart = MsSince(t0);
      Check(next, n);
      if ((*next)[0].round != (*first)[0].round + 1) Die("the restart did not open the next round");
    }
    std::printf("| %d | %d | %.1f | %.1f |\n", n, procs, form, restart);
    std::fflush(stdout);
  }
}

void Memory(int n) {
  std::printf("| what | server RSS before (MiB) | after (MiB) | per unit (KiB) |\n");
  std::printf("|---|---|---|---|\n");
  {
    ServerProcess server(/*separate=*/true);
    const long before = server.RssKiB();
    SimulatedJob job("127.0.0.1", server.port(), Job(n, "memory"));
    if (auto st = job.Connect(); !st.ok()) Die(st.ToString());
    Check(job.FormRound(), n);
    const long after = server.RssKiB();
    std::printf(
        "| one job of %d nodes, round formed, streams open | %.1f | %.1f | %.2f per node |\n", n,
        before / 1024.0, after / 1024.0, double(after - before) / n);
  }
  {
    constexpr int kJobs = 1000;
    ServerProcess server(/*separate=*/true);
    const long before = server.RssKiB();
    std::vector<std::unique_ptr<SimulatedJob>> jobs;
    for (int j = 0; j < kJobs; ++j) {
      SimulatedJobOptions o = Job(1, "memory-" + std::to_string(j));
      o.channels = 1;
      jobs.push_back(std::make_unique<SimulatedJob>("127.0.0.1", server.port(), o));
      if (auto st = jobs.back()->Connect(); !st.ok()) Die(st.ToString());
      Check(jobs.back()->FormRound(), 1);
    }
    const long after = server.RssKiB();
    std::printf(
        "| %d jobs of one node, each on its own connection | %.1f | %.1f | %.2f per job |\n", kJobs,
        before / 1024.0, after / 1024.0, double(after - before) / kJobs);
  }
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  // As ddprund does (server_heap.h); DDPRUN_BENCH_GLIBC_HEAP=1 leaves glibc's
  // defaults, for the comparison in docs/benchmarks.md.
  if (const char* e = std::getenv("DDPRUN_BENCH_GLIBC_HEAP"); !e || std::string(e) != "1") {
    KeepFreedHeapForReuse();
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--serve") {
    ExecWithServerHeap(argv);  // as ddprund
    return Serve();
  }
  if (mode == "--table") {  // the in-memory side alone (for profiling)
    const int n = argc > 2 ? std::atoi(argv[2]) : 16384;
    for (int r = 0; r < 5; ++r)
      std::printf("%d agents: job table + metrics hub %.2f ms\n", n, TableMs(n));
    return 0;
  }
  // N agents (or nodes) and P agent processes of --split and --restart:
  // N >= 1, 1 <= P <= N, or one usage line and exit 2.
  auto sizes = [&](int default_n) {
    const int n = argc > 2 ? std::atoi(argv[2]) : default_n;
    const int p = argc > 3 ? std::atoi(argv[3]) : 1;
    if (n < 1 || p < 1 || p > n) {
      std::fprintf(stderr,
                   "usage: rendezvous_bench %s N [P]: N >= 1 agents over 1 <= P <= N "
                   "processes\n",
                   mode.c_str());
      std::exit(2);
    }
    return std::pair{n, p};
  };
  if (mode == "--split") {
    const auto [n, p] = sizes(16384);
    Split(n, p);
    return 0;
  }
  if (mode == "--agents" && argc == 7) {
    return PlayAgents(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
                      std::atoi(argv[5]), std::atoi(argv[6]));
  }
  if (mode == "--restart") {
    const auto [n, p] = sizes(4096);
    Restart(n, p);
  } else if (mode == "--memory") {
    Memory(argc > 2 ? std::atoi(argv[2]) : 16384);
  } else {
    Rendezvous(argc > 1 ? std::atoi(argv[1]) : 4096, argc > 2 ? std::atoi(argv[2]) : 8);
  }
  return 0;
}
