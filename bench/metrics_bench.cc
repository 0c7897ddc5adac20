// One ddprund serving N simulated nodes x P ranks that each send a
// MetricsReport every second (the agents' cadence), as in issue 10:
//
//   metrics_bench [--nodes 1024] [--nproc 8] [--seconds 30] [--idle 10]
//
// It starts a real ddprund (next to this binary) on loopback, forms the
// job's round with SimulatedJob (real Join streams), then measures two
// phases of the same daemon in the same run: `idle` seconds with the round
// formed and no reports (the peer), then `seconds` with every node
// reporting. Printed: ddprund's CPU (% of one core) and RSS in each phase
// and their ratio, the reports per second, the data age on the dashboard's
// API (now minus the oldest rank's sampling time, fetched once a second),
// and the time and size of /api/v1/jobs/<job> and /metrics. docs/benchmarks.md.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/rendezvous/client.h"
#include "nlohmann/json.hpp"
#include "support/simulated_job.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// GET http://127.0.0.1:port/target; the body, or "" on failure.
std::string Get(int port, const std::string& target) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string resp;
  char buf[1 << 16];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const auto body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// utime + stime of pid in seconds, and its RSS in MiB.
std::pair<double, double> CpuAndRss(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string f;
  double ut = 0, st = 0;
  for (int i = 3; i <= 15 && rest >> f; ++i) {
    if (i == 14) ut = std::stod(f);
    if (i == 15) st = std::stod(f);
  }
  double rss = 0;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stod(line.substr(6)) / 1024.0;
  }
  return {(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK)), rss};
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 1024, nproc = 8;
  double seconds = 30, idle = 10;
  bool hold = false;
  for (int i = 1; i + 1 < argc || (i < argc && std::string(argv[i]) == "--hold"); ++i) {
    const std::string a = argv[i];
    if (a == "--hold") {
      hold = true;
      continue;
    }
    const std::string v = argv[++i];
    if (a == "--nodes")
      nodes = std::stoi(v);
    else if (a == "--nproc")
      nproc = std::stoi(v);
    else if (a == "--seconds")
      seconds = std::stod(v);
    else if (a == "--idle")
      idle = std::stod(v);
    else {
      std::fprintf(stderr,
                   "metrics_bench: unknown flag %s; see the top of bench/metrics_bench.cc\n",
                   a.c_str());
      return 2;
    }
  }
  std::string self(argv[0]);
  const std::string ddprund = self.substr(0, self.rfind('/') + 1) + "ddprund";
  const int port = FreePort(), dport = FreePort();
  const std::string ps = std::to_string(port), ds = std::to_string(dport);
  std::vector<std::string> args = {ddprund, "--host",           "127.0.0.1", "--port",
                                   ps,      "--dashboard_port", ds};
  std::vector<char*> cargv;
  for (auto& s : args) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  // The daemon dies with this process (PR_SET_PDEATHSIG), however it ends.
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    execv(ddprund.c_str(), cargv.data());
    _exit(127);
  }
  if (pid < 0) {
    std::fprintf(stderr, "metrics_bench: cannot start %s\n", ddprund.c_str());
    return 1;
  }
  auto stop_daemon = [&] {
    ::kill(pid, SIGTERM);
    int st;
    ::waitpid(pid, &st, 0);
  };

  ddprun::testing::SimulatedJobOptions jo;
  jo.job_id = "bench";
  jo.nodes = nodes;
  jo.nproc = nproc;
  jo.channels = std::min(nodes, 64);
  ddprun::testing::SimulatedJob job("127.0.0.1", port, jo);
  if (auto st = job.Connect(); !st.ok()) {
    std::fprintf(stderr, "metrics_bench: %s\n", std::string(st.message()).c_str());
    stop_daemon();
    return 1;
  }
  auto assignments = job.FormRound();
  if (!assignments.ok()) {
    std::fprintf(stderr, "metrics_bench: %s\n",
                 std::string(assignments.status().message()).c_str());
    stop_daemon();
    return 1;
  }
  std::printf("ddprund pid %d: %d nodes x %d ranks formed; dashboard http://127.0.0.1:%d/\n", pid,
              nodes, nproc, dport);
  std::fflush(stdout);

  // Phase 1, the peer: the same daemon and job, no reports.
  auto [cpu0, rss0] = CpuAndRss(pid);
  std::this_thread::sleep_for(std::chrono::duration<double>(idle));
  auto [cpu1, rss1] = CpuAndRss(pid);
  const double idle_cpu = 100 * (cpu1 - cpu0) / idle;

  // Phase 2: every node reports once a second, spread over the second.
  std::atomic<bool> stop{false};
  std::atomic<long> sent{0}, failed{0};
  const int threads = 4;
  std::vector<std::thread> pool;
  const auto t_start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<std::int64_t> steps(static_cast<size_t>(nodes), 0);
      for (long tick = 0; !stop; ++tick) {
        const auto tick_start = t_start + std::chrono::seconds(tick);
        for (int n = t; n < nodes && !stop; n += threads) {
          std::this_thread::sleep_until(
              tick_start + std::chrono::microseconds(1000000LL * n / std::max(1, nodes)));
          const auto& as = (*assignments)[static_cast<size_t>(n)];
          ddprun::rendezvous::MetricsReport r;
          r.job_id = "bench";
          r.node_id = as.node_id;
          r.round = as.round;
          r.host = job.Spec(n).host;
          r.unix_s = Now();
          const double phase = std::sin(static_cast<double>(tick) / 20.0);
          const int done = 10 + static_cast<int>(2 * phase);
          for (int l = 0; l < nproc; ++l) {
            ddprun::rendezvous::RankSample s;
            s.rank = as.base_rank + l;
            s.local_rank = l;
            s.pid = 10000 + s.rank;
            s.state = "running";
            s.has_progress_source = true;
            s.steps = steps[static_cast<size_t>(n)] + done;
            const double step = (s.rank == 3 ? 0.15 : 0.1) * (1 - 0.1 * phase);
            s.step_seconds.assign(static_cast<size_t>(done), step);
            s.samples_total = 32.0 * static_cast<double>(s.steps);
            s.cpu_percent = 95;
            s.rss_bytes = 1ULL << 30;
            s.scalars["loss"] = 3.0 / (1.0 + 0.01 * static_cast<double>(s.steps));
            s.scalars["lr"] = 1e-3;
            r.ranks.push_back(std::move(s));
          }
          steps[static_cast<size_t>(n)] += done;
          auto reply = job.ClientOf(n).ReportMetrics(r, 10s);
          (reply.ok() ? sent : failed)++;
        }
      }
    });
  }
  std::vector<double> ages, api_ms, metrics_ms;
  size_t api_bytes = 0, metrics_bytes = 0;
  auto [cpu2, rss2] = CpuAndRss(pid);
  const auto measure_start = Clock::now();
  std::this_thread::sleep_for(2s);  // every node has reported once
  while (hold || std::chrono::duration<double>(Clock::now() - measure_start).count() < seconds) {
    const auto a0 = Clock::now();
    const std::string doc = Get(dport, "/api/v1/jobs/bench");
    api_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a0).count());
    api_bytes = doc.size();
    auto j = nlohmann::json::parse(doc, nullptr, false);
    if (!j.is_discarded() && j.contains("ranks")) {
      double oldest = 1e300;
      for (const auto& r : j["ranks"]) oldest = std::min(oldest, r.value("report_unix_s", 0.0));
      ages.push_back(Now() - oldest);
    }
    const auto m0 = Clock::now();
    metrics_bytes = Get(dport, "/metrics").size();
    metrics_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - m0).count());
    std::this_thread::sleep_until(a0 + 1s);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - measure_start).count();
  auto [cpu3, rss3] = CpuAndRss(pid);
  stop = true;
  for (auto& t : pool) t.join();
  const double busy_cpu = 100 * (cpu3 - cpu2) / elapsed;
  const double total_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  std::printf("reports: %ld sent (%.0f/s), %ld failed\n", sent.load(), sent.load() / total_s,
              failed.load());
  std::printf("data age on /api/v1/jobs/bench (oldest of %d ranks): p50 %.2f s, max %.2f s\n",
              nodes * nproc, Quantile(ages, 0.5), Quantile(ages, 1.0));
  std::printf("GET /api/v1/jobs/bench: p50 %.1f ms, max %.1f ms, %.1f MiB\n", Quantile(api_ms, 0.5),
              Quantile(api_ms, 1.0), api_bytes / 1048576.0);
  std::printf("GET /metrics: p50 %.1f ms, max %.1f ms, %.1f MiB\n", Quantile(metrics_ms, 0.5),
              Quantile(metrics_ms, 1.0), metrics_bytes / 1048576.0);
  std::printf("ddprund CPU: idle %.1f %% of a core, reporting %.1f %% (ratio %.1fx)\n", idle_cpu,
              busy_cpu, idle_cpu > 0 ? busy_cpu / idle_cpu : 0.0);
  std::printf("ddprund RSS: idle %.0f MiB, reporting %.0f MiB (ratio %.2fx)\n", rss1, rss3,
              rss1 > 0 ? rss3 / rss1 : 0.0);
  stop_daemon();
  return failed.load() == 0 && !ages.empty() && Quantile(ages, 1.0) < 2.0 ? 0 : 1;
}
