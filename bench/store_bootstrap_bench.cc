// Store bootstrap at scale (issue 12): N simulated torch 1.13 workers
// (store_load.h) bootstrap against ddprun's TCPStore server and against torch
// 1.13's own (Debian's /usr/bin/python3, TCPStore(is_master=True)), each
// server in its own child process, in the same run; prints one table.
//
//   store_bootstrap_bench [--clients 1000,2000,4000,8000,16000]
//                         [--conns_per_client 1] [--no_torch] [--repeat 1]
// A client is one connection (the one carrying the bootstrap traffic); a torch
// 1.13 worker opens two (--conns_per_client 2 adds the silent second one). An N
// whose connections do not fit the open-file limit is skipped, saying so.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ddprun/rendezvous/store/c10d_store_server.h"
#include "store_load.h"

namespace {

using ddprun::bench::BootstrapOptions;
using ddprun::bench::RunBootstrap;

// A server in a child process: stdout gives its port, closing stdin stops it.
struct Child {
  pid_t pid = -1;
  int to_child = -1;
  int port = 0;
};

Child Spawn(const std::vector<std::string>& argv) {
  int in[2], out[2];
  if (::pipe(in) != 0 || ::pipe(out) != 0) std::abort();
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::close(in[1]);
    ::close(out[0]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "store_bootstrap_bench: cannot run %s: %s\n", args[0],
                 std::strerror(errno));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  c.to_child = in[1];
  std::string line;
  char ch;
  while (::read(out[0], &ch, 1) == 1 && ch != '\n') line += ch;
  ::close(out[0]);
  if (!absl::SimpleAtoi(line, &c.port)) c.port = 0;
  return c;
}

// Stops the child; returns its CPU seconds.
double Stop(Child& c) {
  ::close(c.to_child);
  int status = 0;
  rusage ru{};
  ::wait4(c.pid, &status, 0, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int ServeDdprun() {
  auto server = ddprun::rendezvous::C10dStoreServer::Start({"127.0.0.1", 0});
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::printf("%d\n", (*server)->port());
  std::fflush(stdout);
  char buf[64];
  while (::read(0, buf, sizeof(buf)) > 0) {
  }
  return 0;
}

struct Run {
  double seconds = 0, server_cpu = 0, gen_cpu = 0;
  bool ok = false;
};

Run Measure(const std::vector<std::string>& argv, int clients, int conns) {
  Run r;
  Child child = Spawn(argv);
  if (child.port == 0) {
    std::fprintf(stderr, "store_bootstrap_bench: the server %s did not start\n", argv[0].c_str());
    Stop(child);
    return r;
  }
  BootstrapOptions opts;
  opts.port = child.port;
  opts.clients = clients;
  opts.conns_per_client = conns;
  auto res = RunBootstrap(opts);
  r.server_cpu = Stop(child);
  if (!res.ok()) {
    std::fprintf(stderr, "store_bootstrap_bench: %s (N=%d): %s\n", argv[0].c_str(), clients,
                 std::string(res.status().message()).c_str());
    return r;
  }
  if (res->wrong_uid != 0 || !res->checkin_counts_ok) {
    std::fprintf(stderr, "store_bootstrap_bench: wrong results (N=%d, %d wrong ids)\n", clients,
                 res->wrong_uid);
    return r;
  }
  r.ok = true;
  r.seconds = res->seconds;
  r.gen_cpu = res->generator_cpu_s;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--serve_ddprun") return ServeDdprun();
  std::vector<int> ns = {1000, 2000, 4000, 8000, 16000};
  int conns = 1, repeat = 1;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--clients" && i + 1 < argc) {
      ns.clear();
      for (absl::string_view s : absl::StrSplit(argv[++i], ',')) {
        int n;
        if (absl::SimpleAtoi(s, &n)) ns.push_back(n);
      }
    } else if (a == "--conns_per_client" && i + 1 < argc) {
      conns = std::atoi(argv[++i]);
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no_torch") {
      torch = false;
    } else {
      std::fprintf(stderr,
                   "usage: store_bootstrap_bench [--clients N,N,..] [--conns_per_client 1|2] "
                   "[--repeat R] [--no_torch]\n");
      return 2;
    }
  }
  const std::uint64_t limit = ddprun::rendezvous::RaiseOpenFileLimit();
  const std::string self = "/proc/self/exe";
  char exe[4096];
  const ssize_t len = ::readlink(self.c_str(), exe, sizeof(exe) - 1);
  exe[len > 0 ? len : 0] = '\0';
  const std::vector<std::string> ddprun_argv = {exe, "--serve_ddprun"};
  const std::vector<std::string> torch_argv = {
      "/usr/bin/python3", "-c",
      "import sys, datetime, torch.distributed as d\n"
      "s = d.TCPStore('127.0.0.1', 0, None, True, timeout=datetime.timedelta(seconds=600),"
      " wait_for_workers=False)\n"
      "print(s.port, flush=True)\n"
      "sys.stdin.read()\n"};
  std::printf("open-file limit %llu; %d connection(s) per client; best of %d\n",
              static_cast<unsigned long long>(limit), conns, repeat);
  std::printf(
      "| clients | connections | ddprun store | torch 1.13 TCPStore | torch/ddprun | "
      "ddprun server CPU | generator CPU |\n|---|---|---|---|---|---|---|\n");
  double prev = 0;
  int prev_n = 0;
  for (int n : ns) {
    const std::uint64_t need = static_cast<std::uint64_t>(n) * conns + 64;
    if (need > limit) {
      std::printf("| %d | %d | SKIPPED: needs %llu open files, the limit is %llu (ulimit -n) |\n",
                  n, n * conns, static_cast<unsigned long long>(need),
                  static_cast<unsigned long long>(limit));
      continue;
    }
    Run best_d, best_t;
    for (int r = 0; r < repeat; ++r) {
      Run d = Measure(ddprun_argv, n, conns);
      if (d.ok && (!best_d.ok || d.seconds < best_d.seconds)) best_d = d;
      if (torch) {
        Run t = Measure(torch_argv, n, conns);
        if (t.ok && (!best_t.ok || t.seconds < best_t.seconds)) best_t = t;
      }
    }
    char ds[32] = "failed", ts[32] = "-", ratio[32] = "-";
    if (best_d.ok) std::snprintf(ds, sizeof(ds), "%.3f s", best_d.seconds);
    if (best_t.ok) std::snprintf(ts, sizeof(ts), "%.3f s", best_t.seconds);
    if (best_d.ok && best_t.ok) {
      std::snprintf(ratio, sizeof(ratio), "%.1fx", best_t.seconds / best_d.seconds);
    }
    std::printf("| %d | %d | %s | %s | %s | %.2f s | %.2f s |\n", n, n * conns, ds, ts, ratio,
                best_d.server_cpu, best_d.gen_cpu);
    std::fflush(stdout);
    if (best_d.ok && prev > 0) {
      std::printf("  growth %d -> %d: x%.2f for x%.2f clients\n", prev_n, n, best_d.seconds / prev,
                  static_cast<double>(n) / prev_n);
    }
    if (best_d.ok) {
      prev = best_d.seconds;
      prev_n = n;
    }
  }
  return 0;
}
