// Monitoring's costs, each with its peer in the same run (docs/benchmarks.md):
//   1. the writer: ddp::metrics::Step + Scalar per step, channel on vs off
//      (off = no DDPRUN_METRICS_FILE: one branch), and one collective's
//      recording (start + end), as a share of a 10 ms step;
//   2. the agent's sampling: MetricsCollector::Sample over N real workers
//      (sleeping child processes with a channel each) on the real /proc,
//      CPU time per sample and as a share of one core at one sample a second;
//   3. memory: the channel's size per worker.
//
//   build/bin/monitoring_bench [workers=8] [samples=200]
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddprun/agent/metrics_collector.h"
#include "ddprun/rendezvous/common/clock.h"
#include "ddprun/rendezvous/monitoring/metrics_channel.h"

namespace rdzv = ::ddprun::rendezvous;
using Clock = std::chrono::steady_clock;

namespace {

int MakeChannel() {
  const int fd = ::memfd_create("bench-channel", MFD_CLOEXEC);
  const std::string init = rdzv::InitialChannelBytes();
  if (::pwrite(fd, init.data(), init.size(), 0) != static_cast<ssize_t>(init.size())) std::abort();
  return fd;
}

double CpuSeconds() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// ns per call of `f`, best of 5 runs of `n` calls.
template <class F>
double NsPerCall(int n, F f) {
  double best = 1e300;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) f(i);
    best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int workers = argc > 1 ? std::atoi(argv[1]) : 8;
  const int samples = argc > 2 ? std::atoi(argv[2]) : 200;

  // 1. The writer. "off" is what ddp::metrics does without a channel: a
  // null check (volatile, so that the compiler keeps it).
  const int fd = MakeChannel();
  auto writer = rdzv::ChannelWriter::Open("/proc/self/fd/" + std::to_string(fd));
  if (!writer.ok()) return std::fprintf(stderr, "%s\n", writer.status().ToString().c_str()), 1;
  rdzv::ChannelWriter* volatile off = nullptr;
  const int n = 200000;
  const double step_off = NsPerCall(n, [&](int i) {
    if (off != nullptr) off->Step(32, 0.01);
  });
  const double step_on = NsPerCall(n, [&](int i) {
    (*writer)->Step(32, 0.01);
    (*writer)->Scalar("loss", i * 1e-6);
  });
  const double coll_on = NsPerCall(n, [&](int) {
    (*writer)->CollectiveStart("allreduce");
    (*writer)->CollectiveEnd("allreduce", 4 << 20, 1e-3, 3.0);
  });
  const double step_ns = 10e6;
  std::printf("writer: Step+Scalar %.0f ns (off: %.1f ns), one collective recorded %.0f ns\n",
              step_on, step_off, coll_on);
  std::printf("writer overhead for a 10 ms step with 10 collectives: %.4f %% (goal < 1 %%)\n",
              100.0 * (step_on + 10 * coll_on - step_off) / step_ns);

  // 2. The agent's sampling over `workers` real processes.
  std::vector<pid_t> pids;
  std::vector<ddprun::agent::MonitoredWorker> ws;
  for (int j = 0; j < workers; ++j) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::pause();
      ::_exit(0);
    }
    ::setpgid(pid, pid);
    pids.push_back(pid);
    ws.push_back({.rank = j, .local_rank = j, .pid = pid, .channel_fd = MakeChannel()});
  }
  auto proc = ddprun::agent::MakeProcfsSource();
  auto gpu = ddprun::agent::MakeNvmlSource();
  ddprun::agent::MetricsCollector collector(*proc, *gpu, rdzv::SystemClock::Get());
  collector.Reset(ws);
  collector.Sample(nullptr);  // NVML's dlopen and the first /proc pass
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  for (int i = 0; i < samples; ++i) collector.Sample(nullptr);
  const double cpu = (CpuSeconds() - cpu0) / samples;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count() / samples;
  int procs = static_cast<int>(proc->Scan().size());
  std::printf(
      "agent sampling, %d workers, %d processes on the machine: %.3f ms CPU per sample "
      "(%.3f ms wall) = %.3f %% of a core at 1 sample/s (goal < 1 %%)\n",
      workers, procs, cpu * 1e3, wall * 1e3, cpu * 100);
  for (pid_t p : pids) ::kill(p, SIGKILL);
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);

  // 3. Memory.
  std::printf("channel per worker: %zu bytes (goal <= 1 MiB); stack file: empty until a dump\n",
              sizeof(rdzv::ChannelLayout));
  return 0;
}
