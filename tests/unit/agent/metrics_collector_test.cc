// MetricsCollector (metrics_collector.h) with an injected /proc, GPU and
// clock: CPU % of a worker's whole process group, RSS, GPU n/a, the channel's
// values, a broken channel reported once. No socket, no process.
#include "ddprun/agent/metrics_collector.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <string>

namespace ddprun::agent {
namespace {

namespace rdzv = ::ddprun::rendezvous;

class FakeProc final : public ProcSource {
 public:
  std::vector<ProcStat> procs;
  int scans = 0;
  std::vector<ProcStat> Scan() override {
    ++scans;
    return procs;
  }
  double ticks_per_second() const override { return 100; }
  // (pid, remote port) of the established connections.
  std::set<std::pair<pid_t, int>> connections;
  int connection_checks = 0;
  bool ConnectedToPort(pid_t pid, int port) override {
    ++connection_checks;
    return connections.count({pid, port}) > 0;
  }
};

class FakeGpu final : public GpuSource {
 public:
  GpuUse use;
  std::set<pid_t> asked;
  GpuUse Sample(const std::set<pid_t>& pids) override {
    asked = pids;
    return use;
  }
};

int Channel() {
  const int fd = ::memfd_create("collector-test", MFD_CLOEXEC);
  const std::string init = rdzv::InitialChannelBytes();
  REQUIRE(::pwrite(fd, init.data(), init.size(), 0) == static_cast<ssize_t>(init.size()));
  return fd;
}

TEST_CASE("collector: CPU of the worker's process group, RSS, GPU n/a, channel values", "[unit]") {
  FakeProc proc;
  FakeGpu gpu;
  rdzv::FakeClock clock;
  MetricsCollector c(proc, gpu, clock);
  const int fd = Channel();
  c.Reset({MonitoredWorker{.rank = 4, .local_rank = 0, .pid = 0, .channel_fd = fd},
           MonitoredWorker{.rank = 5, .local_rank = 1, .pid = 0, .channel_fd = -1}});
  c.SetPid(0, 100);
  c.SetPid(1, 200);
  // Worker 100 and its DataLoader child 101 (same group); 300 is someone else's.
  proc.procs = {{100, 100, 1000, 1 << 20},
                {101, 100, 500, 2 << 20},
                {200, 200, 0, 4096},
                {300, 300, 99999, 1 << 30}};
  auto first = c.Sample(nullptr);
  REQUIRE(first.size() == 2);
  CHECK(first[0].rank == 4);
  CHECK(first[0].pid == 100);
  CHECK(first[0].cpu_percent == 0);  // no interval yet
  CHECK(first[0].rss_bytes == (3u << 20));
  CHECK(first[0].gpu_util_percent < 0);
  CHECK(first[0].state == "running");
  CHECK_FALSE(first[0].has_progress_source);
  CHECK(gpu.asked == std::set<pid_t>{200});

  // Two seconds: 100 used 1 s of CPU, its child 0.5 s, and a new child 102
  // appeared with 0.5 s: (100 + 50 + 50) ticks / 100 Hz / 2 s = 100 %.
  clock.Advance(std::chrono::seconds(2));
  proc.procs = {
      {100, 100, 1100, 1 << 20}, {101, 100, 550, 2 << 20}, {102, 100, 50, 0}, {200, 200, 0, 4096}};
  auto w = rdzv::ChannelWriter::Open("/proc/self/fd/" + std::to_string(fd));
  REQUIRE(w.ok());
  (*w)->Step(8, std::nan(""));
  (*w)->Step(8, 0.5);
  (*w)->Scalar("loss", 2.5);
  gpu.use = GpuUse{.util_percent = 55, .mem_bytes = 1 << 30};
  c.SetState(1, "exited");
  auto second = c.Sample(nullptr);
  CHECK(second[0].cpu_percent == Approx(100));
  CHECK(second[0].steps == 2);
  CHECK(second[0].samples_total == 16);
  CHECK(second[0].step_seconds == std::vector<double>{0.5});
  CHECK(second[0].scalars.at("loss") == 2.5);
  CHECK(second[0].has_progress_source);
  CHECK(second[0].gpu_util_percent == 55);
  CHECK(second[0].gpu_mem_bytes == (1u << 30));
  CHECK(second[1].state == "exited");
  CHECK(second[1].steps == 0);
  CHECK(proc.scans == 2);  // one pass over /proc per sample, for every worker

  // Durations are reported once.
  clock.Advance(std::chrono::seconds(1));
  CHECK(c.Sample(nullptr)[0].step_seconds.empty());
  ::close(fd);
}

TEST_CASE("collector: a worker reached its store once a process of its group connects to it",
          "[unit]") {
  FakeProc proc;
  FakeGpu gpu;
  rdzv::FakeClock clock;
  MetricsCollector c(proc, gpu, clock);
  c.Reset({MonitoredWorker{.rank = 0, .local_rank = 0, .pid = 0, .channel_fd = -1},
           MonitoredWorker{.rank = 1, .local_rank = 1, .pid = 0, .channel_fd = -1}},
          /*store_port=*/29500);
  c.SetPid(0, 100);
  c.SetPid(1, 200);
  // 101 is 100's child (a `sh -c` wrapper's python); 300 is someone else's.
  proc.procs = {{100, 100, 0, 0}, {101, 100, 0, 0}, {200, 200, 0, 0}, {300, 300, 0, 0}};
  proc.connections = {{200, 8080}, {300, 29500}};  // not the store, and not a worker
  auto first = c.Sample(nullptr);
  CHECK_FALSE(first[0].reached_store);
  CHECK_FALSE(first[1].reached_store);
  proc.connections.insert({101, 29500});
  auto second = c.Sample(nullptr);
  CHECK(second[0].reached_store);
  CHECK_FALSE(second[1].reached_store);
  // Sticky: not looked for again once found, even after the connection closed.
  proc.connections.clear();
  const int checks = proc.connection_checks;
  auto third = c.Sample(nullptr);
  CHECK(third[0].reached_store);
  CHECK(proc.connection_checks == checks + 1);  // rank 1's only
}

TEST_CASE("collector: a worker that breaks its channel is reported once and ignored", "[unit]") {
  FakeProc proc;
  FakeGpu gpu;
  rdzv::FakeClock clock;
  MetricsCollector c(proc, gpu, clock);
  const int fd = Channel();
  c.Reset({MonitoredWorker{.rank = 0, .local_rank = 0, .pid = 7, .channel_fd = fd}});
  auto w = rdzv::ChannelWriter::Open("/proc/self/fd/" + std::to_string(fd));
  REQUIRE(w.ok());
  for (int i = 0; i < 5; ++i) (*w)->Step(1, 0.1);
  std::vector<std::string> warnings;
  CHECK(c.Sample(&warnings)[0].steps == 5);
  CHECK(warnings.empty());
  const std::string garbage(64, '\xff');
  REQUIRE(::pwrite(fd, garbage.data(), garbage.size(), 0) == 64);
  for (int i = 0; i < 3; ++i) {
    clock.Advance(std::chrono::seconds(1));
    auto s = c.Sample(&warnings);
    CHECK(s[0].steps == 0);
    CHECK_FALSE(s[0].has_progress_source);
  }
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("rank 0: the metrics channel's header was overwritten"));
  ::close(fd);
}

}  // namespace
}  // namespace ddprun::agent
